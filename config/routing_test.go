package config_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/envelope"
)

// head is minimal without its route: 8 lines, ending with "routes:".
var head = minimal[:strings.Index(minimal, "  - table")]

func TestQuotedTableNames(t *testing.T) {
	for in, want := range map[string][2]string{
		`'"Vendes"."Outbox.Events"'`: {"Vendes", "Outbox.Events"},
		`'vendes."Outbox"'`:          {"vendes", "Outbox"},
		`'"we""ird".t_1$'`:           {`we"ird`, "t_1$"},
		`'"public".outbox'`:          {"public", "outbox"},
	} {
		cfg := mustParse(t, head+"  - table: "+in+"\n    topic: t\n", nil)
		if got := [2]string{cfg.Routes[0].Schema, cfg.Routes[0].Name}; got != want {
			t.Errorf("%s: schema, name = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		`'"Vendes.Outbox'`:                  `has a quoted name without its closing quote`,
		`'"".outbox'`:                       `has an empty quoted name`,
		`Vendes.outbox`:                     `has Vendes unquoted, which SQL reads as vendes: quote a name with capitals ("Vendes")`,
		`'"Vendes"."Outbox"x'`:              `has "x" after the table name`,
		`'public.out-box'`:                  `has out-box unquoted: quote a name with such characters`,
		`'"Vendes"'`:                        `must be schema.table`,
		"public." + strings.Repeat("t", 64): "longer than 63 bytes",
	} {
		_, err := config.Parse([]byte(head+"  - table: "+in+"\n    topic: t\n"), env(nil), nil)
		assertErr(t, err, "line 9: routes[0].table: ", want)
	}
}

func TestRoutingValidation(t *testing.T) {
	route := "  - table: public.outbox\n    topic: comandes\n"
	tests := []struct {
		name    string
		routes  string
		wantErr []string
	}{
		{"a table whose routes all filter", "  - table: public.outbox\n    topic: a\n    filter: {tipus: x}\n",
			[]string{"line 11: routes[0].filter: every route of public.outbox has a filter, so a change that matches none would be lost"}},
		{"a message prefix whose routes all filter", "  - message: comandes\n    topic: a\n    filter: {tipus: x}\n",
			[]string{`line 11: routes[0].filter: every route of message prefix "comandes" has a filter`}},
		{"a second unfiltered route", route + "  - table: public.outbox\n    topic: other\n",
			[]string{`line 11: routes[1].table: "public.outbox" is already routed by routes[0] (another route of the same source needs a filter`}},
		{"a null in a filter", route + "  - table: public.outbox\n    topic: b\n    filter: {tipus: [a, null]}\n",
			[]string{"line 13: routes[1].filter.tipus: null never matches"}},
		{"a filter that is a list", route + "  - table: public.outbox\n    topic: b\n    filter: [tipus]\n",
			[]string{"line 13: routes[1].filter: expected a mapping of column names"}},
		{"a filter with no value", route + "  - table: public.outbox\n    topic: b\n    filter: {tipus: []}\n",
			[]string{"line 13: routes[1].filter.tipus: no value to match"}},
		{"conflicting overrides", route + "    overrides:\n      - when: {tipus: [a, b]}\n        drop: true\n      - when: {tipus: b}\n        topic: x\n",
			[]string{`line 14: routes[0].overrides[1].when: conflicts with overrides[0]: both match tipus = "b"`}},
		{"overrides on more columns do not conflict on one", route + "    overrides:\n      - when: {tipus: a}\n        drop: true\n      - when: {tipus: a, mercat: vic}\n        topic: x\n",
			nil},
		{"an override dropping and routing", route + "    overrides:\n      - when: {tipus: a}\n        drop: true\n        topic: x\n",
			[]string{"line 13: routes[0].overrides[0].drop: true together with a topic"}},
		{"an override doing nothing", route + "    overrides:\n      - when: {tipus: a}\n",
			[]string{"line 12: routes[0].overrides[0]: a topic, or drop: true"}},
		{"an override without when", route + "    overrides:\n      - drop: true\n",
			[]string{"line 12: routes[0].overrides[0].when: required"}},
		{"a template with a slash", "  - table: public.outbox\n    topic: \"{agregat}/x\"\n",
			[]string{`line 10: routes[0].topic: "{agregat}/x": '/' can never be part of a Kafka topic name`}},
		{"an unclosed placeholder", "  - table: public.outbox\n    topic: \"{agregat.x\"\n",
			[]string{`line 10: routes[0].topic: "{agregat.x": a '{' without its '}'`}},
		{"a fallback without a template", route + "    topic_fallback: altres\n",
			[]string{"line 11: routes[0].topic_fallback: set, but no topic is a template"}},
		{"a fallback for an override's template", route + "    topic_fallback: altres\n    overrides: [{when: {tipus: a}, topic: \"x.{mercat}\"}]\n", nil},
		{"an invalid fallback", "  - table: public.outbox\n    topic: \"{agregat}\"\n    topic_fallback: \"a b\"\n",
			[]string{`line 11: routes[0].topic_fallback: "a b" is not a valid Kafka topic name`}},
		{"an unknown value shape", route + "    value: raw\n", []string{`line 11: routes[0].value: "raw" is not one of envelope, payload`}},
		{"json value converter with the envelope", route + "    value_converter: json\n", []string{"line 11: routes[0].value_converter: json writes the payload as a JSON string: it needs value: payload"}},
		{"an unknown converter", route + "    key_converter: avro\n", []string{`line 11: routes[0].key_converter: "avro" is not one of string, json`}},
		{"a field with both places", route + "    fields: [{column: a, header: a, envelope: a}]\n", []string{"line 11: routes[0].fields[0]: one of header: NAME or envelope: NAME"}},
		{"a field over a standard header", route + "    fields: [{column: agregat, header: tipus}]\n", []string{`routes[0].fields[0].header: "tipus" is already a header of the record`}},
		{"a field over an envelope member", route + "    fields: [{column: agregat, envelope: dades}]\n", []string{`routes[0].fields[0].envelope: "dades" is already a member of the value`}},
		{"a field on the stream header (issue 32)", route + "    fields:\n      - column: agregat\n        header: outboxd.stream\n",
			[]string{`line 13: routes[0].fields[0].header: "outboxd.stream": headers named outboxd.... are outboxd's own`}},
		{"a field on a reserved header in capitals", route + "    fields: [{column: a, header: x}, {column: agregat, header: OUTBOXD.Stream}]\n",
			[]string{`line 11: routes[0].fields[1].header: "OUTBOXD.Stream": headers named outboxd.... are outboxd's own`}},
		{"a field on a header that only contains outboxd.", route + "    fields: [{column: agregat, header: x.outboxd.stream}]\n", nil},
		{"two fields with one header name", route + "    fields: [{column: a, header: x}, {column: b, header: x}]\n", []string{`routes[0].fields[1].header: "x" is already a header`}},
		{"both trace forms", route + "    trace: {traceparent: tp, span_context: sc}\n", []string{"line 11: routes[0].trace.span_context: either span_context"}},
		{"a tracestate alone", route + "    trace: {tracestate: ts}\n", []string{"routes[0].trace.tracestate: needs trace.traceparent"}},
		{"a table and a message", "  - table: public.outbox\n    message: comandes\n    topic: t\n", []string{"line 10: routes[0].message: a route has a table or a message prefix, not both"}},
		{"neither", "  - topic: t\n", []string{"routes[0].table: required (schema.table, e.g. public.outbox; or message: a logical message prefix)"}},
		{"debezium for a message", "  - message: comandes\n    topic: t\n    preset: debezium\n", []string{"line 11: routes[0].preset: debezium is a table's preset"}},
		{"an unknown preset", route + "    preset: sequin\n", []string{`line 11: routes[0].preset: "sequin" is not one of debezium`}},
		{"no creat_en for the envelope", route + "    columns: {creat_en: \"-\"}\n", []string{`routes[0].columns.creat_en: "-" (no such column) is allowed only for versio`}},
		{"no creat_en for a payload", route + "    value: payload\n    columns: {creat_en: \"-\"}\n", nil},
		{"a message route", "  - message: comandes\n    topic: \"{tipus}\"\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Parse([]byte(head+tt.routes), env(nil), nil)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("valid routes refused: %v", err)
				}
				return
			}
			assertErr(t, err, tt.wantErr...)
		})
	}
}

// TestPresetDefaults: a preset fills what its route leaves out, and only
// that.
func TestPresetDefaults(t *testing.T) {
	cfg := mustParse(t, head+`  - table: inventory.outboxevent
    preset: debezium
  - table: inventory.outbox2
    preset: debezium
    topic: "{type}.events"
    columns: {agregat_id: aggregate_id}
    trace: {traceparent: tp}
    value: envelope
  - message: comandes
    topic: comandes.esdeveniments
    columns: {carrega: payload}
`, nil)
	want := config.Route{Table: "inventory.outboxevent", Schema: "inventory", Name: "outboxevent", Preset: "debezium", Topic: "outbox.event.{aggregatetype}",
		Columns: config.Columns(envelope.DebeziumColumns()), Value: "payload", Trace: config.Trace{SpanContext: "tracingspancontext", Optional: true}, OnError: "stop"}
	if !reflect.DeepEqual(cfg.Routes[0], want) {
		t.Errorf("debezium route\n got %+v\nwant %+v", cfg.Routes[0], want)
	}
	cols := config.Columns(envelope.DebeziumColumns())
	cols.AgregatID = "aggregate_id"
	want = config.Route{Table: "inventory.outbox2", Schema: "inventory", Name: "outbox2", Preset: "debezium", Topic: "{type}.events",
		Columns: cols, Value: "envelope", Trace: config.Trace{Traceparent: "tp"}, OnError: "stop"}
	if !reflect.DeepEqual(cfg.Routes[1], want) {
		t.Errorf("debezium route with keys\n got %+v\nwant %+v", cfg.Routes[1], want)
	}
	msgCols := config.Columns(envelope.MessageColumns())
	msgCols.Carrega = "payload"
	if got := cfg.Routes[2]; got.Columns != msgCols || got.Message != "comandes" {
		t.Errorf("message route %+v", got)
	}
}

// TestRoutingPublication: each table once, with every column its routes
// read and the line of the key that reads it.
func TestRoutingPublication(t *testing.T) {
	cfg := mustParse(t, head+`  - table: public.outbox
    topic: "{agregat}.esdeveniments"
  - table: public.outbox
    topic: analitica
    filter: {mercat: girona}
    fields: [{column: client, header: client}]
  - message: comandes
    topic: t
`, nil)
	routing := cfg.Routing()
	got := routing.Publication()
	if len(got) != 1 || got[0].Table != (catalog.Table{Schema: "public", Name: "outbox"}) {
		t.Fatalf("publication %+v", got)
	}
	if tables := routing.Tables(); len(tables) != 1 || tables[0].Table != got[0].Table || tables[0].Route != &routing.Routes[0] {
		t.Fatalf("tables %+v: want public.outbox by routes[0], and no table for the message route", tables)
	}
	if s := routing.Sources; len(s) != 2 || !reflect.DeepEqual(s[0].Routes, []int{0, 1}) || s[1].Prefix != "comandes" {
		t.Fatalf("sources %+v: want public.outbox with routes 0 and 1, then the message prefix", s)
	}
	for _, c := range []string{"id", "agregat_id", "tipus", "versio", "carrega", "creat_en", "agregat", "mercat", "client"} {
		if !strings.Contains(strings.Join(got[0].Columns, ","), c) {
			t.Errorf("column %s missing from %v", c, got[0].Columns)
		}
	}
	keys := map[string]string{}
	for _, r := range got[0].Refs {
		keys[r.Column] = r.Key
	}
	if keys["mercat"] != "line 13: routes[1].filter.mercat" || keys["agregat"] != "line 10: routes[0].topic" || keys["client"] != "line 14: routes[1].fields[0].column" {
		t.Errorf("refs %v", keys)
	}
}
