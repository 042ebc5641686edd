package config_test

import (
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
		{"derived field is not a key", minimal + "    schema: public\n",
			[]string{`line 11: unknown key "schema" in routes[0]`}},
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
			_, err := config.Parse([]byte(tt.yml), env(nil))
			assertErr(t, err, tt.wantErr...)
		})
	}
}
