package config_test

import (
	"strings"
	"testing"

	"github.com/outboxd/outboxd/config"
)

func TestValidateErrors(t *testing.T) {
	tests := []struct {
		name    string
		yml     string
		wantErr []string
	}{
		{"tls keys without enable", strings.Replace(minimal, "kafka:\n", "kafka:\n  tls:\n    ca_file: /ca.pem\n", 1),
			[]string{`kafka.tls.enable: false, but other kafka.tls keys are set`}},
		{"client cert without key", strings.Replace(minimal, "kafka:\n", "kafka:\n  tls:\n    enable: true\n    cert_file: /c.pem\n", 1),
			[]string{`line 9: kafka.tls.cert_file: cert_file and key_file go together`}},
		{"tls 1.1", strings.Replace(minimal, "kafka:\n", "kafka:\n  tls:\n    enable: true\n    min_version: \"1.1\"\n", 1),
			[]string{`line 9: kafka.tls.min_version: "1.1" is not one of 1.2, 1.3`}},
		{"insecure with a CA", strings.Replace(minimal, "kafka:\n", "kafka:\n  tls:\n    enable: true\n    ca_file: /ca.pem\n    insecure_skip_verify: true\n", 1),
			[]string{`kafka.tls.insecure_skip_verify: true together with ca_file`}},
		{"sasl credentials without a mechanism", strings.Replace(minimal, "kafka:\n", "kafka:\n  sasl:\n    username: u\n", 1),
			[]string{`kafka.sasl.mechanism: required when kafka.sasl has credentials`}},
		{"unknown sasl mechanism", strings.Replace(minimal, "kafka:\n", "kafka:\n  sasl:\n    mechanism: GSSAPI\n    username: u\n    password: p\n", 1),
			[]string{`line 8: kafka.sasl.mechanism: "GSSAPI" is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, AWS_MSK_IAM`}},
		{"msk iam with a password and no tls", strings.Replace(minimal, "kafka:\n", "kafka:\n  sasl:\n    mechanism: AWS_MSK_IAM\n    password: p\n", 1),
			[]string{`kafka.sasl.username: not used with AWS_MSK_IAM`, `kafka.tls.enable: AWS_MSK_IAM needs TLS`}},
		{"sasl without username and password", strings.Replace(minimal, "kafka:\n", "kafka:\n  sasl:\n    mechanism: SCRAM-SHA-512\n", 1),
			[]string{`kafka.sasl.username: required`, `kafka.sasl.password: required`}},
		{"postgres tls mode", strings.Replace(minimal, "postgres:\n", "postgres:\n  tls:\n    mode: strict\n", 1),
			[]string{`line 4: postgres.tls.mode: "strict" is not one of disable, allow, prefer, require, verify-ca, verify-full`}},
		{"bad partitioner", strings.Replace(minimal, "kafka:\n", "kafka:\n  partitioner: fnv\n", 1),
			[]string{`line 7: kafka.partitioner: "fnv" is not one of murmur2, crc32`}},
		{"bad partition change policy", strings.Replace(minimal, "kafka:\n", "kafka:\n  on_partition_change: rehash\n", 1),
			[]string{`line 7: kafka.on_partition_change: "rehash" is not one of follow, stop`}},
		{"idempotence not a boolean", strings.Replace(minimal, "kafka:\n", "kafka:\n  idempotence: maybe\n", 1),
			[]string{`line 7: kafka.idempotence: expected true or false, got "maybe"`}},
		{"bad compression", strings.Replace(minimal, "kafka:\n", "kafka:\n  compression: brotli\n", 1),
			[]string{`line 7: kafka.compression: "brotli"`}},
		{"bad log level", minimal + "log:\n  level: verbose\n",
			[]string{`line 12: log.level: "verbose"`}},
		{"bad log format", minimal + "log:\n  format: xml\n",
			[]string{`line 12: log.format: "xml"`}},
		{"tracing endpoint not a URL", minimal + "tracing:\n  endpoint: otel-collector:4318\n",
			[]string{`line 12: tracing.endpoint: must be the OTLP/HTTP receiver's URL, e.g. http://collector:4318, got "otel-collector:4318"`}},
		{"tracing ca_file over http", minimal + "tracing:\n  endpoint: http://c:4318\n  ca_file: /ca.pem\n",
			[]string{`line 13: tracing.ca_file: is for an https endpoint`}},
		{"tracing ratio out of range", minimal + "tracing:\n  endpoint: http://c:4318\n  sample_ratio: 1.5\n",
			[]string{`line 13: tracing.sample_ratio: must be between 0 and 1, got 1.5`}},
		{"tracing ratio not a number", minimal + "tracing:\n  endpoint: http://c:4318\n  sample_ratio: half\n",
			[]string{`line 13: tracing.sample_ratio: expected a number, got "half"`}},
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
		{"dash only for versio and publicat_en", minimal + "    columns:\n      creat_en: \"-\"\n",
			[]string{`line 12: routes[0].columns.creat_en: "-" (no such column) is allowed only for versio and publicat_en`}},
		{"empty publicat_en is not the spelling of no column", minimal + "    columns:\n      publicat_en: \"\"\n",
			[]string{`line 12: routes[0].columns.publicat_en: column name must not be empty (write "-" if the table has no publicat_en column)`}},
		{"mark_published without a publicat_en column", strings.Replace(minimal+"    columns:\n      publicat_en: \"-\"\n", "postgres:\n", "postgres:\n  mark_published: true\n", 1),
			[]string{`line 13: routes[0].columns.publicat_en: postgres.mark_published is true, but the table has no publicat_en column`}},
		{"unknown snapshot", strings.Replace(minimal, "postgres:\n", "postgres:\n  snapshot: all\n", 1),
			[]string{`line 3: postgres.snapshot: "all" is not one of pending, none`}},
		{"negative retention age", minimal + "retention:\n  max_age: -1h\n",
			[]string{`line 12: retention.max_age: must be >= 0 (0 turns retention off), got -1h0m0s`}},
		{"retention on with bad pacing", minimal + "retention:\n  max_age: 168h\n  interval: 0s\n  batch_size: 0\n",
			[]string{`line 13: retention.interval: must be a positive duration, got 0s`, `line 14: retention.batch_size: must be > 0, got 0`}},
		{"a registry schema on the envelope", minimal + "    schema: {registry: \"http://r:8081\"}\n",
			[]string{`line 11: routes[0].schema: the schema is carrega's: it needs value: payload`}},
		{"thrift", minimal + "    value: payload\n    schema: {registry: \"http://r:8081\", format: thrift}\n",
			[]string{`routes[0].schema.format: must be json_schema, avro or protobuf, got "thrift"`}},
		{"a registered key beside key_converter", minimal + "    value: payload\n    key_converter: json\n    schema: {registry: \"http://r:8081\", key: registered}\n",
			[]string{`routes[0].schema.key: registered and key_converter: json both write the key`}},
		{"a key of another kind", minimal + "    value: payload\n    schema: {registry: \"http://r:8081\", key: avro}\n",
			[]string{`routes[0].schema.key: "avro" is not one of string, registered`}},
		{"subject by topic with a template", strings.Replace(minimal, "topic: comandes.esdeveniments", "topic: \"{agregat}.ev\"", 1) + "    value: payload\n    schema: {registry: \"http://r:8081\"}\n",
			[]string{`routes[0].schema.subject_strategy: topic names the subject <topic>-value, and the topic is a template`}},
		{"record strategy without schemas", minimal + "    value: payload\n    schema: {registry: \"http://r:8081\", subject_strategy: record}\n",
			[]string{`routes[0].schema.schemas: required with subject_strategy record`}},
		{"schema keys without a registry", minimal + "    value: payload\n    schema: {auto_register: true}\n",
			[]string{`routes[0].schema.registry: required`}},
		{"a schema file that cannot be read", minimal + "    value: payload\n    schema:\n      registry: \"http://r:8081\"\n      schemas:\n        comanda.creada: /nope/comanda.json\n",
			[]string{`line 15: routes[0].schema.schemas.comanda.creada: /nope/comanda.json`}},
		{"retention in an unknown mode", minimal + "retention:\n  max_age: 168h\n  mode: truncate\n",
			[]string{`line 13: retention.mode: must be delete or drop_partitions, got "truncate"`}},
		{"partition drops without a lock timeout", minimal + "retention:\n  max_age: 168h\n  mode: drop_partitions\n  lock_timeout: 0s\n  batch_size: 0\n",
			[]string{`line 14: retention.lock_timeout: must be a positive duration, got 0s`}},
		{"retention on a table without creat_en", minimal + "    value: payload\n    columns:\n      creat_en: \"-\"\nretention:\n  max_age: 168h\n",
			[]string{`line 13: routes[0].columns.creat_en: retention.max_age is set, but public.outbox has no creat_en column ("-")`}},
		{"empty versio is not the spelling of no column", minimal + "    columns:\n      versio: \"\"\n",
			[]string{`line 12: routes[0].columns.versio: column name must not be empty (write "-" if the table has no version column)`}},
		{"bad slot", strings.Replace(minimal, "slot: outboxd_comandes", "slot: Outboxd-Comandes", 1),
			[]string{`line 4: postgres.slot: "Outboxd-Comandes" is not a valid slot name`}},
		{"bad slot table", strings.Replace(minimal, "slot: outboxd_comandes", "slot: outboxd_comandes\n  slot_table: outboxd_slots", 1),
			[]string{`line 5: postgres.slot_table: "outboxd_slots": must be schema.table`}},
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
			_, err := config.Parse([]byte(tt.yml), env(nil), nil)
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
	_, err := config.Parse([]byte(yml), env(nil), nil)
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
		{"dash for versio is YAML only", func(c *config.Config) { c.Routes[0].Columns.Versio = "-" },
			[]string{`routes[0].columns.versio: "-" is the YAML spelling of no such column; in Columns it is ""`}},
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
