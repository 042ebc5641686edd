package envelope_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/envelope"
)

func TestParseTimestamptz(t *testing.T) {
	tests := []struct {
		in   string
		want time.Time
	}{
		{"2026-12-02 12:46:05.123456+00", time.Date(2026, 12, 2, 12, 46, 5, 123456000, time.UTC)},
		{"2026-12-02 12:46:05+00", time.Date(2026, 12, 2, 12, 46, 5, 0, time.UTC)},
		{"2026-12-02 18:16:05.5+05:30", time.Date(2026, 12, 2, 12, 46, 5, 500000000, time.UTC)},
		{"2026-12-02 09:46:05.000001-03", time.Date(2026, 12, 2, 12, 46, 5, 1000, time.UTC)},
		{"1900-01-01 00:00:00+00:09:21", time.Date(1899, 12, 31, 23, 50, 39, 0, time.UTC)},
		{"1969-12-31 23:59:59.9995+00", time.Date(1969, 12, 31, 23, 59, 59, 999500000, time.UTC)},
		{"12026-01-01 00:00:00+00", time.Date(12026, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"0044-03-15 12:00:00+00 BC", time.Date(-43, 3, 15, 12, 0, 0, 0, time.UTC)},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := envelope.ParseTimestamptz([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if want := tc.want.UnixMicro(); got != want {
				t.Errorf("got %d µs, want %d µs", got, want)
			}
		})
	}
	for _, in := range []string{"", "infinity", "-infinity", "2026-12-02", "2026-12-02 12:46:05", "2026-13-02 12:46:05+00",
		"2026-12-02 12:46:05.1234567+00", "2026-12-02 12:46:05+00x", "2026-12-02T12:46:05+00"} {
		if _, err := envelope.ParseTimestamptz([]byte(in)); err == nil {
			t.Errorf("%q: want an error", in)
		}
	}
}

// relation builds a Relation message for the seed's outbox table with the
// given column order and types.
func relation(cols ...string) *pglogrepl.RelationMessage {
	types := map[string]uint32{"id": 2950, "agregat": 25, "agregat_id": 25, "tipus": 25, "versio": 23, "carrega": 3802, "creat_en": 1184, "publicat_en": 1184}
	rel := &pglogrepl.RelationMessage{RelationID: 16400, Namespace: "public", RelationName: "outbox"}
	for _, c := range cols {
		typ, ok := types[c]
		if !ok {
			typ = 25
		}
		rel.Columns = append(rel.Columns, &pglogrepl.RelationMessageColumn{Name: c, DataType: typ})
	}
	return rel
}

func tuple(vals ...*string) []envelope.Column {
	var row []envelope.Column
	for _, v := range vals {
		if v == nil {
			row = append(row, envelope.Column{Kind: pglogrepl.TupleDataTypeNull})
			continue
		}
		row = append(row, envelope.Column{Kind: pglogrepl.TupleDataTypeText, Data: []byte(*v)})
	}
	return row
}

func s(v string) *string { return &v }

var seedCols = envelope.Columns{ID: "id", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "carrega", CreatEn: "creat_en"}

func TestBuildGolden(t *testing.T) {
	r := newRouter(t, "comandes", []envelope.Route{{Schema: "public", Table: "outbox", Topic: "comandes.esdeveniments", Columns: seedCols}}, 0)
	// Columns in a different order than the contract's CREATE TABLE: they
	// are found by name.
	b := bind(r, relation("publicat_en", "carrega", "id", "tipus", "agregat", "agregat_id", "creat_en", "versio"))
	carrega := `{"id": "P-2026-000123", "client": "anna", "linies": [{"producte": "formatge-curat", "quantitat": 2, "preu_centims": 1450}]}`
	rec, err := build(r, b, tuple(nil, s(carrega), s("6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70"), s("comanda.creada"), s("comanda"),
		s("P-2026-000123"), s("2026-09-10 09:33:20.123999+02"), s("1")), nil)
	if err != nil {
		t.Fatal(err)
	}
	golden, err := os.ReadFile(filepath.Join("testdata", "comanda_creada.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(rec.Value), strings.TrimSpace(string(golden)); got != want {
		t.Errorf("value:\n got %s\nwant %s", got, want)
	}
	if rec.Topic != "comandes.esdeveniments" || string(rec.Key) != "P-2026-000123" {
		t.Errorf("topic %q key %q", rec.Topic, rec.Key)
	}
	if len(rec.Headers) != 2 || rec.Headers[0].Key != "tipus" || string(rec.Headers[0].Value) != "comanda.creada" ||
		rec.Headers[1].Key != "id_esdeveniment" || string(rec.Headers[1].Value) != "6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70" {
		t.Errorf("headers %+v", rec.Headers)
	}
	if string(rec.RowID) != "6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70" {
		t.Errorf("row id %q", rec.RowID)
	}
	// A relay consumer decodes it with the field types it expects.
	var env struct {
		ID     string         `json:"id_esdeveniment"`
		Tipus  string         `json:"tipus"`
		Versio int            `json:"versio"`
		DataMs int64          `json:"data_ms"`
		Origen string         `json:"origen"`
		Dades  map[string]any `json:"dades"`
	}
	if err := json.Unmarshal(rec.Value, &env); err != nil {
		t.Fatal(err)
	}
	if env.DataMs != time.Date(2026, 9, 10, 7, 33, 20, 123000000, time.UTC).UnixMilli() {
		t.Errorf("data_ms %d is not truncated to the millisecond", env.DataMs)
	}
	var dades map[string]any
	_ = json.Unmarshal([]byte(carrega), &dades)
	if got, _ := json.Marshal(env.Dades); string(got) != mustMarshal(dades) {
		t.Errorf("dades %s differs from carrega", got)
	}
}

func mustMarshal(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestBuildDebeziumColumnsWithoutVersio(t *testing.T) {
	cols := envelope.Columns{ID: "id", AgregatID: "aggregateid", Tipus: "type", Carrega: "payload", CreatEn: "timestamp"}
	r := newRouter(t, "cataleg", []envelope.Route{{Schema: "app", Table: "outboxevent", Topic: "cataleg", Columns: cols}}, 0)
	rel := &pglogrepl.RelationMessage{Namespace: "app", RelationName: "outboxevent"}
	for _, c := range []struct {
		n string
		t uint32
	}{{"id", 2950}, {"aggregatetype", 25}, {"aggregateid", 25}, {"type", 25}, {"payload", 25}, {"timestamp", 1184}} {
		rel.Columns = append(rel.Columns, &pglogrepl.RelationMessageColumn{Name: c.n, DataType: c.t})
	}
	rec, err := build(r, bind(r, rel), tuple(s("a"), s("producte"), s("K-1"), s("producte.creat"), s(`"text\"json"`), s("1970-01-01 00:00:01.0015+00")), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id_esdeveniment":"a","tipus":"producte.creat","versio":1,"data_ms":1001,"origen":"cataleg","dades":"text\"json"}`
	if string(rec.Value) != want {
		t.Errorf("got %s\nwant %s", rec.Value, want)
	}
}

func TestBuildBadRows(t *testing.T) {
	r := newRouter(t, "comandes", []envelope.Route{{Schema: "public", Table: "outbox", Topic: "t", Columns: seedCols}}, 0)
	full := relation("id", "agregat", "agregat_id", "tipus", "versio", "carrega", "creat_en", "publicat_en")
	ok := func() []*string {
		return []*string{s("id-1"), s("comanda"), s("K"), s("comanda.creada"), s("1"), s(`{}`), s("2026-01-01 00:00:00+00"), nil}
	}
	textCarrega := relation("id", "agregat", "agregat_id", "tipus", "versio", "carrega", "creat_en", "publicat_en")
	textCarrega.Columns[5].DataType = 25
	tests := []struct {
		name   string
		rel    *pglogrepl.RelationMessage
		change func(v []*string)
		column string
		reason string
	}{
		{"null agregat_id", full, func(v []*string) { v[2] = nil }, "agregat_id", "NULL"},
		{"null id", full, func(v []*string) { v[0] = nil }, "id", "NULL"},
		{"versio not a number", full, func(v []*string) { v[4] = s("dos") }, "versio", "not an integer"},
		{"versio numeric", full, func(v []*string) { v[4] = s("1.5") }, "versio", "not an integer"},
		{"carrega text not JSON", textCarrega, func(v []*string) { v[5] = s("hola") }, "carrega", "not valid JSON"},
		{"creat_en infinity", full, func(v []*string) { v[6] = s("infinity") }, "creat_en", "infinite"},
		{"tipus column missing", relation("id", "agregat", "agregat_id", "kind", "versio", "carrega", "creat_en"), nil, "tipus", "does not exist"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := ok()
			if tc.change != nil {
				tc.change(v)
			}
			_, err := build(r, bind(r, tc.rel), tuple(v...), nil)
			var re *envelope.RowError
			if !errors.As(err, &re) {
				t.Fatalf("want a RowError, got %v", err)
			}
			if re.Column != tc.column || !strings.Contains(re.Reason, tc.reason) || re.Table != "public.outbox" {
				t.Errorf("got %v", err)
			}
		})
	}
	// A table without a route.
	other := &pglogrepl.RelationMessage{Namespace: "public", RelationName: "comandes"}
	if _, err := build(r, bind(r, other), tuple(), nil); err == nil || !strings.Contains(err.Error(), "no route") {
		t.Errorf("unrouted table: got %v", err)
	}
}

func TestStringEscapingMatchesEncodingJSON(t *testing.T) {
	r := newRouter(t, "comandes", []envelope.Route{{Schema: "public", Table: "outbox", Topic: "t", Columns: seedCols}}, 0)
	b := bind(r, relation("id", "agregat", "agregat_id", "tipus", "versio", "carrega", "creat_en"))
	for _, in := range []string{"plain", `quo"te`, `back\slash`, "new\nline\ttab\rcr", "\x00\x01\x1f", "àèí·l€ 😀", "bad\xffutf8", "sep\u2028\u2029", "<html>&"} {
		rec, err := build(r, b, tuple(s("id"), s("a"), s("K"), s(in), s("1"), s("{}"), s("2026-01-01 00:00:00+00")), nil)
		if err != nil {
			t.Fatal(err)
		}
		var env struct{ Tipus string }
		if err := json.Unmarshal(rec.Value, &env); err != nil {
			t.Fatalf("%q: %v in %s", in, err, rec.Value)
		}
		want := strings.ToValidUTF8(in, "\ufffd")
		if env.Tipus != want {
			t.Errorf("%q round-tripped as %q", in, env.Tipus)
		}
	}
}

// TestBuildWithScratch: a Scratch reused from row to row gives each record
// the value a fresh build gives, and allocates nothing once warm.
func TestBuildWithScratch(t *testing.T) {
	r := newRouter(t, "comandes", []envelope.Route{{Schema: "public", Table: "outbox", Topic: "t", Columns: seedCols}}, 0)
	b := bind(r, relation("id", "agregat", "agregat_id", "tipus", "versio", "carrega", "creat_en", "publicat_en"))
	var sc envelope.Scratch
	rows := [][]envelope.Column{
		tuple(s("6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70"), s("comanda"), s("P-1"), s("comanda.creada"), s("1"), s(`{"a": [1, 2, 3], "b": "llarg llarg llarg"}`), s("2026-09-10 09:33:20.123999+02"), nil),
		tuple(s("7a2d0f3b-1b5c-4d9f-8e2a-3c4d5e6f7081"), s("comanda"), s("P-2"), s(`tipus "amb" cometes`), s("-12"), s(`{}`), s("1969-12-31 23:59:59.9995+00"), nil),
	}
	for round := 0; round < 2; round++ {
		for i, row := range rows {
			want, err := build(r, b, row, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := build(r, b, row, &sc)
			if err != nil {
				t.Fatal(err)
			}
			if string(got.Value) != string(want.Value) || string(got.Key) != string(want.Key) ||
				string(got.Headers[0].Value) != string(want.Headers[0].Value) || string(got.Headers[1].Value) != string(want.Headers[1].Value) {
				t.Errorf("round %d row %d: scratch build %s, fresh %s", round, i, got.Value, want.Value)
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = build(r, b, rows[0], &sc) }); n != 0 {
		t.Errorf("%.1f allocations per warm build, want 0", n)
	}
}

// valueShapes are the record shapes BenchmarkBuild and
// TestWarmBuildsDoNotAllocate build: the contract's envelope (the first:
// and a CloudEvent in each mode.
var valueShapes = []struct {
	name  string
	route envelope.Route
}{
	{"envelope", envelope.Route{Schema: "public", Table: "outbox", Topic: "t", Columns: seedCols}},
	{"cloudevents_binary", envelope.Route{Schema: "public", Table: "outbox", Topic: "t", Columns: seedCols, Value: envelope.ValueCloudEvents}},
	{"cloudevents_structured", envelope.Route{Schema: "public", Table: "outbox", Topic: "t", Columns: seedCols, Value: envelope.ValueCloudEvents,
		CloudEvents: envelope.CloudEvents{Mode: envelope.CEStructured}}},
}

// benchRow is a typical order event.
func benchRow() []envelope.Column {
	return tuple(s("6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70"), s("comanda"), s("P-2026-000123"), s("comanda.creada"), s("1"),
		s(`{"id": "P-2026-000123", "client": "anna", "mercat": "girona", "linies": [{"producte": "formatge-curat", "quantitat": 2, "preu_centims": 1450}, {"producte": "mel-de-romani", "quantitat": 1, "preu_centims": 890}]}`),
		s("2026-09-10 09:33:20.123999+02"), nil)
}

// BenchmarkBuild: ns per row of each shape (BenchmarkBuild/envelope,
// .../cloudevents_binary, .../cloudevents_structured).
func BenchmarkBuild(b *testing.B) {
	for _, shape := range valueShapes {
		bench := func(b *testing.B) {
			r := newRouter(b, "comandes", []envelope.Route{shape.route}, 0)
			bd := bind(r, relation("id", "agregat", "agregat_id", "tipus", "versio", "carrega", "creat_en", "publicat_en"))
			row := benchRow()
			pos := envelope.Position{CommitLSN: 0x16B3748, Index: 3, CommitTime: 1789000000000000}
			var sc envelope.Scratch
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, _, err := r.Build(bd, row, pos, &sc); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.Run(shape.name, bench)
	}
}

// TestWarmBuildsDoNotAllocate: with a warm Scratch, no shape allocates.
func TestWarmBuildsDoNotAllocate(t *testing.T) {
	for _, shape := range valueShapes {
		r := newRouter(t, "comandes", []envelope.Route{shape.route}, 0)
		bd := bind(r, relation("id", "agregat", "agregat_id", "tipus", "versio", "carrega", "creat_en", "publicat_en"))
		row := benchRow()
		pos := envelope.Position{CommitLSN: 0x16B3748, Index: 3}
		var sc envelope.Scratch
		if n := testing.AllocsPerRun(100, func() { _, _, _ = r.Build(bd, row, pos, &sc) }); n != 0 {
			t.Errorf("%q: %.1f allocations per warm build, want 0", shape.name, n)
		}
	}
}

// TestBadRowErrorNamesTheRow: an operator must find the poison row from the
// error alone: its id when it is readable; nothing else the row holds (the
// agregat_id, the bad value) is quoted.
func TestBadRowErrorNamesTheRow(t *testing.T) {
	r := newRouter(t, "comandes", []envelope.Route{{Schema: "public", Table: "outbox", Topic: "t", Columns: seedCols}}, 0)
	rel := relation("id", "agregat", "agregat_id", "tipus", "versio", "carrega", "creat_en")
	rel.Columns[5].DataType = 25 // carrega as text
	b := bind(r, rel)
	_, err := build(r, b, tuple(s("6f1c-bad"), s("comanda"), s("P-9"), s("comanda.creada"), s("1"), s("no és JSON"), s("2026-01-01 00:00:00+00")), nil)
	want := `outbox row id="6f1c-bad" in public.outbox, column "carrega": the value is not valid JSON`
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
	// A NULL agregat_id is not named; the id still is.
	_, err = build(r, b, tuple(s("6f1c-null"), s("comanda"), nil, s("comanda.creada"), s("1"), s("{}"), s("2026-01-01 00:00:00+00")), nil)
	if err == nil || !strings.Contains(err.Error(), `outbox row id="6f1c-null" in public.outbox, column "agregat_id"`) {
		t.Errorf("null key: got %v", err)
	}
}

// TestRecordSizeLimit: the envelope decides whether a row fits the limit,
// by the record's size on the wire; a dead-letter record that would not
// fit keeps the row's size instead of the row.
func TestRecordSizeLimit(t *testing.T) {
	const limit = 2000
	routes := []envelope.Route{{Schema: "public", Table: "outbox", Topic: "t", Columns: seedCols, DeadLetterTopic: "t.dlq"}}
	r := newRouter(t, "comandes", routes, limit)
	b := bind(r, relation("id", "agregat", "agregat_id", "tipus", "versio", "carrega", "creat_en"))
	row := func(n int) []envelope.Column {
		return tuple(s("id-1"), s("comanda"), s("P-1"), s("comanda.creada"), s("1"), s(`"`+strings.Repeat("x", n)+`"`), s("2026-01-01 00:00:00+00"))
	}
	// Find the largest carrega that fits, from the record itself.
	fit := 0
	for n := 1500; n < limit; n++ {
		rec, err := build(r, b, row(n), nil)
		if err != nil {
			break
		}
		if rec.WireSize() > limit {
			t.Fatalf("a %d-byte record passed the %d-byte limit", rec.WireSize(), limit)
		}
		fit = n
	}
	_, err := build(r, b, row(fit+1), nil)
	var re *envelope.RowError
	if !errors.As(err, &re) || !strings.Contains(re.Reason, "over kafka.batch_bytes (2000)") || re.ID != "id-1" {
		t.Fatalf("one byte more: got %v", err)
	}
	dl := r.DeadLetter(b, row(fit+1), err, "0/16B3748", time.Unix(0, 0))
	if dl.Value != nil || dl.WireSize() > limit || header(dl, envelope.HeaderSize) == "" || string(dl.Key) != "P-1" || dl.Topic != "t.dlq" {
		t.Errorf("too large a dead letter: value %d bytes, size header %q", len(dl.Value), header(dl, envelope.HeaderSize))
	}
	small := r.DeadLetter(b, row(10), errors.New("x"), "0/1", time.Unix(0, 0))
	if !json.Valid(small.Value) || header(small, envelope.HeaderSize) != "" || header(small, envelope.HeaderID) != "id-1" {
		t.Errorf("small dead letter: %s", small.Value)
	}
}

func TestDeadLetterRefused(t *testing.T) {
	routes := []envelope.Route{{Schema: "public", Table: "outbox", Topic: "t", Columns: seedCols, DeadLetterTopic: "t.dlq"}}
	r := newRouter(t, "comandes", routes, 0)
	b := bind(r, relation("id", "agregat", "agregat_id", "tipus", "versio", "carrega", "creat_en"))
	refused := &outboxd.RefusedError{Topic: "t", Key: []byte("P-7"), Size: 150000, Err: errors.New("[10] Message Size Too Large"),
		Headers: []outboxd.Header{{Key: envelope.HeaderTipus, Value: []byte("comanda.creada")}, {Key: envelope.HeaderID, Value: []byte("id-7")}, {Key: "x", Value: []byte("y")}}}
	dl := r.DeadLetterRefused(b, refused, "0/16B3748", time.Unix(0, 0))
	if dl.Topic != "t.dlq" || string(dl.Key) != "P-7" || dl.Value != nil || header(dl, envelope.HeaderID) != "id-7" || header(dl, envelope.HeaderTipus) != "comanda.creada" ||
		header(dl, envelope.HeaderSize) != "150000" || header(dl, envelope.HeaderLSN) != "0/16B3748" || !strings.Contains(header(dl, envelope.HeaderError), "Message Size Too Large") || header(dl, "x") != "" {
		t.Errorf("dead letter of a refused record: %+v", dl)
	}
}

func header(r outboxd.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func newRouter(t testing.TB, origen string, routes []envelope.Route, maxBytes int) *envelope.Router {
	t.Helper()
	r, err := envelope.NewRouter(origen, routes, maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// bind is the binding of the relation's first route.
func bind(r *envelope.Router, rel *pglogrepl.RelationMessage) *envelope.Binding {
	return r.Bind(rel)[0]
}

// build is Build for a change published by its route, at no position.
func build(r *envelope.Router, b *envelope.Binding, row []envelope.Column, sc *envelope.Scratch) (outboxd.Record, error) {
	rec, verdict, err := r.Build(b, row, envelope.Position{}, sc)
	if err == nil && verdict != envelope.Publish {
		return rec, fmt.Errorf("verdict %d, want Publish", verdict)
	}
	return rec, err
}
