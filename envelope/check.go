package envelope

import (
	"fmt"
	"sort"
	"strings"
)

// Problem is one thing wrong with a route, at its configuration key
// relative to the route ("topic_fallback", "overrides[1].when",
// "columns.id"): config adds the route's place and the line.
type Problem struct {
	Key, Text string
}

func (p Problem) String() string { return p.Key + ": " + p.Text }

// problems collects a route's problems.
type problems []Problem

func (ps *problems) add(key, format string, args ...any) {
	*ps = append(*ps, Problem{Key: key, Text: fmt.Sprintf(format, args...)})
}

func (ps *problems) oneOf(key, got string, allowed []string) {
	for _, a := range allowed {
		if got == a {
			return
		}
	}
	ps.add(key, "%q is not one of %s", got, strings.Join(allowed, ", "))
}

// Problems is every problem of the route's shape, the one judgement of
// whether a route can be compiled and run: config reports them with their
// lines, and NewRouter refuses a route that has one. Where the route reads
// from is not judged here: a source is config's to name (a table or a
// message prefix), and whether its columns exist is the database's to say
// (catalog.CheckColumns).
func (r *Route) Problems() []Problem {
	var ps problems
	if r.Preset != "" {
		ps.oneOf("preset", r.Preset, presets)
	}
	ps.topic("topic", r.Topic, true)
	if r.TopicFallback != "" {
		switch t, err := ParseTemplate(r.Topic); {
		case !ValidTopic(r.TopicFallback):
			ps.add("topic_fallback", "%q is not a valid Kafka topic name", r.TopicFallback)
		case err == nil && t.Static() && !r.templatedOverrides():
			ps.add("topic_fallback", "set, but no topic is a template: only a {column} value can make a name invalid")
		}
	}
	ps.match("filter", r.Filter)
	ps.overrides(r.Overrides)
	switch t := r.DeadLetterTopic; {
	case t == "":
	case !ValidTopic(t):
		ps.add("dead_letter_topic", "%q is not a valid Kafka topic name", t)
	case t == r.Topic:
		ps.add("dead_letter_topic", "must differ from the route's topic")
	}
	ps.columns(r)
	if r.Value != "" {
		ps.oneOf("value", r.Value, values)
	}
	if r.ValueJSON && r.Value != ValuePayload {
		ps.add("value_converter", "json writes the payload as a JSON string: it needs value: payload (the envelope is JSON already)")
	}
	ps.fields(r)
	ps.cloudEvents(r)
	switch t := r.Trace; {
	case t.SpanContext != "" && (t.Traceparent != "" || t.Tracestate != ""):
		ps.add("trace.span_context", "either span_context (a serialized Properties holding both) or traceparent and tracestate, not both")
	case t.Tracestate != "" && t.Traceparent == "":
		ps.add("trace.tracestate", "needs trace.traceparent: a tracestate means nothing without its traceparent")
	}
	return ps
}

// templatedOverrides: an override's topic is a template.
func (r *Route) templatedOverrides() bool {
	for _, o := range r.Overrides {
		if t, err := ParseTemplate(o.Topic); err == nil && !t.Static() {
			return true
		}
	}
	return false
}

// topic checks a topic or a template.
func (ps *problems) topic(key, topic string, required bool) {
	if topic == "" {
		if required {
			ps.add(key, "required")
		}
		return
	}
	if _, err := ParseTemplate(topic); err != nil {
		ps.add(key, "%v", err)
	}
}

func (ps *problems) match(key string, m []Condition) {
	for _, c := range m {
		switch {
		case c.Column == "":
			ps.add(key, "a column name must not be empty")
		case len(c.Values) == 0:
			ps.add(key+"."+c.Column, "no value to match")
		}
	}
}

// overrides checks each override, and that no two of them can claim the
// same row: two overrides on the same columns sharing a value of each
// would both match it.
func (ps *problems) overrides(os []Override) {
	for k, o := range os {
		at := fmt.Sprintf("overrides[%d]", k)
		if len(o.When) == 0 {
			ps.add(at+".when", "required: the column values the override applies to, e.g. {tipus: comanda.esborrany}")
		}
		ps.match(at+".when", o.When)
		switch {
		case o.Drop && o.Topic != "":
			ps.add(at+".drop", "true together with a topic: an override either drops the row or sends it to its topic")
		case !o.Drop && o.Topic == "":
			ps.add(at, "a topic, or drop: true")
		default:
			ps.topic(at+".topic", o.Topic, false)
		}
		for e := 0; e < k; e++ {
			if shared, ok := overlap(os[e].When, o.When); ok {
				ps.add(at+".when", "conflicts with overrides[%d]: both match %s; give each value one override", e, shared)
			}
		}
	}
}

// overlap reports whether a and b constrain the same columns and share a
// value on each, with an example of a row both match.
func overlap(a, b []Condition) (string, bool) {
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

// columns checks the column names: each that the record needs is named,
// and no column serves two of them.
func (ps *problems) columns(r *Route) {
	c := r.Columns
	cols := []struct{ key, val string }{
		{"id", c.ID}, {"agregat_id", c.AgregatID}, {"tipus", c.Tipus}, {"versio", c.Versio}, {"carrega", c.Carrega}, {"creat_en", c.CreatEn},
	}
	used := map[string]string{}
	for _, col := range cols {
		switch {
		case col.val == "" && col.key == "versio": // no such column: versio 1
		case col.val == "" && col.key == "creat_en" && !r.NeedsCreatEn():
		case col.val == "":
			ps.add("columns."+col.key, "column name must not be empty")
		case used[col.val] != "":
			ps.add("columns."+col.key, "column %q is also used for %s", col.val, used[col.val])
		default:
			used[col.val] = col.key
		}
	}
}

// fields checks that each field names a column and one place for it, not
// taken by the record already.
func (ps *problems) fields(r *Route) {
	headers, members := map[string]bool{}, map[string]bool{}
	for _, h := range r.headers() {
		headers[h] = true
	}
	for _, m := range r.members() {
		members[m] = true
	}
	for k, f := range r.Fields {
		at := fmt.Sprintf("fields[%d]", k)
		switch {
		case f.Column == "":
			ps.add(at+".column", "required")
		case (f.Header == "") == (f.Envelope == ""):
			ps.add(at, "one of header: NAME or envelope: NAME (where the column's value goes, under which name)")
		case strings.HasPrefix(strings.ToLower(f.Header), ReservedHeaderPrefix):
			ps.add(at+".header", "%q: headers named %s... are outboxd's own (a row's column must not pass for one of them)", f.Header, ReservedHeaderPrefix)
		case f.Header != "" && headers[f.Header]:
			ps.add(at+".header", "%q is already a header of the record", f.Header)
		case f.Envelope != "" && members[f.Envelope]:
			ps.add(at+".envelope", "%q is already a member of the value", f.Envelope)
		}
		headers[f.Header] = f.Header != ""
		members[f.Envelope] = f.Envelope != ""
	}
}
