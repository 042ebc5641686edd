package config

import (
	"fmt"

	"github.com/outboxd/outboxd/envelope"
)

// Route.KeyConverter and Route.ValueConverter values besides "" (string).
const (
	ConverterString = "string"
	ConverterJSON   = "json"
)

// routeFromYAML derives routes[i]'s Schema and Name and fills what its
// preset (or its being a message route) sets by default and the YAML does
// not; "-" becomes "" where it means no such column. The defaults are
// envelope's: the preset's, or a message's.
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
		d := Columns(envelope.MessageColumns())
		defaults = &d
	case r.Preset == envelope.PresetDebezium:
		d := Columns(envelope.DebeziumColumns())
		defaults = &d
	}
	if r.Preset == envelope.PresetDebezium {
		if r.Value == "" {
			r.Value = envelope.ValuePayload
		}
		if r.Topic == "" {
			r.Topic = envelope.DebeziumTopic
		}
		if r.Trace == (Trace{}) {
			r.Trace = Trace{SpanContext: envelope.DebeziumSpanContext, Optional: true}
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
	er := r.envelope()
	var errs []error
	for _, col := range cols {
		if !set("columns."+col.key) && col.def != nil {
			*col.val = *col.def
			continue
		}
		switch {
		case *col.val == noColumn && (col.key == "versio" || col.key == "publicat_en"):
			*col.val = ""
		case *col.val == noColumn && col.key == "creat_en" && !er.NeedsCreatEn():
			*col.val = ""
		case *col.val == "" && (col.key == "versio" || col.key == "publicat_en") && set("columns."+col.key):
			path := at("columns." + col.key)
			what := map[string]string{"versio": "version", "publicat_en": "publicat_en"}[col.key]
			errs = append(errs, fmt.Errorf("line %d: %s: column name must not be empty (write \"-\" if the table has no %s column)", c.lines[path], path, what))
		}
	}
	return errs
}

// Routing is the routed model of the configuration (envelope.Routing):
// every route as envelope takes it, grouped by source, its errors naming
// the line. Each command builds it once and hands it to every part that
// acts on routes.
func (c Config) Routing() envelope.Routing {
	routes := make([]envelope.Route, len(c.Routes))
	for i, r := range c.Routes {
		routes[i] = r.envelope()
	}
	return envelope.NewRouting(routes, func(i int, key string) string { return c.where(fmt.Sprintf("routes[%d].%s", i, key)) })
}

// envelope is the route as the envelope package takes it: on_error
// becomes the dead-letter topic, the converters become flags.
func (r Route) envelope() envelope.Route {
	er := envelope.Route{Schema: r.Schema, Table: r.Name, Prefix: r.Message, Topic: r.Topic, TopicFallback: r.TopicFallback,
		Filter: conditions(r.Filter), Preset: r.Preset, Value: r.Value, KeyJSON: r.KeyConverter == ConverterJSON, ValueJSON: r.ValueConverter == ConverterJSON,
		Trace: envelope.Trace(r.Trace), Position: r.PositionHeaders, Timestamp: r.Timestamp, Columns: envelope.Columns(r.Columns),
		CloudEvents: envelope.CloudEvents(r.CloudEvents)}
	if r.Message != "" {
		er.Schema, er.Table = "", ""
	}
	for _, o := range r.Overrides {
		er.Overrides = append(er.Overrides, envelope.Override{When: conditions(o.When), Topic: o.Topic, Drop: o.Drop})
	}
	for _, f := range r.Fields {
		er.Fields = append(er.Fields, envelope.Field(f))
	}
	if r.OnError == OnErrorDeadLetter {
		er.DeadLetterTopic = r.DeadLetterTopic
	}
	return er
}

func conditions(m Match) []envelope.Condition {
	var out []envelope.Condition
	for _, c := range m {
		out = append(out, envelope.Condition(c))
	}
	return out
}

// where is a field path with its line, "line 14: routes[1].filter.tipus",
// or the path alone for a Config built in Go.
func (c Config) where(path string) string {
	if line := (&validator{lines: c.lines}).lineOf(path); line > 0 {
		return fmt.Sprintf("line %d: %s", line, path)
	}
	return path
}

// routes checks the routes: what the YAML spells its own way (the source,
// "-", on_error, the converters) here, the shape of each route by
// envelope's judgement (Route.Problems), and that each source has one
// route without a filter.
func (v *validator) routes(c Config, m envelope.Routing) {
	if len(c.Routes) == 0 {
		v.add("routes", "at least one route is required")
	}
	for i, r := range c.Routes {
		at := func(f string) string { return fmt.Sprintf("routes[%d].%s", i, f) }
		v.source(at, r)
		dashes := v.dashes(at, r)
		for _, p := range m.Routes[i].Problems() {
			if !dashes[p.Key] { // said in the YAML's own words
				v.add(at(p.Key), "%s", p.Text)
			}
		}
		v.onError(at, r)
		for _, conv := range []struct{ key, val string }{{"key_converter", r.KeyConverter}, {"value_converter", r.ValueConverter}} {
			if conv.val != "" {
				v.oneOf(at(conv.key), conv.val, ConverterString, ConverterJSON)
			}
		}
	}
	v.sources(c, m)
}

// source checks that the route reads a table, by a valid name, or the
// messages of a prefix.
func (v *validator) source(at func(string) string, r Route) {
	switch message := r.Message != ""; {
	case r.Table == "" && !message:
		v.add(at("table"), "required (schema.table, e.g. public.outbox; or message: a logical message prefix)")
	case r.Table != "" && message:
		v.add(at("message"), "a route has a table or a message prefix, not both")
	case message:
		if r.Preset == envelope.PresetDebezium {
			v.add(at("preset"), "debezium is a table's preset (Debezium's EventRouter reads an outbox table)")
		}
	default:
		if schema, name, err := splitTable(r.Table); err != nil {
			v.add(at("table"), "%q %v, e.g. public.outbox or '\"Vendes\".\"Outbox\"'", r.Table, err)
		} else if r.Schema != schema || r.Name != name {
			v.add(at("table"), "Schema/Name (%q, %q) do not match table %q", r.Schema, r.Name, r.Table)
		}
	}
}

// dashes reports each column left "-" where "-" means nothing (routeFromYAML
// turned every other into ""), and returns their keys.
func (v *validator) dashes(at func(string) string, r Route) map[string]bool {
	out := map[string]bool{}
	for _, col := range []struct{ key, val string }{
		{"id", r.Columns.ID}, {"agregat_id", r.Columns.AgregatID}, {"tipus", r.Columns.Tipus},
		{"versio", r.Columns.Versio}, {"carrega", r.Columns.Carrega}, {"creat_en", r.Columns.CreatEn},
	} {
		key := "columns." + col.key
		switch {
		case col.val != noColumn:
			continue
		case col.key == "versio":
			v.add(at(key), "%q is the YAML spelling of no such column; in Columns it is \"\"", noColumn)
		default:
			v.add(at(key), "%q (no such column) is allowed only for versio and publicat_en (and for creat_en on a message route or with value: payload)", noColumn)
		}
		out[key] = true
	}
	return out
}

// onError checks on_error and the dead-letter topic it needs (whose name
// envelope judges).
func (v *validator) onError(at func(string) string, r Route) {
	switch r.OnError {
	case OnErrorStop:
		if r.DeadLetterTopic != "" {
			v.add(at("dead_letter_topic"), "set, but on_error is %q: set on_error: %s to use it", r.OnError, OnErrorDeadLetter)
		}
	case OnErrorDeadLetter:
		if r.DeadLetterTopic == "" {
			v.add(at("dead_letter_topic"), "required when on_error is %s", OnErrorDeadLetter)
		}
	default:
		v.add(at("on_error"), "%q is not one of %s, %s", r.OnError, OnErrorStop, OnErrorDeadLetter)
	}
}

// sources checks that each source has one route without a filter: it
// takes what the filtered ones do not, and a second would take the same
// rows again.
func (v *validator) sources(c Config, m envelope.Routing) {
	for _, s := range m.Sources {
		main := -1
		for _, i := range s.Routes {
			r := c.Routes[i]
			switch {
			case len(r.Filter) > 0:
				continue
			case main < 0:
				main = i
				continue
			}
			key, what := "table", r.Table
			if r.Message != "" {
				key, what = "message", r.Message
			}
			v.add(fmt.Sprintf("routes[%d].%s", i, key), "%q is already routed by routes[%d] (another route of the same source needs a filter: it then takes the rows the filter matches, as well)", what, main)
		}
		if main < 0 {
			name := s.Table.String()
			if s.Prefix != "" {
				name = fmt.Sprintf("message prefix %q", s.Prefix)
			}
			v.add(fmt.Sprintf("routes[%d].filter", s.Routes[0]), "every route of %s has a filter, so a change that matches none would be lost: give one route of it no filter (and drop changes on purpose with overrides: [{when: ..., drop: true}])", name)
		}
	}
}
