package config_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/config"
)

// env returns a lookupEnv backed by a map.
func env(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

// minimal is the smallest valid configuration; tests append to or edit it.
const minimal = `origen: comandes
postgres:
  dsn: "postgres://outboxd@127.0.0.1/km0"
  slot: outboxd_comandes
  publication: outboxd_comandes
kafka:
  brokers: ["127.0.0.1:9092"]
routes:
  - table: public.outbox
    topic: comandes.esdeveniments
`

func mustParse(t *testing.T, yml string, vars map[string]string) config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(yml), env(vars))
	if err != nil {
		t.Fatalf("Parse: unexpected error:\n%v", err)
	}
	return cfg
}

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestDefault(t *testing.T) {
	d := config.Default()
	want := struct {
		Postgres config.Postgres
		Kafka    config.Kafka
		Pipeline config.Pipeline
		Health   config.Health
		Log      config.Log
	}{
		Postgres: config.Postgres{
			CreateSlot:         true,
			CreatePublication:  true,
			StatusInterval:     100 * time.Millisecond,
			IdleStatusInterval: 10 * time.Second,
			ConnectTimeout:     10 * time.Second,
			StandbyRetry:       2 * time.Second,
			ReceiveTimeout:     30 * time.Second,
		},
		Kafka: config.Kafka{
			Partitioner:     "murmur2",
			Compression:     "lz4",
			Linger:          5 * time.Millisecond,
			BatchSize:       1000,
			BatchBytes:      1048576,
			MaxAttempts:     10,
			WriteTimeout:    10 * time.Second,
			ClientID:        "outboxd",
			DeliveryTimeout: 30 * time.Second,
		},
		Pipeline: config.Pipeline{
			MaxInFlightEvents: 5000,
			MaxInFlightBytes:  8388608,
			ShutdownTimeout:   30 * time.Second,
			BackoffMin:        500 * time.Millisecond,
			BackoffMax:        30 * time.Second,
		},
		Health: config.Health{Listen: "127.0.0.1:9597", PollInterval: 5 * time.Second, MaxLag: time.Minute, MaxRetainedWALBytes: 1 << 30},
		Log:    config.Log{Level: "info", Format: "text"},
	}
	got := struct {
		Postgres config.Postgres
		Kafka    config.Kafka
		Pipeline config.Pipeline
		Health   config.Health
		Log      config.Log
	}{d.Postgres, d.Kafka, d.Pipeline, d.Health, d.Log}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Default() =\n%+v\nwant\n%+v", got, want)
	}
	if d.Origen != "" || len(d.Routes) != 0 {
		t.Errorf("Default(): Origen %q, Routes %v; want empty", d.Origen, d.Routes)
	}
	wantCols := config.Columns{ID: "id", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "carrega", CreatEn: "creat_en"}
	if got := config.DefaultColumns(); got != wantCols {
		t.Errorf("DefaultColumns() = %+v, want %+v", got, wantCols)
	}
}

func TestParseAppliesDefaults(t *testing.T) {
	cfg := mustParse(t, minimal, nil)
	d := config.Default()
	d.Postgres.DSN = "postgres://outboxd@127.0.0.1/km0"
	d.Postgres.Slot = "outboxd_comandes"
	d.Postgres.Publication = "outboxd_comandes"
	d.Kafka.Brokers = []string{"127.0.0.1:9092"}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"postgres", cfg.Postgres, d.Postgres},
		{"kafka", cfg.Kafka, d.Kafka},
		{"pipeline", cfg.Pipeline, d.Pipeline},
		{"health", cfg.Health, d.Health},
		{"log", cfg.Log, d.Log},
		{"routes", cfg.Routes, []config.Route{{
			Table: "public.outbox", Schema: "public", Name: "outbox",
			Topic: "comandes.esdeveniments", Columns: config.DefaultColumns(), OnError: config.OnErrorStop,
		}}},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s =\n%+v\nwant\n%+v", c.name, c.got, c.want)
		}
	}
}

func TestParseExamples(t *testing.T) {
	tests := []struct {
		file  string
		check func(t *testing.T, c config.Config)
	}{
		{"contract.yaml", func(t *testing.T, c config.Config) {
			if c.Origen != "comandes" {
				t.Errorf("origen = %q", c.Origen)
			}
			if want := "postgres://outboxd:s3cr3t@127.0.0.1:5432/km0_comandes"; c.Postgres.DSN != want {
				t.Errorf("dsn = %q, want %q", c.Postgres.DSN, want)
			}
			if c.Postgres.Slot != "outboxd_comandes" || c.Postgres.Publication != "outboxd_comandes" {
				t.Errorf("slot, publication = %q, %q", c.Postgres.Slot, c.Postgres.Publication)
			}
			if !reflect.DeepEqual(c.Kafka.Brokers, []string{"127.0.0.1:9092"}) || c.Kafka.Partitioner != "murmur2" {
				t.Errorf("kafka = %+v", c.Kafka)
			}
			want := []config.Route{{
				Table: "public.outbox", Schema: "public", Name: "outbox",
				Topic: "comandes.esdeveniments", Columns: config.DefaultColumns(), OnError: config.OnErrorStop,
			}}
			if !reflect.DeepEqual(c.Routes, want) {
				t.Errorf("routes = %+v, want %+v", c.Routes, want)
			}
			if c.Health.Listen != "127.0.0.1:8080" {
				t.Errorf("health.listen = %q", c.Health.Listen)
			}
		}},
		{"debezium.yaml", func(t *testing.T, c config.Config) {
			wantPG := config.Postgres{
				DSN:                "host=db.internal port=5432 dbname=km0_inventari user=outboxd password=s3cr3t sslmode=require",
				Slot:               "outboxd_inventari",
				Publication:        "outboxd_inventari",
				CreateSlot:         false,
				CreatePublication:  false,
				StatusInterval:     500 * time.Millisecond,
				IdleStatusInterval: 30 * time.Second,
				ConnectTimeout:     5 * time.Second,
				StandbyRetry:       2 * time.Second,
				ReceiveTimeout:     30 * time.Second,
			}
			if c.Postgres != wantPG {
				t.Errorf("postgres =\n%+v\nwant\n%+v", c.Postgres, wantPG)
			}
			wantKafka := config.Kafka{
				Brokers:         []string{"kafka-1.internal:9092", "kafka-2.internal:9092", "kafka-3.internal:9092"},
				Partitioner:     "crc32",
				Compression:     "zstd",
				Linger:          20 * time.Millisecond,
				BatchSize:       500,
				BatchBytes:      2097152,
				MaxAttempts:     5,
				WriteTimeout:    15 * time.Second,
				ClientID:        "outboxd-inventari",
				DeliveryTimeout: 30 * time.Second,
			}
			if !reflect.DeepEqual(c.Kafka, wantKafka) {
				t.Errorf("kafka =\n%+v\nwant\n%+v", c.Kafka, wantKafka)
			}
			wantRoutes := []config.Route{
				{
					Table: "inventari.outboxevent", Schema: "inventari", Name: "outboxevent",
					Topic: "inventari.esdeveniments",
					Columns: config.Columns{
						ID: "id", AgregatID: "aggregateid", Tipus: "type",
						Versio: config.NoColumn, Carrega: "payload", CreatEn: "timestamp",
					},
					OnError: config.OnErrorStop,
				},
				{
					Table: "public.outbox", Schema: "public", Name: "outbox",
					Topic: "inventari.legacy", Columns: config.DefaultColumns(), OnError: config.OnErrorStop,
				},
			}
			if !reflect.DeepEqual(c.Routes, wantRoutes) {
				t.Errorf("routes =\n%+v\nwant\n%+v", c.Routes, wantRoutes)
			}
			wantPipe := config.Pipeline{
				MaxInFlightEvents: 2000, MaxInFlightBytes: 16777216,
				ShutdownTimeout: time.Minute, BackoffMin: 100 * time.Millisecond, BackoffMax: 10 * time.Second,
			}
			if c.Pipeline != wantPipe {
				t.Errorf("pipeline = %+v, want %+v", c.Pipeline, wantPipe)
			}
			if c.Health.Listen != "" {
				t.Errorf("health.listen = %q, want \"\" (disabled)", c.Health.Listen)
			}
			if c.Log != (config.Log{Level: "debug", Format: "json"}) {
				t.Errorf("log = %+v", c.Log)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			cfg := mustParse(t, string(readTestdata(t, tt.file)), map[string]string{"PGPASSWORD": "s3cr3t"})
			tt.check(t, cfg)
			if err := cfg.Validate(); err != nil {
				t.Errorf("Validate on a parsed config: %v", err)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	t.Setenv("OUTBOXD_TEST_PASSWORD", "from-env")
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	yml := strings.Replace(minimal, "outboxd@", "outboxd:${OUTBOXD_TEST_PASSWORD}@", 1)
	if err := os.WriteFile(good, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(good)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if want := "postgres://outboxd:from-env@127.0.0.1/km0"; cfg.Postgres.DSN != want {
		t.Errorf("dsn = %q, want %q (expanded from the process environment)", cfg.Postgres.DSN, want)
	}

	bad := filepath.Join(dir, "outboxd.yaml")
	if err := os.WriteFile(bad, []byte(minimal+"kafak: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = config.Load(bad)
	if err == nil || !strings.HasPrefix(err.Error(), bad+": line 11: unknown key \"kafak\"") {
		t.Errorf("Load error = %v, want it to start with %q", err, bad+": line 11: unknown key \"kafak\"")
	}

	if _, err := config.Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("Load of a missing file: error = %v, want one naming the file", err)
	}
}

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
			wantDSN: "postgres://u:@h/db",
		},
		{
			name: "double dollar is a literal dollar", dsn: `"postgres://u:pa$$${PW}$$@h/db"`, vars: map[string]string{"PW": "x"},
			wantDSN: "postgres://u:pa$x$@h/db",
		},
		{
			name: "escaped reference is not expanded", dsn: `"postgres://u:$${PW}@h/db"`, vars: nil,
			wantDSN: "postgres://u:${PW}@h/db",
		},
		{
			name: "lone dollar is kept", dsn: `"postgres://u:a$b@h/db"`, vars: nil,
			wantDSN: "postgres://u:a$b@h/db",
		},
		{
			name: "value is not re-expanded", dsn: `"postgres://u:${PW}@h/db"`, vars: map[string]string{"PW": "${OTHER}"},
			wantDSN: "postgres://u:${OTHER}@h/db",
		},
		{
			name: "unset", dsn: `"postgres://u:${PGPASSWORD}@h/db"`, vars: map[string]string{"PW": "x"},
			wantErr: []string{"line 3:", "PGPASSWORD", "not set"},
		},
		{
			name: "newline in value", dsn: `"${PW}"`, vars: map[string]string{"PW": "a\nslot: evil"},
			wantErr: []string{"line 3:", "PW", "line break"},
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
			cfg, err := config.Parse([]byte(yml), env(tt.vars))
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
		_, err := config.Parse([]byte(minimal+"log:\n  level: ${LEVEL}\n"), env(nil))
		assertErr(t, err, "line 12: environment variable LEVEL is not set")
	})
	t.Run("nil lookupEnv defines nothing", func(t *testing.T) {
		_, err := config.Parse([]byte(minimal+"log:\n  level: ${HOME}\n"), nil)
		assertErr(t, err, "line 12:", "HOME")
	})
	t.Run("all unset variables are reported", func(t *testing.T) {
		_, err := config.Parse([]byte("origen: ${A}\nlog:\n  level: ${B}\n"), env(nil))
		assertErr(t, err, "line 1: environment variable A", "line 3: environment variable B")
	})
}

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

func TestValidateErrors(t *testing.T) {
	tests := []struct {
		name    string
		yml     string
		wantErr []string
	}{
		{"bad partitioner", strings.Replace(minimal, "kafka:\n", "kafka:\n  partitioner: fnv\n", 1),
			[]string{`line 7: kafka.partitioner: "fnv" is not one of murmur2, crc32`}},
		{"bad compression", strings.Replace(minimal, "kafka:\n", "kafka:\n  compression: brotli\n", 1),
			[]string{`line 7: kafka.compression: "brotli"`}},
		{"bad log level", minimal + "log:\n  level: verbose\n",
			[]string{`line 12: log.level: "verbose"`}},
		{"bad log format", minimal + "log:\n  format: xml\n",
			[]string{`line 12: log.format: "xml"`}},
		{"dead_letter without a topic", minimal + "    on_error: dead_letter\n",
			[]string{`routes[0].dead_letter_topic: required when on_error is dead_letter`}},
		{"unknown on_error", minimal + "    on_error: ignore\n",
			[]string{`routes[0].on_error: "ignore" is not one of stop, dead_letter`}},
		{"dead letter topic equals the topic", minimal + "    on_error: dead_letter\n    dead_letter_topic: comandes.esdeveniments\n",
			[]string{`routes[0].dead_letter_topic: must differ from the route's topic`}},
		{"dead letter topic with stop", minimal + "    dead_letter_topic: dlq\n",
			[]string{`routes[0].dead_letter_topic: set, but on_error is "stop"`}},
		{"duplicate tables", minimal + "  - table: public.outbox\n    topic: other\n",
			[]string{`line 11: routes[1].table: "public.outbox" is already routed by routes[0]`}},
		{"table without schema", strings.Replace(minimal, "table: public.outbox", "table: outbox", 1),
			[]string{`line 9: routes[0].table: "outbox" must be schema.table`}},
		{"table with two dots", strings.Replace(minimal, "table: public.outbox", "table: db.public.outbox", 1),
			[]string{`line 9: routes[0].table: "db.public.outbox"`}},
		{"table with empty part", strings.Replace(minimal, "table: public.outbox", "table: public.", 1),
			[]string{`line 9: routes[0].table: "public."`}},
		{"table not lowercase", strings.Replace(minimal, "table: public.outbox", "table: public.Outbox", 1),
			[]string{`line 9: routes[0].table: "public.Outbox"`}},
		{"bad topic", strings.Replace(minimal, "topic: comandes.esdeveniments", "topic: comandes/esdeveniments", 1),
			[]string{`line 10: routes[0].topic: "comandes/esdeveniments" is not a valid Kafka topic name`}},
		{"topic too long", strings.Replace(minimal, "topic: comandes.esdeveniments", "topic: "+strings.Repeat("t", 250), 1),
			[]string{`line 10: routes[0].topic:`}},
		{"missing topic uses the route's line", strings.Replace(minimal, "    topic: comandes.esdeveniments\n", "", 1),
			[]string{`line 9: routes[0].topic: required`}},
		{"no routes", strings.Replace(minimal, "routes:\n  - table: public.outbox\n    topic: comandes.esdeveniments\n", "", 1),
			[]string{`routes: at least one route is required`}},
		{"empty route list", strings.Replace(minimal, "routes:\n  - table: public.outbox\n    topic: comandes.esdeveniments\n", "routes: []\n", 1),
			[]string{`line 8: routes: at least one route is required`}},
		{"empty column name", minimal + "    columns:\n      tipus: \"\"\n",
			[]string{`line 12: routes[0].columns.tipus: column name must not be empty`}},
		{"duplicate column names", minimal + "    columns:\n      carrega: tipus\n",
			[]string{`line 12: routes[0].columns.carrega: column "tipus" is also used for tipus`}},
		{"dash only for versio", minimal + "    columns:\n      creat_en: \"-\"\n",
			[]string{`line 12: routes[0].columns.creat_en: "-" (no such column) is allowed only for versio`}},
		{"bad slot", strings.Replace(minimal, "slot: outboxd_comandes", "slot: Outboxd-Comandes", 1),
			[]string{`line 4: postgres.slot: "Outboxd-Comandes" is not a valid slot name`}},
		{"missing dsn uses the section's line", strings.Replace(minimal, "  dsn: \"postgres://outboxd@127.0.0.1/km0\"\n", "", 1),
			[]string{`line 2: postgres.dsn: required`}},
		{"missing origen has no line", strings.Replace(minimal, "origen: comandes\n", "", 1),
			[]string{`origen: required`}},
		{"broker without port", strings.Replace(minimal, `["127.0.0.1:9092"]`, `["127.0.0.1:9092", "kafka"]`, 1),
			[]string{`line 7: kafka.brokers[1]: "kafka": want host:port`}},
		{"broker with bad port", strings.Replace(minimal, `["127.0.0.1:9092"]`, `["kafka:http"]`, 1),
			[]string{`line 7: kafka.brokers[0]: "kafka:http": port "http"`}},
		{"no brokers", strings.Replace(minimal, `["127.0.0.1:9092"]`, `[]`, 1),
			[]string{`line 7: kafka.brokers: required`}},
		{"zero duration", strings.Replace(minimal, "kafka:\n", "kafka:\n  write_timeout: 0s\n", 1),
			[]string{`line 7: kafka.write_timeout: must be a positive duration, got 0s`}},
		{"negative duration", minimal + "pipeline:\n  shutdown_timeout: -1s\n",
			[]string{`line 12: pipeline.shutdown_timeout: must be a positive duration, got -1s`}},
		{"idle status shorter than status", strings.Replace(minimal, "postgres:\n", "postgres:\n  status_interval: 5s\n  idle_status_interval: 2s\n", 1),
			[]string{`line 4: postgres.idle_status_interval: 2s is shorter than status_interval 5s`}},
		{"backoff max below min", minimal + "pipeline:\n  backoff_min: 2s\n  backoff_max: 1s\n",
			[]string{`line 13: pipeline.backoff_max: 1s is shorter than backoff_min 2s`}},
		{"zero in-flight bound", minimal + "pipeline:\n  max_in_flight_events: 0\n",
			[]string{`line 12: pipeline.max_in_flight_events: must be > 0, got 0`}},
		{"bad listen", minimal + "health:\n  listen: localhost\n",
			[]string{`line 12: health.listen: "localhost": want host:port`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tt.yml), env(nil))
			assertErr(t, err, tt.wantErr...)
		})
	}
}

func TestMultipleErrorsReportedTogether(t *testing.T) {
	yml := `origen: ""
postgres:
  dsn: ""
  slot: outboxd_comandes
  publication: outboxd_comandes
  connect_timeout: soon
kafka:
  brokers: ["127.0.0.1:9092"]
  partitioner: fnv
  kafak: 1
routes:
  - table: public.outbox
    topic: a
  - table: public.outbox
    topic: "b c"
`
	_, err := config.Parse([]byte(yml), env(nil))
	want := []string{
		`line 6: postgres.connect_timeout: invalid duration "soon"`,
		`line 10: unknown key "kafak" in kafka`,
		`line 1: origen: required`,
		`line 3: postgres.dsn: required`,
		`line 9: kafka.partitioner: "fnv" is not one of murmur2, crc32`,
		`line 14: routes[1].table: "public.outbox" is already routed by routes[0]`,
		`line 15: routes[1].topic: "b c" is not a valid Kafka topic name`,
	}
	assertErr(t, err, want...)
	if n := len(strings.Split(err.Error(), "\n")); n != len(want) {
		t.Errorf("got %d error lines, want %d:\n%v", n, len(want), err)
	}
}

func TestValidateBuiltInGo(t *testing.T) {
	valid := func() config.Config {
		c := config.Default()
		c.Origen = "comandes"
		c.Postgres.DSN = "postgres://outboxd@h/db"
		c.Postgres.Slot = "outboxd_comandes"
		c.Postgres.Publication = "outboxd_comandes"
		c.Kafka.Brokers = []string{"k:9092"}
		c.Routes = []config.Route{{
			Table: "public.outbox", Schema: "public", Name: "outbox",
			Topic: "comandes.esdeveniments", Columns: config.DefaultColumns(), OnError: config.OnErrorStop,
		}}
		return c
	}
	if err := valid().Validate(); err != nil {
		t.Fatalf("Validate of a valid Go config: %v", err)
	}

	tests := []struct {
		name    string
		edit    func(c *config.Config)
		wantErr []string
	}{
		{"no line numbers", func(c *config.Config) { c.Kafka.Partitioner = "fnv" },
			[]string{`kafka.partitioner: "fnv" is not one of murmur2, crc32`}},
		{"empty Default is invalid", func(c *config.Config) { *c = config.Default() },
			[]string{"origen: required", "postgres.dsn: required", "postgres.slot: required",
				"postgres.publication: required", "kafka.brokers: required", "routes: at least one route is required"}},
		{"zero columns", func(c *config.Config) { c.Routes[0].Columns = config.Columns{} },
			[]string{"routes[0].columns.id: column name must not be empty", "routes[0].columns.creat_en: column name must not be empty"}},
		{"schema and name not derived", func(c *config.Config) { c.Routes[0].Schema, c.Routes[0].Name = "", "" },
			[]string{`routes[0].table: Schema/Name ("", "") do not match table "public.outbox"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.edit(&c)
			err := c.Validate()
			assertErr(t, err, tt.wantErr...)
			if strings.Contains(err.Error(), "line ") {
				t.Errorf("error for a Go-built config mentions a line: %v", err)
			}
		})
	}
}

func TestRedactedDSN(t *testing.T) {
	tests := []struct {
		dsn, want string
	}{
		{"postgres://outboxd:s3cr3t@127.0.0.1:5432/km0_comandes", "postgres://outboxd:xxxxx@127.0.0.1:5432/km0_comandes"},
		{"postgresql://outboxd:s3cr3t@db/km0?sslmode=require", "postgresql://outboxd:xxxxx@db/km0?sslmode=require"},
		{"postgres://outboxd:p%40ss%2Fw0rd@db/km0", "postgres://outboxd:xxxxx@db/km0"},
		{"postgres://outboxd@db/km0", "postgres://outboxd@db/km0"},
		{"postgres://outboxd@db/km0?password=s3cr3t&sslmode=disable", "postgres://outboxd@db/km0?password=xxxxx&sslmode=disable"},
		{"postgres://outboxd:s3/cr3t@db/km0", "postgres://xxxxx@db/km0"}, // unparseable: user info dropped entirely
		{"host=db user=outboxd password=s3cr3t dbname=km0", "host=db user=outboxd password=xxxxx dbname=km0"},
		{"password=s3cr3t host=db", "password=xxxxx host=db"},
		{"host=db password = s3cr3t", "host=db password = xxxxx"},
		{`host=db password='s3 cr\'3t' dbname=km0`, "host=db password=xxxxx dbname=km0"},
		{`host=db password=s3\ cr3t dbname=km0`, "host=db password=xxxxx dbname=km0"},
		{"host=db user=outboxd dbname=km0", "host=db user=outboxd dbname=km0"},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.dsn, func(t *testing.T) {
			got := config.Postgres{DSN: tt.dsn}.RedactedDSN()
			if got != tt.want {
				t.Errorf("RedactedDSN(%q) = %q, want %q", tt.dsn, got, tt.want)
			}
			for _, secret := range []string{"s3cr3t", "cr3t", "p%40ss"} {
				if strings.Contains(got, secret) {
					t.Errorf("RedactedDSN(%q) = %q leaks %q", tt.dsn, got, secret)
				}
			}
		})
	}
}

// assertErr fails unless err is non-nil and contains every substring.
func assertErr(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", want)
	}
	if len(want) == 0 {
		t.Fatal("test setup: no expected substrings")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not contain %q; got:\n%v", w, err)
		}
	}
}
