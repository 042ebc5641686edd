package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/redact"
	"github.com/outboxd/outboxd/schemareg"
	"github.com/outboxd/outboxd/sink"
)

var (
	slotRe = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
)

// Validate reports every problem in c, joined, each naming the field path and,
// when c came from Parse, the line of that field (or of its nearest enclosing
// key when the field is missing).
func (c Config) Validate() error {
	v := validator{lines: c.lines}
	if c.Origen == "" {
		v.add("origen", "required (the service name, e.g. comandes)")
	}
	v.postgres(c.Postgres)
	v.kafka(c.Kafka)
	m := c.Routing()
	v.routes(c, m)
	for i, r := range c.Routes {
		v.registry(i, r)
		if c.Postgres.MarkPublished && r.Message == "" && r.Columns.PublicatEn == "" {
			v.add(fmt.Sprintf("routes[%d].columns.publicat_en", i), "postgres.mark_published is true, but the table has no publicat_en column (\"-\"): name it, or leave mark_published off")
		}
	}
	v.retention(c.Retention, m)
	v.pipeline(c.Pipeline)
	v.health(c.Health)
	v.tracing(c.Tracing)
	v.oneOf("log.level", c.Log.Level, "trace", "debug", "info", "warn", "error")
	v.oneOf("log.format", c.Log.Format, "text", "json")
	return errors.Join(v.errs...)
}

func (v *validator) postgres(p Postgres) {
	if p.DSN == "" {
		v.add("postgres.dsn", "required")
	} else if _, reason := p.connConfig(); reason != "" {
		v.add("postgres.dsn", "not a valid connection string: %s", reason)
	}
	if p.Slot == "" {
		v.add("postgres.slot", "required")
	} else if !slotRe.MatchString(p.Slot) {
		v.add("postgres.slot", "%q is not a valid slot name (lowercase letters, digits and _; at most 63)", p.Slot)
	}
	if p.Publication == "" {
		v.add("postgres.publication", "required")
	} else if len(p.Publication) > 63 {
		v.add("postgres.publication", "longer than 63 bytes")
	}
	if _, _, err := splitTable(p.SlotTable); err != nil {
		v.add("postgres.slot_table", "%q: %v", p.SlotTable, err)
	}
	v.positive("postgres.status_interval", p.StatusInterval)
	v.positive("postgres.idle_status_interval", p.IdleStatusInterval)
	v.positive("postgres.connect_timeout", p.ConnectTimeout)
	v.positive("postgres.standby_retry", p.StandbyRetry)
	v.positive("postgres.receive_timeout", p.ReceiveTimeout)
	if p.TLS.Mode != "" {
		v.oneOf("postgres.tls.mode", p.TLS.Mode, "disable", "allow", "prefer", "require", "verify-ca", "verify-full")
	}
	if (p.TLS.CertFile == "") != (p.TLS.KeyFile == "") {
		v.add("postgres.tls.cert_file", "cert_file and key_file go together (a client certificate and its key)")
	}
	v.oneOf("postgres.snapshot", p.Snapshot, SnapshotPending, SnapshotNone)
	if p.StatusInterval > 0 && p.IdleStatusInterval > 0 && p.IdleStatusInterval < p.StatusInterval {
		v.add("postgres.idle_status_interval", "%s is shorter than status_interval %s", p.IdleStatusInterval, p.StatusInterval)
	}
}

func (v *validator) kafka(k Kafka) {
	if len(k.Brokers) == 0 {
		v.add("kafka.brokers", "required (a list of host:port)")
	}
	for i, b := range k.Brokers {
		if err := hostPort(b, false); err != nil {
			v.add(fmt.Sprintf("kafka.brokers[%d]", i), "%q: %v", b, err)
		}
	}
	v.oneOf("kafka.partitioner", k.Partitioner, sink.Partitioners()...)
	v.oneOf("kafka.compression", k.Compression, sink.Compressions()...)
	v.oneOf("kafka.on_partition_change", k.OnPartitionChange, sink.PartitionChanges()...)
	v.kafkaSecurity(k)
	v.positive("kafka.linger", k.Linger)
	v.positive("kafka.write_timeout", k.WriteTimeout)
	v.positive("kafka.delivery_timeout", k.DeliveryTimeout)
	if k.Transactions {
		v.positive("kafka.transaction_interval", k.TransactionInterval)
		if !k.Idempotence {
			v.add("kafka.transactions", "needs kafka.idempotence: true (a transactional producer is an idempotent one)")
		}
		if k.TransactionInterval >= k.DeliveryTimeout {
			v.add("kafka.transaction_interval", "%s is not shorter than delivery_timeout %s: records wait for their transaction's commit", k.TransactionInterval, k.DeliveryTimeout)
		}
	}
	if k.BatchSize <= 0 {
		v.add("kafka.batch_size", "must be > 0, got %d", k.BatchSize)
	}
	if k.BatchBytes <= 0 {
		v.add("kafka.batch_bytes", "must be > 0, got %d", k.BatchBytes)
	}
	if k.MaxAttempts <= 0 {
		v.add("kafka.max_attempts", "must be > 0, got %d", k.MaxAttempts)
	}
	if k.ClientID == "" {
		v.add("kafka.client_id", "must not be empty")
	}
}

// retention checks the job, and that each table it prunes has the
// creat_en column it deletes by (its first route's).
func (v *validator) retention(rt Retention, m envelope.Routing) {
	if rt.MaxAge < 0 {
		v.add("retention.max_age", "must be >= 0 (0 turns retention off), got %s", rt.MaxAge)
		return
	}
	if rt.MaxAge == 0 {
		return
	}
	v.positive("retention.interval", rt.Interval)
	v.positive("retention.confirm_timeout", rt.ConfirmTimeout)
	switch rt.Mode {
	case RetentionDelete:
		if rt.BatchSize <= 0 {
			v.add("retention.batch_size", "must be > 0, got %d", rt.BatchSize)
		}
	case RetentionDropPartitions:
		v.positive("retention.lock_timeout", rt.LockTimeout)
	default:
		v.add("retention.mode", "must be %s or %s, got %q", RetentionDelete, RetentionDropPartitions, rt.Mode)
	}
	for _, s := range m.Sources {
		if k := s.Routes[0]; s.Prefix == "" && m.Routes[k].Columns.CreatEn == "" {
			v.add(fmt.Sprintf("routes[%d].columns.creat_en", k), "retention.max_age is set, but %s has no creat_en column (\"-\"): retention deletes rows (or drops partitions) by their creat_en; name the column, or turn retention off (max_age: 0)", s.Table)
		}
	}
}

func (v *validator) pipeline(pl Pipeline) {
	if pl.MaxInFlightEvents <= 0 {
		v.add("pipeline.max_in_flight_events", "must be > 0, got %d", pl.MaxInFlightEvents)
	}
	if pl.MaxInFlightBytes <= 0 {
		v.add("pipeline.max_in_flight_bytes", "must be > 0, got %d", pl.MaxInFlightBytes)
	}
	v.positive("pipeline.shutdown_timeout", pl.ShutdownTimeout)
	v.positive("pipeline.backoff_min", pl.BackoffMin)
	v.positive("pipeline.backoff_max", pl.BackoffMax)
	if pl.BackoffMin > 0 && pl.BackoffMax > 0 && pl.BackoffMax < pl.BackoffMin {
		v.add("pipeline.backoff_max", "%s is shorter than backoff_min %s", pl.BackoffMax, pl.BackoffMin)
	}
}

func (v *validator) health(h Health) {
	if h.Listen != "" {
		if err := hostPort(h.Listen, true); err != nil {
			v.add("health.listen", "%q: %v (or \"\" to disable the server)", h.Listen, err)
		}
	}
	v.positive("health.poll_interval", h.PollInterval)
	if h.MaxLag < 0 {
		v.add("health.max_lag", "must be >= 0 (0 disables the check), got %s", h.MaxLag)
	}
	if h.MaxRetainedWALBytes < 0 {
		v.add("health.max_retained_wal_bytes", "must be >= 0 (0 disables the check), got %d", h.MaxRetainedWALBytes)
	}
}

// hostPort checks host:port; emptyHost allows ":8080" (all interfaces).
func hostPort(s string, emptyHost bool) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return errors.New("want host:port")
	}
	if host == "" && !emptyHost {
		return errors.New("want host:port, the host is empty")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

type validator struct {
	lines map[string]int
	errs  []error
}

// add records a problem with field path, prefixed with the line of the field
// or of its nearest enclosing key that has one.
func (v *validator) add(path, format string, args ...any) {
	msg := path + ": " + fmt.Sprintf(format, args...)
	if line := v.lineOf(path); line > 0 {
		msg = fmt.Sprintf("line %d: %s", line, msg)
	}
	v.errs = append(v.errs, errors.New(msg))
}

func (v *validator) lineOf(path string) int {
	for path != "" {
		if line, ok := v.lines[path]; ok {
			return line
		}
		cut := strings.LastIndexAny(path, ".[")
		if cut < 0 {
			return 0
		}
		path = path[:cut]
	}
	return 0
}

func (v *validator) positive(path string, d time.Duration) {
	if d <= 0 {
		v.add(path, "must be a positive duration, got %s", d)
	}
}

func (v *validator) oneOf(path, got string, allowed ...string) {
	for _, a := range allowed {
		if got == a {
			return
		}
	}
	v.add(path, "%q is not one of %s", got, strings.Join(allowed, ", "))
}

func (v *validator) kafkaSecurity(k Kafka) {
	t := k.TLS
	if !t.Enable && (t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify) {
		v.add("kafka.tls.enable", "false, but other kafka.tls keys are set: set enable: true to use TLS")
	}
	if t.MinVersion != "" {
		v.oneOf("kafka.tls.min_version", t.MinVersion, sink.TLSVersions()...)
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		v.add("kafka.tls.cert_file", "cert_file and key_file go together (a client certificate and its key, for mTLS)")
	}
	if t.InsecureSkipVerify && t.CAFile != "" {
		v.add("kafka.tls.insecure_skip_verify", "true together with ca_file: the CA would not be checked; keep ca_file and drop insecure_skip_verify")
	}
	s := k.SASL
	if s.Mechanism == "" {
		if s.Username != "" || s.Password != "" || s.PasswordFile != "" {
			v.add("kafka.sasl.mechanism", "required when kafka.sasl has credentials (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
		}
		return
	}
	v.oneOf("kafka.sasl.mechanism", s.Mechanism, sink.SASLMechanisms()...)
	if s.Mechanism == sink.SASLAWSMSKIAM {
		// Credentials come from the AWS SDK's chain (IRSA, instance role...).
		if s.Username != "" || s.Password != "" || s.PasswordFile != "" {
			v.add("kafka.sasl.username", "not used with AWS_MSK_IAM: the AWS credentials come from the environment, web identity or instance role")
		}
		if !t.Enable {
			v.add("kafka.tls.enable", "AWS_MSK_IAM needs TLS (MSK's IAM listener is TLS, port 9098): set kafka.tls.enable: true")
		}
		return
	}
	if s.AWSRegion != "" {
		v.add("kafka.sasl.aws_region", "only used with mechanism AWS_MSK_IAM")
	}
	if s.Username == "" {
		v.add("kafka.sasl.username", "required with kafka.sasl.mechanism")
	}
	if s.Password == "" && s.PasswordFile == "" {
		v.add("kafka.sasl.password", "required with kafka.sasl.mechanism (or password_file)")
	}
}

// registry checks a route's schema registry settings: what the wire format
// can wrap (a payload, or a binary CloudEvent's data) and the subjects it
// can name.
func (v *validator) registry(i int, r Route) {
	s := r.Registry
	at := fmt.Sprintf("routes[%d].schema", i)
	if s.URL == "" {
		if s.Format != "" || len(s.Schemas) > 0 || s.AutoRegister || s.SubjectStrategy != "" || s.Key != "" {
			v.add(at+".registry", "required: the schema registry's URL (e.g. http://registry:8081, or Apicurio's http://registry:8080/apis/ccompat/v7)")
		}
		return
	}
	switch s.Format {
	case "", schemareg.FormatJSONSchema, schemareg.FormatAvro, schemareg.FormatProtobuf:
	default:
		v.add(at+".format", "must be json_schema, avro or protobuf, got %q", s.Format)
	}
	if s.SubjectStrategy != "" {
		v.oneOf(at+".subject_strategy", s.SubjectStrategy, schemareg.StrategyTopic, schemareg.StrategyRecord, schemareg.StrategyTopicRecord)
	}
	switch {
	case r.Value == envelope.ValueCloudEvents && r.CloudEvents.Mode == envelope.CEStructured:
		v.add(at, "a structured CloudEvent is JSON of its own: the registry's wire format wraps a binary CloudEvent's data (cloudevents.mode: binary)")
	case r.Value != envelope.ValuePayload && r.Value != envelope.ValueCloudEvents && !(r.Value == "" && r.Preset == envelope.PresetDebezium):
		v.add(at, "the schema is carrega's: it needs value: payload (or value: cloudevents, binary), not the envelope")
	case r.ValueConverter == ConverterJSON:
		v.add(at, "value_converter: json writes the payload as a JSON string, which its schema does not describe")
	}
	for _, f := range r.Fields {
		if f.Envelope != "" {
			v.add(at, "fields with envelope: wrap carrega in an object its schema does not describe; put them in headers")
			break
		}
	}
	if s.Key != "" {
		v.oneOf(at+".key", s.Key, KeyString, KeyRegistered)
	}
	// A subject named after the route's topic needs that one topic: no
	// template, no override to another.
	oneTopic := func(field, template, override string) {
		if template != "" && strings.Contains(r.Topic, "{") {
			v.add(field, "%s", template)
		}
		for k, o := range r.Overrides {
			if o.Topic != "" {
				v.add(fmt.Sprintf("routes[%d].overrides[%d].topic", i, k), "%s", override)
			}
		}
	}
	if s.Key == KeyRegistered {
		template := "a registered key's subject is <topic>-key, and the topic is a template"
		if r.KeyConverter == ConverterJSON {
			v.add(at+".key", "registered and key_converter: json both write the key: choose one")
			template = "" // one problem of the key at a time
		}
		oneTopic(at+".key", template,
			"with schema.key: registered the keys' subject is the route's topic's: an override's topic would get keys under another topic's subject")
	}
	topicStrategy := s.SubjectStrategy == "" || s.SubjectStrategy == schemareg.StrategyTopic
	if topicStrategy {
		oneTopic(at+".subject_strategy", "topic names the subject <topic>-value, and the topic is a template: use record or topic_record (a subject per schema)",
			"with schema.subject_strategy topic the subject is the route's topic's: an override's topic would get records under another topic's subject; use record or topic_record")
	}
	if len(s.Schemas) == 0 && !topicStrategy {
		v.add(at+".schemas", "required with subject_strategy %s: the schemas name their records", s.SubjectStrategy)
	}
	if len(s.Schemas) > 0 && s.Version != 0 {
		v.add(at+".version", "pins the subject's version when no schemas are given; with schemas, each file is its own")
	}
	if s.AutoRegister && len(s.Schemas) == 0 {
		v.add(at+".auto_register", "registers the schemas given in schemas: none is")
	}
}

func (v *validator) tracing(t Tracing) {
	if t.Endpoint == "" {
		return
	}
	u, err := url.Parse(t.Endpoint)
	switch {
	case err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https"):
		v.add("tracing.endpoint", "must be the OTLP/HTTP receiver's URL, e.g. http://collector:4318, got %q", redact.URL(t.Endpoint))
	case u.User != nil:
		v.add("tracing.endpoint", "holds credentials (user info), which the exporter would not send: give them in tracing.headers instead (authorization: \"Basic <base64 of user:password>\", or a bearer token; a header's value may be a ${VAR})")
	case t.CAFile != "" && u.Scheme != "https":
		v.add("tracing.ca_file", "is for an https endpoint; %s is %s", redact.URL(t.Endpoint), u.Scheme)
	}
	if t.SampleRatio < 0 || t.SampleRatio > 1 {
		v.add("tracing.sample_ratio", "must be between 0 and 1, got %g", t.SampleRatio)
	}
	if t.ServiceName == "" {
		v.add("tracing.service_name", "required (the service.name of outboxd's spans)")
	}
	if t.QueueSize < 1 {
		v.add("tracing.queue_size", "must be at least 1, got %d", t.QueueSize)
	}
}
