package envelope

import (
	"slices"

	"github.com/outboxd/outboxd/catalog"
)

// Routing is the routed model of a configuration, built once from it
// (config's Config.Routing): every route, and each source the routes read,
// once. Everything that acts on routes reads it: the Router compiles its
// Routes, the publication and the start's column check take its
// Publication, and the cut-over snapshot, replay, marks and retention work
// on its Tables.
type Routing struct {
	Routes  []Route
	Sources []Source
	// key names a route's configuration key in an error; nil: the key
	// relative to the route.
	key func(route int, key string) string
}

// Source is where changes come from, a table or the logical messages of
// one prefix, and the routes that take them.
type Source struct {
	Table  catalog.Table // a table's names; zero for a message prefix
	Prefix string        // a message prefix; "" for a table
	// Routes are the indexes of its routes in Routing.Routes, in the
	// file's order.
	Routes []int
}

// NewRouting groups routes by source. key names route i's configuration
// key k for an error, with its line when the routes came from a file
// ("line 13: routes[1].filter.mercat"); nil leaves k as it is.
func NewRouting(routes []Route, key func(route int, key string) string) Routing {
	return Routing{Routes: routes, Sources: sources(routes), key: key}
}

// RoutesMessages reports whether a route takes logical messages.
func (m Routing) RoutesMessages() bool {
	for _, s := range m.Sources {
		if s.Prefix != "" {
			return true
		}
	}
	return false
}

// sources groups routes by source, in the order of each source's first
// route. A route with neither a table nor a prefix has no source (config
// refuses it).
func sources(routes []Route) []Source {
	type name struct {
		table  catalog.Table
		prefix string
	}
	var out []Source
	index := map[name]int{}
	for i, r := range routes {
		n := name{prefix: r.Prefix}
		switch {
		case r.Prefix != "":
		case r.Table != "":
			n.table = catalog.Table{Schema: r.Schema, Name: r.Table}
		default:
			continue
		}
		k, ok := index[n]
		if !ok {
			k = len(out)
			index[n] = k
			out = append(out, Source{Table: n.table, Prefix: n.prefix})
		}
		out[k].Routes = append(out[k].Routes, i)
	}
	return out
}

// Key names route i's configuration key k ("filter.mercat") for an error.
func (m Routing) Key(i int, k string) string {
	if m.key == nil {
		return k
	}
	return m.key(i, k)
}

// Table is a routed table as what reads or writes the table itself sees
// it: the cut-over snapshot, replay, marks and retention.
type Table struct {
	catalog.Table
	// Routes are the indexes of its routes in Routing.Routes, in the
	// file's order: every one gets the table's rows (the Router binds them
	// all).
	Routes []int
	// Route is the first of them: it names the columns that reading the
	// table needs (id, creat_en, publicat_en), and replay names the table
	// by its topic too.
	Route *Route
}

// Tables is each routed table once, in the order of the file. A message
// prefix has no table.
func (m Routing) Tables() []Table {
	var out []Table
	for _, s := range m.Sources {
		if s.Prefix == "" {
			out = append(out, Table{Table: s.Table, Routes: s.Routes, Route: &m.Routes[s.Routes[0]]})
		}
	}
	return out
}

// Publication is what the publication must publish: each routed table
// once, with every column its routes read and the key that reads it.
func (m Routing) Publication() []catalog.RoutedTable {
	var out []catalog.RoutedTable
	for _, s := range m.Tables() {
		t := catalog.RoutedTable{Table: s.Table}
		for _, i := range s.Routes {
			for _, ref := range m.Routes[i].Refs() {
				if !slices.Contains(t.Columns, ref.Column) {
					t.Columns = append(t.Columns, ref.Column)
				}
				t.Refs = append(t.Refs, catalog.Ref{Column: ref.Column, Key: m.Key(i, ref.Use)})
			}
		}
		out = append(out, t)
	}
	return out
}
