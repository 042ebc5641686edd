package schemareg

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hamba/avro/v2"
)

// order is a file of testdata/order: the bench's order (tools/bench),
// order.json, and its schema in each format.
func order(tb testing.TB, name string) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "order", name))
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// benchCodec is a Codec of format with the one schema text.
func benchCodec(tb testing.TB, format, text string) *Codec {
	tb.Helper()
	e, err := newEntry(format, Registered{Subject: "comandes-value", ID: 7, Version: 1, Schema: text, SchemaType: SchemaType(format)})
	if err != nil {
		tb.Fatal(err)
	}
	return &Codec{only: e}
}

// BenchmarkEncode: ns and allocations per row of the bench's order in
// each format's wire form (compare BenchmarkBuild/envelope in envelope/,
// the record without a registry).
func BenchmarkEncode(b *testing.B) {
	for _, shape := range []struct{ name, format, schema string }{
		{"avro", FormatAvro, "comanda-creada.avsc"},
		{"protobuf", FormatProtobuf, "comanda_creada.proto"},
		{"jsonschema", FormatJSONSchema, "comanda-creada.json"},
	} {
		b.Run(shape.name, func(b *testing.B) {
			c := benchCodec(b, shape.format, order(b, shape.schema))
			row, tipus := []byte(order(b, "order.json")), []byte("comanda.creada")
			var dst []byte
			b.ReportAllocs()
			for b.Loop() {
				out, err := c.Encode(dst[:0], row, tipus, 1)
				if err != nil {
					b.Fatal(err)
				}
				dst = out
			}
		})
	}
	b.Run("avro_reference", func(b *testing.B) {
		schema := avro.MustParse(order(b, "comanda-creada.avsc"))
		row := []byte(order(b, "order.json"))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := refAvroOf(schema, row); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestEncodeDoesNotAllocate: a warm codec writes the bench's order in
// Avro, in Protobuf and validated by its JSON Schema, and an Avro row with a union, an enum, a map and
// a timestamp, without allocating.
func TestEncodeDoesNotAllocate(t *testing.T) {
	c := benchCodec(t, FormatAvro, order(t, "comanda-creada.avsc"))
	pb := benchCodec(t, FormatProtobuf, order(t, "comanda_creada.proto"))
	js := benchCodec(t, FormatJSONSchema, order(t, "comanda-creada.json"))
	rich := benchCodec(t, FormatAvro, `{"type": "record", "name": "R", "fields": [
  {"name": "nota", "type": ["null", "string"], "default": null},
  {"name": "n", "type": ["null", "long", "string"]},
  {"name": "estat", "type": {"type": "enum", "name": "Estat", "symbols": ["NOVA", "PAGADA"]}},
  {"name": "quan", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "pes", "type": "double"},
  {"name": "attrs", "type": {"type": "map", "values": "string"}},
  {"name": "mercat", "type": "string", "default": "girona"}]}`)
	for _, tc := range []struct {
		c   *Codec
		row string
	}{
		{c, order(t, "order.json")},
		{pb, order(t, "order.json")},
		{js, order(t, "order.json")},
		{rich, `{"n": "x", "estat": "PAGADA", "quan": "2026-12-05T10:00:00.123Z", "pes": 1.25, "attrs": {"a": "b", "c": "d"}, "extra": [1, {"x": null}]}`},
	} {
		row, tipus := []byte(tc.row), []byte("comanda.creada")
		dst, err := tc.c.Encode(nil, row, tipus, 1)
		if err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { dst, _ = tc.c.Encode(dst[:0], row, tipus, 1) }); n != 0 {
			t.Errorf("%.1f allocations per warm encoding of %s, want 0", n, tc.row)
		}
	}
}
