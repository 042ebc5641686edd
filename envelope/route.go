package envelope

// Route sends the changes of one source (a table, or the logical messages
// of one prefix) to Kafka, one record per change it takes. It is the one
// route type: config fills it from the file (Routing), Problems judges
// it, the Router compiles it, and everything that reads the table itself
// (the cut-over snapshot, replay, marks, retention) reads its columns.
type Route struct {
	Schema, Table string // a table route
	Prefix        string // a logical-message route (Table is "")

	// Topic is a topic name or a template with {column} placeholders.
	// TopicFallback, when set, takes the rows whose rendered name is not
	// a valid topic; otherwise such a row is a bad row.
	Topic, TopicFallback string
	// Filter: the route takes only the rows matching every condition.
	Filter []Condition
	// Overrides: the first one matching replaces the topic, or drops the
	// row on purpose.
	Overrides []Override

	Columns Columns
	Preset  string // "" (the contract's record) or PresetDebezium
	Value   string // ValueEnvelope ("" too), ValuePayload or ValueCloudEvents
	// CloudEvents: the CloudEvent's mode and source (ValueCloudEvents).
	CloudEvents CloudEvents
	// Encoder, when set, writes a payload (or a binary CloudEvent's data)
	// in a schema registry's wire format (schemareg.Codec): found at
	// start, not configured here.
	Encoder ValueEncoder
	// KeyEncoder, when set, writes the key in a schema registry's wire
	// format (schemareg.KeyCodec, schema.key: registered).
	KeyEncoder KeyEncoder
	// KeyJSON and ValueJSON write the key and the payload as JSON strings,
	// as Kafka Connect's JsonConverter (schemas.enable=false) does.
	KeyJSON, ValueJSON bool
	Fields             []Field
	Trace              Trace
	// Position adds the headers outboxd.commit_lsn and outboxd.txn_index.
	Position bool
	// Timestamp names the column whose value becomes the record's
	// timestamp; "" leaves the produce time.
	Timestamp string

	// DeadLetterTopic receives the rows that cannot become records; empty
	// means such a row stops outboxd.
	DeadLetterTopic string
}

// ValueEncoder validates a value against the schema of its tipus (and
// versio) and appends its wire form to dst; an error is the row's: why it
// cannot be written, never what it holds. Describe names that schema for a
// binary CloudEvent: its URI in the registry (dataschema) and the media
// type of the data (datacontenttype); nil when the tipus has none (Encode
// refuses the row then).
type ValueEncoder interface {
	Encode(dst, data, tipus []byte, versio int64) ([]byte, error)
	Describe(tipus []byte, versio int64) (dataschema, contentType []byte)
}

// KeyEncoder appends a key's wire form to dst.
type KeyEncoder interface {
	EncodeKey(dst, key []byte) []byte
}

// Columns names the columns a route reads. "" means the table has no such
// column: no versio (every event has versio 1), no creat_en (a payload
// value needs none; a logical message's data_ms is its commit time), no
// publicat_en.
type Columns struct {
	ID, AgregatID, Tipus, Versio, Carrega, CreatEn string
	// PublicatEn is the column the polling relay set once it published a
	// row (NULL: pending): the cut-over snapshot reads it and
	// postgres.mark_published sets it. A record never carries it.
	PublicatEn string
}

// Condition holds when Column's text is one of Values (NULL never does).
type Condition struct {
	Column string
	Values []string
}

// Override replaces a route's topic, or drops the row, when every
// condition of When holds.
type Override struct {
	When  []Condition
	Topic string // a topic or a template
	Drop  bool
}

// Field places a column's value into a header or the value's envelope,
// under a name (exactly one of Header and Envelope is set).
type Field struct {
	Column, Header, Envelope string
}

// Trace names the columns that carry a W3C trace context: Traceparent and
// Tracestate hold the headers' values; SpanContext holds a serialized
// java.util.Properties with them (Debezium's tracingspancontext).
type Trace struct {
	Traceparent, Tracestate, SpanContext string
	// Optional: a missing column means no trace context (the Debezium
	// preset's tracingspancontext is an optional column).
	Optional bool
}

// PresetDebezium is the record of Debezium's outbox EventRouter: header
// id; a NULL key or payload gives a null key or value. The other preset,
// "", is the contract's record: headers tipus and id_esdeveniment; every
// mapped value required.
const PresetDebezium = "debezium"

// Value shapes.
const (
	// ValueEnvelope is the contract's JSON envelope with carrega embedded.
	ValueEnvelope = "envelope"
	// ValuePayload is the payload column alone; with envelope fields, the
	// object {"payload": ..., field: ...} (Debezium's envelope).
	ValuePayload = "payload"
)

// The values Route.Preset and Route.Value take besides "".
var (
	presets = []string{PresetDebezium}
	values  = []string{ValueEnvelope, ValuePayload, ValueCloudEvents}
)

// DefaultColumns are the column names of the contract's outbox table: a
// table route reads them unless it names others.
func DefaultColumns() Columns {
	return Columns{ID: "id", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "carrega", CreatEn: "creat_en", PublicatEn: "publicat_en"}
}

// DebeziumColumns are the column names of Debezium's outbox table (id,
// aggregatetype, aggregateid, type, payload, and an optional timestamp):
// a route with PresetDebezium reads them unless it names others.
func DebeziumColumns() Columns {
	return Columns{ID: "id", AgregatID: "aggregateid", Tipus: "type", Carrega: "payload", CreatEn: "timestamp"}
}

// MessageColumns are the members a logical message's JSON carries by
// default: the envelope's own names, and agregat_id for the key. No
// creat_en: data_ms is the transaction's commit time.
func MessageColumns() Columns {
	return Columns{ID: "id_esdeveniment", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "dades"}
}

// Debezium's defaults for a route with PresetDebezium that leaves them
// unset: the value is the payload alone (ValuePayload),
// route.topic.replacement with route.by.field, and
// tracing.span.context.field (an optional column).
const (
	DebeziumTopic       = "outbox.event.{aggregatetype}"
	DebeziumSpanContext = "tracingspancontext"
)

// NeedsCreatEn: the record needs a creat_en column for its data_ms. A
// message's data_ms is its commit time, and a payload value has no
// data_ms.
func (r *Route) NeedsCreatEn() bool { return r.Prefix == "" && r.Value != ValuePayload }

// headers are the headers every record of the route has (a field may not
// take their names).
func (r *Route) headers() []string {
	hs := []string{HeaderTraceparent, HeaderTracestate, HeaderCommitLSN, HeaderTxnIndex}
	switch {
	case r.Value == ValueCloudEvents:
		return append(hs, ceHeaders...)
	case r.Preset == PresetDebezium:
		return append(hs, HeaderDebeziumID)
	}
	return append(hs, HeaderTipus, HeaderID)
}

// members are the members of the route's value (an envelope field may not
// take their names).
func (r *Route) members() []string {
	if r.Value == ValuePayload {
		return []string{"payload"}
	}
	return []string{"id_esdeveniment", "tipus", "versio", "data_ms", "origen", "dades"}
}
