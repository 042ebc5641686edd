package envelope

import (
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/catalog"
)

// Columns names the columns a route reads. "" means the table has no such
// column: no versio (every event has versio 1), no creat_en (a payload
// value needs none; a logical message's data_ms is its commit time).
type Columns struct {
	ID, AgregatID, Tipus, Versio, Carrega, CreatEn string
}

// Presets: the record's headers and what a NULL may mean.
const (
	// PresetKM0 is the contract's record: headers tipus and
	// id_esdeveniment; every mapped value required.
	PresetKM0 = "km0"
	// PresetDebezium is the record of Debezium's outbox EventRouter:
	// header id; a NULL key or payload gives a null key or value.
	PresetDebezium = "debezium"
)

// Value shapes.
const (
	// ValueEnvelope is the contract's JSON envelope with carrega embedded.
	ValueEnvelope = "envelope"
	// ValuePayload is the payload column alone; with envelope fields, the
	// object {"payload": ..., field: ...} (Debezium's envelope).
	ValuePayload = "payload"
)

// Route sends the changes of one source (a table, or the logical messages
// of one prefix) to Kafka, one record per change it takes.
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
	Preset  string // PresetKM0 ("" too) or PresetDebezium
	Value   string // ValueEnvelope ("" too) or ValuePayload
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

// Roles: the columns a record is made of.
const (
	roleID = iota
	roleKey
	roleTipus
	roleVersio
	roleCarrega
	roleCreatEn
	roleTimestamp
	roleTraceparent
	roleTracestate
	roleSpanContext
	nRoles
)

// route is a Route compiled: every column it reads, once, in cols; each use
// refers to its index there.
type route struct {
	*Route
	cols     []string
	optional []bool // a missing column is no error (and reads as NULL)
	role     [nRoles]int
	topic    template
	fallback string
	filter   []condition
	over     []override
	fields   []field
	debezium bool
	payload  bool // ValuePayload
	// payloadEnvelope: a payload value with envelope fields.
	payloadEnvelope bool
}

type template struct {
	static string // the topic, when the template has no placeholder
	parts  []templatePart
	cache  topicCache
}

type templatePart struct {
	literal string
	col     int // -1 for a literal
}

type condition struct {
	col    int
	values []string
}

type override struct {
	when  []condition
	topic template
	drop  bool
}

type field struct {
	col    int
	header string // a header's name, or "" for an envelope field
	member []byte // the envelope member's name as a JSON string, with its colon
}

func (rt *route) ref(name string, optional bool) int {
	for i, c := range rt.cols {
		if c == name {
			rt.optional[i] = rt.optional[i] && optional
			return i
		}
	}
	rt.cols = append(rt.cols, name)
	rt.optional = append(rt.optional, optional)
	return len(rt.cols) - 1
}

func compile(r *Route) (*route, error) {
	rt := &route{Route: r, debezium: r.Preset == PresetDebezium, payload: r.Value == ValuePayload}
	for i := range rt.role {
		rt.role[i] = -1
	}
	switch r.Preset {
	case "", PresetKM0, PresetDebezium:
	default:
		return nil, fmt.Errorf("unknown preset %q", r.Preset)
	}
	switch r.Value {
	case "", ValueEnvelope, ValuePayload:
	default:
		return nil, fmt.Errorf("unknown value %q", r.Value)
	}
	var err error
	for _, c := range r.Filter {
		rt.filter = append(rt.filter, rt.condition(c))
	}
	for _, o := range r.Overrides {
		ov := override{drop: o.Drop}
		for _, c := range o.When {
			ov.when = append(ov.when, rt.condition(c))
		}
		if !o.Drop {
			if ov.topic, err = rt.template(o.Topic); err != nil {
				return nil, fmt.Errorf("override topic: %w", err)
			}
		}
		rt.over = append(rt.over, ov)
	}
	c := r.Columns
	need := func(role int, col string) {
		if col != "" {
			rt.role[role] = rt.ref(col, false)
		}
	}
	need(roleID, c.ID)
	need(roleKey, c.AgregatID)
	if !rt.debezium || !rt.payload {
		need(roleTipus, c.Tipus) // a header of the km0 preset, a member of the envelope
	}
	need(roleCarrega, c.Carrega)
	if !rt.payload {
		if c.Versio != "" {
			// A message may leave versio out: 1.
			rt.role[roleVersio] = rt.ref(c.Versio, r.Prefix != "")
		}
		need(roleCreatEn, c.CreatEn)
		if c.CreatEn == "" && r.Prefix == "" {
			return nil, errors.New("the envelope needs a creat_en column")
		}
	}
	need(roleTimestamp, r.Timestamp)
	for _, t := range []struct {
		role int
		col  string
	}{{roleTraceparent, r.Trace.Traceparent}, {roleTracestate, r.Trace.Tracestate}, {roleSpanContext, r.Trace.SpanContext}} {
		if t.col != "" {
			rt.role[t.role] = rt.ref(t.col, r.Trace.Optional)
		}
	}
	if rt.role[roleID] < 0 || rt.role[roleKey] < 0 || rt.role[roleCarrega] < 0 {
		return nil, errors.New("the columns id, agregat_id and carrega are required")
	}
	if rt.topic, err = rt.template(r.Topic); err != nil {
		return nil, fmt.Errorf("topic: %w", err)
	}
	if r.TopicFallback != "" && !ValidTopic(r.TopicFallback) {
		return nil, fmt.Errorf("topic_fallback %q is not a valid Kafka topic name", r.TopicFallback)
	}
	rt.fallback = r.TopicFallback
	for _, f := range r.Fields {
		fd := field{col: rt.ref(f.Column, false), header: f.Header}
		if (f.Header == "") == (f.Envelope == "") {
			return nil, fmt.Errorf("field %s: exactly one of header and envelope", f.Column)
		}
		if f.Envelope != "" {
			fd.member = append(appendString(nil, []byte(f.Envelope)), ':')
			rt.payloadEnvelope = rt.payload
		}
		rt.fields = append(rt.fields, fd)
	}
	return rt, nil
}

func (rt *route) condition(c Condition) condition {
	return condition{col: rt.ref(c.Column, false), values: c.Values}
}

func (rt *route) template(s string) (template, error) {
	t, err := ParseTemplate(s)
	if err != nil {
		return template{}, err
	}
	if t.Static() {
		return template{static: s}, nil
	}
	out := template{cache: topicCache{}}
	for _, p := range t.Parts {
		tp := templatePart{literal: p.Literal, col: -1}
		if p.Column != "" {
			tp.col = rt.ref(p.Column, false)
		}
		out.parts = append(out.parts, tp)
	}
	return out, nil
}

// Router knows the routes, the service name and the largest record Kafka
// takes.
type Router struct {
	origen   []byte // origen already encoded as a JSON string
	tables   map[catalog.Table][]*route
	prefixes map[string][]*Binding // bound once: a message has no Relation
	maxBytes int                   // the largest WireSize a record may have; 0: no limit
}

// NewRouter compiles the routes. maxRecordBytes is kafka.batch_bytes: a
// record whose WireSize is larger is a bad row. Its errors are those a
// validated configuration never has.
func NewRouter(origen string, routes []Route, maxRecordBytes int) (*Router, error) {
	r := &Router{origen: appendString(nil, []byte(origen)), tables: map[catalog.Table][]*route{}, prefixes: map[string][]*Binding{}, maxBytes: maxRecordBytes}
	for i := range routes {
		rt, err := compile(&routes[i])
		if err != nil {
			return nil, fmt.Errorf("route %d: %w", i, err)
		}
		if rt.Table == "" {
			r.prefixes[rt.Prefix] = append(r.prefixes[rt.Prefix], bindMessage(rt))
			continue
		}
		t := catalog.Table{Schema: rt.Schema, Name: rt.Table}
		r.tables[t] = append(r.tables[t], rt)
	}
	return r, nil
}

// Binding is one route of one relation (as announced by a pgoutput Relation
// message), or of one message prefix, with the route's columns found.
type Binding struct {
	Name  string // schema.table as a reader writes it, or `message prefix "p"`
	Route *Route // nil when the table has no route
	rt    *route
	pos   []int    // per rt.cols: position in the tuple, -1 when absent
	oid   []uint32 // per rt.cols: type OID (0 for a message member)
	// columns: every column's name, in tuple order (for a dead letter).
	columns []string
	message bool
}

// Bind resolves a relation's columns for each of its table's routes, in
// the order of the configuration; a table without a route has one binding
// whose Route is nil. It does not fail on missing columns: a table may be
// altered back before any insert arrives, so the error is reported when a
// row needs the column.
func (r *Router) Bind(rel *pglogrepl.RelationMessage) []*Binding {
	t := catalog.Table{Schema: rel.Namespace, Name: rel.RelationName}
	name := t.String()
	routes := r.tables[t]
	if len(routes) == 0 {
		return []*Binding{{Name: name}}
	}
	columns := make([]string, len(rel.Columns))
	for i, c := range rel.Columns {
		columns[i] = c.Name
	}
	out := make([]*Binding, len(routes))
	for i, rt := range routes {
		b := &Binding{Name: name, Route: rt.Route, rt: rt, columns: columns, pos: make([]int, len(rt.cols)), oid: make([]uint32, len(rt.cols))}
		for j, col := range rt.cols {
			b.pos[j] = -1
			for k, c := range rel.Columns {
				if c.Name == col {
					b.pos[j], b.oid[j] = k, c.DataType
					break
				}
			}
		}
		out[i] = b
	}
	return out
}

// BindMessage returns the bindings of the routes of a logical message's
// prefix, none when the prefix has no route. It does not allocate.
func (r *Router) BindMessage(prefix []byte) []*Binding {
	return r.prefixes[string(prefix)]
}

// messageColumns is the one "column" of a logical message, for dead letters.
var messageColumns = []string{"content"}

func bindMessage(rt *route) *Binding {
	b := &Binding{Name: fmt.Sprintf("message prefix %q", rt.Prefix), Route: rt.Route, rt: rt, columns: messageColumns, message: true,
		pos: make([]int, len(rt.cols)), oid: make([]uint32, len(rt.cols))}
	for i := range b.pos {
		b.pos[i] = i
	}
	return b
}

// Refs lists every column (or, for a message route, member) the route
// reads that must exist, each with the configuration key that reads it,
// relative to the route: "columns.id", "filter.tipus",
// "overrides[0].when.tipus", "topic", "fields[1].column", "trace.traceparent",
// "timestamp". The route must compile (NewRouter's errors): nil otherwise.
func (r Route) Refs() []Ref {
	rt, err := compile(&r)
	if err != nil {
		return nil
	}
	var out []Ref
	add := func(col, use string) { out = append(out, Ref{Column: col, Use: use}) }
	uses := [nRoles]string{roleID: "columns.id", roleKey: "columns.agregat_id", roleTipus: "columns.tipus", roleVersio: "columns.versio",
		roleCarrega: "columns.carrega", roleCreatEn: "columns.creat_en", roleTimestamp: "timestamp", roleTraceparent: "trace.traceparent",
		roleTracestate: "trace.tracestate", roleSpanContext: "trace.span_context"}
	for role, i := range rt.role {
		if i >= 0 && !rt.optional[i] {
			add(rt.cols[i], uses[role])
		}
	}
	for _, c := range r.Filter {
		add(c.Column, "filter."+c.Column)
	}
	for k, o := range r.Overrides {
		for _, c := range o.When {
			add(c.Column, fmt.Sprintf("overrides[%d].when.%s", k, c.Column))
		}
		if t, err := ParseTemplate(o.Topic); err == nil {
			for _, c := range t.Columns() {
				add(c, fmt.Sprintf("overrides[%d].topic", k))
			}
		}
	}
	if t, err := ParseTemplate(r.Topic); err == nil {
		for _, c := range t.Columns() {
			add(c, "topic")
		}
	}
	for k, f := range r.Fields {
		add(f.Column, fmt.Sprintf("fields[%d].column", k))
	}
	return out
}

// Ref is a column a route reads and the key that makes it read it.
type Ref struct {
	Column, Use string
}

// String is "column (use)".
func (r Ref) String() string { return r.Column + " (" + r.Use + ")" }
