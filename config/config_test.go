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
	cfg, err := config.Parse([]byte(yml), env(vars), nil)
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
	type sections struct {
		Postgres  config.Postgres
		Kafka     config.Kafka
		Pipeline  config.Pipeline
		Retention config.Retention
		Health    config.Health
		Log       config.Log
	}
	want := sections{
		Postgres: config.Postgres{
			CreateSlot:         true,
			CreatePublication:  true,
			SlotTable:          "public.outboxd_slots",
			FailoverSlot:       true,
			StatusInterval:     100 * time.Millisecond,
			IdleStatusInterval: 10 * time.Second,
			ConnectTimeout:     10 * time.Second,
			StandbyRetry:       2 * time.Second,
			ReceiveTimeout:     30 * time.Second,
			Snapshot:           config.SnapshotPending,
			Streaming:          true,
		},
		Kafka: config.Kafka{
			Partitioner:       "murmur2",
			Compression:       "lz4",
			Linger:            5 * time.Millisecond,
			BatchSize:         1000,
			BatchBytes:        1048576,
			MaxAttempts:       10,
			WriteTimeout:      10 * time.Second,
			ClientID:          "outboxd",
			DeliveryTimeout:   30 * time.Second,
			OnPartitionChange: "follow",
			Idempotence:       true,
			Deduplicate:       true, StreamKeyFile: "outboxd-stream.key", TransactionInterval: 100 * time.Millisecond,
		},
		Pipeline: config.Pipeline{
			MaxInFlightEvents: 1500,
			MaxInFlightBytes:  4194304,
			ShutdownTimeout:   30 * time.Second,
			BackoffMin:        500 * time.Millisecond,
			BackoffMax:        30 * time.Second,
		},
		Retention: config.Retention{Mode: config.RetentionDelete, Interval: time.Minute, BatchSize: 1000, ConfirmTimeout: 30 * time.Second, LockTimeout: 2 * time.Second},
		Health:    config.Health{Listen: "127.0.0.1:9597", PollInterval: 5 * time.Second, MaxLag: time.Minute, MaxRetainedWALBytes: 1 << 30},
		Log:       config.Log{Level: "info", Format: "text"},
	}
	got := sections{d.Postgres, d.Kafka, d.Pipeline, d.Retention, d.Health, d.Log}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Default() =\n%+v\nwant\n%+v", got, want)
	}
	if d.Origen != "" || len(d.Routes) != 0 {
		t.Errorf("Default(): Origen %q, Routes %v; want empty", d.Origen, d.Routes)
	}
	wantCols := config.Columns{ID: "id", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "carrega", CreatEn: "creat_en", PublicatEn: "publicat_en"}
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
				DSN:                "host=db.internal port=5432 dbname=km0_inventari user=outboxd password=s3cr3t sslmode=verify-full",
				Slot:               "outboxd_inventari",
				Publication:        "outboxd_inventari",
				CreateSlot:         false,
				CreatePublication:  false,
				SlotTable:          "public.outboxd_slots",
				FailoverSlot:       true,
				StatusInterval:     500 * time.Millisecond,
				IdleStatusInterval: 30 * time.Second,
				ConnectTimeout:     5 * time.Second,
				StandbyRetry:       2 * time.Second,
				ReceiveTimeout:     30 * time.Second,
				Streaming:          true,
				Snapshot:           config.SnapshotNone,
			}
			if c.Postgres != wantPG {
				t.Errorf("postgres =\n%+v\nwant\n%+v", c.Postgres, wantPG)
			}
			wantKafka := config.Kafka{
				Brokers:           []string{"kafka-1.internal:9092", "kafka-2.internal:9092", "kafka-3.internal:9092"},
				Partitioner:       "crc32",
				Compression:       "zstd",
				Linger:            20 * time.Millisecond,
				BatchSize:         500,
				BatchBytes:        2097152,
				MaxAttempts:       5,
				WriteTimeout:      15 * time.Second,
				ClientID:          "outboxd-inventari",
				DeliveryTimeout:   30 * time.Second,
				OnPartitionChange: "follow",
				Idempotence:       true,
				Deduplicate:       true, StreamKeyFile: "outboxd-stream.key", TransactionInterval: 100 * time.Millisecond,
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
						Versio: "", Carrega: "payload", CreatEn: "timestamp",
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
	if want := filepath.Join(dir, "outboxd-stream.key"); cfg.Kafka.StreamKeyFile != want {
		t.Errorf("kafka.stream_key_file = %q, want %q (beside the configuration file)", cfg.Kafka.StreamKeyFile, want)
	}

	secret := filepath.Join(dir, "pg-password")
	if err := os.WriteFile(secret, []byte("p@ss/w\"rd\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withFile := filepath.Join(dir, "with-file.yaml")
	yml = strings.Replace(minimal, "  slot:", "  password_file: "+secret+"\n  slot:", 1)
	if err := os.WriteFile(withFile, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, err := config.Load(withFile); err != nil || cfg.Postgres.Password != `p@ss/w"rd` {
		t.Errorf("Load with password_file: password %q, error %v; want %q", cfg.Postgres.Password, err, `p@ss/w"rd`)
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

// In the YAML "-" says that a table has no versio column; in Columns that is
// "". An absent or null versio keeps the default column name.
func TestVersioSpellings(t *testing.T) {
	tests := []struct {
		columns string
		want    string
	}{
		{"    columns:\n      versio: \"-\"\n", ""},
		{"    columns:\n      versio: '-'\n", ""},
		{"    columns:\n      versio:\n", "versio"},
		{"    columns:\n      versio: ~\n", "versio"},
		{"    columns:\n      versio: version\n", "version"},
		{"", "versio"},
	}
	for _, tt := range tests {
		t.Run(tt.columns, func(t *testing.T) {
			cfg := mustParse(t, minimal+tt.columns, nil)
			if got := cfg.Routes[0].Columns.Versio; got != tt.want {
				t.Errorf("Versio = %q, want %q", got, tt.want)
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

// TestSoftMemoryLimit: by default 6 × max_in_flight_bytes, and room for a
// span per record in flight and per place in the export queue with
// tracing on; an explicit pipeline.memory_limit wins; a negative one sets
// none.
func TestSoftMemoryLimit(t *testing.T) {
	traced := config.Default()
	traced.Tracing.Endpoint = "http://collector:4318"
	for _, c := range []struct {
		p       config.Pipeline
		tracing config.Tracing
		limit   int64
		ok      bool
	}{
		{config.Default().Pipeline, config.Default().Tracing, 24 << 20, true},
		{config.Pipeline{MaxInFlightBytes: 16 << 20}, config.Tracing{}, 96 << 20, true},
		{config.Pipeline{MaxInFlightBytes: 4 << 20, MemoryLimit: 64 << 20}, traced.Tracing, 64 << 20, true},
		{config.Pipeline{MaxInFlightBytes: 4 << 20, MemoryLimit: -1}, config.Tracing{}, 0, false},
		{traced.Pipeline, traced.Tracing, 24<<20 + (1500+2048)*config.SpanMemory, true},
	} {
		cfg := config.Config{Pipeline: c.p, Tracing: c.tracing}
		if limit, ok := cfg.SoftMemoryLimit(); limit != c.limit || ok != c.ok {
			t.Errorf("%+v %+v: got %d %v, want %d %v", c.p, c.tracing, limit, ok, c.limit, c.ok)
		}
	}
}

// TestTracingHeaderFiles (issue 35, item 5): a header's value from a file
// (a bearer token in a mounted secret), as password_file; the same header
// in both forms is refused, and an error names the file, never the value.
func TestTracingHeaderFiles(t *testing.T) {
	files := map[string]string{"/run/secrets/otlp": "Bearer t0k3n\n"}
	read := func(name string) ([]byte, error) {
		if v, ok := files[name]; ok {
			return []byte(v), nil
		}
		return nil, os.ErrNotExist
	}
	yml := minimal + "tracing:\n  endpoint: https://collector:4318\n  headers: {x-team: outboxd}\n  header_files: {authorization: /run/secrets/otlp}\n"
	cfg, err := config.Parse([]byte(yml), nil, read)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tracing.Headers["authorization"] != "Bearer t0k3n" || cfg.Tracing.Headers["x-team"] != "outboxd" {
		t.Errorf("headers %v", cfg.Tracing.Headers)
	}
	both := minimal + "tracing:\n  endpoint: https://collector:4318\n  headers: {authorization: x}\n  header_files: {authorization: /run/secrets/otlp}\n"
	if _, err := config.Parse([]byte(both), nil, read); err == nil || !strings.Contains(err.Error(), "keep one") {
		t.Errorf("a header in both forms: %v", err)
	}
	missing := minimal + "tracing:\n  endpoint: https://collector:4318\n  header_files: {authorization: /run/secrets/none}\n"
	if _, err := config.Parse([]byte(missing), nil, read); err == nil || !strings.Contains(err.Error(), "tracing.header_files.authorization") {
		t.Errorf("a missing header file: %v", err)
	}
}
