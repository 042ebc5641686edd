package envelope_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/envelope"
)

// col is a column of a test relation: its name and type OID.
type col struct {
	name string
	oid  uint32
}

// table is a Relation message for schema.name with cols.
func table(schema, name string, cols ...col) *pglogrepl.RelationMessage {
	rel := &pglogrepl.RelationMessage{RelationID: 16500, Namespace: schema, RelationName: name}
	for _, c := range cols {
		rel.Columns = append(rel.Columns, &pglogrepl.RelationMessageColumn{Name: c.name, DataType: c.oid})
	}
	return rel
}

// The seed's outbox table, with more columns for the routing tests.
var richCols = []col{{"id", 2950}, {"agregat", 25}, {"agregat_id", 25}, {"tipus", 25}, {"versio", 23}, {"carrega", 3802},
	{"creat_en", 1184}, {"mercat", 25}, {"urgent", 16}, {"import", 20}, {"meta", 3802}, {"traceparent", 25}, {"tracestate", 25}}

// richRow is a row of richCols; set replaces values by column name.
func richRow(set map[string]*string) []envelope.Column {
	vals := map[string]*string{"id": s("6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70"), "agregat": s("comanda"), "agregat_id": s("P-1"), "tipus": s("comanda.creada"),
		"versio": s("2"), "carrega": s(`{"a": 1}`), "creat_en": s("2026-09-10 09:33:20.123999+02"), "mercat": s("girona"), "urgent": s("t"),
		"import": s("2900"), "meta": s(`{"canal": "web"}`), "traceparent": s("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), "tracestate": s("congo=t61rcWkgMzE")}
	for k, v := range set {
		vals[k] = v
	}
	var out []*string
	for _, c := range richCols {
		out = append(out, vals[c.name])
	}
	return tuple(out...)
}

func richTable() *pglogrepl.RelationMessage { return table("public", "outbox", richCols...) }

func km0Route(topic string) envelope.Route {
	return envelope.Route{Schema: "public", Table: "outbox", Topic: topic, Columns: seedCols}
}

// publish builds row for every route of the relation and returns the
// records made, failing on an error.
func publish(t *testing.T, r *envelope.Router, rel *pglogrepl.RelationMessage, row []envelope.Column) []outboxd.Record {
	t.Helper()
	var out []outboxd.Record
	for _, b := range r.Bind(rel) {
		rec, verdict, err := r.Build(b, row, envelope.Position{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if verdict == envelope.Publish {
			out = append(out, rec)
		}
	}
	return out
}

func headers(r outboxd.Record) map[string]string {
	m := map[string]string{}
	for _, h := range r.Headers {
		m[h.Key] = string(h.Value)
	}
	return m
}

func TestTopicTemplate(t *testing.T) {
	rt := km0Route("{agregat}.{mercat}.esdeveniments")
	rt.TopicFallback = "comandes.altres"
	r := newRouter(t, "comandes", []envelope.Route{rt}, 0)
	for _, tc := range []struct {
		agregat, mercat *string
		topic           string
	}{
		{s("comanda"), s("girona"), "comanda.girona.esdeveniments"},
		{s("pagament"), s("vic"), "pagament.vic.esdeveniments"},
		{s("comanda"), s("girona"), "comanda.girona.esdeveniments"}, // from the cache
		{s("comanda"), s("la bisbal"), "comandes.altres"},           // a space: invalid
		{s("comanda"), nil, "comandes.altres"},                      // NULL
		{s(strings.Repeat("x", 240)), s("girona"), "comandes.altres"},
	} {
		recs := publish(t, r, richTable(), richRow(map[string]*string{"agregat": tc.agregat, "mercat": tc.mercat}))
		if len(recs) != 1 || recs[0].Topic != tc.topic {
			t.Errorf("agregat %v mercat %v: topic %q, want %q", tc.agregat, tc.mercat, recs[0].Topic, tc.topic)
		}
	}
	// Without a fallback an invalid name is a bad row, named.
	r = newRouter(t, "comandes", []envelope.Route{km0Route("{agregat}.esdeveniments")}, 0)
	b := r.Bind(richTable())[0]
	_, _, err := r.Build(b, richRow(map[string]*string{"agregat": s("comanda/x")}), envelope.Position{}, nil)
	var re *envelope.RowError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "the topic template gives a name that is not a valid Kafka topic name") ||
		strings.Contains(err.Error(), "comanda/x") || re.ID == "" {
		t.Errorf("invalid rendered topic: %v", err)
	}
}

func TestParseTemplate(t *testing.T) {
	for _, ok := range []string{"a", "outbox.event.{aggregatetype}", "{a}{b}", "{Mixed Case}.x"} {
		if _, err := envelope.ParseTemplate(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for in, want := range map[string]string{
		"":                               "empty",
		"a b":                            "not a valid Kafka topic name",
		"{agregat":                       "without its '}'",
		"agregat}":                       "without its '{'",
		"{}":                             "must name a column",
		"comandes/{agregat}":             `'/' can never be part`,
		strings.Repeat("x", 249) + "{a}": "literal parts alone",
	} {
		if _, err := envelope.ParseTemplate(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", in, err, want)
		}
	}
}

// TestFilterAndOverrides: a second route of the table takes the rows its
// filter matches; overrides send a value elsewhere or drop it, on purpose.
func TestFilterAndOverrides(t *testing.T) {
	main := km0Route("comandes")
	main.Overrides = []envelope.Override{
		{When: []envelope.Condition{{Column: "tipus", Values: []string{"comanda.prova", "comanda.esborrany"}}}, Drop: true},
		{When: []envelope.Condition{{Column: "tipus", Values: []string{"comanda.cancellada"}}, {Column: "mercat", Values: []string{"vic"}}}, Topic: "incidencies.{mercat}"},
	}
	second := km0Route("analitica.comandes")
	second.Filter = []envelope.Condition{{Column: "tipus", Values: []string{"comanda.creada", "comanda.cancellada"}}}
	r := newRouter(t, "comandes", []envelope.Route{main, second}, 0)
	for _, tc := range []struct {
		tipus, mercat string
		topics        []string
	}{
		{"comanda.creada", "girona", []string{"comandes", "analitica.comandes"}},
		{"comanda.pagada", "girona", []string{"comandes"}},
		{"comanda.prova", "girona", nil},
		{"comanda.cancellada", "vic", []string{"incidencies.vic", "analitica.comandes"}},
		{"comanda.cancellada", "girona", []string{"comandes", "analitica.comandes"}},
	} {
		var got []string
		for _, rec := range publish(t, r, richTable(), richRow(map[string]*string{"tipus": s(tc.tipus), "mercat": s(tc.mercat)})) {
			got = append(got, rec.Topic)
		}
		if strings.Join(got, ",") != strings.Join(tc.topics, ",") {
			t.Errorf("%s/%s: topics %v, want %v", tc.tipus, tc.mercat, got, tc.topics)
		}
	}
	// The verdicts say why no record came.
	bs := r.Bind(richTable())
	if _, v, err := r.Build(bs[0], richRow(map[string]*string{"tipus": s("comanda.prova")}), envelope.Position{}, nil); v != envelope.Dropped || err != nil {
		t.Errorf("dropped: verdict %d, %v", v, err)
	}
	if _, v, err := r.Build(bs[1], richRow(map[string]*string{"tipus": s("comanda.pagada")}), envelope.Position{}, nil); v != envelope.Filtered || err != nil {
		t.Errorf("filtered: verdict %d, %v", v, err)
	}
	// NULL matches nothing; a filter column that does not exist is a bad row.
	if recs := publish(t, r, richTable(), richRow(map[string]*string{"tipus": s("comanda.creada"), "mercat": nil})); len(recs) != 2 {
		t.Errorf("NULL mercat: %d records", len(recs))
	}
	second.Filter = []envelope.Condition{{Column: "tipo", Values: []string{"x"}}}
	r = newRouter(t, "comandes", []envelope.Route{main, second}, 0)
	if _, _, err := r.Build(r.Bind(richTable())[1], richRow(nil), envelope.Position{}, nil); err == nil || !strings.Contains(err.Error(), `column "tipo": the column does not exist`) {
		t.Errorf("filter on a missing column: %v", err)
	}
}

// TestFieldsPlacement: extra columns into headers (text; booleans as
// true/false) and into the envelope (integers and booleans as such, JSON
// embedded, text as strings, NULL as null).
func TestFieldsPlacement(t *testing.T) {
	rt := km0Route("t")
	rt.Fields = []envelope.Field{{Column: "agregat", Header: "agregat"}, {Column: "urgent", Header: "urgent"}, {Column: "mercat", Envelope: "mercat"},
		{Column: "import", Envelope: "import_centims"}, {Column: "urgent", Envelope: "urgent"}, {Column: "meta", Envelope: "meta"}, {Column: "tracestate", Envelope: "buit"}}
	r := newRouter(t, "comandes", []envelope.Route{rt}, 0)
	rec := publish(t, r, richTable(), richRow(map[string]*string{"tracestate": nil}))[0]
	want := `{"id_esdeveniment":"6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70","tipus":"comanda.creada","versio":2,"data_ms":1789025600123,"origen":"comandes","dades":{"a": 1},"mercat":"girona","import_centims":2900,"urgent":true,"meta":{"canal": "web"},"buit":null}`
	if string(rec.Value) != want {
		t.Errorf("value\n got %s\nwant %s", rec.Value, want)
	}
	if h := headers(rec); h["agregat"] != "comanda" || h["urgent"] != "true" || h["tipus"] != "comanda.creada" || len(rec.Headers) != 4 {
		t.Errorf("headers %v", h)
	}
}

// TestRawPayload: value: payload is the payload column alone, the id and
// the type in the km0 headers.
func TestRawPayload(t *testing.T) {
	rt := km0Route("t")
	rt.Value = envelope.ValuePayload
	r := newRouter(t, "comandes", []envelope.Route{rt}, 0)
	rec := publish(t, r, richTable(), richRow(nil))[0]
	if string(rec.Value) != `{"a": 1}` || string(rec.Key) != "P-1" || headers(rec)["id_esdeveniment"] != "6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70" || headers(rec)["tipus"] != "comanda.creada" {
		t.Errorf("raw record: key %s value %s headers %v", rec.Key, rec.Value, headers(rec))
	}
	// The km0 preset keeps every mapped value required.
	if _, _, err := r.Build(r.Bind(richTable())[0], richRow(map[string]*string{"carrega": nil}), envelope.Position{}, nil); err == nil {
		t.Error("a NULL carrega passed in the km0 preset")
	}
}

// TestTraceContext: a traceparent column (with tracestate) or Debezium's
// span context (java.util.Properties) becomes the traceparent header; an
// invalid one is left out, as W3C tells receivers to.
func TestTraceContext(t *testing.T) {
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	rt := km0Route("t")
	rt.Trace = envelope.Trace{Traceparent: "traceparent", Tracestate: "tracestate"}
	r := newRouter(t, "comandes", []envelope.Route{rt}, 0)
	h := headers(publish(t, r, richTable(), richRow(nil))[0])
	if h["traceparent"] != tp || h["tracestate"] != "congo=t61rcWkgMzE" {
		t.Errorf("headers %v", h)
	}
	for _, bad := range []string{"", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331", "00-00000000000000000000000000000000-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", tp + "-x"} {
		h := headers(publish(t, r, richTable(), richRow(map[string]*string{"traceparent": s(bad)}))[0])
		if _, ok := h["traceparent"]; ok {
			t.Errorf("%q: passed as a traceparent", bad)
		}
		if _, ok := h["tracestate"]; ok {
			t.Errorf("%q: a tracestate without its traceparent", bad)
		}
	}
	// A later version may be longer.
	if h := headers(publish(t, r, richTable(), richRow(map[string]*string{"traceparent": s("01" + tp[2:] + "-what-comes")}))[0]); h["traceparent"] == "" {
		t.Error("a version 01 traceparent with more fields was dropped")
	}
	// Debezium's tracingspancontext, as Properties.store writes it.
	props := "#Tue Sep 10 09:33:20 CEST 2026\r\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rcWkgMzE\r\ntraceparent=" + tp + "\r\n"
	cols := append(append([]col{}, richCols...), col{"tracingspancontext", 25})
	rt.Trace = envelope.Trace{SpanContext: "tracingspancontext"}
	r = newRouter(t, "comandes", []envelope.Route{rt}, 0)
	row := append(richRow(nil), tuple(s(props))...)
	h = headers(publish(t, r, table("public", "outbox", cols...), row)[0])
	if h["traceparent"] != tp || h["tracestate"] != "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE" {
		t.Errorf("span context headers %v", h)
	}
}

func TestPositionHeaders(t *testing.T) {
	rt := km0Route("t")
	rt.Position = true
	r := newRouter(t, "comandes", []envelope.Route{rt}, 0)
	var sc envelope.Scratch
	rec, _, err := r.Build(r.Bind(richTable())[0], richRow(nil), envelope.Position{CommitLSN: 0x16B3748, Index: 7}, &sc)
	if err != nil {
		t.Fatal(err)
	}
	if h := headers(rec); h["outboxd.commit_lsn"] != "23803720" || h["outboxd.txn_index"] != "7" {
		t.Errorf("headers %v", h)
	}
}

// TestRecordTimestamp: the timestamp column becomes the record's time, in
// ms: timestamptz, timestamp without time zone (UTC), bigint ms; NULL
// leaves the produce time.
func TestRecordTimestamp(t *testing.T) {
	for _, tc := range []struct {
		oid  uint32
		in   *string
		want int64
	}{
		{1184, s("2019-05-03 13:31:34.484651+00"), 1556890294484},
		{1114, s("2019-05-03 13:31:34.484651"), 1556890294484},
		{20, s("1556890294344"), 1556890294344},
		{1184, nil, 0},
	} {
		rt := km0Route("t")
		rt.Timestamp = "moment"
		r := newRouter(t, "comandes", []envelope.Route{rt}, 0)
		cols := append(append([]col{}, richCols...), col{"moment", tc.oid})
		recs := publish(t, r, table("public", "outbox", cols...), append(richRow(nil), tuple(tc.in)...))
		if recs[0].Time != tc.want {
			t.Errorf("%d %v: time %d, want %d", tc.oid, tc.in, recs[0].Time, tc.want)
		}
	}
}

// TestLogicalMessage: a message's JSON members play the columns; data_ms
// is the commit time unless a member is mapped; a bad message is a bad row
// named as a message.
func TestLogicalMessage(t *testing.T) {
	msgCols := envelope.Columns{ID: "id_esdeveniment", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "dades"}
	rt := envelope.Route{Prefix: "comandes", Topic: "{agregat}.esdeveniments", Columns: msgCols, Position: true,
		Fields: []envelope.Field{{Column: "canal", Header: "canal"}, {Column: "canal", Envelope: "canal"}}, DeadLetterTopic: "dlq"}
	r := newRouter(t, "comandes", []envelope.Route{rt}, 0)
	bs := r.BindMessage([]byte("comandes"))
	if len(bs) != 1 || len(r.BindMessage([]byte("altres"))) != 0 {
		t.Fatalf("bindings: %d", len(bs))
	}
	commit := time.Date(2026, 9, 10, 7, 33, 20, 123999000, time.UTC)
	pos := envelope.Position{CommitLSN: 100, Index: 3, CommitTime: commit.UnixMicro()}
	content := `{"id_esdeveniment": "e-1", "agregat": "comanda", "agregat_id": "P-\u00e01", "tipus": "comanda.creada",
		"dades": {"linies": [1, {"x": "}"}]}, "canal": "web", "\u0063anal2": 1}`
	var sc envelope.Scratch
	rec, _, err := r.Build(bs[0], tuple(s(content)), pos, &sc)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id_esdeveniment":"e-1","tipus":"comanda.creada","versio":1,"data_ms":1789025600123,"origen":"comandes","dades":{"linies": [1, {"x": "}"}]},"canal":"web"}`
	if rec.Topic != "comanda.esdeveniments" || string(rec.Key) != "P-à1" || string(rec.Value) != want {
		t.Errorf("record: topic %s key %q value\n got %s\nwant %s", rec.Topic, rec.Key, rec.Value, want)
	}
	if h := headers(rec); h["canal"] != "web" || h["outboxd.txn_index"] != "3" || h["id_esdeveniment"] != "e-1" {
		t.Errorf("headers %v", h)
	}
	if rec.RowID != nil {
		t.Errorf("a message has no row to mark, yet row id %q", rec.RowID)
	}
	for in, reason := range map[string]string{
		`[1, 2]`:                  "not a JSON object",
		`{"id_esdeveniment": "e"`: "not a JSON object",
		`{"id_esdeveniment": "e-2", "agregat": "comanda", "tipus": "t", "dades": {}}`:                                   `member "agregat_id": the message has no such member`,
		`{"id_esdeveniment": "e-3", "agregat": "comanda", "agregat_id": "K", "tipus": "t", "dades": {}, "versio": "u"}`: `member "versio": not an integer`,
	} {
		_, _, err := r.Build(bs[0], tuple(s(in)), pos, &sc)
		var re *envelope.RowError
		if !errors.As(err, &re) || !re.Message || !strings.Contains(err.Error(), reason) || !strings.HasPrefix(err.Error(), "logical message") {
			t.Errorf("%s: got %v, want %q", in, err, reason)
			continue
		}
		dl := r.DeadLetter(bs[0], tuple(s(in)), err, "0/64", time.Unix(0, 0))
		var v map[string]string
		if json.Unmarshal(dl.Value, &v) != nil || v["content"] != in || dl.Topic != "dlq" || header(dl, envelope.HeaderTable) != `message prefix "comandes"` {
			t.Errorf("dead letter of %s: %s %v", in, dl.Value, dl.Headers)
		}
	}
}

// TestBuildAllocatesNothingInAnyMode: the hot path stays allocation-free
// whatever the route asks for.
func TestBuildAllocatesNothingInAnyMode(t *testing.T) {
	cols := append(append([]col{}, richCols...), col{"tracingspancontext", 25}, col{"moment", 1184}, col{"bin", 17})
	rel := table("public", "outbox", cols...)
	row := append(richRow(nil), tuple(s("#c\ntraceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\ntracestate=a\\=1\n"), s("2026-01-01 00:00:00+00"), s(`\x0a0b`))...)
	rich := km0Route("{agregat}.{mercat}")
	rich.Filter = []envelope.Condition{{Column: "mercat", Values: []string{"girona"}}}
	rich.Overrides = []envelope.Override{{When: []envelope.Condition{{Column: "tipus", Values: []string{"x"}}}, Drop: true}}
	rich.Fields = []envelope.Field{{Column: "agregat", Header: "agregat"}, {Column: "urgent", Header: "urgent"}, {Column: "meta", Envelope: "meta"}, {Column: "import", Envelope: "import"}}
	rich.Trace = envelope.Trace{Traceparent: "traceparent", Tracestate: "tracestate"}
	rich.Position, rich.Timestamp = true, "moment"
	debezium := envelope.Route{Schema: "public", Table: "outbox", Preset: envelope.PresetDebezium, Value: envelope.ValuePayload, Topic: "outbox.event.{agregat}",
		Columns: envelope.Columns{ID: "id", AgregatID: "agregat_id", Tipus: "tipus", Carrega: "carrega"}, KeyJSON: true, ValueJSON: true,
		Trace: envelope.Trace{SpanContext: "tracingspancontext"}, Fields: []envelope.Field{{Column: "tipus", Envelope: "type"}}}
	binary := debezium
	binary.Columns.Carrega, binary.Fields, binary.ValueJSON = "bin", nil, false
	raw := km0Route("t")
	raw.Value = envelope.ValuePayload
	for name, rt := range map[string]envelope.Route{"template, filter, override, fields, trace, position, timestamp": rich,
		"debezium json converters, envelope field, span context": debezium, "bytea payload": binary, "raw": raw} {
		r := newRouter(t, "comandes", []envelope.Route{rt}, 0)
		b := r.Bind(rel)[0]
		var sc envelope.Scratch
		pos := envelope.Position{CommitLSN: 1 << 40, Index: 12}
		if _, v, err := r.Build(b, row, pos, &sc); err != nil || v != envelope.Publish {
			t.Fatalf("%s: %v %d", name, err, v)
		}
		if n := testing.AllocsPerRun(100, func() { _, _, _ = r.Build(b, row, pos, &sc) }); n != 0 {
			t.Errorf("%s: %.1f allocations per warm build, want 0", name, n)
		}
	}
	msg := envelope.Route{Prefix: "p", Topic: "{tipus}", Columns: envelope.Columns{ID: "id_esdeveniment", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "dades"}, Position: true}
	r := newRouter(t, "comandes", []envelope.Route{msg}, 0)
	b := r.BindMessage([]byte("p"))[0]
	content := tuple(s(`{"id_esdeveniment": "e-1", "agregat_id": "P-1", "tipus": "comanda.creada", "versio": 2, "dades": {"a": "\u00e0"}}`))
	var sc envelope.Scratch
	if _, _, err := r.Build(b, content, envelope.Position{}, &sc); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _, _ = r.Build(b, content, envelope.Position{}, &sc) }); n != 0 {
		t.Errorf("logical message: %.1f allocations per warm build, want 0", n)
	}
}

// TestNewRouterRefusesProblems: the router compiles only what
// Route.Problems passes, the one judgement of a route's shape (config
// reports the same problems with their lines).
func TestNewRouterRefusesProblems(t *testing.T) {
	noCreatEn := km0Route("t")
	noCreatEn.Columns.CreatEn = ""
	jsonEnvelope := km0Route("t")
	jsonEnvelope.ValueJSON = true
	for want, rt := range map[string]envelope.Route{
		`route 0: topic: "{agregat": a '{' without its '}'`:                                                                          km0Route("{agregat"),
		"route 0: columns.creat_en: column name must not be empty":                                                                   noCreatEn,
		"route 0: value_converter: json writes the payload as a JSON string: it needs value: payload (the envelope is JSON already)": jsonEnvelope,
	} {
		if _, err := envelope.NewRouter("comandes", []envelope.Route{rt}, 0); err == nil || err.Error() != want {
			t.Errorf("NewRouter: %v, want %q", err, want)
		}
		if ps := rt.Problems(); len(ps) != 1 || "route 0: "+ps[0].String() != want {
			t.Errorf("Problems: %v, want the one problem of %q", ps, want)
		}
	}
	msg := envelope.Route{Prefix: "p", Topic: "t", Columns: envelope.MessageColumns()}
	if ps := msg.Problems(); len(ps) != 0 {
		t.Errorf("a message route needs no creat_en: %v", ps)
	}
}
