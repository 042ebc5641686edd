package envelope

import "fmt"

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

// roleKeys are the configuration keys, relative to the route, that name
// each role's column (Ref.Use).
var roleKeys = [nRoles]string{roleID: "columns.id", roleKey: "columns.agregat_id", roleTipus: "columns.tipus", roleVersio: "columns.versio",
	roleCarrega: "columns.carrega", roleCreatEn: "columns.creat_en", roleTimestamp: "timestamp", roleTraceparent: "trace.traceparent",
	roleTracestate: "trace.tracestate", roleSpanContext: "trace.span_context"}

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
	// ce: a CloudEvent (ValueCloudEvents), structured or binary, from
	// source (NewRouter renders it).
	ce, ceStructured bool
	ceSource         []byte
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

// compile resolves every column r reads. r has no Problems: the only
// errors left are those of a template that Problems would have named.
func compile(r *Route) (*route, error) {
	rt := &route{Route: r, debezium: r.Preset == PresetDebezium, payload: r.Value == ValuePayload, fallback: r.TopicFallback,
		ce: r.Value == ValueCloudEvents, ceStructured: r.CloudEvents.Mode == CEStructured}
	for _, c := range r.Filter {
		rt.filter = append(rt.filter, rt.condition(c))
	}
	for _, o := range r.Overrides {
		ov := override{drop: o.Drop}
		for _, c := range o.When {
			ov.when = append(ov.when, rt.condition(c))
		}
		if !o.Drop {
			var err error
			if ov.topic, err = rt.template(o.Topic); err != nil {
				return nil, fmt.Errorf("override topic: %w", err)
			}
		}
		rt.over = append(rt.over, ov)
	}
	rt.roles()
	var err error
	if rt.topic, err = rt.template(r.Topic); err != nil {
		return nil, fmt.Errorf("topic: %w", err)
	}
	for _, f := range r.Fields {
		fd := field{col: rt.ref(f.Column, false), header: f.Header}
		if f.Envelope != "" {
			fd.member = append(appendString(nil, []byte(f.Envelope)), ':')
			rt.payloadEnvelope = rt.payload
		}
		rt.fields = append(rt.fields, fd)
	}
	return rt, nil
}

// roles finds the column of each role the record needs; -1 for a role it
// has no column for.
func (rt *route) roles() {
	for i := range rt.role {
		rt.role[i] = -1
	}
	r, c := rt.Route, rt.Columns
	need := func(role int, col string) {
		if col != "" {
			rt.role[role] = rt.ref(col, false)
		}
	}
	need(roleID, c.ID)
	need(roleKey, c.AgregatID)
	if !rt.debezium || !rt.payload {
		need(roleTipus, c.Tipus) // a header of the contract's record, a member of the envelope
	}
	need(roleCarrega, c.Carrega)
	if rt.payload && r.Encoder != nil && c.Versio != "" {
		// The schema may be per tipus/versio.
		rt.role[roleVersio] = rt.ref(c.Versio, r.Prefix != "")
	}
	if !rt.payload {
		if c.Versio != "" {
			// A message may leave versio out: 1.
			rt.role[roleVersio] = rt.ref(c.Versio, r.Prefix != "")
		}
		need(roleCreatEn, c.CreatEn)
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

// Ref is a column a route reads and the configuration key, relative to
// the route, that makes it read it.
type Ref struct {
	Column, Use string
}

// String is "column (use)".
func (r Ref) String() string { return r.Column + " (" + r.Use + ")" }

// Refs lists every column (or, for a message route, member) the route
// reads that must exist, each with the configuration key that reads it:
// "columns.id", "filter.tipus", "overrides[0].when.tipus", "topic",
// "fields[1].column", "trace.traceparent", "timestamp". For a route with
// Problems it may be nil or partial.
func (r Route) Refs() []Ref {
	rt, err := compile(&r)
	if err != nil {
		return nil
	}
	var out []Ref
	add := func(col, use string) { out = append(out, Ref{Column: col, Use: use}) }
	for role, i := range rt.role {
		if i >= 0 && !rt.optional[i] {
			add(rt.cols[i], roleKeys[role])
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
