package config_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/config"
)

func TestEnvExpansion(t *testing.T) {
	tests := []struct {
		name    string
		dsn     string // the dsn line's value, in YAML
		vars    map[string]string
		wantDSN string
		wantErr []string // substrings; nil means success
	}{
		{
			name: "set", dsn: `"postgres://u:${PW}@h/db"`, vars: map[string]string{"PW": "secret"},
			wantDSN: "postgres://u:secret@h/db",
		},
		{
			name: "two in one line", dsn: `"postgres://${USR}:${PW}@h/db"`, vars: map[string]string{"USR": "u", "PW": "p"},
			wantDSN: "postgres://u:p@h/db",
		},
		{
			name: "set but empty", dsn: `"postgres://u:${PW}@h/db"`, vars: map[string]string{"PW": ""},
			wantErr: []string{"line 3: postgres.dsn: environment variable PW is set but empty"},
		},
		{
			name: "a host that injects a database and settings", dsn: `"postgres://u@${H}/db?sslmode=verify-full"`,
			vars:    map[string]string{"H": "evil:5432/db?sslmode=disable&x="},
			wantErr: []string{"line 3:", "${H} stands in the hosts of the URL"},
		},
		{
			name: "host, port and a list of hosts", dsn: `"postgres://u@${H}:${P},${H2}/db"`,
			vars:    map[string]string{"H": "db-1.internal", "P": "5433", "H2": "[::1]:5432"},
			wantDSN: "postgres://u@db-1.internal:5433,[::1]:5432/db",
		},
		{
			name: "the database name and query values are encoded", dsn: `"postgres://u@h/${DB}?application_name=${A}"`,
			vars:    map[string]string{"DB": "km0?sslmode=disable", "A": "a&sslmode=disable"},
			wantDSN: "postgres://u@h/km0%3Fsslmode%3Ddisable?application_name=a%26sslmode%3Ddisable",
		},
		{
			name: "double dollar is a literal dollar", dsn: `"postgres://u:pa$$${PW}$$@h/db"`, vars: map[string]string{"PW": "x"},
			wantDSN: "postgres://u:pa$x$@h/db",
		},
		{
			name: "escaped reference is not expanded", dsn: `"host=h dbname=$${PW}"`, vars: nil,
			wantDSN: "host=h dbname=${PW}",
		},
		{
			name: "lone dollar is kept", dsn: `"postgres://u:a$b@h/db"`, vars: nil,
			wantDSN: "postgres://u:a$b@h/db",
		},
		{
			name: "value is not re-expanded", dsn: `"postgres://u:${PW}@h/db"`, vars: map[string]string{"PW": "${OTHER}"},
			wantDSN: "postgres://u:%24%7BOTHER%7D@h/db", // percent-encoded in the user info
		},
		{
			name: "unset", dsn: `"postgres://u:${PGPASSWORD}@h/db"`, vars: map[string]string{"PW": "x"},
			wantErr: []string{"line 3:", "PGPASSWORD", "not set"},
		},
		{
			name: "invalid name", dsn: `"${1PW}"`, vars: map[string]string{"1PW": "x"},
			wantErr: []string{"line 3:", "invalid variable name", "1PW"},
		},
		{
			name: "unterminated", dsn: `"${PW"`, vars: map[string]string{"PW": "x"},
			wantErr: []string{"line 3:", "unterminated"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			yml := strings.Replace(minimal, `"postgres://outboxd@127.0.0.1/km0"`, tt.dsn, 1)
			if yml == minimal {
				t.Fatal("test setup: dsn not replaced")
			}
			cfg, err := config.Parse([]byte(yml), env(tt.vars), nil)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if cfg.Postgres.DSN != tt.wantDSN {
					t.Errorf("dsn = %q, want %q", cfg.Postgres.DSN, tt.wantDSN)
				}
				return
			}
			assertErr(t, err, tt.wantErr...)
		})
	}

	t.Run("unset variable in a later line names that line", func(t *testing.T) {
		_, err := config.Parse([]byte(minimal+"log:\n  level: ${LEVEL}\n"), env(nil), nil)
		assertErr(t, err, "line 12: environment variable LEVEL is not set")
	})
	t.Run("nil lookupEnv defines nothing", func(t *testing.T) {
		_, err := config.Parse([]byte(minimal+"log:\n  level: ${HOME}\n"), nil, nil)
		assertErr(t, err, "line 12:", "HOME")
	})
	t.Run("all unset variables are reported", func(t *testing.T) {
		_, err := config.Parse([]byte("origen: ${A}\nlog:\n  level: ${B}\n"), env(nil), nil)
		assertErr(t, err, "line 1: environment variable A", "line 3: environment variable B")
	})
	t.Run("unset variable in a literal block names its line", func(t *testing.T) {
		_, err := config.Parse([]byte(minimal+"log:\n  level: |\n    a\n    ${LEVEL}\n"), env(nil), nil)
		assertErr(t, err, "line 14: environment variable LEVEL is not set")
	})
}

// A value is put in place after the YAML is parsed: it is data, whatever
// characters it holds, and YAML gives it the type it would have had written
// there.
func TestExpansionInValues(t *testing.T) {
	origen := func(c config.Config) any { return c.Origen }
	tests := []struct {
		name    string
		yml     string // replaces minimal's first line, "origen: comandes"
		vars    map[string]string
		got     func(c config.Config) any
		want    any
		wantErr string
	}{
		{name: "line break and YAML syntax stay in the value",
			yml: "origen: ${V}", vars: map[string]string{"V": "a\npostgres: {slot: evil}\nlog: {format: json} # x"},
			got:  func(c config.Config) any { return []string{c.Origen, c.Postgres.Slot, c.Log.Format} },
			want: []string{"a\npostgres: {slot: evil}\nlog: {format: json} # x", "outboxd_comandes", "text"}},
		{name: "quotes in a double-quoted value",
			yml: `origen: "${V}"`, vars: map[string]string{"V": `say "hi" 'there'`},
			got: origen, want: `say "hi" 'there'`},
		{name: "a value null is a string, not a missing value",
			yml: "origen: ${V}", vars: map[string]string{"V": "null"},
			got: origen, want: "null"},
		{name: "an empty value is an error",
			yml: "origen: x\nhealth: {listen: \"${L}\"}", vars: map[string]string{"L": ""},
			wantErr: "line 2: health.listen: environment variable L is set but empty"},
		{name: "a plain value takes its YAML type",
			yml:  "origen: x\npipeline:\n  max_in_flight_events: ${N}\n  backoff_max: ${D}\n  backoff_min: ${D}\nhealth:\n  pprof: ${B}",
			vars: map[string]string{"N": "7", "D": "3s", "B": "true"},
			got: func(c config.Config) any {
				return []any{c.Pipeline.MaxInFlightEvents, c.Pipeline.BackoffMax, c.Health.Pprof}
			},
			want: []any{7, 3 * time.Second, true}},
		{name: "a quoted value stays a string",
			yml: "origen: x\npipeline:\n  max_in_flight_events: \"${N}\"", vars: map[string]string{"N": "7"},
			wantErr: `line 3: pipeline.max_in_flight_events: expected an integer, got "7"`},
		{name: "comments are not expanded",
			yml: "# ${UNSET} in a comment\norigen: x # ${ALSO_UNSET}",
			got: origen, want: "x"},
		{name: "quoted variables in a flow mapping",
			yml: `origen: x
log: {level: "${L}", format: "${F}"}`, vars: map[string]string{"L": "warn", "F": "json"},
			got: func(c config.Config) any { return c.Log }, want: config.Log{Level: "warn", Format: "json"}},
		{name: "keys are not expanded",
			yml: "${K}: x", vars: map[string]string{"K": "origen"},
			wantErr: `line 1: unknown key "${K}"`},
		{name: "an unquoted variable in a flow list is a syntax error that says so",
			yml: "origen: x\nlog: {level: ${L}}", vars: map[string]string{"L": "warn"},
			wantErr: `line 2: did not find expected ',' or '}' (inside [ ] or { }, quote a value that holds a variable: "${NAME}")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			yml := strings.Replace(minimal, "origen: comandes\n", tt.yml+"\n", 1)
			cfg, err := config.Parse([]byte(yml), env(tt.vars), nil)
			if tt.wantErr != "" {
				assertErr(t, err, tt.wantErr)
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got := tt.got(cfg); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %#v, want %#v", got, tt.want)
			}
		})
	}
}

// kafka.tls.ca_file and server_name take an empty variable: "" there means
// the default (the system's roots, the broker's name), as safe as a value.
func TestEmptyValueWhereAllowed(t *testing.T) {
	yml := strings.Replace(minimal, "kafka:\n", "kafka:\n  tls: {enable: true, ca_file: \"${CA}\", server_name: \"${SN}\"}\n", 1)
	cfg := mustParse(t, yml, map[string]string{"CA": "", "SN": ""})
	if cfg.Kafka.TLS.CAFile != "" || cfg.Kafka.TLS.ServerName != "" {
		t.Errorf("tls %+v", cfg.Kafka.TLS)
	}
}
