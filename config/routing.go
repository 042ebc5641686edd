package config

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/envelope"
)

// Route.Preset, Route.Value and the converters' values.
const (
	PresetDebezium = "debezium"
	ValueEnvelope  = "envelope"
	ValuePayload   = "payload"
	ConverterJSON  = "json"
)

// DebeziumColumns are the column names of Debezium's outbox table
// (id, aggregatetype, aggregateid, type, payload, and an optional
// timestamp): a route with preset: debezium gets them for every column its
// YAML does not name.
func DebeziumColumns() Columns {
	return Columns{ID: "id", AgregatID: "aggregateid", Tipus: "type", Versio: "", Carrega: "payload", CreatEn: "timestamp"}
}

// MessageColumns are the members a logical message's JSON carries by
// default: the envelope's own names, and agregat_id for the key. No
// creat_en: data_ms is the transaction's commit time.
func MessageColumns() Columns {
	return Columns{ID: "id_esdeveniment", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "dades", CreatEn: ""}
}

// Debezium's defaults: route.topic.replacement with route.by.field, and
// tracing.span.context.field.
const (
	DebeziumTopic       = "outbox.event.{aggregatetype}"
	DebeziumSpanContext = "tracingspancontext"
)

// routeFromYAML derives routes[i]'s Schema and Name and fills what its
// preset (or its being a message route) sets by default and the YAML does
// not; "-" becomes "" where it means no such column.
func (c *Config) routeFromYAML(i int) []error {
	r := &c.Routes[i]
	at := func(f string) string { return fmt.Sprintf("routes[%d].%s", i, f) }
	set := func(f string) bool { _, ok := c.lines[at(f)]; return ok }
	if schema, name, err := splitTable(r.Table); err == nil {
		r.Schema, r.Name = schema, name
	}
	var defaults *Columns
	switch {
	case r.Message != "":
		d := MessageColumns()
		defaults = &d
	case r.Preset == PresetDebezium:
		d := DebeziumColumns()
		defaults = &d
	}
	if r.Preset == PresetDebezium {
		if r.Value == "" {
			r.Value = ValuePayload
		}
		if r.Topic == "" {
			r.Topic = DebeziumTopic
		}
		if r.Trace == (Trace{}) {
			r.Trace = Trace{SpanContext: DebeziumSpanContext, Optional: true}
		}
	}
	cols := []struct {
		key      string
		val, def *string
	}{
		{"id", &r.Columns.ID, nil}, {"agregat_id", &r.Columns.AgregatID, nil}, {"tipus", &r.Columns.Tipus, nil},
		{"versio", &r.Columns.Versio, nil}, {"carrega", &r.Columns.Carrega, nil}, {"creat_en", &r.Columns.CreatEn, nil},
		{"publicat_en", &r.Columns.PublicatEn, nil},
	}
	if defaults != nil {
		d := []*string{&defaults.ID, &defaults.AgregatID, &defaults.Tipus, &defaults.Versio, &defaults.Carrega, &defaults.CreatEn, &defaults.PublicatEn}
		for k := range cols {
			cols[k].def = d[k]
		}
	}
	var errs []error
	for _, col := range cols {
		if !set("columns."+col.key) && col.def != nil {
			*col.val = *col.def
			continue
		}
		switch {
		case *col.val == noColumn && (col.key == "versio" || col.key == "publicat_en"):
			*col.val = ""
		case *col.val == noColumn && col.key == "creat_en" && r.mayLackCreatEn():
			*col.val = ""
		case *col.val == "" && (col.key == "versio" || col.key == "publicat_en") && set("columns."+col.key):
			path := at("columns." + col.key)
			what := map[string]string{"versio": "version", "publicat_en": "publicat_en"}[col.key]
			errs = append(errs, fmt.Errorf("line %d: %s: column name must not be empty (write \"-\" if the table has no %s column)", c.lines[path], path, what))
		}
	}
	return errs
}

// mayLackCreatEn: nothing needs a creat_en column: a message's data_ms is
// its commit time, and a payload value has no data_ms.
func (r Route) mayLackCreatEn() bool { return r.Message != "" || r.Value == ValuePayload }

// splitTable splits "schema.table" in SQL identifier syntax into its two
// names: an unquoted name is lowercase letters, digits, _ and $ (PostgreSQL
// would fold capitals to lowercase: a name with capitals must be quoted,
// so that it means one thing); a quoted one is any text, "" standing for ".
func splitTable(t string) (schema, name string, err error) {
	schema, rest, err := ident(t)
	if err != nil {
		return "", "", err
	}
	if !strings.HasPrefix(rest, ".") {
		return "", "", errors.New("must be schema.table")
	}
	name, rest, err = ident(rest[1:])
	switch {
	case err != nil:
		return "", "", err
	case rest != "":
		return "", "", fmt.Errorf("has %q after the table name: must be schema.table (quote a name that holds a dot)", rest)
	}
	return schema, name, nil
}

// maxIdent is PostgreSQL's longest identifier (NAMEDATALEN - 1), in bytes.
const maxIdent = 63

func ident(s string) (name, rest string, err error) {
	if strings.HasPrefix(s, `"`) {
		var b strings.Builder
		for i := 1; i < len(s); i++ {
			if s[i] != '"' {
				b.WriteByte(s[i])
				continue
			}
			if i+1 < len(s) && s[i+1] == '"' {
				b.WriteByte('"')
				i++
				continue
			}
			switch name = b.String(); {
			case name == "":
				return "", "", errors.New("has an empty quoted name")
			case len(name) > maxIdent:
				return "", "", fmt.Errorf("has a name longer than %d bytes", maxIdent)
			}
			return name, s[i+1:], nil
		}
		return "", "", errors.New("has a quoted name without its closing quote")
	}
	end := strings.IndexByte(s, '.')
	if end < 0 {
		end = len(s)
	}
	name, rest = s[:end], s[end:]
	if name == "" {
		return "", "", errors.New("has an empty name")
	}
	for i, c := range name {
		switch {
		case c >= 'a' && c <= 'z' || c == '_', i > 0 && (c >= '0' && c <= '9' || c == '$'):
		case c >= 'A' && c <= 'Z':
			return "", "", fmt.Errorf("has %s unquoted, which SQL reads as %s: quote a name with capitals (\"%s\")", name, strings.ToLower(name), name)
		default:
			return "", "", fmt.Errorf("has %s unquoted: quote a name with such characters (\"%s\")", name, name)
		}
	}
	if len(name) > maxIdent {
		return "", "", fmt.Errorf("has a name longer than %d bytes", maxIdent)
	}
	return name, rest, nil
}

// table is the table a route reads, by its exact names.
func (r Route) table() catalog.Table { return catalog.Table{Schema: r.Schema, Name: r.Name} }

func (v *validator) routes(routes []Route) {
	main := map[string]int{} // the route of each source without a filter
	filtered := map[string]int{}
	for i, r := range routes {
		v.route(i, r)
		source := fmt.Sprintf("message prefix %q", r.Message)
		switch {
		case r.Message == "" && (r.Table == "" || r.Schema == ""):
			continue
		case r.Message == "":
			source = r.table().String()
		}
		if len(r.Filter) > 0 {
			if _, ok := filtered[source]; !ok {
				filtered[source] = i
			}
			continue
		}
		if first, dup := main[source]; dup {
			key, what := "table", r.Table
			if r.Message != "" {
				key, what = "message", r.Message
			}
			v.add(fmt.Sprintf("routes[%d].%s", i, key), "%q is already routed by routes[%d] (another route of the same source needs a filter: it then takes the rows the filter matches, as well)", what, first)
			continue
		}
		main[source] = i
	}
	for source, i := range filtered {
		if _, ok := main[source]; !ok {
			v.add(fmt.Sprintf("routes[%d].filter", i), "every route of %s has a filter, so a change that matches none would be lost: give one route of it no filter (and drop changes on purpose with overrides: [{when: ..., drop: true}])", source)
		}
	}
}

func (v *validator) route(i int, r Route) {
	at := func(f string) string { return fmt.Sprintf("routes[%d].%s", i, f) }
	message := r.Message != ""

	switch {
	case r.Table == "" && !message:
		v.add(at("table"), "required (schema.table, e.g. public.outbox; or message: a logical message prefix)")
	case r.Table != "" && message:
		v.add(at("message"), "a route has a table or a message prefix, not both")
	case message:
		if r.Preset == PresetDebezium {
			v.add(at("preset"), "debezium is a table's preset (Debezium's EventRouter reads an outbox table)")
		}
	default:
		if schema, name, err := splitTable(r.Table); err != nil {
			v.add(at("table"), "%q %v, e.g. public.outbox or '\"Vendes\".\"Outbox\"'", r.Table, err)
		} else if r.Schema != schema || r.Name != name {
			v.add(at("table"), "Schema/Name (%q, %q) do not match table %q", r.Schema, r.Name, r.Table)
		}
	}
	if r.Preset != "" && r.Preset != PresetDebezium {
		v.oneOf(at("preset"), r.Preset, PresetDebezium)
	}

	v.topic(at("topic"), r.Topic, true)
	if r.TopicFallback != "" {
		switch t, err := envelope.ParseTemplate(r.Topic); {
		case !envelope.ValidTopic(r.TopicFallback):
			v.add(at("topic_fallback"), "%q is not a valid Kafka topic name", r.TopicFallback)
		case err == nil && t.Static() && !r.templatedOverrides():
			v.add(at("topic_fallback"), "set, but no topic is a template: only a {column} value can make a name invalid")
		}
	}
	v.match(at("filter"), r.Filter)
	v.overrides(i, r.Overrides)

	switch r.OnError {
	case OnErrorStop:
		if r.DeadLetterTopic != "" {
			v.add(at("dead_letter_topic"), "set, but on_error is %q: set on_error: %s to use it", r.OnError, OnErrorDeadLetter)
		}
	case OnErrorDeadLetter:
		switch {
		case r.DeadLetterTopic == "":
			v.add(at("dead_letter_topic"), "required when on_error is %s", OnErrorDeadLetter)
		case !envelope.ValidTopic(r.DeadLetterTopic):
			v.add(at("dead_letter_topic"), "%q is not a valid Kafka topic name", r.DeadLetterTopic)
		case r.DeadLetterTopic == r.Topic:
			v.add(at("dead_letter_topic"), "must differ from the route's topic")
		}
	default:
		v.add(at("on_error"), "%q is not one of %s, %s", r.OnError, OnErrorStop, OnErrorDeadLetter)
	}

	v.columns(i, r)
	v.shape(i, r)
}

// templatedOverrides: an override's topic is a template.
func (r Route) templatedOverrides() bool {
	for _, o := range r.Overrides {
		if t, err := envelope.ParseTemplate(o.Topic); err == nil && !t.Static() {
			return true
		}
	}
	return false
}

// topic checks a topic or a template.
func (v *validator) topic(path, topic string, required bool) {
	if topic == "" {
		if required {
			v.add(path, "required")
		}
		return
	}
	if _, err := envelope.ParseTemplate(topic); err != nil {
		v.add(path, "%v", err)
	}
}

func (v *validator) match(path string, m Match) {
	for _, c := range m {
		switch {
		case c.Column == "":
			v.add(path, "a column name must not be empty")
		case len(c.Values) == 0:
			v.add(path+"."+c.Column, "no value to match")
		}
	}
}

// overrides checks each override, and that no two of them can claim the
// same row: two overrides on the same columns sharing a value of each
// would both match it.
func (v *validator) overrides(i int, os []Override) {
	for k, o := range os {
		at := fmt.Sprintf("routes[%d].overrides[%d]", i, k)
		if len(o.When) == 0 {
			v.add(at+".when", "required: the column values the override applies to, e.g. {tipus: comanda.esborrany}")
		}
		v.match(at+".when", o.When)
		switch {
		case o.Drop && o.Topic != "":
			v.add(at+".drop", "true together with a topic: an override either drops the row or sends it to its topic")
		case !o.Drop && o.Topic == "":
			v.add(at, "a topic, or drop: true")
		default:
			v.topic(at+".topic", o.Topic, false)
		}
		for e := 0; e < k; e++ {
			if shared, ok := overlap(os[e].When, o.When); ok {
				v.add(at+".when", "conflicts with overrides[%d]: both match %s; give each value one override", e, shared)
			}
		}
	}
}

// overlap reports whether a and b constrain the same columns and share a
// value on each, with an example of a row both match.
func overlap(a, b Match) (string, bool) {
	if len(a) != len(b) || len(a) == 0 {
		return "", false
	}
	var example []string
	for _, ca := range a {
		found := false
		for _, cb := range b {
			if cb.Column != ca.Column {
				continue
			}
			for _, x := range ca.Values {
				for _, y := range cb.Values {
					if x == y && !found {
						found = true
						example = append(example, fmt.Sprintf("%s = %q", ca.Column, x))
					}
				}
			}
		}
		if !found {
			return "", false
		}
	}
	sort.Strings(example)
	return strings.Join(example, " and "), true
}

func (v *validator) columns(i int, r Route) {
	at := func(f string) string { return fmt.Sprintf("routes[%d].%s", i, f) }
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
		case col.val == "" && col.key == "versio": // no such column
		case col.val == "" && col.key == "creat_en" && r.mayLackCreatEn():
		case col.val == "":
			v.add(path, "column name must not be empty")
		case col.val == noColumn && col.key == "versio":
			v.add(path, "%q is the YAML spelling of no such column; in Columns it is \"\"", noColumn)
		case col.val == noColumn:
			v.add(path, "%q (no such column) is allowed only for versio and publicat_en (and for creat_en on a message route or with value: payload)", noColumn)
		default:
			if other, dup := used[col.val]; dup {
				v.add(path, "column %q is also used for %s", col.val, other)
			} else {
				used[col.val] = col.key
			}
		}
	}
}

// shape checks the value, the converters, the fields, the trace context
// and the timestamp.
func (v *validator) shape(i int, r Route) {
	at := func(f string) string { return fmt.Sprintf("routes[%d].%s", i, f) }
	if r.Value != "" {
		v.oneOf(at("value"), r.Value, ValueEnvelope, ValuePayload)
	}
	for _, conv := range []struct{ key, val string }{{"key_converter", r.KeyConverter}, {"value_converter", r.ValueConverter}} {
		if conv.val != "" {
			v.oneOf(at(conv.key), conv.val, "string", ConverterJSON)
		}
	}
	if r.ValueConverter == ConverterJSON && r.Value != ValuePayload {
		v.add(at("value_converter"), "json writes the payload as a JSON string: it needs value: payload (the envelope is JSON already)")
	}
	members := map[string]bool{"payload": true}
	if r.Value != ValuePayload {
		members = map[string]bool{"id_esdeveniment": true, "tipus": true, "versio": true, "data_ms": true, "origen": true, "dades": true}
	}
	headers := map[string]bool{envelope.HeaderTraceparent: true, envelope.HeaderTracestate: true, envelope.HeaderCommitLSN: true, envelope.HeaderTxnIndex: true}
	if r.Preset == PresetDebezium {
		headers[envelope.HeaderDebeziumID] = true
	} else {
		headers[envelope.HeaderTipus], headers[envelope.HeaderID] = true, true
	}
	for k, f := range r.Fields {
		path := fmt.Sprintf("routes[%d].fields[%d]", i, k)
		switch {
		case f.Column == "":
			v.add(path+".column", "required")
		case (f.Header == "") == (f.Envelope == ""):
			v.add(path, "one of header: NAME or envelope: NAME (where the column's value goes, under which name)")
		case f.Header != "" && headers[f.Header]:
			v.add(path+".header", "%q is already a header of the record", f.Header)
		case f.Envelope != "" && members[f.Envelope]:
			v.add(path+".envelope", "%q is already a member of the value", f.Envelope)
		}
		headers[f.Header] = f.Header != ""
		members[f.Envelope] = f.Envelope != ""
	}
	t := r.Trace
	switch {
	case t.SpanContext != "" && (t.Traceparent != "" || t.Tracestate != ""):
		v.add(at("trace.span_context"), "either span_context (a serialized Properties holding both) or traceparent and tracestate, not both")
	case t.Tracestate != "" && t.Traceparent == "":
		v.add(at("trace.tracestate"), "needs trace.traceparent: a tracestate means nothing without its traceparent")
	}
}

// Envelope is the route as the envelope package takes it.
func (r Route) Envelope() envelope.Route {
	er := envelope.Route{Schema: r.Schema, Table: r.Name, Prefix: r.Message, Topic: r.Topic, TopicFallback: r.TopicFallback,
		Filter: conditions(r.Filter), Preset: r.Preset, Value: r.Value, KeyJSON: r.KeyConverter == ConverterJSON, ValueJSON: r.ValueConverter == ConverterJSON,
		Trace:    envelope.Trace{Traceparent: r.Trace.Traceparent, Tracestate: r.Trace.Tracestate, SpanContext: r.Trace.SpanContext, Optional: r.Trace.Optional},
		Position: r.PositionHeaders, Timestamp: r.Timestamp,
		Columns: envelope.Columns{ID: r.Columns.ID, AgregatID: r.Columns.AgregatID, Tipus: r.Columns.Tipus,
			Versio: r.Columns.Versio, Carrega: r.Columns.Carrega, CreatEn: r.Columns.CreatEn}}
	if r.Message != "" {
		er.Schema, er.Table = "", ""
	}
	for _, o := range r.Overrides {
		er.Overrides = append(er.Overrides, envelope.Override{When: conditions(o.When), Topic: o.Topic, Drop: o.Drop})
	}
	for _, f := range r.Fields {
		er.Fields = append(er.Fields, envelope.Field{Column: f.Column, Header: f.Header, Envelope: f.Envelope})
	}
	if r.OnError == OnErrorDeadLetter {
		er.DeadLetterTopic = r.DeadLetterTopic
	}
	return er
}

func conditions(m Match) []envelope.Condition {
	var out []envelope.Condition
	for _, c := range m {
		out = append(out, envelope.Condition{Column: c.Column, Values: c.Values})
	}
	return out
}

// EnvelopeRoutes is every route as the envelope package takes it.
func (c Config) EnvelopeRoutes() []envelope.Route {
	out := make([]envelope.Route, len(c.Routes))
	for i, r := range c.Routes {
		out[i] = r.Envelope()
	}
	return out
}

// Table is a routed table and its routes.
type Table struct {
	catalog.Table
	// Routes are the indexes of its routes in Config.Routes, in the file's
	// order. The first names the columns that reading the table itself
	// needs (id, creat_en, publicat_en: the snapshot, replay, marks,
	// retention).
	Routes []int
}

// Tables is each routed table once, in the order of the file: the one list
// of tables that the publication, check, the snapshot, replay, marks and
// retention work on. A message route has no table.
func (c Config) Tables() []Table {
	var out []Table
	index := map[catalog.Table]int{}
	for k, r := range c.Routes {
		if r.Message != "" {
			continue
		}
		t := r.table()
		i, ok := index[t]
		if !ok {
			i = len(out)
			index[t] = i
			out = append(out, Table{Table: t})
		}
		out[i].Routes = append(out[i].Routes, k)
	}
	return out
}

// CatalogRoutes is what the publication must publish: each routed table
// once, with every column its routes read.
func (c Config) CatalogRoutes() []catalog.Route {
	tables := c.Tables()
	out := make([]catalog.Route, len(tables))
	for i, t := range tables {
		out[i].Table = t.Table
		for _, k := range t.Routes {
			for _, ref := range c.Routes[k].Envelope().Refs() {
				if !slices.Contains(out[i].Columns, ref.Column) {
					out[i].Columns = append(out[i].Columns, ref.Column)
				}
				out[i].Refs = append(out[i].Refs, catalog.Ref{Column: ref.Column, Key: c.Where(fmt.Sprintf("routes[%d].%s", k, ref.Use))})
			}
		}
	}
	return out
}

// Where is a field path with its line, "line 14: routes[1].filter.tipus",
// or the path alone for a Config built in Go.
func (c Config) Where(path string) string {
	if line := (&validator{lines: c.lines}).lineOf(path); line > 0 {
		return fmt.Sprintf("line %d: %s", line, path)
	}
	return path
}
