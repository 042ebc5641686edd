package catalog

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// Ref is a column a route reads and the configuration key that makes it
// read it ("line 14: routes[1].filter.tipus"), for an error that names the
// line to change.
type Ref struct {
	Column string
	Key    string
}

// Relation is what the catalogs say about a routed table.
type Relation struct {
	Exists bool
	Kind   string // pg_class.relkind: r (table), p (partitioned table), v, ...
	// Columns by name: the type as format_type prints it, and the name of
	// its base type (a domain's underlying type).
	Columns map[string]ColumnType
}

// ColumnType is a column's type.
type ColumnType struct{ Type, Base string }

// ReadRelation reads a table's kind and columns; Exists is false when the
// role sees no such table.
func ReadRelation(ctx context.Context, conn *pgconn.PgConn, t Table) (Relation, error) {
	rel := Relation{Columns: map[string]ColumnType{}}
	reg := "pg_catalog.to_regclass(" + QuoteLiteral(t.Quoted()) + ")"
	rows, err := query(ctx, conn, "SELECT relkind::text FROM pg_catalog.pg_class WHERE oid = "+reg)
	if err != nil || len(rows) == 0 {
		return rel, err
	}
	rel.Exists, rel.Kind = true, str(rows[0][0])
	rows, err = query(ctx, conn, `SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), bt.typname::text
		FROM pg_catalog.pg_attribute a
		JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
		JOIN pg_catalog.pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
		WHERE a.attrelid = `+reg+` AND a.attnum > 0 AND NOT a.attisdropped`)
	if err != nil {
		return rel, err
	}
	for _, r := range rows {
		rel.Columns[str(r[0])] = ColumnType{Type: str(r[1]), Base: str(r[2])}
	}
	return rel, nil
}

// Missing is the refs of r whose column rel lacks, as one line each:
// "column tipo (line 14: routes[1].filter.tipo) does not exist in
// public.outbox".
func (r RoutedTable) Missing(rel Relation) []string {
	var out []string
	for _, ref := range r.Refs {
		if _, ok := rel.Columns[ref.Column]; !ok {
			out = append(out, fmt.Sprintf("column %s (%s) does not exist in %s", displayIdent(ref.Column), ref.Key, r.Table))
		}
	}
	return out
}

// CheckColumns reads each routed table and reports every column a route
// reads that it lacks, or that it is missing: the one verdict the daemon
// acts on at start (outboxd check says more, with the types).
func CheckColumns(ctx context.Context, conn *pgconn.PgConn, tables []RoutedTable) (problems []string, err error) {
	for _, r := range tables {
		rel, err := ReadRelation(ctx, conn, r.Table)
		if err != nil {
			return nil, fmt.Errorf("read the columns of %s: %w", r.Table, err)
		}
		if !rel.Exists {
			problems = append(problems, fmt.Sprintf("table %s does not exist (or the role cannot see its schema)", r.Table))
			continue
		}
		problems = append(problems, r.Missing(rel)...)
	}
	return problems, nil
}
