// Package config turns an outboxd YAML file into validated plain structs.
//
// The pipeline is: Default() → expand ${VAR} in the raw text → decode YAML
// strictly (unknown keys, duplicate keys and wrong types are errors that name
// the line) → Validate(). YAML tags live only in this package; the rest of
// outboxd takes the plain structs.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is the whole outboxd configuration.
type Config struct {
	Origen   string   `yaml:"origen"` // service name, the envelope's "origen"
	Postgres Postgres `yaml:"postgres"`
	Kafka    Kafka    `yaml:"kafka"`
	Routes   []Route  `yaml:"routes"`
	Pipeline Pipeline `yaml:"pipeline"`
	Health   Health   `yaml:"health"`
	Log      Log      `yaml:"log"`

	// lines maps a field path ("routes[1].topic") to the line of its key in
	// the YAML file. Nil for a Config built in Go.
	lines map[string]int
}

// Postgres is the source database and its replication objects.
type Postgres struct {
	DSN                string        `yaml:"dsn"`                  // required
	Slot               string        `yaml:"slot"`                 // required, ^[a-z0-9_]{1,63}$
	Publication        string        `yaml:"publication"`          // required
	CreateSlot         bool          `yaml:"create_slot"`          // create the slot at start when absent
	CreatePublication  bool          `yaml:"create_publication"`   // create the publication at start when absent
	StatusInterval     time.Duration `yaml:"status_interval"`      // standby status while data flows
	IdleStatusInterval time.Duration `yaml:"idle_status_interval"` // standby status at least this often
	ConnectTimeout     time.Duration `yaml:"connect_timeout"`
	StandbyRetry       time.Duration `yaml:"standby_retry"` // retry interval while another instance holds the slot
	// ReceiveTimeout: no message from the server for this long while
	// reading means the connection is presumed dead (a status asking for
	// a reply is sent at half of it).
	ReceiveTimeout time.Duration `yaml:"receive_timeout"`
}

// Kafka is the destination cluster and producer settings.
type Kafka struct {
	Brokers      []string      `yaml:"brokers"`     // required, each host:port
	Partitioner  string        `yaml:"partitioner"` // murmur2 | crc32
	Compression  string        `yaml:"compression"` // none | gzip | snappy | lz4 | zstd
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
}

// Route sends the inserts of one outbox table to one topic.
type Route struct {
	Table   string  `yaml:"table"`   // "schema.table"
	Schema  string  `yaml:"-"`       // derived from Table
	Name    string  `yaml:"-"`       // derived from Table
	Topic   string  `yaml:"topic"`   // Kafka topic name
	Columns Columns `yaml:"columns"` // column names in the outbox table
	// OnError says what a row that cannot become a record does: "stop"
	// (default) stops outboxd with the error; "dead_letter" writes it to
	// DeadLetterTopic and goes on.
	OnError         string `yaml:"on_error"`
	DeadLetterTopic string `yaml:"dead_letter_topic"`
}

// Columns names the columns of an outbox table.
type Columns struct {
	ID        string `yaml:"id"`
	AgregatID string `yaml:"agregat_id"`
	Tipus     string `yaml:"tipus"`
	Versio    string `yaml:"versio"` // NoColumn: no such column, versio is always 1
	Carrega   string `yaml:"carrega"`
	CreatEn   string `yaml:"creat_en"`
}

// Route.OnError values.
const (
	OnErrorStop       = "stop"
	OnErrorDeadLetter = "dead_letter"
)

func validTopic(t string) bool { return topicRe.MatchString(t) && t != "." && t != ".." }

// NoColumn as Columns.Versio means the table has no version column (Debezium
// tables have none) and every event has versio 1.
const NoColumn = "-"

// Pipeline bounds the work in flight and paces retries and shutdown.
type Pipeline struct {
	MaxInFlightEvents int           `yaml:"max_in_flight_events"`
	MaxInFlightBytes  int64         `yaml:"max_in_flight_bytes"`
	ShutdownTimeout   time.Duration `yaml:"shutdown_timeout"`
	BackoffMin        time.Duration `yaml:"backoff_min"`
	BackoffMax        time.Duration `yaml:"backoff_max"`
}

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
			StatusInterval:     100 * time.Millisecond,
			IdleStatusInterval: 10 * time.Second,
			ConnectTimeout:     10 * time.Second,
			StandbyRetry:       2 * time.Second,
			ReceiveTimeout:     30 * time.Second,
		},
		Kafka: Kafka{
			Partitioner:     "murmur2",
			Compression:     "lz4",
			Linger:          5 * time.Millisecond,
			BatchSize:       1000,
			BatchBytes:      1 << 20,
			MaxAttempts:     10,
			WriteTimeout:    10 * time.Second,
			ClientID:        "outboxd",
			DeliveryTimeout: 30 * time.Second,
		},
		Pipeline: Pipeline{
			MaxInFlightEvents: 5000,
			MaxInFlightBytes:  8 << 20,
			ShutdownTimeout:   30 * time.Second,
			BackoffMin:        500 * time.Millisecond,
			BackoffMax:        30 * time.Second,
		},
		Health: Health{Listen: "127.0.0.1:9597", PollInterval: 5 * time.Second, MaxLag: time.Minute, MaxRetainedWALBytes: 1 << 30},
		Log:    Log{Level: "info", Format: "text"},
	}
}

// DefaultColumns returns the column names of the contract's outbox table,
// which a route gets for every column its YAML does not name.
func DefaultColumns() Columns {
	return Columns{
		ID:        "id",
		AgregatID: "agregat_id",
		Tipus:     "tipus",
		Versio:    "versio",
		Carrega:   "carrega",
		CreatEn:   "creat_en",
	}
}

// Load reads the file at path and parses it with the process environment.
// Errors are prefixed with the path.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("load config: %w", err)
	}
	cfg, err := Parse(data, os.LookupEnv)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// Parse expands ${NAME} references with lookupEnv (a nil lookupEnv defines no
// variable), decodes the YAML strictly over Default(), derives each route's
// Schema and Name, and validates. It touches no global state. On error the
// Config is the zero value and the error lists every problem found.
func Parse(data []byte, lookupEnv func(string) (string, bool)) (Config, error) {
	if lookupEnv == nil {
		lookupEnv = func(string) (string, bool) { return "", false }
	}
	expanded, err := expandEnv(data, lookupEnv)
	if err != nil {
		return Config{}, err
	}
	root, err := parseDocument(expanded)
	if err != nil {
		return Config{}, err
	}

	cfg := Default()
	d := decoder{lines: map[string]int{}}
	d.decode(root, reflect.ValueOf(&cfg).Elem(), "")
	cfg.lines = d.lines
	for i := range cfg.Routes {
		r := &cfg.Routes[i]
		if schema, name, ok := splitTable(r.Table); ok {
			r.Schema, r.Name = schema, name
		}
	}

	errs := d.errs
	if verr := cfg.Validate(); verr != nil {
		errs = append(errs, verr)
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	return cfg, nil
}

// ---- ${NAME} expansion ----

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// expandEnv replaces ${NAME} with its value and $$ with $, line by line, so
// that line numbers in later errors still refer to the original file. A value
// containing a line break is rejected: it would shift every later line and
// could inject YAML structure. A $ followed by anything else is kept as is.
func expandEnv(data []byte, lookupEnv func(string) (string, bool)) ([]byte, error) {
	var (
		out  bytes.Buffer
		errs []error
		line = 1
	)
	out.Grow(len(data))
	for i := 0; i < len(data); i++ {
		c := data[i]
		if c == '\n' {
			line++
		}
		if c != '$' || i+1 >= len(data) {
			out.WriteByte(c)
			continue
		}
		switch data[i+1] {
		case '$':
			out.WriteByte('$')
			i++
		case '{':
			end := bytes.IndexByte(data[i+2:], '}')
			nl := bytes.IndexByte(data[i+2:], '\n')
			if end < 0 || (nl >= 0 && nl < end) {
				errs = append(errs, fmt.Errorf("line %d: unterminated variable reference \"${\" (write $$ for a literal $)", line))
				out.WriteByte(c)
				continue
			}
			name := string(data[i+2 : i+2+end])
			i += 2 + end
			if !envName.MatchString(name) {
				errs = append(errs, fmt.Errorf("line %d: invalid variable name %q in ${%s}", line, name, name))
				continue
			}
			val, ok := lookupEnv(name)
			if !ok {
				errs = append(errs, fmt.Errorf("line %d: environment variable %s is not set", line, name))
				continue
			}
			if strings.ContainsAny(val, "\r\n") {
				errs = append(errs, fmt.Errorf("line %d: environment variable %s contains a line break, which is not allowed", line, name))
				continue
			}
			out.WriteString(val)
		default:
			out.WriteByte(c)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out.Bytes(), nil
}

// ---- strict YAML decoding ----

// parseDocument parses exactly one YAML document whose top level is a mapping.
func parseDocument(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty configuration")
		}
		return nil, yamlError(err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, yamlError(err)
	default:
		return nil, fmt.Errorf("line %d: a second YAML document; the configuration must be a single document", extra.Line)
	}
	if len(doc.Content) == 0 {
		return nil, errors.New("empty configuration")
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, errors.New("empty configuration")
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: the top level must be a mapping of keys (origen, postgres, kafka, ...)", root.Line)
	}
	return root, nil
}

// yamlError drops the "yaml: " prefix; the message keeps its "line N:".
func yamlError(err error) error {
	return errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
}

var durationType = reflect.TypeOf(time.Duration(0))

// decoder walks the yaml.Node tree and the target value together, so that
// every problem is reported with its line and field path, all of them at
// once, and the line of every key is remembered for Validate.
type decoder struct {
	lines map[string]int
	errs  []error
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if path != "" {
		msg = path + ": " + msg
	}
	d.errs = append(d.errs, fmt.Errorf("line %d: %s", n.Line, msg))
}

func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // "key:" with no value keeps the default
	}
	if v.Type() == durationType {
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "expected a duration such as \"250ms\" or \"1s\"")
			return
		}
		dur, err := time.ParseDuration(n.Value)
		if err != nil {
			d.fail(n, path, "invalid duration %q (write e.g. \"250ms\", \"1s\", \"2m\")", n.Value)
			return
		}
		v.SetInt(int64(dur))
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		d.decodeStruct(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(n, path, "expected a list")
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			d.lines[p] = item.Line
			elem := s.Index(i)
			if r, ok := elem.Addr().Interface().(*Route); ok {
				r.Columns = DefaultColumns()
				r.OnError = OnErrorStop
			}
			d.decode(item, elem, p)
		}
		v.Set(s)
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int64:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "expected a single value, not a %s", kindName(n.Kind))
			return
		}
		if err := n.Decode(v.Addr().Interface()); err != nil {
			d.fail(n, path, "expected %s, got %q", typeName(v.Kind()), n.Value)
		}
	default:
		// Unreachable for the types of this package.
		d.fail(n, path, "cannot decode into %s", v.Type())
	}
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "expected a mapping of keys, not a %s", kindName(n.Kind))
		return
	}
	fields := map[string]int{}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		tag := t.Field(i).Tag.Get("yaml")
		if tag != "" && tag != "-" {
			fields[tag] = i
		}
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		key := k.Value
		where := ""
		if path != "" {
			where = " in " + path
		}
		if k.Kind != yaml.ScalarNode {
			d.fail(k, "", "keys must be plain names%s", where)
			continue
		}
		if first, dup := seen[key]; dup {
			d.fail(k, "", "duplicate key %q%s (first at line %d)", key, where, first)
			continue
		}
		seen[key] = k.Line
		idx, ok := fields[key]
		if !ok {
			d.fail(k, "", "unknown key %q%s", key, where)
			continue
		}
		p := key
		if path != "" {
			p = path + "." + key
		}
		d.lines[p] = k.Line
		d.decode(val, v.Field(idx), p)
	}
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	default:
		return "single value"
	}
}

func typeName(k reflect.Kind) string {
	switch k {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64:
		return "an integer"
	default:
		return "a string"
	}
}

// ---- validation ----

var (
	slotRe  = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
	identRe = regexp.MustCompile(`^[a-z_][a-z0-9_$]{0,62}$`) // unquoted PostgreSQL identifier
	topicRe = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)
)

// Validate reports every problem in c, joined, each naming the field path and,
// when c came from Parse, the line of that field (or of its nearest enclosing
// key when the field is missing).
func (c Config) Validate() error {
	v := validator{lines: c.lines}

	if c.Origen == "" {
		v.add("origen", "required (the service name, e.g. comandes)")
	}

	p := c.Postgres
	if p.DSN == "" {
		v.add("postgres.dsn", "required")
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
	v.positive("postgres.status_interval", p.StatusInterval)
	v.positive("postgres.idle_status_interval", p.IdleStatusInterval)
	v.positive("postgres.connect_timeout", p.ConnectTimeout)
	v.positive("postgres.standby_retry", p.StandbyRetry)
	v.positive("postgres.receive_timeout", p.ReceiveTimeout)
	if p.StatusInterval > 0 && p.IdleStatusInterval > 0 && p.IdleStatusInterval < p.StatusInterval {
		v.add("postgres.idle_status_interval", "%s is shorter than status_interval %s", p.IdleStatusInterval, p.StatusInterval)
	}

	k := c.Kafka
	if len(k.Brokers) == 0 {
		v.add("kafka.brokers", "required (a list of host:port)")
	}
	for i, b := range k.Brokers {
		if err := hostPort(b, false); err != nil {
			v.add(fmt.Sprintf("kafka.brokers[%d]", i), "%q: %v", b, err)
		}
	}
	v.oneOf("kafka.partitioner", k.Partitioner, "murmur2", "crc32")
	v.oneOf("kafka.compression", k.Compression, "none", "gzip", "snappy", "lz4", "zstd")
	v.positive("kafka.linger", k.Linger)
	v.positive("kafka.write_timeout", k.WriteTimeout)
	v.positive("kafka.delivery_timeout", k.DeliveryTimeout)
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

	if len(c.Routes) == 0 {
		v.add("routes", "at least one route is required")
	}
	tables := map[string]int{}
	for i, r := range c.Routes {
		v.route(i, r, tables)
	}

	pl := c.Pipeline
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

	if c.Health.Listen != "" {
		if err := hostPort(c.Health.Listen, true); err != nil {
			v.add("health.listen", "%q: %v (or \"\" to disable the server)", c.Health.Listen, err)
		}
	}
	v.positive("health.poll_interval", c.Health.PollInterval)
	if c.Health.MaxLag < 0 {
		v.add("health.max_lag", "must be >= 0 (0 disables the check), got %s", c.Health.MaxLag)
	}
	if c.Health.MaxRetainedWALBytes < 0 {
		v.add("health.max_retained_wal_bytes", "must be >= 0 (0 disables the check), got %d", c.Health.MaxRetainedWALBytes)
	}

	v.oneOf("log.level", c.Log.Level, "trace", "debug", "info", "warn", "error")
	v.oneOf("log.format", c.Log.Format, "text", "json")

	return errors.Join(v.errs...)
}

func (v *validator) route(i int, r Route, tables map[string]int) {
	at := func(f string) string { return fmt.Sprintf("routes[%d].%s", i, f) }

	switch schema, name, ok := splitTable(r.Table); {
	case r.Table == "":
		v.add(at("table"), "required (schema.table, e.g. public.outbox)")
	case !ok:
		v.add(at("table"), "%q must be schema.table with unquoted lowercase names, e.g. public.outbox", r.Table)
	default:
		if first, dup := tables[r.Table]; dup {
			v.add(at("table"), "%q is already routed by routes[%d]", r.Table, first)
		} else {
			tables[r.Table] = i
		}
		if r.Schema != schema || r.Name != name {
			v.add(at("table"), "Schema/Name (%q, %q) do not match table %q", r.Schema, r.Name, r.Table)
		}
	}

	switch {
	case r.Topic == "":
		v.add(at("topic"), "required")
	case !validTopic(r.Topic):
		v.add(at("topic"), "%q is not a valid Kafka topic name (letters, digits, '.', '_', '-'; at most 249)", r.Topic)
	}
	switch r.OnError {
	case OnErrorStop:
		if r.DeadLetterTopic != "" {
			v.add(at("dead_letter_topic"), "set, but on_error is %q: set on_error: %s to use it", r.OnError, OnErrorDeadLetter)
		}
	case OnErrorDeadLetter:
		switch {
		case r.DeadLetterTopic == "":
			v.add(at("dead_letter_topic"), "required when on_error is %s", OnErrorDeadLetter)
		case !validTopic(r.DeadLetterTopic):
			v.add(at("dead_letter_topic"), "%q is not a valid Kafka topic name", r.DeadLetterTopic)
		case r.DeadLetterTopic == r.Topic:
			v.add(at("dead_letter_topic"), "must differ from the route's topic")
		}
	default:
		v.add(at("on_error"), "%q is not one of %s, %s", r.OnError, OnErrorStop, OnErrorDeadLetter)
	}

	cols := []struct{ key, val string }{
		{"id", r.Columns.ID},
		{"agregat_id", r.Columns.AgregatID},
		{"tipus", r.Columns.Tipus},
		{"versio", r.Columns.Versio},
		{"carrega", r.Columns.Carrega},
		{"creat_en", r.Columns.CreatEn},
	}
	used := map[string]string{}
	for _, col := range cols {
		path := at("columns." + col.key)
		switch {
		case col.val == "":
			v.add(path, "column name must not be empty")
		case col.val == NoColumn && col.key != "versio":
			v.add(path, "%q (no such column) is allowed only for versio", NoColumn)
		case col.val == NoColumn:
		default:
			if other, dup := used[col.val]; dup {
				v.add(path, "column %q is also used for %s", col.val, other)
			} else {
				used[col.val] = col.key
			}
		}
	}
}

// splitTable splits "schema.table" into its two unquoted identifiers.
func splitTable(t string) (schema, name string, ok bool) {
	schema, name, found := strings.Cut(t, ".")
	if !found || !identRe.MatchString(schema) || !identRe.MatchString(name) {
		return "", "", false
	}
	return schema, name, true
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

// ---- DSN redaction ----

const redacted = "xxxxx"

var (
	kvPassword       = regexp.MustCompile(`\bpassword(\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:[^\s\\]|\\.)+)`)
	urlQueryPassword = regexp.MustCompile(`(password=)[^&#]*`)
)

// RedactedDSN returns the DSN with any password replaced by "xxxxx", for logs.
// It handles the URL form (postgres://u:pw@h/db, and ?password=) and the
// key=value form (password=pw or password='p w').
func (p Postgres) RedactedDSN() string {
	dsn := p.DSN
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return kvPassword.ReplaceAllString(dsn, "password${1}"+redacted)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		// Unparseable: never risk printing the user info.
		scheme, rest, _ := strings.Cut(dsn, "://")
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			rest = redacted + rest[at:]
		}
		rest = urlQueryPassword.ReplaceAllString(rest, "${1}"+redacted)
		return scheme + "://" + rest
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", redacted)
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
