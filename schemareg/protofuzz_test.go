package schemareg

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// randomProto builds a random proto3 file (messages of scalars, strings,
// enums, nested and repeated fields, numbered out of order; sometimes
// what the fast path leaves to protojson: bytes, a map, a oneof, an
// optional, a well-known type) and rows for its first message, in the
// common forms and not (an exponent, an integer's text, "-0", an enum by
// number, a name twice, an unknown member, a surrogate, invalid UTF-8).
type randomProto struct {
	r    *rand.Rand
	gens map[string]func(depth int) string // each message's rows, by name
}

func (g *randomProto) pick(s ...string) string { return s[g.r.IntN(len(s))] }

// form is mostly one of good, sometimes one of odd.
func (g *randomProto) form(good, odd []string) string {
	if g.r.IntN(5) == 0 {
		return g.pick(odd...)
	}
	return g.pick(good...)
}

// file is the .proto text and a row generator for its first message.
func (g *randomProto) file() (string, func() string) {
	var b strings.Builder
	b.WriteString("syntax = \"proto3\";\npackage fz;\nimport \"google/protobuf/timestamp.proto\";\n")
	b.WriteString("enum Estat { ESTAT_DESCONEGUT = 0; NOVA = 1; PAGADA = 2; }\n")
	gens := map[string]func(depth int) string{}
	g.gens = gens
	n := 1 + g.r.IntN(3)
	for m := range n {
		name := fmt.Sprintf("M%d", m)
		type field struct {
			jsonName, protoName string
			gen                 func(depth int) string
			repeated            bool
		}
		var fields []field
		nums := g.r.Perm(30)
		fmt.Fprintf(&b, "message %s {\n", name)
		for f := range 1 + g.r.IntN(5) {
			protoName := fmt.Sprintf("camp_%d", f)
			jsonName := fmt.Sprintf("camp%d", f)
			typ, gen := g.scalar(n, m)
			label := ""
			switch g.r.IntN(8) {
			case 0, 1:
				label = "repeated "
			case 2:
				if g.r.IntN(6) == 0 {
					label = "optional "
				}
			}
			if g.r.IntN(25) == 0 {
				fmt.Fprintf(&b, "  oneof tria%d { string camp_%d = %d; }\n", f, f, nums[f]+1)
				fields = append(fields, field{jsonName, protoName, func(int) string { return `"x"` }, false})
				continue
			}
			if g.r.IntN(25) == 0 {
				fmt.Fprintf(&b, "  map<string, int32> camp_%d = %d;\n", f, nums[f]+1)
				fields = append(fields, field{jsonName, protoName, func(int) string { return `{"a": 1, "b": "2"}` }, false})
				continue
			}
			fmt.Fprintf(&b, "  %s%s %s = %d;\n", label, typ, protoName, nums[f]+1)
			fields = append(fields, field{jsonName, protoName, gen, label == "repeated "})
		}
		b.WriteString("}\n")
		gens[name] = func(depth int) string {
			if g.r.IntN(40) == 0 {
				return g.pick(`[]`, `"x"`, `null`, `{"desconegut": 1}`)
			}
			var parts []string
			for _, f := range fields {
				if g.r.IntN(5) == 0 {
					continue
				}
				key := f.jsonName
				switch g.r.IntN(30) {
				case 0, 1, 4, 5, 6:
					key = f.protoName
				case 2:
					parts = append(parts, fmt.Sprintf("%q: %s", f.protoName, f.gen(depth+1))) // named twice
				case 3:
					key = `c\u0061mp` + f.jsonName[4:]
				}
				v := f.gen(depth + 1)
				if f.repeated && g.r.IntN(6) > 0 {
					items := make([]string, g.r.IntN(4))
					for i := range items {
						items[i] = f.gen(depth + 1)
					}
					v = "[" + strings.Join(items, ", ") + "]"
				}
				if g.r.IntN(30) == 0 {
					v = "null"
				}
				parts = append(parts, fmt.Sprintf("%q: %s", key, v))
			}
			g.r.Shuffle(len(parts), func(i, j int) { parts[i], parts[j] = parts[j], parts[i] })
			return "{" + strings.Join(parts, g.pick(", ", ",", "\n ")) + "}"
		}
	}
	return b.String(), func() string { return gens["M0"](0) + g.pick("", "", " ", "\n", " x") }
}

// scalar is a field type and a generator of its values' JSON; of n
// messages, the field is in message m.
func (g *randomProto) scalar(n, m int) (string, func(depth int) string) {
	ints := func(int) string {
		return g.form([]string{"0", "7", "-7", "2147483647", `"12"`, "-2147483648", "300"},
			[]string{"2147483648", "4294967295", "4294967296", "9223372036854775807", "-9223372036854775808", "18446744073709551615",
				"18446744073709551616", `"-3"`, `" 4"`, "1e2", "1.0", "1.5", "-0", `"x"`, "true", "007"})
	}
	switch k := g.r.IntN(14); k {
	case 0, 1:
		return g.pick("int32", "sint32", "sfixed32", "uint32", "fixed32"), ints
	case 2, 3:
		return g.pick("int64", "sint64", "sfixed64", "uint64", "fixed64"), ints
	case 4:
		return "bool", func(int) string { return g.form([]string{"true", "false"}, []string{`"true"`, "0"}) }
	case 5, 6:
		return "string", func(int) string {
			return g.form([]string{`"anna"`, `""`, `"caf\u00e9 \"q\" \\ \n"`, `"€"`}, []string{`"\ud83d\ude00"`, `"\ud800 x"`, "\"bad \xff\"", "5"})
		}
	case 7:
		return g.pick("float", "double"), func(int) string {
			return g.form([]string{"0", "-0.0", "1.5", "-2.25e-3", "7", "12345678901234567890"}, []string{"-0", "3.4e39", "1e400", `"1.5"`, `"NaN"`})
		}
	case 8:
		return "Estat", func(int) string {
			return g.pick(`"NOVA"`, `"PAGADA"`, `"ESTAT_DESCONEGUT"`, "1", "0", "7", `"ALTRA"`, `"1"`, "1.0")
		}
	case 9:
		if g.r.IntN(4) == 0 {
			return g.pick("bytes", "google.protobuf.Timestamp"), func(int) string { return g.pick(`"YWJj"`, `"2026-12-05T10:00:00Z"`, `"x"`) }
		}
		fallthrough
	default:
		target := fmt.Sprintf("M%d", g.r.IntN(n))
		if target <= fmt.Sprintf("M%d", m) && g.r.IntN(2) == 0 {
			target = fmt.Sprintf("M%d", (m+1)%n) // mostly forward: rows end
		}
		return target, func(depth int) string {
			if depth > 3 {
				return "{}"
			}
			return g.gens[target](depth)
		}
	}
}

// sameProto fails t unless Encode (the fast path, or protojson when it
// does not take the row) and protoOf agree: the same bytes, or the same
// refusal. It reports whether the fast path took the row.
func sameProto(t *testing.T, text string, e *entry, data []byte) bool {
	t.Helper()
	want, wantErr := protoOf(e.proto, data)
	got, err := (&Codec{only: e}).Encode(nil, data, []byte("t"), 1)
	switch {
	case (err == nil) != (wantErr == nil):
		t.Fatalf("schema %s\nrow %q\nerr %v, reference %v", text, data, err, wantErr)
	case err != nil && !strings.HasSuffix(err.Error(), ": "+wantErr.Error()):
		t.Fatalf("schema %s\nrow %q\nerr       %v\nreference %v", text, data, err, wantErr)
	case err == nil && !bytes.Equal(got[len(e.prefix):], want):
		t.Fatalf("schema %s\nrow %q\n got % x\nwant % x", text, data, got[len(e.prefix):], want)
	}
	if e.protoFast == nil {
		return false
	}
	_, fast := e.protoFast.encode(nil, data)
	return fast
}

func protoCase(t testing.TB, seed uint64) (string, *entry, func() []byte) {
	g := &randomProto{r: rand.New(rand.NewPCG(seed, seed>>32))}
	text, row := g.file()
	e, err := newEntry(FormatProtobuf, Registered{Subject: "s", ID: 1, Version: 1, Schema: text, SchemaType: "PROTOBUF"})
	if err != nil {
		t.Fatalf("%s: %v", text, err)
	}
	return text, e, func() []byte { return []byte(row()) }
}

// TestProtobufMatchesReference: for 2,000 random .proto files and 10 rows
// each, Encode writes what protojson and proto.Marshal wrote, or refuses
// with their reason; the fast path takes a good share of the rows.
func TestProtobufMatchesReference(t *testing.T) {
	fastShare(t, 2000, func(seed uint64) func() bool {
		text, e, row := protoCase(t, seed)
		return func() bool { return sameProto(t, text, e, row()) }
	})
}

// fastShare runs n random cases (400 with -short) of 10 rows each: a
// case's row checks that the fast path and the reference agree on a row
// and reports whether the fast path took it. It fails t when the fast
// path took less than a tenth of them.
func fastShare(t *testing.T, n int, newCase func(seed uint64) (row func() bool)) {
	if testing.Short() {
		n = 400
	}
	rows, fast := 0, 0
	for seed := range uint64(n) {
		row := newCase(seed)
		for range 10 {
			rows++
			if row() {
				fast++
			}
		}
	}
	if fast < rows/10 {
		t.Fatalf("the fast path took %d of %d rows", fast, rows)
	}
	t.Logf("the fast path took %d of %d rows", fast, rows)
}

// FuzzProtobuf: a random .proto (by seed) and any text: Encode and the
// reference agree. The seeds run in go test; go test -fuzz FuzzProtobuf
// explores.
func FuzzProtobuf(f *testing.F) {
	f.Add(uint64(1), []byte(`{"camp0": 1}`))
	f.Add(uint64(2), []byte(`{"camp_0": "7", "camp1": [1, 2], "camp2": {"camp0": null}}`))
	f.Add(uint64(3), []byte(`{"camp0": "\u00e9", "camp0": 2}`))
	f.Add(uint64(4), []byte(` {} x`))
	f.Add(uint64(5), []byte(`{"camp1": 1e400, "camp2": -0, "camp3": [[]]}`))
	f.Fuzz(func(t *testing.T, seed uint64, data []byte) {
		text, e, row := protoCase(t, seed)
		sameProto(t, text, e, data)
		sameProto(t, text, e, row())
	})
}
