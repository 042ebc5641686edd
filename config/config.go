// Package config turns an outboxd YAML file into validated plain structs.
//
// The pipeline is: Default() → parse the YAML → expand ${NAME} in each scalar
// value → decode strictly over the defaults (unknown keys, duplicate keys and
// wrong types are errors that name the line) → Validate(). YAML tags live
// only in this package; the rest of outboxd takes the plain structs.
//
// ${NAME} is replaced by the variable's value (an unset variable is an error
// with its line; $$ is a literal $) inside values only: mapping keys and
// comments are never expanded. Because the YAML is parsed first, a value is
// data whatever it holds (quotes, colons, line breaks); an unquoted value
// takes the type YAML gives the text in its place (batch_size: ${N} is an
// integer), an empty one counts as absent. Inside [ ] or { } a reference must
// be quoted, since YAML reads "{" there as a mapping. In postgres.dsn a value
// is written so that the DSN reads as meant whatever it holds (see joinDSN);
// postgres.password and postgres.password_file avoid the question altogether.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"time"

	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/sink"
)

// Config is the whole outboxd configuration.
type Config struct {
	Origen   string   `yaml:"origen"` // service name, the envelope's "origen"
	Postgres Postgres `yaml:"postgres"`
	Kafka    Kafka    `yaml:"kafka"`
	Routes   []Route  `yaml:"routes"`
	Pipeline Pipeline `yaml:"pipeline"`
	// Retention deletes delivered outbox rows older than an age.
	Retention Retention `yaml:"retention"`
	Health    Health    `yaml:"health"`
	Log       Log       `yaml:"log"`
	// Tracing exports a span per record, from its commit to Kafka's
	// acknowledgement, over OTLP.
	Tracing Tracing `yaml:"tracing"`

	// lines maps a field path ("routes[1].topic") to the line of its key in
	// the YAML file. Nil for a Config built in Go.
	lines map[string]int
}

// Postgres is the source database and its replication objects.
type Postgres struct {
	DSN string `yaml:"dsn"` // required
	// Password, when set, replaces the DSN's password. Parse sets it from
	// PasswordFile, when that is set (the two keys exclude each other).
	Password string `yaml:"password"`
	// PasswordFile names the file the password is read from at load time,
	// one trailing newline dropped: a Kubernetes secret mounted as a file.
	PasswordFile      string `yaml:"password_file"`
	Slot              string `yaml:"slot"`               // required, ^[a-z0-9_]{1,63}$
	Publication       string `yaml:"publication"`        // required
	CreateSlot        bool   `yaml:"create_slot"`        // create the slot at start when absent
	CreatePublication bool   `yaml:"create_publication"` // create the publication at start when absent
	// SlotTable is the table (schema.table) where outboxd records the slots
	// it has seen and which rows each vouches for (catalog.SlotRecord).
	SlotTable string `yaml:"slot_table"`
	// FailoverSlot makes the slot a failover slot where the server has them
	// (PostgreSQL 17+): created with FAILOVER, or altered to it, so that
	// standbys with sync_replication_slots keep a copy (ignored before 17).
	FailoverSlot       bool          `yaml:"failover_slot"`
	StatusInterval     time.Duration `yaml:"status_interval"`      // standby status while data flows
	IdleStatusInterval time.Duration `yaml:"idle_status_interval"` // standby status at least this often
	ConnectTimeout     time.Duration `yaml:"connect_timeout"`
	StandbyRetry       time.Duration `yaml:"standby_retry"` // retry interval while another instance holds the slot
	// ReceiveTimeout: no message from the server for this long while
	// reading means the connection is presumed dead (a status asking for
	// a reply is sent at half of it).
	ReceiveTimeout time.Duration `yaml:"receive_timeout"`
	// TLS, when set, overrides the DSN's sslmode, sslrootcert, sslcert and
	// sslkey.
	TLS PostgresTLS `yaml:"tls"`
	// Snapshot says what outboxd publishes from the table when it creates
	// the slot: SnapshotPending (the rows the slot's exported snapshot sees
	// with publicat_en NULL, before streaming) or SnapshotNone.
	Snapshot string `yaml:"snapshot"`
	// MarkPublished sets publicat_en on each row once Kafka acknowledged
	// its record (and before the slot passes it).
	MarkPublished bool `yaml:"mark_published"`
	// Streaming asks PostgreSQL 14+ to stream large transactions before
	// their commit (pgoutput protocol version 2, streaming 'on') instead
	// of holding them, and every later commit, until then.
	Streaming bool `yaml:"streaming"`
}

// Postgres.Snapshot values.
const (
	SnapshotPending = "pending"
	SnapshotNone    = "none"
)

// PostgresTLS is libpq's TLS settings under names that match kafka.tls.
type PostgresTLS struct {
	Mode     string `yaml:"mode"`      // sslmode: disable ... verify-full
	CAFile   string `yaml:"ca_file"`   // sslrootcert
	CertFile string `yaml:"cert_file"` // sslcert (client certificate)
	KeyFile  string `yaml:"key_file"`  // sslkey
}

// Kafka is the destination cluster and producer settings.
type Kafka struct {
	Brokers      []string      `yaml:"brokers"`     // required, each host:port
	Partitioner  string        `yaml:"partitioner"` // sink.Partitioners: murmur2 | crc32
	Compression  string        `yaml:"compression"` // sink.Compressions: none | gzip | snappy | lz4 | zstd
	Linger       time.Duration `yaml:"linger"`
	BatchSize    int           `yaml:"batch_size"`  // messages
	BatchBytes   int64         `yaml:"batch_bytes"` // bytes
	MaxAttempts  int           `yaml:"max_attempts"`
	WriteTimeout time.Duration `yaml:"write_timeout"`
	ClientID     string        `yaml:"client_id"`
	// DeliveryTimeout bounds how long records may wait for an
	// acknowledgement before the broker is presumed unreachable and the
	// session restarts (replaying from the slot).
	DeliveryTimeout time.Duration `yaml:"delivery_timeout"`
	// OnPartitionChange: follow | stop, when a topic's partition count
	// changes while outboxd produces to it (sink.Config).
	OnPartitionChange string `yaml:"on_partition_change"`
	// Idempotence: the idempotent producer (sink.Config): retries never
	// duplicate; false for brokers or principals that cannot.
	Idempotence bool `yaml:"idempotence"`
	// Deduplicate: after a restart, records a partition already holds are
	// not produced again (sink.Config.Stream; needs Idempotence).
	Deduplicate bool `yaml:"deduplicate"`
	// StreamKeyFile holds the key of the MAC that makes a record's
	// outboxd.stream header outboxd's (sink.LoadStreamKey): made there at
	// the first start when absent; the instances of a slot share it. A
	// relative path is taken from the configuration file's directory (Load);
	// "": a key in memory, so nothing an earlier process produced proves a
	// position (duplicates after a restart, never a loss).
	StreamKeyFile string `yaml:"stream_key_file"`
	// Transactions: records go out in Kafka transactions (needs
	// Idempotence), acknowledged once committed, at most
	// TransactionInterval after their transaction began; an instance with
	// the same TransactionalID (default outboxd-<system id>-<slot>) is
	// fenced. For read_committed consumers.
	Transactions        bool          `yaml:"transactions"`
	TransactionalID     string        `yaml:"transactional_id"`
	TransactionInterval time.Duration `yaml:"transaction_interval"`
	TLS                 KafkaTLS      `yaml:"tls"`
	SASL                KafkaSASL     `yaml:"sasl"`
}

// KafkaTLS secures every connection to the brokers.
type KafkaTLS struct {
	Enable     bool   `yaml:"enable"`
	CAFile     string `yaml:"ca_file"`     // "": the system's trusted roots
	CertFile   string `yaml:"cert_file"`   // client certificate (mTLS), with key_file
	KeyFile    string `yaml:"key_file"`    // its private key
	ServerName string `yaml:"server_name"` // "": the broker's host name
	MinVersion string `yaml:"min_version"` // 1.2 (default) or 1.3
	// InsecureSkipVerify accepts any certificate; logged as a warning at
	// every start. For a throwaway cluster only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// KafkaSASL authenticates every connection to the brokers.
type KafkaSASL struct {
	Mechanism string `yaml:"mechanism"` // "" (none), PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, AWS_MSK_IAM
	Username  string `yaml:"username"`
	// AWSRegion is the MSK cluster's region for AWS_MSK_IAM ("": the AWS
	// SDK's own, from AWS_REGION or the shared config).
	AWSRegion string `yaml:"aws_region"`
	// Password, or PasswordFile (read at load time, one trailing newline
	// dropped): the two exclude each other.
	Password     string `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
}

// Route sends the changes of one source, an outbox table or the logical
// messages of one prefix, to Kafka: one record per change it takes. A table
// may have several routes: one without a filter takes every row, the others
// the rows their filters match (docs/routing.md). Route is the file's form;
// the rest of outboxd reads the routes as Config.Routing builds them.
type Route struct {
	// Table is "schema.table" in SQL identifier syntax: unquoted names are
	// lowercase, a quoted one ("Vendes", "Outbox.Events") is taken as it
	// is. Schema and Name are the two names, unquoted.
	Table  string `yaml:"table"`
	Schema string `yaml:"-"` // derived from Table
	Name   string `yaml:"-"` // derived from Table
	// Message, instead of Table, routes the transactional logical
	// messages written with pg_logical_emit_message(true, Message, ...).
	Message string `yaml:"message"`
	// Preset: "" (the contract's record, km0) or "debezium" (Debezium's
	// outbox EventRouter: its columns, topic and record).
	Preset string `yaml:"preset"`
	// Topic is a Kafka topic name or a template of {column} placeholders;
	// TopicFallback takes the rows whose rendered name is not valid.
	Topic         string `yaml:"topic"`
	TopicFallback string `yaml:"topic_fallback"`
	// Filter: the route takes only the rows matching every condition.
	Filter Match `yaml:"filter"`
	// Overrides: the first matching one sends the row to its topic, or
	// drops it on purpose.
	Overrides []Override `yaml:"overrides"`
	Columns   Columns    `yaml:"columns"` // column names in the outbox table
	// Value: "" (the envelope), "payload" (the payload column alone) or
	// "cloudevents" (a CloudEvent, shaped by CloudEvents).
	Value       string      `yaml:"value"`
	CloudEvents CloudEvents `yaml:"cloudevents"`
	// Registry writes the value in a schema registry's wire format, after
	// validating it against its schema (off while Registry.URL is "").
	Registry SchemaRegistry `yaml:"schema"`
	// KeyConverter and ValueConverter: "" (string: the text as it is) or
	// "json" (a JSON string, as Kafka Connect's JsonConverter writes one).
	KeyConverter   string  `yaml:"key_converter"`
	ValueConverter string  `yaml:"value_converter"`
	Fields         []Field `yaml:"fields"` // more columns, into headers or the envelope
	Trace          Trace   `yaml:"trace"`
	// PositionHeaders adds outboxd.commit_lsn and outboxd.txn_index.
	PositionHeaders bool `yaml:"position_headers"`
	// Timestamp names the column that becomes the record's timestamp;
	// "": the time it is produced.
	Timestamp string `yaml:"timestamp"`
	// OnError says what a row that cannot become a record does: "stop"
	// (default) stops outboxd with the error; "dead_letter" writes it to
	// DeadLetterTopic and goes on.
	OnError         string `yaml:"on_error"`
	DeadLetterTopic string `yaml:"dead_letter_topic"`
}

// CloudEvents is the CloudEvent a route with value: cloudevents writes:
// its content mode (binary: ce_ headers and carrega as the value;
// structured: the event as JSON) and its source attribute ({origen}: the
// service's name).
type CloudEvents struct {
	Mode   string `yaml:"mode"`   // binary (default) | structured
	Source string `yaml:"source"` // default /km0/{origen}
}

// SchemaRegistry is a route's schema registry: its URL (Confluent's API, or
// Apicurio's /apis/ccompat/v7), the format, how subjects are named, and the
// schemas: a file per tipus (or tipus/versio), registered at start with
// AutoRegister, else looked up; none: the subject's latest version (or
// Version) for every row.
type SchemaRegistry struct {
	URL             string            `yaml:"registry"`
	Format          string            `yaml:"format"`           // json_schema | avro | protobuf
	SubjectStrategy string            `yaml:"subject_strategy"` // topic (default) | record | topic_record
	AutoRegister    bool              `yaml:"auto_register"`
	Schemas         map[string]string `yaml:"schemas"` // tipus[/versio]: file
	Version         int               `yaml:"version"` // without schemas: 0 the latest
	Key             string            `yaml:"key"`     // string (default) | registered: under <topic>-key
	Username        string            `yaml:"username"`
	Password        string            `yaml:"password"`
	PasswordFile    string            `yaml:"password_file"`
	CAFile          string            `yaml:"ca_file"`
	// Texts: each of Schemas' files as read at load time.
	Texts map[string]string `yaml:"-"`
}

// Match is a condition on a row, written as a mapping of column names to a
// value or a list of values: every column holds one of its values (as
// PostgreSQL prints it; NULL never matches).
type Match []Condition

// Condition is one column of a Match.
type Condition struct {
	Column string
	Values []string
}

// Override sends the rows matching When to Topic, or drops them.
type Override struct {
	When  Match  `yaml:"when"`
	Topic string `yaml:"topic"` // a topic or a template
	Drop  bool   `yaml:"drop"`
}

// Field places one more column into a header or into the envelope, under a
// name: exactly one of Header and Envelope.
type Field struct {
	Column   string `yaml:"column"`
	Header   string `yaml:"header"`
	Envelope string `yaml:"envelope"`
}

// Trace names the columns of the W3C trace context: traceparent and
// tracestate, or span_context (a serialized java.util.Properties holding
// them, Debezium's tracingspancontext).
type Trace struct {
	Traceparent string `yaml:"traceparent"`
	Tracestate  string `yaml:"tracestate"`
	SpanContext string `yaml:"span_context"`
	// Optional: the column may be missing (the Debezium preset's default).
	Optional bool `yaml:"-"`
}

// Columns names the columns of an outbox table (or the members of a
// logical message's JSON): envelope.Columns in the file's form (the two
// convert into each other).
type Columns struct {
	ID        string `yaml:"id"`
	AgregatID string `yaml:"agregat_id"`
	Tipus     string `yaml:"tipus"`
	Versio    string `yaml:"versio"` // "": no such column, versio is always 1 (YAML: "-")
	Carrega   string `yaml:"carrega"`
	// CreatEn "": none (YAML: "-"), only for a message route (data_ms is
	// the commit time) or with value: payload.
	CreatEn string `yaml:"creat_en"`
	// PublicatEn is the column the polling relay set once it published a
	// row: NULL means pending. "": the table has none (YAML: "-").
	PublicatEn string `yaml:"publicat_en"`
}

// Route.OnError values.
const (
	OnErrorStop       = "stop"
	OnErrorDeadLetter = "dead_letter"
)

// Pipeline bounds the work in flight and paces retries and shutdown.
type Pipeline struct {
	MaxInFlightEvents int   `yaml:"max_in_flight_events"`
	MaxInFlightBytes  int64 `yaml:"max_in_flight_bytes"`
	// MemoryLimit is the Go runtime's soft memory limit, in bytes: 0 (the
	// default) derives it from MaxInFlightBytes (MemoryLimit method), a
	// negative value sets none. The GOMEMLIMIT environment variable, when
	// set, wins.
	MemoryLimit     int64         `yaml:"memory_limit"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	BackoffMin      time.Duration `yaml:"backoff_min"`
	BackoffMax      time.Duration `yaml:"backoff_max"`
	// SpillDir is where the changes of a streamed transaction wait for its
	// commit beyond a small buffer ("": the system's temporary directory).
	SpillDir string `yaml:"spill_dir"`
}

// SoftMemoryLimit is the soft memory limit outboxd sets on the Go runtime:
// pipeline.memory_limit when positive, none when negative, and by default
// 6 × max_in_flight_bytes (24 MiB with the defaults): the records in
// flight live once in the batch buffers, and the rest of outboxd takes a
// few MiB, so the garbage collector works harder only as the heap nears
// that, instead of letting it grow to twice what is live
// (docs/reports/PERFORMANCE.md, issue 15). With tracing on, the spans that
// may be held besides (one per record in flight, and the export queue)
// add SpanMemory each: without that room the collector would run all the
// time while the queue is full.
func (c Config) SoftMemoryLimit() (int64, bool) {
	p := c.Pipeline
	switch {
	case p.MemoryLimit > 0:
		return p.MemoryLimit, true
	case p.MemoryLimit < 0:
		return 0, false
	}
	limit := 6 * p.MaxInFlightBytes
	if c.Tracing.Endpoint != "" {
		limit += int64(p.MaxInFlightEvents+c.Tracing.QueueSize) * SpanMemory
	}
	return limit, true
}

// SpanMemory is about what one span holds while it waits (its attributes,
// the SDK's record of it), rounded up.
const SpanMemory = 2 << 10

// Retention is the optional job that deletes outbox rows older than MaxAge
// (by creat_en) once the slot has confirmed them: small batches, every
// Interval, each waiting at most ConfirmTimeout for the slot.
//
// Mode drop_partitions drops a partitioned outbox's partitions whose whole
// range is older than MaxAge instead, each once the slot has confirmed its
// rows, waiting at most LockTimeout for a lock.
type Retention struct {
	Mode           string        `yaml:"mode"`    // delete | drop_partitions
	MaxAge         time.Duration `yaml:"max_age"` // 0: off
	Interval       time.Duration `yaml:"interval"`
	BatchSize      int           `yaml:"batch_size"`
	ConfirmTimeout time.Duration `yaml:"confirm_timeout"`
	LockTimeout    time.Duration `yaml:"lock_timeout"`
}

// The key's forms with a schema registry (routes[].schema.key).
const (
	KeyString     = "string"
	KeyRegistered = "registered"
)

// The retention modes.
const (
	RetentionDelete         = "delete"
	RetentionDropPartitions = "drop_partitions"
)

// Health is the HTTP server for /healthz /readyz /status /metrics.
type Health struct {
	Listen string `yaml:"listen"` // "" disables the server
	// PollInterval is how often the slot (pg_replication_slots) and the
	// brokers are checked for /status, /readyz and /metrics.
	PollInterval time.Duration `yaml:"poll_interval"`
	// MaxLag and MaxRetainedWALBytes turn readiness off when crossed; 0
	// disables the check.
	MaxLag              time.Duration `yaml:"max_lag"`
	MaxRetainedWALBytes int64         `yaml:"max_retained_wal_bytes"`
	// Pprof serves Go's profiler under /debug/pprof/ (off by default).
	Pprof bool `yaml:"pprof"`
}

// Tracing is outboxd's own OpenTelemetry spans: one per record, from its
// transaction's commit to Kafka's acknowledgement, the child of the row's
// traceparent when it has one, exported over OTLP/HTTP in batches. Off
// while Endpoint is empty.
type Tracing struct {
	// Endpoint is the OTLP/HTTP receiver's base URL (http://collector:4318);
	// spans go to its /v1/traces.
	Endpoint string `yaml:"endpoint"`
	// SampleRatio is the share of rows without a traceparent that get a
	// span (0 to 1); a row with one follows its sampled flag.
	SampleRatio float64 `yaml:"sample_ratio"`
	// Propagate puts outboxd's span into the record's traceparent header,
	// so that consumers continue from it (the row's own, unchanged, when
	// false or when the span is not sampled).
	Propagate   bool              `yaml:"propagate"`
	ServiceName string            `yaml:"service_name"`
	Headers     map[string]string `yaml:"headers"` // sent with every export (authorization)
	// HeaderFiles are headers whose value is read from a file at load
	// time (a bearer token from a mounted secret), as password_file is.
	HeaderFiles map[string]string `yaml:"header_files"`
	CAFile      string            `yaml:"ca_file"` // https: the roots that sign the receiver's certificate ("": the system's)
	// QueueSize bounds the spans waiting for export; beyond it spans are
	// dropped (counted), never the records.
	QueueSize int `yaml:"queue_size"`
	// RecordKeys adds each record's key (its agregat_id) and row id to its
	// span (messaging.kafka.message.key, messaging.message.id): off by
	// default, since the tracing backend is not where a service's keys
	// are expected to go.
	RecordKeys bool `yaml:"record_keys"`
}

// Log configures the logger.
type Log struct {
	Level  string `yaml:"level"`  // trace | debug | info | warn | error
	Format string `yaml:"format"` // text | json
}

// Default returns a Config with every default filled in and no routes.
func Default() Config {
	return Config{
		Postgres: Postgres{
			CreateSlot:         true,
			CreatePublication:  true,
			SlotTable:          "public.outboxd_slots",
			FailoverSlot:       true,
			StatusInterval:     100 * time.Millisecond,
			IdleStatusInterval: 10 * time.Second,
			ConnectTimeout:     10 * time.Second,
			StandbyRetry:       2 * time.Second,
			ReceiveTimeout:     30 * time.Second,
			Snapshot:           SnapshotPending,
			Streaming:          true,
		},
		Kafka: Kafka{
			Partitioner:       "murmur2",
			Compression:       "lz4",
			Linger:            5 * time.Millisecond,
			BatchSize:         1000,
			BatchBytes:        1 << 20,
			MaxAttempts:       10,
			WriteTimeout:      10 * time.Second,
			ClientID:          "outboxd",
			DeliveryTimeout:   30 * time.Second,
			OnPartitionChange: sink.PartitionsFollow,
			Idempotence:       true,
			Deduplicate:       true,
			StreamKeyFile:     "outboxd-stream.key",
			// A commit costs a round trip to the coordinator and a marker
			// in every partition of the transaction.
			TransactionInterval: 100 * time.Millisecond,
		},
		Pipeline: Pipeline{
			MaxInFlightEvents: 1500,
			MaxInFlightBytes:  4 << 20,
			ShutdownTimeout:   30 * time.Second,
			BackoffMin:        500 * time.Millisecond,
			BackoffMax:        30 * time.Second,
		},
		Retention: Retention{Mode: RetentionDelete, Interval: time.Minute, BatchSize: 1000, ConfirmTimeout: 30 * time.Second, LockTimeout: 2 * time.Second},
		Health:    Health{Listen: "127.0.0.1:9597", PollInterval: 5 * time.Second, MaxLag: time.Minute, MaxRetainedWALBytes: 1 << 30},
		Log:       Log{Level: "info", Format: "text"},
		Tracing:   Tracing{SampleRatio: 1, Propagate: true, ServiceName: "outboxd", QueueSize: 2048},
	}
}

// DefaultColumns are the column names of the contract's outbox table
// (envelope.DefaultColumns), which a route gets for every column its YAML
// does not name.
func DefaultColumns() Columns { return Columns(envelope.DefaultColumns()) }

// defaultRoute is a route with every default filled in: each routes[] item
// of the YAML is decoded over it.
func defaultRoute() Route {
	return Route{Columns: DefaultColumns(), OnError: OnErrorStop}
}

// Load reads the file at path and parses it with the process environment.
// Errors are prefixed with the path.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	cfg, err := Parse(data, os.LookupEnv, os.ReadFile)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	if k := cfg.Kafka.StreamKeyFile; k != "" && !filepath.IsAbs(k) {
		// Beside the file, whatever the working directory: the instances
		// started from one configuration share one key.
		cfg.Kafka.StreamKeyFile = filepath.Join(filepath.Dir(path), k)
	}
	return cfg, nil
}

// Parse parses the YAML, expands ${NAME} in its values with lookupEnv (a nil
// lookupEnv defines no variable), decodes it strictly over Default(), derives
// each route's Schema and Name (and versio "-" becomes ""), reads
// postgres.password_file with readFile (Load passes os.ReadFile; a nil
// readFile reads no file), and validates. It touches no global state but
// through these two functions and what pgconn reads to check the DSN (see
// Postgres.ConnConfig). On error the Config is the zero value and the error
// lists every problem found.
func Parse(data []byte, lookupEnv func(string) (string, bool), readFile func(string) ([]byte, error)) (Config, error) {
	if lookupEnv == nil {
		lookupEnv = func(string) (string, bool) { return "", false }
	}
	root, err := parseDocument(data)
	if err != nil {
		return Config{}, err
	}
	if errs := expandTree(root, "", lookupEnv); len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}

	cfg := Default()
	d := decoder{lines: map[string]int{}}
	d.decode(root, reflect.ValueOf(&cfg).Elem(), "")
	if d.aliased > maxAliased {
		return Config{}, errors.Join(d.errs...) // what follows would judge a half-decoded file
	}
	cfg.lines = d.lines
	errs := append(d.errs, fromYAML(&cfg)...)
	for _, secret := range []struct {
		fileField, file, passwordField string
		password                       *string
	}{
		{"postgres.password_file", cfg.Postgres.PasswordFile, "postgres.password", &cfg.Postgres.Password},
		{"kafka.sasl.password_file", cfg.Kafka.SASL.PasswordFile, "kafka.sasl.password", &cfg.Kafka.SASL.Password},
	} {
		if err := readSecretFile(cfg.lines, secret.fileField, secret.file, secret.passwordField, secret.password, readFile); err != nil {
			errs = append(errs, err)
		}
	}
	for name, file := range cfg.Tracing.HeaderFiles {
		v := cfg.Tracing.Headers[name]
		if err := readSecretFile(cfg.lines, "tracing.header_files."+name, file, "tracing.headers."+name, &v, readFile); err != nil {
			errs = append(errs, err)
			continue
		}
		if cfg.Tracing.Headers == nil {
			cfg.Tracing.Headers = map[string]string{}
		}
		cfg.Tracing.Headers[name] = v
	}
	for i := range cfg.Routes {
		errs = append(errs, cfg.Routes[i].Registry.load(cfg.lines, fmt.Sprintf("routes[%d].schema", i), readFile)...)
	}
	if verr := cfg.Validate(); verr != nil {
		errs = append(errs, verr)
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	return cfg, nil
}

// TransactionalID is the producer's transactional id (kafka.transactions)
// for the database system whose identifier is given:
// kafka.transactional_id, or outboxd-<system id>-<slot>, one per slot of a
// database, so that the instance that takes a slot over fences the one
// that held it.
func (c Config) TransactionalID(system string) string {
	if c.Kafka.TransactionalID != "" {
		return c.Kafka.TransactionalID
	}
	return "outboxd-" + system + "-" + c.Postgres.Slot
}
