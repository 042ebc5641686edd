package schemareg

import (
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
)

const orderAvro = `{"type": "record", "name": "ComandaCreada", "namespace": "km0", "fields": [
  {"name": "id", "type": "string"},
  {"name": "n", "type": "int"},
  {"name": "total", "type": "double"},
  {"name": "nota", "type": ["null", "string"], "default": null},
  {"name": "estat", "type": {"type": "enum", "name": "Estat", "symbols": ["NOVA", "PAGADA"]}},
  {"name": "linies", "type": {"type": "array", "items": {"type": "record", "name": "Linia", "fields": [
    {"name": "producte", "type": "string"}, {"name": "quantitat", "type": "long"}]}}},
  {"name": "mercat", "type": "string", "default": "girona"}]}`

// avroOf writes data by schema with the schema-directed encoder.
func avroOf(schema avro.Schema, data []byte) ([]byte, error) {
	return newAvroCodec(schema).encode(nil, data)
}

// TestAvroOf: carrega (JSON) written by an Avro schema reads back, through
// the Avro decoder, as the same event (defaults filled in); a value the
// schema cannot take is refused by where and what kind, never by what it
// holds.
func TestAvroOf(t *testing.T) {
	sch := avro.MustParse(orderAvro)
	enc, err := avroOf(sch, []byte(`{"id": "P-7", "n": 3, "total": 12.5, "nota": "urgent", "estat": "NOVA",
		"linies": [{"producte": "formatge", "quantitat": 2}], "ignored": true}`))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := avro.Unmarshal(sch, enc, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"id": "P-7", "n": 3, "total": 12.5, "nota": "urgent", "estat": "NOVA",
		"linies": []any{map[string]any{"producte": "formatge", "quantitat": int64(2)}}, "mercat": "girona"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back\n got %#v\nwant %#v", got, want)
	}
	for _, tc := range []struct{ data, want string }{
		{`{"id": "P-7", "n": "secret-text", "total": 1, "estat": "NOVA", "linies": []}`, "at /n: the schema wants int, the value is a string"},
		{`{"id": "P-7", "n": 2.5, "total": 1, "estat": "NOVA", "linies": []}`, "at /n: the schema wants int (an integer)"},
		{`{"id": "P-7", "n": 1, "estat": "NOVA", "linies": []}`, "at /total: required by the schema, missing"},
		{`{"id": "P-7", "n": 1, "total": 1, "estat": "NOVA", "linies": [{"producte": 5, "quantitat": 1}]}`, "at /linies/0/producte: the schema wants string, the value is a number"},
		{`{"id": "P-7", "n": 1, "total": 1, "estat": "ESBORRANY-secret", "linies": []}`, "Estat"},
	} {
		_, err := avroOf(sch, []byte(tc.data))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: err = %v, want %q and no value", tc.data, err, tc.want)
		}
	}
}

// TestAvroLogicalTypes: a logical type's value from its JSON text (an RFC
// 3339 or PostgreSQL timestamp, a date, a time of day, a decimal as a
// number or text) or from its underlying number, read back by the Avro
// decoder as the same instant, day, time or amount; a text that is none
// of them, or a decimal beyond the scale, is refused without the value.
func TestAvroLogicalTypes(t *testing.T) {
	sch := avro.MustParse(`{"type": "record", "name": "Pagament", "fields": [
  {"name": "quan", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "quan_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
  {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
  {"name": "dia", "type": {"type": "int", "logicalType": "date"}},
  {"name": "hora", "type": {"type": "int", "logicalType": "time-millis"}},
  {"name": "hora_us", "type": {"type": "long", "logicalType": "time-micros"}},
  {"name": "durada_us", "type": {"type": "long", "logicalType": "time-micros"}},
  {"name": "import", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
  {"name": "abans", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": null}]}`)
	enc, err := avroOf(sch, []byte(`{"quan": "2026-12-05T10:00:00.123+01:00", "quan_us": "2026-12-05 09:00:00.000007+00",
		"local": "2026-12-05T10:00:00", "dia": "2026-12-05", "hora": "10:30:01.5",
		"hora_us": "10:30:01.000002", "durada_us": 1500, "import": 12.5, "abans": 1764928800000}`))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := avro.Unmarshal(sch, enc, &got); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	for k, want := range map[string]any{"quan": at.Add(123 * time.Millisecond), "quan_us": at.Add(7 * time.Microsecond),
		"local": time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC), "dia": time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC),
		"hora":    10*time.Hour + 30*time.Minute + 1500*time.Millisecond,
		"hora_us": 10*time.Hour + 30*time.Minute + time.Second + 2*time.Microsecond, "durada_us": 1500 * time.Microsecond, "abans": time.UnixMilli(1764928800000).UTC()} {
		g := got[k]
		if m, ok := g.(map[string]any); ok { // a union's branch
			for _, v := range m {
				g = v
			}
		}
		if tm, ok := g.(time.Time); ok {
			g = tm.UTC()
		}
		if !reflect.DeepEqual(g, want) {
			t.Errorf("%s: read back %#v, want %#v", k, g, want)
		}
	}
	if r, ok := got["import"].(*big.Rat); !ok || r.FloatString(2) != "12.50" {
		t.Errorf("import: %#v", got["import"])
	}
	base := `"quan": 1, "quan_us": 1, "local": 1, "dia": 1, "hora": 1, "hora_us": 1, "durada_us": 1, "import": "1"`
	for _, tc := range []struct{ field, want string }{
		{`"quan": "dimarts-secret"`, "at /quan: the schema wants timestamp-millis"},
		{`"dia": "secret"`, "at /dia: the schema wants a date"},
		{`"hora": "25:00-secret"`, "at /hora: the schema wants time-millis"},
		{`"import": 1.005`, "at /import: more decimal places than the schema's scale 2"},
		{`"import": "123456789"`, "at /import: more digits than the schema's precision 9"},
		{`"import": "secret"`, "at /import: the schema wants a decimal"},
	} {
		// The later of two members of one name wins: the field goes last.
		data := "{" + base + ", " + tc.field + "}"
		_, err := avroOf(sch, []byte(data))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: err = %v, want %q and no value", tc.field, err, tc.want)
		}
	}
}
