package config_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/config"
)

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name    string
		yml     string
		wantErr []string
	}{
		{"unknown key at top level", minimal + "kafak:\n  brokers: [\"b:9092\"]\n",
			[]string{`line 11: unknown key "kafak"`}},
		{"unknown key nested", strings.Replace(minimal, "  slot:", "  slott: x\n  slot:", 1),
			[]string{`line 4: unknown key "slott" in postgres`}},
		{"unknown key in a route", minimal + "    colums: {}\n",
			[]string{`line 11: unknown key "colums" in routes[0]`}},
		{"unknown key in columns", minimal + "    columns:\n      id: id\n      payload: x\n",
			[]string{`line 13: unknown key "payload" in routes[0].columns`}},
		{"derived field is not a key", minimal + "    name: outbox\n",
			[]string{`line 11: unknown key "name" in routes[0]`}},
		{"schemas is a mapping", minimal + "    schema: {registry: \"http://r\", schemas: [a]}\n",
			[]string{`line 11: routes[0].schema.schemas: expected a mapping of names to values`}},
		{"duplicate key", minimal + "origen: other\n",
			[]string{`line 11: duplicate key "origen" (first at line 1)`}},
		{"bad duration", minimal + "pipeline:\n  backoff_min: 5 ms\n",
			[]string{`line 12: pipeline.backoff_min: invalid duration "5 ms"`}},
		{"number without unit is not a duration", strings.Replace(minimal, "kafka:\n", "kafka:\n  linger: 5\n", 1),
			[]string{`line 7: kafka.linger: invalid duration "5"`}},
		{"wrong type", strings.Replace(minimal, "kafka:\n", "kafka:\n  batch_size: lots\n", 1),
			[]string{`line 7: kafka.batch_size: expected an integer, got "lots"`}},
		{"wrong bool", strings.Replace(minimal, "postgres:\n", "postgres:\n  create_slot: maybe\n", 1),
			[]string{`line 3: postgres.create_slot: expected true or false, got "maybe"`}},
		{"scalar for a list", strings.Replace(minimal, `brokers: ["127.0.0.1:9092"]`, `brokers: 127.0.0.1:9092`, 1),
			[]string{`line 7: kafka.brokers: expected a list`}},
		{"malformed YAML keeps the line", minimal + "health:\n  listen: \"unterminated\n",
			[]string{"line 12"}},
		{"bad indentation keeps the line", "origen: x\npostgres:\n  dsn: a\n   slot: b\n",
			[]string{"line 4"}},
		{"empty file", "", []string{"empty configuration"}},
		{"only comments", "# nothing\n", []string{"empty configuration"}},
		{"multiple documents", minimal + "---\norigen: other\n", []string{"line 11:", "second YAML document"}},
		{"top level is a list", "- a\n- b\n", []string{"line 1:", "top level must be a mapping"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tt.yml), env(nil), nil)
			assertErr(t, err, tt.wantErr...)
		})
	}
}

// yaml.v3 reports many syntax errors a line early, or at the line where the
// enclosing mapping or list starts, or without a line; each case below is
// one of those, and the error must name the line of the problem.
func TestSyntaxErrorLines(t *testing.T) {
	tests := []struct {
		name     string
		yml      string
		wantLine int
		wantMsg  string
	}{
		{"text after a quoted value, nested",
			"origen: comandes\npostgres:\n  dsn: \"postgres://h/db\"\n  slot: \"outboxd\" x\n",
			4, "did not find expected key"},
		{"text after a quoted value, top level",
			"origen: comandes\n\nlog: \"info\" x\n",
			3, "did not find expected key"},
		{"text after a quoted value on the first line",
			"origen: \"comandes\" x\npostgres: {}\n",
			1, "did not find expected key"},
		{"key indented less than its siblings",
			"origen: comandes\npostgres:\n  dsn: x\n  slot: y\n publication: z\n",
			5, "did not find expected key"},
		{"a list item among keys",
			"origen: comandes\npostgres:\n  dsn: x\n\n  - slot\n",
			5, "did not find expected key"},
		{"a key among list items",
			"origen: comandes\nroutes:\n  - table: public.outbox\n  - table: public.other\n  topic: t\n",
			5, "did not find expected '-' indicator"},
		{"a list at the top, then a key",
			"- a\norigen: comandes\n",
			2, "did not find expected '-' indicator"},
		{"one bracket too many",
			"origen: comandes\nkafka:\n  brokers: [\"k:9092\"]]\n",
			3, "did not find expected key"},
		{"unclosed flow list names its line",
			"origen: comandes\nkafka:\n  brokers: [\"k:9092\"\nroutes: []\n",
			3, "did not find expected ',' or ']'"},
		{"unclosed flow mapping names its line",
			"origen: comandes\nroutes:\n  - {table: public.outbox\n    topic: t\n",
			3, "did not find expected ',' or '}'"},
		{"unknown alias",
			"origen: comandes\nlog:\n  level: *lvl\n",
			3, "unknown anchor 'lvl' referenced"},
		{"block scalar dedented",
			"origen: comandes\npostgres:\n  dsn: |\n    host=h\n   dbname=d\n",
			5, "did not find expected key"},
		{"second document header is not a document",
			"origen: comandes\n%YAML 1.2\n",
			2, "found incompatible YAML document"},
		{"scanner error: mapping in a plain value",
			"origen: comandes\nlog:\n  level: a: b\n",
			3, "mapping values are not allowed in this context"},
		{"scanner error: tab indentation",
			"origen: comandes\nlog:\n\tlevel: info\n",
			3, "found character that cannot start any token"},
		{"scanner error: unterminated quote names where it opens",
			"origen: comandes\nlog:\n  level: \"info\n  format: text\n",
			3, "found unexpected end of stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tt.yml), env(map[string]string{"BROKER": "k:9092"}), nil)
			want := fmt.Sprintf("line %d: %s", tt.wantLine, tt.wantMsg)
			if err == nil || err.Error() != want {
				t.Errorf("error = %v\nwant    %s", err, want)
			}
		})
	}
}

// aliasBomb is a route whose overrides alias one override n times, whose
// filter aliases one list of 20 values in 20 columns: n × 420 values in a
// file of a few KB.
func aliasBomb(n int) string {
	var cols []string
	for i := 1; i <= 20; i++ {
		c := fmt.Sprintf("c%d: *v", i)
		if i == 1 {
			c = "c1: &v [a01, a02, a03, a04, a05, a06, a07, a08, a09, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20]"
		}
		cols = append(cols, c)
	}
	over := "      - &o {topic: x, when: {" + strings.Join(cols, ", ") + "}}\n" + strings.Repeat("      - *o\n", n-1)
	return strings.Replace(minimal, "    topic: comandes.esdeveniments\n", "    topic: comandes.esdeveniments\n    overrides:\n"+over, 1)
}

// The decoder follows aliases itself: their values are bounded, so that a
// few KB cannot stand for millions of values; sharing a mapping between
// routes stays well within the bound.
func TestAliasesAreBounded(t *testing.T) {
	yml := aliasBomb(500)
	_, err := config.Parse([]byte(yml), nil, nil)
	assertErr(t, err, "the aliases (*name) stand for more than 10000 values")
	t.Logf("%d bytes: %v", len(yml), err)

	shared := strings.Replace(minimal, "    topic: comandes.esdeveniments\n",
		"    topic: comandes.esdeveniments\n    columns: &cols {agregat_id: agregat_id}\n  - table: public.outbox2\n    topic: t2\n    columns: *cols\n", 1)
	cfg := mustParse(t, shared, nil)
	if len(cfg.Routes) != 2 || cfg.Routes[1].Columns.AgregatID != "agregat_id" {
		t.Errorf("routes %+v", cfg.Routes)
	}
}
