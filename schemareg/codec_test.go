package schemareg

import (
	"strings"
	"testing"
)

// TestEncode: a value its schema takes is written behind the magic byte
// and the schema's id; one it refuses is an error that says where and by
// which keyword, never the value; a tipus without a schema is named.
func TestEncode(t *testing.T) {
	e, err := newEntry(FormatJSONSchema, Registered{Subject: "comanda.creada", ID: 258, Version: 3, Schema: `{"type": "object", "properties": {"n": {"type": "integer"}, "client": {"type": "string", "maxLength": 4}}, "required": ["n"]}`, SchemaType: "JSON"})
	if err != nil {
		t.Fatal(err)
	}
	c := &Codec{byKey: map[string]*entry{"comanda.creada": e}}
	out, err := c.Encode(nil, []byte(`{"n": 7}`), []byte("comanda.creada"), 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := "\x00\x00\x00\x01\x02" + `{"n": 7}`; string(out) != want {
		t.Errorf("wire form % x, want % x", out, want)
	}
	_, err = c.Encode(nil, []byte(`{"n": 7, "client": "anna-maria-secreta"}`), []byte("comanda.creada"), 1)
	if err == nil || !strings.Contains(err.Error(), `at /client: fails "maxLength"`) || strings.Contains(err.Error(), "secreta") {
		t.Errorf("err = %v: want where and which keyword, not the value", err)
	}
	if _, err = c.Encode(nil, []byte(`{"n": 7}`), []byte("pagament.fet"), 1); err == nil || !strings.Contains(err.Error(), `no schema for tipus "pagament.fet"`) {
		t.Errorf("err = %v, want the tipus without a schema named", err)
	}
	// A schema per tipus/versio comes before the tipus's own.
	v2, _ := newEntry(FormatJSONSchema, Registered{Subject: "comanda.creada", ID: 259, Version: 4, Schema: `{"type": "object"}`, SchemaType: "JSON"})
	c.byKey["comanda.creada/2"] = v2
	out, _ = c.Encode(nil, []byte(`{}`), []byte("comanda.creada"), 2)
	if out[4] != 3 { // id 259 = 0x103
		t.Errorf("versio 2 written with schema id byte %d, want 259's", out[4])
	}
}

// TestSubject: the three strategies, the record named by the schema's
// title or else the tipus.
func TestSubject(t *testing.T) {
	for _, tc := range []struct{ strategy, key, schema, want string }{
		{"", "comanda.creada", `{}`, "comandes-value"},
		{StrategyTopic, "comanda.creada", `{"title": "x"}`, "comandes-value"},
		{StrategyRecord, "comanda.creada/2", `{"title": "km0.ComandaCreada"}`, "km0.ComandaCreada"},
		{StrategyRecord, "comanda.creada/2", `{}`, "comanda.creada"},
		{StrategyTopicRecord, "comanda.creada", `{"title": "km0.ComandaCreada"}`, "comandes-km0.ComandaCreada"},
	} {
		got, err := Subject(FormatJSONSchema, tc.strategy, "comandes", tc.key, tc.schema)
		if err != nil || got != tc.want {
			t.Errorf("%s %s: %q, %v; want %q", tc.strategy, tc.key, got, err, tc.want)
		}
	}
}
