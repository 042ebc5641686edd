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
	// ViaRoot is publish_via_partition_root: a partition's rows are
	// published under the name of its partitioned table. Without it
	// pgoutput names the partition, and Tables lists the partitions of a
	// partitioned table, not the table.
	ViaRoot bool
	// Tables: the tables whose rows pgoutput publishes, under their names
	// (pg_publication_tables).
	Tables map[Table]PublishedTable
	// Partitioned: the partitioned tables the publication names itself
	// (FOR TABLE), with or without partitions yet.
	Partitioned map[Table]bool
}

// PublishedTable is one table's entry in a publication.
type PublishedTable struct {
	Columns   []string // its column list; nil: every column
	RowFilter string   // its WHERE clause; "": none
	// Root is the partitioned table this table is a partition of (the
	// topmost); zero when it is no partition.
	Root Table
}

// ReadPublication reads the publication called name; Exists is false when
// there is none.
func ReadPublication(ctx context.Context, conn *pgconn.PgConn, name string, serverVersion int) (Publication, error) {
	p := Publication{Name: name, Tables: map[Table]PublishedTable{}, Partitioned: map[Table]bool{}}
	lit := QuoteLiteral(name)
	rows, err := query(ctx, conn, "SELECT pubinsert, puballtables, pubviaroot FROM pg_catalog.pg_publication WHERE pubname = "+lit)
	if err != nil || len(rows) == 0 {
		return p, err
	}
	p.Exists, p.Inserts, p.AllTables, p.ViaRoot = true, str(rows[0][0]) == "t", str(rows[0][1]) == "t", str(rows[0][2]) == "t"
	cols := "NULL, NULL"
	if serverVersion >= 150000 { // column lists and row filters
		cols = "array_to_json(t.attnames), t.rowfilter"
	}
	// Each table with the root of its partition tree when it is a partition.
	rows, err = query(ctx, conn, `SELECT t.schemaname, t.tablename, `+cols+`, rn.nspname, r.relname
		FROM pg_catalog.pg_publication_tables t
		JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname
		JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
		LEFT JOIN pg_catalog.pg_class r ON c.relispartition AND r.oid = pg_catalog.pg_partition_root(c.oid)
		LEFT JOIN pg_catalog.pg_namespace rn ON rn.oid = r.relnamespace
		WHERE t.pubname = `+lit)
	if err != nil {
		return p, err
	}
	for _, r := range rows {
		t := PublishedTable{RowFilter: str(r[3]), Root: Table{str(r[4]), str(r[5])}}
		if r[2] != nil {
			if err := json.Unmarshal([]byte(*r[2]), &t.Columns); err != nil {
				return p, fmt.Errorf("read the column list of %s.%s: %w", str(r[0]), str(r[1]), err)
			}
		}
		p.Tables[Table{str(r[0]), str(r[1])}] = t
	}
	rows, err = query(ctx, conn, `SELECT n.nspname, c.relname FROM pg_catalog.pg_publication_rel pr
		JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid
		JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind = 'p' AND p.pubname = `+lit)
	if err != nil {
		return p, err
	}
	for _, r := range rows {
		p.Partitioned[Table{str(r[0]), str(r[1])}] = true
	}
	return p, nil
}

// RoutedTable is what the publication must publish for one routed table:
// its inserts, with at least the columns its routes read
// (envelope.Routing.Publication).
type RoutedTable struct {
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

// options are the publication's options: inserts only, and a partition's
// rows under its partitioned table's name (the routed one).
const options = "WITH (publish = 'insert', publish_via_partition_root = true)"

// CreateSQL is the statement that creates the publication for tables.
func CreateSQL(name string, tables []RoutedTable) string {
	if len(tables) == 0 {
		// Logical messages only: they need no table.
		return fmt.Sprintf("CREATE PUBLICATION %s %s", QuoteIdent(name), options)
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s %s", QuoteIdent(name), quotedTables(tables), options)
}

func quotedTables(tables []RoutedTable) string {
	names := make([]string, len(tables))
	for i, r := range tables {
		names[i] = r.Table.Quoted()
	}
	return strings.Join(names, ", ")
}

// Check is the one policy on a publication: it must exist, publish inserts,
// and publish every row and every mapped column of each routed table and no
// other table. Each problem carries the statement that fixes it.
func (p Publication) Check(tables []RoutedTable) []Problem {
	ref := QuoteIdent(p.Name)
	if !p.Exists {
		return []Problem{{Unpublished, fmt.Sprintf("publication %s does not exist", p.Name), CreateSQL(p.Name, tables) + " (as the tables' owner; see sql/002_publication.sql)"}}
	}
	var out []Problem
	if !p.Inserts {
		out = append(out, Problem{Unpublished, fmt.Sprintf("publication %s does not publish inserts", p.Name), fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert')", ref)})
	}
	if p.AllTables {
		return append(out, Problem{Unrouted, fmt.Sprintf("publication %s is FOR ALL TABLES: an insert into a table without a route stops outboxd", p.Name),
			fmt.Sprintf("use a publication of the outbox tables only: %s", CreateSQL(p.Name, tables))})
	}
	// Without ViaRoot a routed partitioned table is published under its
	// partitions' names: one problem, whose fix covers them all.
	underPartitions := map[Table]bool{}
	if !p.ViaRoot {
		for t := range p.Partitioned {
			underPartitions[t] = true
		}
		for _, t := range p.Tables {
			if t.Root != (Table{}) {
				underPartitions[t.Root] = true
			}
		}
	}
	routed := map[Table]bool{}
	var partitioned []string
	for _, r := range tables {
		routed[r.Table] = true
		t, ok := p.Tables[r.Table]
		if !ok && underPartitions[r.Table] {
			partitioned = append(partitioned, r.Table.String())
			continue
		}
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
					fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s (publish the table without a column list)", ref, quotedTables(tables))})
			}
		}
		if t.RowFilter != "" {
			out = append(out, Problem{Unpublished, fmt.Sprintf("publication %s filters %s with WHERE %s: rows it rejects are never delivered", p.Name, r.Table, t.RowFilter),
				fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s (publish the table without a WHERE clause)", ref, quotedTables(tables))})
		}
	}
	if len(partitioned) > 0 {
		out = append(out, Problem{Unpublished, fmt.Sprintf("publication %s has publish_via_partition_root off: the rows of the partitioned %s reach outboxd under its partitions' names, which have no route (outboxd would stop at the first)",
			p.Name, strings.Join(partitioned, ", ")),
			fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true)", ref)})
	}
	var extra []Table
	for t, pt := range p.Tables {
		if !routed[t] && !(routed[pt.Root] && underPartitions[pt.Root]) {
			extra = append(extra, t)
		}
	}
	sort.Slice(extra, func(i, j int) bool { return extra[i].String() < extra[j].String() })
	for _, t := range extra {
		what := t.String()
		if root := p.Tables[t].Root; root != (Table{}) {
			what += " (a partition of " + root.String() + ")"
		}
		out = append(out, Problem{Unrouted, fmt.Sprintf("publication %s covers %s, which has no route: an insert into it stops outboxd", p.Name, what),
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

// Partitions maps each partition (at every level) of those of tables that
// are partitioned to its table.
func Partitions(ctx context.Context, conn *pgconn.PgConn, tables []Table) (map[Table]Table, error) {
	out := map[Table]Table{}
	for _, t := range tables {
		rows, err := query(ctx, conn, `SELECT n.nspname, c.relname
			FROM pg_catalog.pg_partition_tree(pg_catalog.to_regclass(`+QuoteLiteral(t.Quoted())+`)) p
			JOIN pg_catalog.pg_class c ON c.oid = p.relid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE p.level > 0`)
		if err != nil {
			return nil, fmt.Errorf("read the partitions of %s: %w", t, err)
		}
		for _, r := range rows {
			out[Table{str(r[0]), str(r[1])}] = t
		}
	}
	return out, nil
}
