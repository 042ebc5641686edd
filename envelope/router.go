package envelope

import (
	"fmt"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/catalog"
)

// Router knows the routes, the service name and the largest record Kafka
// takes.
type Router struct {
	origen   []byte // origen already encoded as a JSON string
	tables   map[catalog.Table][]*route
	prefixes map[string][]*Binding // bound once: a message has no Relation
	maxBytes int                   // the largest WireSize a record may have; 0: no limit
}

// NewRouter compiles the routes (Routing.Routes). maxRecordBytes is
// kafka.batch_bytes: a record whose WireSize is larger is a bad row. It
// refuses a route with Problems, which a validated configuration never
// has.
func NewRouter(origen string, routes []Route, maxRecordBytes int) (*Router, error) {
	r := &Router{origen: appendString(nil, []byte(origen)), tables: map[catalog.Table][]*route{}, prefixes: map[string][]*Binding{}, maxBytes: maxRecordBytes}
	compiled := make([]*route, len(routes))
	for i := range routes {
		if ps := routes[i].Problems(); len(ps) > 0 {
			return nil, fmt.Errorf("route %d: %s", i, ps[0])
		}
		rt, err := compile(&routes[i])
		if err != nil {
			return nil, fmt.Errorf("route %d: %w", i, err)
		}
		if rt.ce {
			rt.ceSource = []byte(ceSource(routes[i].CloudEvents, origen))
		}
		compiled[i] = rt
	}
	for _, s := range sources(routes) {
		for _, i := range s.Routes {
			if s.Prefix != "" {
				r.prefixes[s.Prefix] = append(r.prefixes[s.Prefix], bindMessage(compiled[i]))
			} else {
				r.tables[s.Table] = append(r.tables[s.Table], compiled[i])
			}
		}
	}
	return r, nil
}

// Binding is one route of one relation (as announced by a pgoutput Relation
// message), or of one message prefix, with the route's columns found.
type Binding struct {
	Name  string // schema.table as a reader writes it, or `message prefix "p"`
	Route *Route // nil when the table has no route
	rt    *route
	pos   []int  // per rt.cols: position in the tuple, -1 when absent
	kind  []kind // per rt.cols: what its type is read as (kindOther for a message member)
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
		b := &Binding{Name: name, Route: rt.Route, rt: rt, columns: columns, pos: make([]int, len(rt.cols)), kind: make([]kind, len(rt.cols))}
		for j, col := range rt.cols {
			b.pos[j] = -1
			for k, c := range rel.Columns {
				if c.Name == col {
					b.pos[j], b.kind[j] = k, kindOfOID(c.DataType)
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

// RoutesMessages reports whether a route takes logical messages.
func (r *Router) RoutesMessages() bool { return len(r.prefixes) > 0 }

// messageColumns is the one "column" of a logical message, for dead letters.
var messageColumns = []string{"content"}

func bindMessage(rt *route) *Binding {
	b := &Binding{Name: fmt.Sprintf("message prefix %q", rt.Prefix), Route: rt.Route, rt: rt, columns: messageColumns, message: true,
		pos: make([]int, len(rt.cols)), kind: make([]kind, len(rt.cols))}
	for i := range b.pos {
		b.pos[i] = i
	}
	return b
}
