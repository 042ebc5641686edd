package preflight

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/config"
)

// ---- publication ----

// publication is what the catalogs say about the configured publication.
type publication struct {
	exists, inserts, allTables bool
	tables                     map[string]pubTable // "schema.table" -> its entry
	// For creating it when absent:
	super, mayCreateInDB bool
	notOwned             []string // routed tables the role does not own
}

type pubTable struct {
	columns   []string // the column list; nil = every column
	rowFilter string   // the WHERE clause; "" = none
}

func checkPublication(ctx context.Context, conn *pgx.Conn, cfg config.Config) []Result {
	name := cfg.Postgres.Publication
	p := publication{tables: map[string]pubTable{}}
	err := conn.QueryRow(ctx, "SELECT pubinsert, puballtables FROM pg_catalog.pg_publication WHERE pubname = $1", name).Scan(&p.inserts, &p.allTables)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if err := conn.QueryRow(ctx, "SELECT rolsuper, has_database_privilege(current_database(), 'CREATE') FROM pg_catalog.pg_roles WHERE rolname = current_user").Scan(&p.super, &p.mayCreateInDB); err != nil {
			return queryFailed("publication", err)
		}
		for _, r := range cfg.Routes {
			var owns bool
			err := conn.QueryRow(ctx, "SELECT pg_has_role(current_user, relowner, 'USAGE') FROM pg_catalog.pg_class WHERE oid = to_regclass($1)",
				pgx.Identifier{r.Schema, r.Name}.Sanitize()).Scan(&owns)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return queryFailed("publication", err)
			}
			if !owns {
				p.notOwned = append(p.notOwned, r.Table)
			}
		}
	case err != nil:
		return queryFailed("publication", err)
	default:
		p.exists = true
		var num int
		if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&num); err != nil {
			return queryFailed("publication", err)
		}
		q := "SELECT schemaname::text, tablename::text, NULL::text[], '' FROM pg_catalog.pg_publication_tables WHERE pubname = $1"
		if num >= 150000 { // column lists and row filters
			q = "SELECT schemaname::text, tablename::text, attnames::text[], coalesce(rowfilter, '') FROM pg_catalog.pg_publication_tables WHERE pubname = $1"
		}
		rows, err := conn.Query(ctx, q, name)
		if err != nil {
			return queryFailed("publication", err)
		}
		var schema, table string
		var t pubTable
		_, err = pgx.ForEachRow(rows, []any{&schema, &table, &t.columns, &t.rowFilter}, func() error {
			p.tables[schema+"."+table] = pubTable{columns: append([]string(nil), t.columns...), rowFilter: t.rowFilter}
			return nil
		})
		if err != nil {
			return queryFailed("publication", err)
		}
	}
	return []Result{evalPublication(cfg, p)}
}

// evalPublication: the publication must publish inserts of every routed
// table, every mapped column and every row, and no table without a route
// (an insert into one stops outboxd). An absent one passes when outboxd
// will create it.
func evalPublication(cfg config.Config, p publication) Result {
	name := cfg.Postgres.Publication
	ref := pgx.Identifier{name}.Sanitize()
	var idents []string
	for _, r := range cfg.Routes {
		idents = append(idents, pgx.Identifier{r.Schema, r.Name}.Sanitize())
	}
	const sqlFile = "run sql/002_publication.sql as the tables' owner"
	if !p.exists {
		create := fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')", ref, strings.Join(idents, ", "))
		switch {
		case !cfg.Postgres.CreatePublication:
			return fail("publication", fmt.Sprintf("publication %s does not exist and postgres.create_publication is false", name),
				fmt.Sprintf("%s (%s), or set postgres.create_publication: true", sqlFile, create))
		case p.super:
			return pass("publication", "%s does not exist; will be created at start (the role is a superuser)", name)
		case len(p.notOwned) > 0:
			return fail("publication", fmt.Sprintf("publication %s does not exist and the role cannot create it: it does not own %s", name, strings.Join(p.notOwned, ", ")),
				fmt.Sprintf("%s (%s)", sqlFile, create))
		case !p.mayCreateInDB:
			return fail("publication", fmt.Sprintf("publication %s does not exist and the role lacks CREATE on the database", name),
				fmt.Sprintf("%s (%s), or GRANT CREATE ON DATABASE to the role", sqlFile, create))
		}
		return pass("publication", "%s does not exist; will be created at start (the role owns every routed table)", name)
	}
	if !p.inserts {
		return fail("publication", fmt.Sprintf("publication %s does not publish inserts", name),
			fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert')", ref))
	}
	if p.allTables {
		return fail("publication", fmt.Sprintf("publication %s is FOR ALL TABLES: an insert into a table without a route stops outboxd", name),
			fmt.Sprintf("use a publication of the outbox tables only: CREATE PUBLICATION ... FOR TABLE %s WITH (publish = 'insert') (sql/002_publication.sql)", strings.Join(idents, ", ")))
	}
	var problems, fixes []string
	routed := map[string]bool{}
	for i, r := range cfg.Routes {
		key := r.Schema + "." + r.Name
		routed[key] = true
		t, ok := p.tables[key]
		if !ok {
			problems = append(problems, "does not cover "+r.Table)
			fixes = append(fixes, fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", ref, idents[i]))
			continue
		}
		if t.columns != nil {
			var missing []string
			for _, c := range mapped(r.Columns) {
				if !contains(t.columns, c) {
					missing = append(missing, c)
				}
			}
			if len(missing) > 0 {
				problems = append(problems, fmt.Sprintf("its column list for %s leaves out %s", r.Table, strings.Join(missing, ", ")))
				fixes = append(fixes, fmt.Sprintf("ALTER PUBLICATION %s SET TABLE ... %s without a column list", ref, idents[i]))
			}
		}
		if t.rowFilter != "" {
			problems = append(problems, fmt.Sprintf("it filters %s with WHERE %s: rows it rejects are never delivered", r.Table, t.rowFilter))
			fixes = append(fixes, fmt.Sprintf("publish %s without a WHERE clause", idents[i]))
		}
	}
	for _, t := range sortedKeys(p.tables) {
		if !routed[t] {
			problems = append(problems, fmt.Sprintf("it covers %s, which has no route: an insert into it stops outboxd", t))
			fixes = append(fixes, fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s, or add a route for it", ref, t))
		}
	}
	if len(problems) > 0 {
		return fail("publication", fmt.Sprintf("publication %s: %s", name, strings.Join(problems, "; ")), strings.Join(fixes, "; "))
	}
	return pass("publication", "%s publishes inserts of %s", name, strings.Join(sortedKeys(routed), ", "))
}

func mapped(c config.Columns) []string {
	out := []string{c.ID, c.AgregatID, c.Tipus, c.Carrega, c.CreatEn}
	if c.Versio != "" {
		out = append(out, c.Versio)
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

// ---- the slot ----

// Slot is a replication slot as pg_replication_slots shows it.
type Slot struct {
	Name, Plugin, Type string
	Database           string // "" for a physical slot
	SameDatabase       bool   // the slot belongs to the connection's database
	Active             bool
	ActivePID          int
	ConfirmedFlushLSN  string // "" when the slot has none
	WALStatus          string // reserved, extended, unreserved, lost
	// BytesAfterConfirmed is pg_current_wal_lsn() - confirmed_flush_lsn:
	// WAL written since the last position outboxd confirmed, which holds any
	// event not yet delivered.
	BytesAfterConfirmed int64
}

// ReadSlot returns the slot called name, or nil when there is none.
func ReadSlot(ctx context.Context, conn *pgx.Conn, name string) (*Slot, error) {
	s := Slot{Name: name}
	err := conn.QueryRow(ctx, `SELECT coalesce(plugin::text, ''), slot_type, coalesce(database::text, ''),
			coalesce(database = current_database(), false), active, coalesce(active_pid, 0),
			coalesce(confirmed_flush_lsn::text, ''), coalesce(wal_status, ''),
			coalesce((pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, 0)
		FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, name).
		Scan(&s.Plugin, &s.Type, &s.Database, &s.SameDatabase, &s.Active, &s.ActivePID, &s.ConfirmedFlushLSN, &s.WALStatus, &s.BytesAfterConfirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read replication slot %q: %w", name, err)
	}
	return &s, nil
}

func checkSlot(ctx context.Context, conn *pgx.Conn, cfg config.Config) []Result {
	s, err := ReadSlot(ctx, conn, cfg.Postgres.Slot)
	if err != nil {
		return queryFailed("slot", err)
	}
	return []Result{evalSlot(cfg.Postgres, s)}
}

func evalSlot(pg config.Postgres, s *Slot) Result {
	name := pg.Slot
	if s == nil {
		if pg.CreateSlot {
			return pass("slot", "%s does not exist; will be created at start (it begins at the current WAL position)", name)
		}
		return fail("slot", fmt.Sprintf("replication slot %s does not exist and postgres.create_slot is false", name),
			fmt.Sprintf("reconcile events committed since the old slot's position (if any), then set postgres.create_slot: true, or SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", name))
	}
	switch {
	case s.Type != "logical" || s.Plugin != "pgoutput":
		return fail("slot", fmt.Sprintf("replication slot %s is a %s slot with plugin %q, outboxd needs a logical pgoutput slot", name, s.Type, s.Plugin),
			"choose another postgres.slot name")
	case !s.SameDatabase:
		return fail("slot", fmt.Sprintf("replication slot %s belongs to database %s, not the DSN's", name, s.Database),
			"point postgres.dsn at that database or choose another postgres.slot name")
	case s.WALStatus == "lost":
		return fail("slot", fmt.Sprintf("replication slot %s has wal_status lost: WAL it needed was removed, events are missing", name),
			"reconcile the outbox (republish rows since the last delivered one), then outboxd slot drop --yes and start with postgres.create_slot: true")
	case s.Active:
		return fail("slot", fmt.Sprintf("replication slot %s is active for PID %d (another outboxd?)", name, s.ActivePID),
			"stop the other consumer of the slot, or give this instance its own postgres.slot")
	case s.WALStatus == "unreserved":
		return fail("slot", fmt.Sprintf("replication slot %s has wal_status unreserved: it is past max_slot_wal_keep_size and its WAL will be removed at the next checkpoint (warning: events may be lost)", name),
			"start outboxd now so the slot advances, or raise max_slot_wal_keep_size")
	}
	return pass("slot", "%s exists, inactive, confirmed_flush_lsn %s, %d bytes of WAL after it, wal_status %s", name, s.ConfirmedFlushLSN, s.BytesAfterConfirmed, s.WALStatus)
}
