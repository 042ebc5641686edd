package schemareg

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// randomJSONSchema builds a random draft-7 schema (types, properties,
// required, additionalProperties, items, lengths and counts, $ref to a
// definition, true and false; sometimes a keyword the fast path leaves to
// the validator: enum, pattern, minimum, format, anyOf) and rows for it,
// most of them valid, some not, some in forms only the validator can
// judge (1.0 for an integer, a member named twice, an escaped name).
type randomJSONSchema struct {
	r *rand.Rand
}

func (g *randomJSONSchema) pick(s ...string) string { return s[g.r.IntN(len(s))] }

// form is mostly one of good, sometimes one of odd.
func (g *randomJSONSchema) form(good, odd []string) string {
	if g.r.IntN(6) == 0 {
		return g.pick(odd...)
	}
	return g.pick(good...)
}

func (g *randomJSONSchema) schema(depth int) (string, func(depth int) string) {
	k := g.r.IntN(12)
	if k == 4 && g.r.IntN(3) > 0 {
		k = 1 // a keyword for the validator, now and then
	}
	if depth > 2 && k >= 8 {
		k = g.r.IntN(8)
	}
	str := func(int) string {
		return g.form([]string{`"anna"`, `"caf\u00e9"`, `"€€€"`, `"abc"`}, []string{`""`, `"abcdefghij"`, "\"\xff\xfe\"", `"\ud800"`, "5", "null"})
	}
	switch k {
	case 0:
		return fmt.Sprintf(`{"type": "string", "minLength": %d, "maxLength": %d}`, g.r.IntN(3), 2+g.r.IntN(8)), str
	case 1:
		return `{"type": "string"}`, str
	case 2:
		return g.pick(`{"type": "integer"}`, `{"type": "number"}`, `{"type": ["integer", "null"]}`, `{"type": ["string", "number"]}`), func(int) string {
			return g.form([]string{"0", "7", "-3"}, []string{"1.0", "1.5", "1e2", "-0", "123456789012345678901234567890", `"7"`, "null"})
		}
	case 3:
		return g.pick(`{"type": "boolean"}`, `{"type": "null"}`, `true`, `{}`, `false`), func(int) string {
			return g.pick("true", "false", "null", "0", `"x"`)
		}
	case 4:
		return g.pick(`{"enum": ["NOVA", "PAGADA"]}`, `{"type": "string", "pattern": "^[A-Z]+$"}`, `{"type": "integer", "minimum": 0}`,
				`{"type": "string", "format": "date-time"}`, `{"anyOf": [{"type": "string"}, {"type": "integer"}]}`),
			func(int) string {
				return g.pick(`"NOVA"`, `"nova"`, "5", "-5", `"2026-12-05T10:00:00Z"`, `"x"`)
			}
	case 5:
		return `{"$ref": "#/definitions/linia"}`, func(int) string {
			return g.form([]string{`{"producte": "formatge", "quantitat": 2}`}, []string{`{"producte": "mel"}`, `{"quantitat": 1.0, "producte": ""}`, `[]`})
		}
	case 6, 7:
		items, gen := g.schema(depth + 1)
		bounds := ""
		if g.r.IntN(3) == 0 {
			bounds = fmt.Sprintf(`, "minItems": %d, "maxItems": %d`, g.r.IntN(2), 1+g.r.IntN(3))
		}
		return fmt.Sprintf(`{"type": "array", "items": %s%s}`, items, bounds), func(d int) string {
			if g.r.IntN(30) == 0 {
				return g.pick(`{}`, `"x"`)
			}
			parts := make([]string, g.r.IntN(4))
			for i := range parts {
				parts[i] = gen(d + 1)
			}
			return "[" + strings.Join(parts, ", ") + "]"
		}
	}
	return g.object(depth)
}

func (g *randomJSONSchema) object(depth int) (string, func(depth int) string) {
	n := 1 + g.r.IntN(4)
	props := make([]string, n)
	gens := make([]func(int) string, n)
	var required []string
	for i := range props {
		typ, gen := g.schema(depth + 1)
		props[i], gens[i] = fmt.Sprintf(`"p%d": %s`, i, typ), gen
		if g.r.IntN(2) == 0 {
			required = append(required, fmt.Sprintf(`"p%d"`, i))
		}
	}
	addl := g.pick("", "", `, "additionalProperties": false`, `, "additionalProperties": true`, `, "additionalProperties": {"type": "integer"}`)
	req := ""
	if len(required) > 0 {
		req = `, "required": [` + strings.Join(required, ", ") + `]`
	}
	return fmt.Sprintf(`{"type": "object", "properties": {%s}%s%s}`, strings.Join(props, ", "), req, addl), func(d int) string {
		if g.r.IntN(30) == 0 {
			return g.pick(`[]`, `"x"`, `null`)
		}
		var parts []string
		for i := range props {
			key := fmt.Sprintf(`"p%d"`, i)
			switch g.r.IntN(30) {
			case 0, 1:
				continue
			case 2:
				parts = append(parts, fmt.Sprintf("%s: %s", key, gens[i](d+1)))
			case 3:
				key = fmt.Sprintf(`"\u0070%d"`, i)
			case 4:
				parts = append(parts, g.pick(`"extra": 1`, `"extra": "x"`))
			}
			parts = append(parts, fmt.Sprintf("%s: %s", key, gens[i](d+1)))
		}
		g.r.Shuffle(len(parts), func(i, j int) { parts[i], parts[j] = parts[j], parts[i] })
		return "{" + strings.Join(parts, ", ") + "}"
	}
}

// jsonCase is a random schema of seed (as an entry, and the same without
// the fast path: the reference) and a row for it.
func jsonCase(t testing.TB, seed uint64) (string, *entry, *entry, func() []byte) {
	g := &randomJSONSchema{r: rand.New(rand.NewPCG(seed, seed>>32))}
	body, gen := g.object(0)
	text := `{"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"linia": {"type": "object",
  "properties": {"producte": {"type": "string"}, "quantitat": {"type": "integer"}}, "required": ["producte", "quantitat"]}},` + body[1:]
	e, err := newEntry(FormatJSONSchema, Registered{Subject: "s", ID: 1, Version: 1, Schema: text, SchemaType: "JSON"})
	if err != nil {
		t.Fatalf("%s: %v", text, err)
	}
	ref := *e
	ref.jsonFast = nil
	return text, e, &ref, func() []byte { return []byte(gen(0) + g.pick("", "", " \n", " x", "}")) }
}

// sameJSON fails t unless Encode with the fast path and without it agree:
// the same bytes, or both refuse. A refusal's where and keyword are the
// validator's either way (the fast path refuses nothing), and with two
// faults in a row the validator names the first it meets in Go's map
// order: the texts are not compared. It reports whether the fast path
// passed the row.
func sameJSON(t *testing.T, text string, e, ref *entry, data []byte) bool {
	t.Helper()
	got, err := (&Codec{only: e}).Encode(nil, data, []byte("t"), 1)
	want, wantErr := (&Codec{only: ref}).Encode(nil, data, []byte("t"), 1)
	switch {
	case (err == nil) != (wantErr == nil):
		t.Fatalf("schema %s\nrow %q\nerr %v, reference %v", text, data, err, wantErr)
	case string(got) != string(want):
		t.Fatalf("schema %s\nrow %q\n got %q\nwant %q", text, data, got, want)
	}
	return e.jsonFast != nil && e.jsonFast.valid(data)
}

// TestJSONSchemaMatchesReference: for 2,000 random schemas and 10 rows
// each, Encode with the fast path writes or refuses what the validator
// alone does; the fast path passes a good share of the rows.
func TestJSONSchemaMatchesReference(t *testing.T) {
	fastShare(t, 2000, func(seed uint64) func() bool {
		text, e, ref, row := jsonCase(t, seed)
		return func() bool { return sameJSON(t, text, e, ref, row()) }
	})
}

// FuzzJSONSchema: a random schema (by seed) and any text: Encode with and
// without the fast path agree. The seeds run in go test; go test -fuzz
// FuzzJSONSchema explores.
func FuzzJSONSchema(f *testing.F) {
	f.Add(uint64(1), []byte(`{"p0": 1}`))
	f.Add(uint64(2), []byte(`{"p0": "x", "p1": [1, 2], "p2": {"p0": null}} x`))
	f.Add(uint64(3), []byte(`{"p0": "\u00e9", "p0": 2}`))
	f.Add(uint64(4), []byte(` {"\u0070\u0030": 1.0} `))
	f.Fuzz(func(t *testing.T, seed uint64, data []byte) {
		text, e, ref, row := jsonCase(t, seed)
		sameJSON(t, text, e, ref, data)
		sameJSON(t, text, e, ref, row())
	})
}
