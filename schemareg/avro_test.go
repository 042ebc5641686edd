package schemareg

import (
	"reflect"
	"strings"
	"testing"

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
