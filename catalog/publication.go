package catalog

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Publication is what the catalogs say about one publication.
type Publication struct {
	Name                       string
	Exists, Inserts, AllTables bool
	Tables                     map[Table]PublishedTable
}

// PublishedTable is one table's entry in a publication.
type PublishedTable struct {
	Columns   []string // its column list; nil: every column
	RowFilter string   // its WHERE clause; "": none
}

// ReadPublication reads the publication called name; Exists is false when
// there is none.
func ReadPublication(ctx context.Context, conn *pgconn.PgConn, name string, serverVersion int) (Publication, error) {
	p := Publication{Name: name, Tables: map[Table]PublishedTable{}}
	rows, err := query(ctx, conn, "SELECT pubinsert, puballtables FROM pg_catalog.pg_publication WHERE pubname = "+QuoteLiteral(name))
	if err != nil || len(rows) == 0 {
		return p, err
	}
	p.Exists, p.Inserts, p.AllTables = true, str(rows[0][0]) == "t", str(rows[0][1]) == "t"
	q := "SELECT schemaname, tablename, NULL, NULL FROM pg_catalog.pg_publication_tables WHERE pubname = "
	if serverVersion >= 150000 { // column lists and row filters
		q = "SELECT schemaname, tablename, array_to_json(attnames), rowfilter FROM pg_catalog.pg_publication_tables WHERE pubname = "
	}
	if rows, err = query(ctx, conn, q+QuoteLiteral(name)); err != nil {
		return p, err
	}
	for _, r := range rows {
		t := PublishedTable{RowFilter: str(r[3])}
		if r[2] != nil {
			if err := json.Unmarshal([]byte(*r[2]), &t.Columns); err != nil {
				return p, fmt.Errorf("read the column list of %s.%s: %w", str(r[0]), str(r[1]), err)
			}
		}
		p.Tables[Table{str(r[0]), str(r[1])}] = t
	}
	return p, nil
}

// Route is what the publication must publish for one routed table: its
// inserts, with at least the columns its routes read.
type Route struct {
	Table   Table
	Columns []string
	// Refs: each column read, with the configuration key that reads it.
	Refs []Ref
}

// Problem kinds, from the one that loses events silently to the one that
// only stops outboxd.
const (
	// Unpublished: events of a routed table do not reach outboxd (the
	// publication is missing, does not publish inserts, does not cover the
	// table, leaves out a mapped column or filters rows).
	Unpublished = "unpublished"
	// Unrouted: the publication covers a table without a route; an insert
	// into it stops outboxd.
	Unrouted = "unrouted"
)

// Problem is one thing wrong with the publication, and the SQL that fixes it.
type Problem struct {
	Kind string
	Text string
	Fix  string
}

func (p Problem) String() string { return p.Text + ": " + p.Fix }

// CreateSQL is the statement that creates the publication for routes.
func CreateSQL(name string, routes []Route) string {
	if len(routes) == 0 {
		// Logical messages only: they need no table.
		return fmt.Sprintf("CREATE PUBLICATION %s WITH (publish = 'insert')", QuoteIdent(name))
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')", QuoteIdent(name), quotedTables(routes))
}

func quotedTables(routes []Route) string {
	names := make([]string, len(routes))
	for i, r := range routes {
		names[i] = r.Table.Quoted()
	}
	return strings.Join(names, ", ")
}

// Check is the one policy on a publication: it must exist, publish inserts,
// and publish every row and every mapped column of each routed table and no
// other table. Each problem carries the statement that fixes it.
func (p Publication) Check(routes []Route) []Problem {
	ref := QuoteIdent(p.Name)
	if !p.Exists {
		return []Problem{{Unpublished, fmt.Sprintf("publication %s does not exist", p.Name), CreateSQL(p.Name, routes) + " (as the tables' owner; see sql/002_publication.sql)"}}
	}
	var out []Problem
	if !p.Inserts {
		out = append(out, Problem{Unpublished, fmt.Sprintf("publication %s does not publish inserts", p.Name), fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert')", ref)})
	}
	if p.AllTables {
		return append(out, Problem{Unrouted, fmt.Sprintf("publication %s is FOR ALL TABLES: an insert into a table without a route stops outboxd", p.Name),
			fmt.Sprintf("use a publication of the outbox tables only: %s", CreateSQL(p.Name, routes))})
	}
	routed := map[Table]bool{}
	for _, r := range routes {
		routed[r.Table] = true
		t, ok := p.Tables[r.Table]
		if !ok {
			out = append(out, Problem{Unpublished, fmt.Sprintf("publication %s does not cover %s: its inserts do not reach outboxd", p.Name, r.Table),
				fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", ref, r.Table.Quoted())})
			continue
		}
		if t.Columns != nil {
			var missing []string
			for _, c := range r.Columns {
				if !contains(t.Columns, c) {
					missing = append(missing, c)
				}
			}
			if len(missing) > 0 {
				out = append(out, Problem{Unpublished, fmt.Sprintf("publication %s's column list for %s leaves out %s", p.Name, r.Table, strings.Join(missing, ", ")),
					fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s (publish the table without a column list)", ref, quotedTables(routes))})
			}
		}
		if t.RowFilter != "" {
			out = append(out, Problem{Unpublished, fmt.Sprintf("publication %s filters %s with WHERE %s: rows it rejects are never delivered", p.Name, r.Table, t.RowFilter),
				fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s (publish the table without a WHERE clause)", ref, quotedTables(routes))})
		}
	}
	var extra []Table
	for t := range p.Tables {
		if !routed[t] {
			extra = append(extra, t)
		}
	}
	sort.Slice(extra, func(i, j int) bool { return extra[i].String() < extra[j].String() })
	for _, t := range extra {
		out = append(out, Problem{Unrouted, fmt.Sprintf("publication %s covers %s, which has no route: an insert into it stops outboxd", p.Name, t),
			fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s, or add a route for it", ref, t.Quoted())})
	}
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
