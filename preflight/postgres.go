package preflight

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/postgres"
	"github.com/outboxd/outboxd/replication"
)

// Connect opens a normal (non-replication) connection with the configured
// DSN and connect timeout. Its error never contains the password.
func Connect(ctx context.Context, pg config.Postgres) (*pgx.Conn, error) {
	cc, err := pg.ConnConfig()
	if err != nil {
		return nil, err
	}
	return postgres.ConnectPgx(ctx, cc, postgres.Session{})
}

func checkPostgres(ctx context.Context, t *target) []Result {
	cfg := *t
	pg := cfg.Postgres
	ctx, cancel := context.WithTimeout(ctx, pg.ConnectTimeout+30*time.Second)
	defer cancel()
	conn, err := Connect(ctx, pg)
	if err != nil {
		fix := "check postgres.dsn (host, port, database, user, password) and pg_hba.conf; the server must accept TCP connections from here"
		if why := postgres.Explain(err); why != "" {
			fix = why
		}
		out := append([]Result{fail("database", fmt.Sprintf("cannot connect to %s: %s", pg.RedactedDSN(), oneLine(err.Error())), fix)}, checkTLS(pg)...)
		for _, name := range databaseChecks(cfg) {
			out = append(out, skipped(name, "the database is unreachable"))
		}
		return out
	}
	defer conn.Close(context.Background())
	var version, db, user string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version'), current_database(), current_user").Scan(&version, &db, &user); err != nil {
		return []Result{fail("database", "connected, but a query failed: "+err.Error(), "check the role's privileges")}
	}
	out := []Result{pass("database", "connected to %s (PostgreSQL %s, database %s, role %s)", pg.RedactedDSN(), version, db, user)}
	// pg_control_system() is PUBLIC's; the same identifier as the
	// replication protocol's IDENTIFY_SYSTEM.
	_ = conn.QueryRow(ctx, "SELECT system_identifier::text FROM pg_control_system()").Scan(&t.system)
	out = append(out, checkTLS(pg)...)
	svc, err := recognise(ctx, conn)
	switch {
	case err != nil:
		out = append(out, warn("service", "could not read the server's settings: "+oneLine(err.Error()), "check that the role can read pg_settings"))
	case svc != nil:
		cfg.service = svc
		out = append(out, pass("service", "%s: see %s", svc.Name, svc.Doc()))
	}
	for _, check := range []func(context.Context, *pgx.Conn, target) []Result{
		checkWalLevel, checkCapacity, checkRole, checkTables, checkPartitions, checkPublication, checkSlot, checkFailover, checkStreaming, checkCutoverLock,
	} {
		out = append(out, check(ctx, conn, cfg)...)
	}
	return out
}

// checkTLS warns when the DSN reaches PostgreSQL over the network below
// verify-full (the daemon logs the same at every start).
func checkTLS(pg config.Postgres) []Result {
	if detail, fix := pg.TLSWarning(); detail != "" {
		return []Result{warn("tls", detail, fix)}
	}
	return nil
}

// databaseChecks names the checks that need a database connection.
func databaseChecks(cfg target) []string {
	names := []string{"wal_level", "max_replication_slots", "max_wal_senders", "role"}
	for _, t := range cfg.routing.Tables() {
		names = append(names, "table "+t.String())
	}
	return append(names, "publication", "slot", "failover", "streaming", "cut-over lock")
}

func queryFailed(name string, err error) []Result {
	return []Result{fail(name, "query failed: "+oneLine(err.Error()), "check that the role can read the system catalogs")}
}

// ---- the cut-over lock ----

// checkCutoverLock says who holds the slot's cut-over lock, which any role
// can take (its key is public): a session that is not an outboxd holds
// back a cut-over and the retention job.
func checkCutoverLock(ctx context.Context, conn *pgx.Conn, cfg target) []Result {
	hs, err := catalog.CutoverLockHolders(ctx, conn.PgConn(), cfg.Postgres.Slot)
	if err != nil {
		return queryFailed("cut-over lock", err)
	}
	return []Result{evalCutoverLock(hs, catalog.DescribeCutoverHolders(cfg.Postgres.Slot, hs, nil))}
}

func evalCutoverLock(hs []catalog.LockHolder, busy string) Result {
	if len(hs) == 0 {
		return pass("cut-over lock", "free")
	}
	for _, h := range hs {
		if !h.Outboxd {
			return warn("cut-over lock", busy, "end that session if it is not yours; while it holds the lock no cut-over starts and the retention job deletes nothing")
		}
	}
	return pass("cut-over lock", "%s", busy)
}

// ---- streaming ----

// checkStreaming says whether the server will stream large transactions
// to outboxd (replication.DecideStreaming decides, as for the session),
// and whether pipeline.spill_dir takes their changes.
func checkStreaming(ctx context.Context, conn *pgx.Conn, cfg target) []Result {
	var version int
	var workMem string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('logical_decoding_work_mem')").Scan(&version, &workMem); err != nil {
		return queryFailed("streaming", err)
	}
	msgs := cfg.routing.RoutesMessages()
	d := replication.DecideStreaming(cfg.Postgres.Streaming, msgs, version, cfg.Pipeline.SpillDir)
	return []Result{evalStreaming(d, cfg.Postgres.Streaming && msgs, workMem)}
}

// evalStreaming: d is the decision, byMessages that streaming is off only
// because a route takes logical messages (outboxd's choice, not a setting
// to change).
func evalStreaming(d replication.Streaming, byMessages bool, workMem string) Result {
	switch {
	case d.DirErr != nil:
		return warn("streaming", fmt.Sprintf("off: %s, so the server holds each transaction larger than logical_decoding_work_mem (%s), a migration on any table included, until its commit, and every later event waits", d.Off, workMem),
			"set pipeline.spill_dir to a directory outboxd may write (in a container: an emptyDir or tmpfs volume), with room for the outbox rows of the largest transaction")
	case d.Off == "":
		return pass("streaming", "on: the server streams transactions larger than logical_decoding_work_mem (%s) as they run, and outboxd keeps their outbox changes in %s until their commit", workMem, d.Dir)
	case byMessages:
		return pass("streaming", "off (%s): a transaction larger than logical_decoding_work_mem (%s) is spilled to the server's disk and holds back every later event until its commit is decoded", d.Off, workMem)
	}
	return warn("streaming", fmt.Sprintf("off (%s): a transaction larger than logical_decoding_work_mem (%s), a migration on any table included, is spilled to the server's disk and holds back every later event until its commit is decoded", d.Off, workMem),
		"on PostgreSQL 14+, leave postgres.streaming at its default (true)")
}

// ---- wal_level ----

func checkWalLevel(ctx context.Context, conn *pgx.Conn, cfg target) []Result {
	var level string
	if err := conn.QueryRow(ctx, "SELECT current_setting('wal_level')").Scan(&level); err != nil {
		return queryFailed("wal_level", err)
	}
	return []Result{evalWalLevel(level, cfg.service)}
}

// evalWalLevel: svc is the managed service the server is on (nil: none
// recognised), whose own setting is the fix.
func evalWalLevel(level string, svc *postgres.Service) Result {
	if level == "logical" {
		return pass("wal_level", "logical")
	}
	fix := "set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL; on a managed service, its own setting: docs/managed-postgres.md"
	if svc != nil {
		fix = fmt.Sprintf("on %s, %s (%s)", svc.Name, svc.Logical, svc.Doc())
	}
	return fail("wal_level", fmt.Sprintf("wal_level is %s, logical decoding needs logical", level), fix)
}

// ---- max_replication_slots, max_wal_senders ----

type capacity struct {
	maxSlots, usedSlots     int
	slotExists, slotActive  bool // our slot; active: its walsender is among the used ones
	maxSenders, usedSenders int
}

func checkCapacity(ctx context.Context, conn *pgx.Conn, cfg target) []Result {
	var c capacity
	err := conn.QueryRow(ctx, `SELECT current_setting('max_replication_slots')::int,
		(SELECT count(*) FROM pg_catalog.pg_replication_slots)::int,
		EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = $1),
		EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = $1 AND active),
		current_setting('max_wal_senders')::int,
		(SELECT count(*) FROM pg_catalog.pg_stat_replication)::int`, cfg.Postgres.Slot).
		Scan(&c.maxSlots, &c.usedSlots, &c.slotExists, &c.slotActive, &c.maxSenders, &c.usedSenders)
	if err != nil {
		return queryFailed("max_replication_slots", err)
	}
	return evalCapacity(c)
}

func evalCapacity(c capacity) []Result {
	var out []Result
	switch {
	case c.slotExists:
		out = append(out, pass("max_replication_slots", "our slot already exists (%d of %d slots in use)", c.usedSlots, c.maxSlots))
	case c.usedSlots < c.maxSlots:
		out = append(out, pass("max_replication_slots", "%d of %d slots in use, one is free for ours", c.usedSlots, c.maxSlots))
	default:
		out = append(out, fail("max_replication_slots", fmt.Sprintf("all %d slots are in use and ours does not exist", c.maxSlots),
			"raise max_replication_slots (restart needed) or drop an unused slot (SELECT slot_name, active FROM pg_replication_slots)"))
	}
	switch {
	case c.slotActive:
		out = append(out, pass("max_wal_senders", "%d of %d walsenders active, ours among them", c.usedSenders, c.maxSenders))
	case c.usedSenders < c.maxSenders:
		out = append(out, pass("max_wal_senders", "%d of %d walsenders active", c.usedSenders, c.maxSenders))
	default:
		out = append(out, fail("max_wal_senders", fmt.Sprintf("all %d walsenders are active (pg_stat_replication)", c.maxSenders),
			"raise max_wal_senders (restart needed) or stop an unused replication client"))
	}
	return out
}

// ---- role ----

// role is what decides whether the connected role may stream from a slot.
type role struct {
	name        string
	repl, super bool
	// rdsReplication: a member of rds_replication, directly or through
	// other roles (Amazon RDS and Aurora's way; false where no such role
	// exists).
	rdsReplication bool
}

func checkRole(ctx context.Context, conn *pgx.Conn, cfg target) []Result {
	var r role
	// pg_has_role on a NULL oid (no rds_replication role) is NULL.
	err := conn.QueryRow(ctx, `SELECT r.rolname, r.rolreplication, r.rolsuper, COALESCE(pg_catalog.pg_has_role(r.oid, m.oid, 'MEMBER'), false)
		FROM pg_catalog.pg_roles r LEFT JOIN pg_catalog.pg_roles m ON m.rolname = $1
		WHERE r.rolname = current_user`, postgres.RDSReplication).Scan(&r.name, &r.repl, &r.super, &r.rdsReplication)
	if err != nil {
		return queryFailed("role", err)
	}
	return []Result{evalRole(r, cfg.service)}
}

// evalRole decides whether r may stream from a slot, the way the server
// decides it: a superuser, the REPLICATION attribute, or (on Amazon RDS
// and Aurora) membership of rds_replication. svc is the managed service
// the server is on, nil if none was recognised: its way is the fix.
func evalRole(r role, svc *postgres.Service) Result {
	switch {
	case r.super:
		return pass("role", "%s is a superuser (a least-privilege role with REPLICATION is enough: sql/003_role.sql)", r.name)
	case r.repl && svc != nil:
		return pass("role", "%s has REPLICATION (%s's way: %s)", r.name, svc.Name, svc.Grant(pgx.Identifier{r.name}.Sanitize()))
	case r.repl:
		return pass("role", "%s has REPLICATION", r.name)
	case r.rdsReplication:
		return pass("role", "%s is a member of %s (Amazon RDS and Aurora's way to replicate: %s)", r.name, postgres.RDSReplication, postgres.RDS.Doc())
	}
	detail := fmt.Sprintf("role %s has neither REPLICATION nor SUPERUSER nor membership of %s, so it cannot stream from a slot", r.name, postgres.RDSReplication)
	quoted := pgx.Identifier{r.name}.Sanitize()
	if svc != nil {
		return fail("role", detail+" on "+svc.Name, svc.Grant(quoted)+" ("+svc.Doc()+")")
	}
	return fail("role", detail, postgres.ReplicationFix(quoted))
}

// ---- tables and columns ----

// column is one column of an outbox table: its type as format_type prints
// it and the name of its base type (a domain's underlying type).
type column struct{ typ, base string }

func checkTables(ctx context.Context, conn *pgx.Conn, cfg target) []Result {
	var out []Result
	for _, t := range cfg.routing.Tables() {
		name := "table " + t.String()
		rel, err := catalog.ReadRelation(ctx, conn.PgConn(), t.Table)
		switch {
		case err != nil:
			out = append(out, queryFailed(name, err)...)
			continue
		case !rel.Exists:
			out = append(out, fail(name, fmt.Sprintf("%s does not exist (or the role cannot see its schema)", t),
				"create it (sql/001_outbox.sql), or correct routes[].table; grant USAGE on its schema"))
			continue
		}
		cols := map[string]column{}
		for n, c := range rel.Columns {
			cols[n] = column{c.Type, c.Base}
		}
		var results []Result
		for _, i := range t.Routes {
			where := func(use string) string { return cfg.routing.Key(i, use) }
			results = append(results, evalRoute(&cfg.routing.Routes[i], where, rel.Kind, cols))
		}
		if r := markPrivilege(ctx, conn, cfg.Postgres, t, cols); r != nil {
			results = append(results, *r)
		}
		res := merge(name, results)
		if rel.Kind == "p" && res.Status == Pass {
			res.Detail = "partitioned, routed as one table; " + res.Detail
		}
		out = append(out, res)
	}
	return out
}

// markPrivilege is a FAIL when postgres.mark_published would have to set
// the table's publicat_en column (its first route's) and the role may
// not: the first mark, of the cut-over snapshot or of the stream, would
// stop outboxd. Nil otherwise.
func markPrivilege(ctx context.Context, conn *pgx.Conn, pg config.Postgres, t envelope.Table, cols map[string]column) *Result {
	publicatEn := t.Route.Columns.PublicatEn
	if !pg.MarkPublished || publicatEn == "" {
		return nil
	}
	name := "table " + t.String()
	if _, ok := cols[publicatEn]; !ok {
		res := fail(name, fmt.Sprintf("column %s (columns.publicat_en) does not exist: postgres.mark_published cannot set it", publicatEn),
			"set routes[].columns.publicat_en to the column to mark, or leave postgres.mark_published off")
		return &res
	}
	var may bool
	var col, role string // as SQL identifiers, quoted where they need it
	if err := conn.QueryRow(ctx, "SELECT has_column_privilege($1::regclass, $2, 'UPDATE'), quote_ident($2), quote_ident(current_user)",
		t.Quoted(), publicatEn).Scan(&may, &col, &role); err != nil {
		res := fail(name, fmt.Sprintf("could not read the role's privilege on %s: %v", publicatEn, err), "check the role's access to the table")
		return &res
	}
	if may {
		return nil
	}
	res := fail(name, fmt.Sprintf("postgres.mark_published is on, but the role may not UPDATE %s: the first mark would stop outboxd", publicatEn),
		fmt.Sprintf("GRANT UPDATE (%s) ON %s TO %s, or leave postgres.mark_published off", col, t.Table, role))
	return &res
}

// merge makes the results of a table's routes one result.
func merge(name string, results []Result) Result {
	if len(results) == 1 {
		return results[0]
	}
	var details, fixes []string
	for _, r := range results {
		if r.Status == Fail {
			details, fixes = append(details, r.Detail), append(fixes, r.Fix)
		}
	}
	if len(details) > 0 {
		return fail(name, strings.Join(details, "; "), strings.Join(fixes, "; "))
	}
	for _, r := range results {
		details = append(details, r.Detail)
	}
	return pass(name, "%s", strings.Join(details, "; "))
}

// evalRoute checks that every column the route reads exists with a type
// outboxd can turn into the record (envelope's Route.Fits). relkind is
// pg_class.relkind; where names a use's configuration key (with its line,
// for a route read from a file).
func evalRoute(r *envelope.Route, where func(use string) string, relkind string, cols map[string]column) Result {
	table := catalog.Table{Schema: r.Schema, Name: r.Table}
	name := "table " + table.String()
	if relkind != "r" && relkind != "p" {
		return fail(name, fmt.Sprintf("%s is not a table (relkind %s)", table, relkind), "route a plain table: only tables are published")
	}
	var problems, fixes, found []string
	seen := map[string]bool{}
	for _, ref := range r.Refs() {
		c, ok := cols[ref.Column]
		mapped := strings.HasPrefix(ref.Use, "columns.")
		key := ref.Use
		if !mapped {
			key = where(ref.Use)
		}
		fits, want := r.Fits(ref.Use, c.base)
		switch {
		case !ok && mapped:
			problems = append(problems, fmt.Sprintf("column %s (%s) does not exist", ref.Column, ref.Use))
			fixes = append(fixes, fmt.Sprintf("set routes[].%s to one of: %s", ref.Use, strings.Join(sortedKeys(cols), ", ")))
		case !ok:
			problems = append(problems, fmt.Sprintf("column %s (%s) does not exist", ref.Column, key))
			fixes = append(fixes, fmt.Sprintf("correct %s: %s has %s", key, table, strings.Join(sortedKeys(cols), ", ")))
		case ref.Use == "columns.creat_en" && c.base == "timestamp":
			problems = append(problems, fmt.Sprintf("column %s is timestamp without time zone: the instant is ambiguous", ref.Column))
			fixes = append(fixes, fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE timestamptz USING %s AT TIME ZONE 'UTC' (with the zone the writers meant)",
				table.Quoted(), pgx.Identifier{ref.Column}.Sanitize(), pgx.Identifier{ref.Column}.Sanitize()))
		case !fits:
			problems = append(problems, fmt.Sprintf("column %s (%s) is %s, outboxd needs %s", ref.Column, key, c.typ, want))
			fixes = append(fixes, fmt.Sprintf("map %s to a column of type %s, or change the column's type", key, want))
		case !seen[ref.Column]:
			seen[ref.Column] = true
			found = append(found, fmt.Sprintf("%s %s", ref.Column, c.typ))
		}
	}
	if r.Columns.Versio == "" && r.Value != envelope.ValuePayload {
		found = append(found, "versio -")
	}
	if len(problems) > 0 {
		return fail(name, strings.Join(problems, "; "), strings.Join(fixes, "; "))
	}
	return pass(name, "%s", strings.Join(found, ", "))
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
