package envelope

import (
	"sort"
	"testing"

	"github.com/jackc/pglogrepl"
)

// TestEveryFittingTypeIsRead: for each use with a type demand, a column of
// every type that Fits accepts (what `outboxd check` passes) becomes a
// record through Build, read by the kind the same table gives its OID; a
// type Fits refuses is named with what the use needs.
func TestEveryFittingTypeIsRead(t *testing.T) {
	uses := make([]string, 0, len(demands))
	for use := range demands {
		uses = append(uses, use)
	}
	sort.Strings(uses)
	for _, use := range uses {
		for _, value := range []string{ValueEnvelope, ValuePayload} {
			r := typedRoute(use, value)
			if len(r.Refs()) == 0 {
				t.Fatalf("%s: a route with no refs", use)
			}
			fitted := 0
			for _, typ := range pgTypes {
				ok, want := r.Fits(use, typ.name)
				if !ok {
					if want == "" {
						t.Errorf("%s (%s): %s refused without saying what fits", use, value, typ.name)
					}
					continue
				}
				if typ.oid == 0 || !r.reads(use) {
					continue // an extension's type has no fixed OID to bind
				}
				fitted++
				if err := buildTyped(r, use, typ.oid, sample(use, typ.kind)); err != nil {
					t.Errorf("%s (%s) of type %s: check passes it, Build fails: %v", use, value, typ.name, err)
				}
			}
			if r.reads(use) && fitted == 0 {
				t.Errorf("%s (%s): no type fits", use, value)
			}
			if ok, _ := r.Fits(use, "numeric"); ok {
				t.Errorf("%s (%s): numeric fits, which Build does not read as any demanded kind", use, value)
			}
		}
	}
}

// columnOf names the column each use reads in typedRoute.
var columnOf = map[string]string{
	"columns.agregat_id": "agregat_id", "columns.tipus": "tipus", "columns.versio": "versio", "columns.carrega": "carrega",
	"columns.creat_en": "creat_en", "timestamp": "moment", "trace.traceparent": "tp", "trace.tracestate": "tstate", "trace.span_context": "sc",
}

// typedRoute is a route that reads the column of use, with value shape
// value.
func typedRoute(use, value string) *Route {
	cols := DefaultColumns()
	cols.PublicatEn = ""
	r := &Route{Schema: "public", Table: "outbox", Topic: "t", Columns: cols, Value: value, Timestamp: "moment",
		Trace: Trace{Traceparent: "tp", Tracestate: "tstate"}}
	if use == "trace.span_context" {
		r.Trace = Trace{SpanContext: "sc"}
	}
	return r
}

// reads: the route reads use's column (a payload value reads no versio,
// no creat_en).
func (r *Route) reads(use string) bool {
	for _, ref := range r.Refs() {
		if ref.Use == use {
			return true
		}
	}
	return false
}

// buildTyped builds one row of r whose column for use has type oid and
// text value; the other columns have the seed's types and values.
func buildTyped(r *Route, use string, oid uint32, value string) error {
	router, err := NewRouter("comandes", []Route{*r}, 0)
	if err != nil {
		return err
	}
	cols := []struct {
		name, value string
		oid         uint32
	}{
		{"id", "6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70", 2950}, {"agregat_id", "P-1", 25}, {"tipus", "comanda.creada", 25}, {"versio", "2", 23},
		{"carrega", `{"a": 1}`, 3802}, {"creat_en", "2026-01-01 10:00:00.5+00", 1184}, {"moment", "2026-01-01 10:00:00.5+00", 1184},
		{"tp", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", 25}, {"tstate", "congo=t61rcWkgMzE", 25}, {"sc", "traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n", 25},
	}
	rel := &pglogrepl.RelationMessage{Namespace: "public", RelationName: "outbox"}
	var row []Column
	for _, c := range cols {
		if c.name == columnOf[use] {
			c.oid, c.value = oid, value
		}
		rel.Columns = append(rel.Columns, &pglogrepl.RelationMessageColumn{Name: c.name, DataType: c.oid})
		row = append(row, Column{Kind: pglogrepl.TupleDataTypeText, Data: []byte(c.value)})
	}
	_, _, err = router.Build(router.Bind(rel)[0], row, Position{}, nil)
	return err
}

// sample is a value of a column of kind k as PostgreSQL prints it, fit
// for use.
func sample(use string, k kind) string {
	switch {
	case use == "columns.carrega" && k == kindBytea:
		return `\x7b7d`
	case use == "columns.carrega":
		return `{"a": 1}`
	case use == "columns.versio" || k == kindInteger && use == "columns.agregat_id":
		return "2"
	case k == kindInteger:
		return "1767261600500" // milliseconds
	case k == kindTimestamp:
		return "2026-01-01 10:00:00.5"
	case k == kindTimestamptz:
		return "2026-01-01 10:00:00.5+00"
	case k == kindUUID:
		return "6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f71"
	case use == "trace.span_context":
		return "traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n"
	case use == "trace.traceparent":
		return "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	}
	return "comanda.creada"
}
