package schemareg

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
)

// randomAvro builds a random Avro schema (records, enums, arrays, maps,
// unions, logical types, defaults) and rows for it: most fit it, some
// miss a field, hold a wrong kind, name a member twice or escape a name.
type randomAvro struct {
	r     *rand.Rand
	seed  uint64 // in every name: hamba/avro caches encoders by a schema's canonical form, which leaves defaults out
	names int
	maps  bool // the schema has a map: hamba/avro writes its entries in Go's map order
}

func (g *randomAvro) name() string {
	g.names++
	return fmt.Sprintf("n%d_%d", g.seed, g.names)
}

// schema is a schema's JSON text and a generator of its values' JSON.
func (g *randomAvro) schema(depth int) (string, func() string) {
	k := g.r.IntN(16)
	if depth > 2 && k >= 9 {
		k = g.r.IntN(9)
	}
	switch k {
	case 0:
		return `"null"`, func() string { return g.pick("null", "null", "1") }
	case 1:
		return `"boolean"`, func() string { return g.pick("true", "false", `"true"`) }
	case 2:
		return `"int"`, func() string {
			return g.pick("0", "-7", "2147483647", "-2147483648", "2147483648", "1.5", "1e3", `"3"`, "300")
		}
	case 3:
		return `"long"`, func() string {
			return g.pick("0", "-1", "9223372036854775807", "-9223372036854775808", "9223372036854775808", "12345678901", "2.0", "-0")
		}
	case 4:
		return g.pick(`"float"`, `"double"`), func() string {
			return g.pick("0", "1.5", "-2.25e-3", "3.4e39", "1e400", "123456789012345678901234567890", "7", `"x"`)
		}
	case 5:
		return g.pick(`"string"`, `"bytes"`), func() string {
			return g.pick(`"anna"`, `""`, `"caf\u00e9 \"q\" \\ \n"`, `"\ud83d\ude00 \ud800 x"`, "\"bad \xff utf8\"", `"€"`, "5", "null")
		}
	case 6:
		return g.pick(`{"type": "long", "logicalType": "timestamp-millis"}`, `{"type": "long", "logicalType": "timestamp-micros"}`,
				`{"type": "long", "logicalType": "local-timestamp-millis"}`, `{"type": "long", "logicalType": "local-timestamp-micros"}`),
			func() string {
				return g.pick(`"2026-12-05T10:00:00.123+01:00"`, `"2026-12-05 09:00:00.000007+00"`, `"2026-12-05T10:00:00"`,
					`"dimarts"`, "1764928800000", "-5", `"2026-12-05 10:00:00"`)
			}
	case 7:
		return g.pick(`{"type": "int", "logicalType": "date"}`, `{"type": "int", "logicalType": "time-millis"}`,
				`{"type": "long", "logicalType": "time-micros"}`, `{"type": "string", "logicalType": "uuid"}`),
			func() string {
				return g.pick(`"2026-12-05"`, `"1969-07-20"`, `"10:30:01.5"`, `"23:59:59.999999"`, `"25:00"`, "19000", `"x"`,
					`"6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70"`)
			}
	case 8:
		prec := 1 + g.r.IntN(20)
		scale := g.r.IntN(prec + 1)
		return fmt.Sprintf(`{"type": "bytes", "logicalType": "decimal", "precision": %d, "scale": %d}`, prec, scale), func() string {
			return g.pick("12.5", `"-0.01"`, "0", "-128", "-129", "255", "-1", `"1e2"`, `"x"`, "123456789012.345", "true", `"-32768"`)
		}
	case 9, 10:
		name := g.name()
		syms := []string{"NOVA", "PAGADA", "ENVIADA"}[:1+g.r.IntN(3)]
		return fmt.Sprintf(`{"type": "enum", "name": %q, "symbols": ["%s"]}`, name, strings.Join(syms, `", "`)), func() string {
			return g.pick(`"NOVA"`, `"PAGADA"`, `"ENVIADA"`, `"N\u004fVA"`, `"ALTRA"`, "1")
		}
	case 11:
		items, gen := g.schema(depth + 1)
		return fmt.Sprintf(`{"type": "array", "items": %s}`, items), func() string {
			if g.r.IntN(10) == 0 {
				return g.pick(`{}`, `"x"`)
			}
			n := g.r.IntN(4)
			if g.r.IntN(8) == 0 {
				n = 95 + g.r.IntN(120) // more than a block
			}
			parts := make([]string, n)
			for i := range parts {
				parts[i] = gen()
			}
			return "[" + strings.Join(parts, ", ") + "]"
		}
	case 12:
		g.maps = true
		values, gen := g.schema(depth + 1)
		return fmt.Sprintf(`{"type": "map", "values": %s}`, values), func() string {
			if g.r.IntN(10) == 0 {
				return g.pick(`[]`, `7`)
			}
			n := g.r.IntN(4)
			parts := make([]string, n)
			for i := range parts {
				parts[i] = fmt.Sprintf(`"k%d": %s`, g.r.IntN(3), gen())
			}
			return "{" + strings.Join(parts, ", ") + "}"
		}
	case 13:
		// A union: null and up to two other kinds (distinct by name).
		var branches []string
		var gens []func() string
		seen := map[string]bool{}
		if g.r.IntN(3) > 0 {
			branches, seen[`"null"`] = append(branches, `"null"`), true
			gens = append(gens, func() string { return "null" })
		}
		for range 1 + g.r.IntN(2) {
			b, gen := g.schema(depth + 1)
			key := b
			if strings.HasPrefix(b, `{"type": "record"`) || strings.HasPrefix(b, `{"type": "enum"`) {
				key = b[:20] + g.name()
			}
			if strings.HasPrefix(b, `{"type": "array"`) || strings.HasPrefix(b, `{"type": "map"`) {
				key = b[:14]
			}
			if seen[key] || strings.HasPrefix(b, "[") {
				continue
			}
			seen[key] = true
			branches, gens = append(branches, b), append(gens, gen)
		}
		if len(branches) == 0 {
			branches, gens = append(branches, `"null"`), append(gens, func() string { return "null" })
		}
		g.r.Shuffle(len(branches), func(i, j int) {
			branches[i], branches[j] = branches[j], branches[i]
			gens[i], gens[j] = gens[j], gens[i]
		})
		return "[" + strings.Join(branches, ", ") + "]", func() string { return gens[g.r.IntN(len(gens))]() }
	}
	return g.record(depth)
}

// record is a record schema: each field maybe with a default.
func (g *randomAvro) record(depth int) (string, func() string) {
	name := g.name()
	n := 1 + g.r.IntN(4)
	fields := make([]string, n)
	gens := make([]func() string, n)
	names := make([]string, n)
	for i := range fields {
		typ, gen := g.schema(depth + 1)
		names[i], gens[i] = fmt.Sprintf("f%d", i), gen
		def := ""
		if g.r.IntN(3) == 0 {
			// A default: a value of the type, as JSON (a union's is of its first branch); a
			// schema hamba/avro refuses is left out of the test.
			def = `, "default": ` + gen()
		}
		fields[i] = fmt.Sprintf(`{"name": %q, "type": %s%s}`, names[i], typ, def)
	}
	return fmt.Sprintf(`{"type": "record", "name": %q, "fields": [%s]}`, name, strings.Join(fields, ", ")), func() string {
		if g.r.IntN(12) == 0 {
			return g.pick(`[]`, `"x"`, `null`)
		}
		var parts []string
		for i := range names {
			key := fmt.Sprintf("%q", names[i])
			switch g.r.IntN(14) {
			case 0:
				continue // missing
			case 1:
				key = `"\u0066` + names[i][1:] + `"` // an escaped name
			case 2:
				parts = append(parts, fmt.Sprintf("%s: %s", key, gens[i]())) // named twice: the last counts
			case 3:
				parts = append(parts, `"extra": {"a": [1, "x", null]}`)
			}
			parts = append(parts, fmt.Sprintf("%s: %s", key, gens[i]()))
		}
		g.r.Shuffle(len(parts), func(i, j int) { parts[i], parts[j] = parts[j], parts[i] })
		return "{" + strings.Join(parts, g.pick(", ", ",", " ,\n\t")) + "}"
	}
}

func (g *randomAvro) pick(s ...string) string { return s[g.r.IntN(len(s))] }

// sameAvro fails t unless the schema-directed encoder and the reference
// agree on data: the same bytes, or the same error. With a map in the
// schema the reference writes entries in Go's map order (and finds the
// first bad one in it): the values read back must be equal, and both
// refuse or neither.
func sameAvro(t *testing.T, schema avro.Schema, hasMap bool, data []byte) {
	t.Helper()
	want, wantErr := refAvroOf(schema, data)
	got, err := newAvroCodec(schema).encode(nil, data)
	switch {
	case (err == nil) != (wantErr == nil):
		t.Fatalf("schema %s\nrow %q\nerr %v, reference %v", schema, data, err, wantErr)
	case err != nil && !hasMap && err.Error() != wantErr.Error():
		t.Fatalf("schema %s\nrow %q\nerr       %v\nreference %v", schema, data, err, wantErr)
	case err == nil && !bytes.Equal(got, want):
		if hasMap {
			var a, b any
			errA, errB := avro.Unmarshal(schema, got, &a), avro.Unmarshal(schema, want, &b)
			if errA == nil && errB == nil && reflect.DeepEqual(a, b) {
				return
			}
		}
		t.Fatalf("schema %s\nrow %q\n got % x\nwant % x", schema, data, got, want)
	}
}

// avroCase is a random schema of seed and a row for it.
func avroCase(seed uint64) (avro.Schema, bool, func() []byte, error) {
	g := &randomAvro{r: rand.New(rand.NewPCG(seed, seed>>32)), seed: seed}
	text, gen := g.record(0)
	schema, err := avro.Parse(text)
	return schema, g.maps, func() []byte { return []byte(gen()) }, err
}

// TestAvroMatchesReference: for 3,000 random schemas and 10 rows each,
// the schema-directed encoder writes the bytes the encoder it replaced
// wrote (through Go values and hamba/avro), or refuses with its error.
func TestAvroMatchesReference(t *testing.T) {
	n := 3000
	if testing.Short() {
		n = 500
	}
	parsed := 0
	for seed := range uint64(n) {
		schema, hasMap, row, err := avroCase(seed)
		if err != nil {
			continue // a default hamba/avro refuses
		}
		parsed++
		for range 10 {
			sameAvro(t, schema, hasMap, row())
		}
	}
	if parsed < n/2 {
		t.Fatalf("only %d of %d random schemas parsed", parsed, n)
	}
}

// FuzzAvro: a random schema (by seed) and any text: the encoder and the
// reference agree. The seeds run in go test; go test -fuzz FuzzAvro
// explores.
func FuzzAvro(f *testing.F) {
	f.Add(uint64(1), []byte(`{"f0": 1}`))
	f.Add(uint64(7), []byte(`{"f0": "x", "f1": [1, 2], "f2": {"k0": null}} trailing`))
	f.Add(uint64(12), []byte(`{"f0": "\u00e9", "f0": 2`))
	f.Add(uint64(30), []byte(` 5 `))
	f.Add(uint64(31), []byte(`"\ud800"x`))
	f.Add(uint64(99), []byte(`{"f1": 1e400, "f2": -0, "f3": [[]]}`))
	f.Fuzz(func(t *testing.T, seed uint64, data []byte) {
		schema, hasMap, row, err := avroCase(seed)
		if err != nil {
			return
		}
		sameAvro(t, schema, hasMap, data)
		sameAvro(t, schema, hasMap, row())
	})
}
