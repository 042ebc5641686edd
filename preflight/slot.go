package preflight

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/republish"
)

// ---- publication ----

// publication is what the catalogs say about the configured publication,
// and, when it is absent, whether the role may create it.
type publication struct {
	catalog.Publication
	super, mayCreateInDB bool
	notOwned             []string // routed tables the role does not own
}

func checkPublication(ctx context.Context, conn *pgx.Conn, cfg target) []Result {
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return queryFailed("publication", err)
	}
	pub, err := catalog.ReadPublication(ctx, conn.PgConn(), cfg.Postgres.Publication, version)
	if err != nil {
		return queryFailed("publication", err)
	}
	p := publication{Publication: pub}
	if !pub.Exists {
		if err := conn.QueryRow(ctx, "SELECT rolsuper, has_database_privilege(current_database(), 'CREATE') FROM pg_catalog.pg_roles WHERE rolname = current_user").Scan(&p.super, &p.mayCreateInDB); err != nil {
			return queryFailed("publication", err)
		}
		for _, t := range cfg.routing.Tables() { // messages need none
			var owns bool
			err := conn.QueryRow(ctx, "SELECT pg_has_role(current_user, relowner, 'USAGE') FROM pg_catalog.pg_class WHERE oid = to_regclass($1)",
				t.Quoted()).Scan(&owns)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return queryFailed("publication", err)
			}
			if !owns {
				p.notOwned = append(p.notOwned, t.String())
			}
		}
	}
	return []Result{evalPublication(cfg, p)}
}

// evalPublication: catalog's policy (every row and mapped column of each
// routed table, no other table); an absent publication passes when
// outboxd will create it.
func evalPublication(cfg target, p publication) Result {
	name := cfg.Postgres.Publication
	routes := cfg.routing.Publication()
	if !p.Exists {
		const sqlFile = "run sql/002_publication.sql as the tables' owner"
		create := catalog.CreateSQL(name, routes)
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
	problems := p.Check(routes)
	if len(problems) == 0 {
		names := make([]string, len(routes))
		for i, r := range routes {
			names[i] = r.Table.String()
		}
		sort.Strings(names)
		return pass("publication", "%s publishes inserts of %s", name, strings.Join(names, ", "))
	}
	var texts, fixes []string
	for _, pr := range problems {
		texts = append(texts, pr.Text)
		fixes = append(fixes, pr.Fix)
	}
	return fail("publication", strings.Join(texts, "; "), strings.Join(fixes, "; "))
}

// ---- the slot ----

func checkSlot(ctx context.Context, conn *pgx.Conn, cfg target) []Result {
	s, err := catalog.ReadSlot(ctx, conn.PgConn(), cfg.Postgres.Slot)
	if err != nil {
		return queryFailed("slot", err)
	}
	m, err := catalog.ReadSlot(ctx, conn.PgConn(), catalog.CutoverMarker(cfg.Postgres.Slot))
	if err != nil {
		return queryFailed("slot", err)
	}
	c := cutover{marker: m != nil}
	if cfg.Postgres.Snapshot == config.SnapshotPending && (c.marker || s == nil && cfg.Postgres.CreateSlot) {
		// The start creates the slot with a snapshot: say what it will
		// publish, and whether it can.
		// The snapshot's own question (republish.CountPending): a cut-over
		// that could not read or order the pending rows fails here.
		for _, t := range cfg.routing.Tables() {
			name, i := t.String(), t.Routes[0]
			if t.Route.Columns.PublicatEn == "" {
				continue
			}
			n, err := republish.CountPending(ctx, conn.PgConn(), t)
			if err != nil {
				why, fix := err.Error(), "grant outboxd's role SELECT on the table, or set postgres.snapshot: none"
				var ce *republish.ColumnError
				if errors.As(err, &ce) {
					why, fix = ce.Table+" "+ce.Problem, strings.Replace(ce.Fix, "routes[]", fmt.Sprintf("routes[%d]", i), 1)
				}
				return []Result{fail("slot", fmt.Sprintf("the slot will be created with a snapshot of the rows pending in %s (publicat_en NULL), and the cut-over could not publish them: %s", name, why), fix)}
			}
			c.pending = append(c.pending, fmt.Sprintf("%s: %d", name, n))
		}
	}
	record, rec := checkRecord(ctx, conn, cfg.Postgres)
	out := []Result{evalSlot(cfg.Postgres, s, c)}
	if s == nil && rec != nil && !c.marker {
		out[0] = fail("slot", fmt.Sprintf("replication slot %s does not exist, though outboxd has seen it (it had confirmed %s at %s, recorded in %s): events committed after that position may be in no slot, and outboxd stops at start (exit status 3) until told to create it again",
			cfg.Postgres.Slot, rec.Seen, rec.SeenAt.UTC().Format(time.RFC3339), cfg.Postgres.SlotTable),
			fmt.Sprintf("accept the gap (outboxd slot forget --gap-from %s), start outboxd, and reconcile the events (outboxd replay; docs/operations.md#a-dropped-slot)", rec.Seen))
	}
	out = append(out, record)
	hold := catalog.ReplayHold(cfg.Postgres.Slot)
	h, err := catalog.ReadSlot(ctx, conn.PgConn(), hold)
	if err != nil {
		return append(out, queryFailed("replay hold", err)...)
	}
	if h != nil {
		out = append(out, warn("replay hold", fmt.Sprintf("an unfinished cut-over of %s was given up: its snapshot rows may not all be in Kafka, and the retention job deletes nothing while the hold slot %s exists", cfg.Postgres.Slot, hold),
			fmt.Sprintf("republish them (outboxd replay --from the creat_en of the oldest row the relay had not published), then SELECT pg_drop_replication_slot('%s')", hold)))
	}
	return out
}

// cutover is what check knows of the cut-over a start would do
// (replication/cutover.go).
type cutover struct {
	marker  bool     // an earlier one did not finish
	pending []string // "schema.table: n" rows its snapshot would publish
}

func evalSlot(pg config.Postgres, s *catalog.Slot, c cutover) Result {
	name := pg.Slot
	pending := strings.Join(c.pending, ", ")
	if pending == "" {
		pending = "no table with a publicat_en column"
	}
	switch {
	case c.marker && !pg.CreateSlot:
		return fail("slot", fmt.Sprintf("the cut-over of %s did not finish (marker slot %s exists): its snapshot rows may not all be in Kafka, and postgres.create_slot is false", name, catalog.CutoverMarker(name)),
			"set postgres.create_slot: true to publish the pending rows again, or postgres.snapshot: none to give up on them (then replay its rows: outboxd holds the retention job until you have)")
	case c.marker && pg.Snapshot == config.SnapshotNone:
		return pass("slot", "the cut-over of %s did not finish; with postgres.snapshot: none the next start gives it up (its snapshot rows may not all be in Kafka: replay them with outboxd replay; the retention job deletes nothing until the replay hold %s is dropped)", name, catalog.ReplayHold(name))
	case c.marker && catalog.CutoverKeeps(s):
		return pass("slot", "the cut-over of %s did not finish; the next start keeps its slot (never confirmed, at its consistent point %s: it holds every change since), publishes the rows pending now (%s), then streams from that point: duplicates of the rows already delivered and of those committed since, no gap", name, s.ConfirmedFlush, pending)
	case c.marker && s == nil:
		return pass("slot", "the cut-over of %s did not finish before its slot was created (or the slot was dropped); the next start creates it with an exported snapshot and publishes the pending rows (%s)", name, pending)
	case c.marker:
		return warn("slot", fmt.Sprintf("the cut-over of %s did not finish and its slot cannot be streamed from (a %s %s slot, wal_status %s): the next start drops it and does the cut-over again with a new slot, publishing the pending rows (%s); events committed since the first attempt that are not pending rows (logical messages, rows of tables without publicat_en or deleted since) are in no slot", name, s.Type, s.Plugin, s.WALStatus, pending),
			"after the restart, republish the rows of tables without publicat_en committed since the first attempt (outboxd replay --from); logical messages and deleted rows cannot be recovered")
	case s == nil && pg.CreateSlot && pg.Snapshot == config.SnapshotPending:
		return pass("slot", "%s does not exist; will be created at start with an exported snapshot, whose pending rows (publicat_en NULL) are published before streaming: %s", name, pending)
	}
	if s == nil {
		if pg.CreateSlot {
			return pass("slot", "%s does not exist; will be created at start (it begins at the current WAL position)", name)
		}
		return fail("slot", fmt.Sprintf("replication slot %s does not exist and postgres.create_slot is false", name),
			fmt.Sprintf("reconcile events committed since the old slot's position (if any, with outboxd replay), then set postgres.create_slot: true, or SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", name))
	}
	switch {
	case s.Type != "logical" || s.Plugin != "pgoutput":
		return fail("slot", fmt.Sprintf("replication slot %s is a %s slot with plugin %q, outboxd needs a logical pgoutput slot", name, s.Type, s.Plugin),
			"choose another postgres.slot name")
	case !s.SameDatabase:
		return fail("slot", fmt.Sprintf("replication slot %s belongs to database %s, not the DSN's", name, s.Database),
			"point postgres.dsn at that database or choose another postgres.slot name")
	case s.Unusable() != "":
		fix := "reconcile the outbox (outboxd replay --from the time of the last delivered event), then outboxd slot drop --yes and start with postgres.create_slot: true"
		if s.Invalidated == "idle_timeout" {
			fix += "; raise idle_replication_slot_timeout (or 0) above the longest time outboxd may be stopped"
		}
		return fail("slot", fmt.Sprintf("replication slot %s cannot be streamed from: %s; events are missing", name, s.Unusable()), fix)
	case s.WALStatus == "unreserved":
		return fail("slot", fmt.Sprintf("replication slot %s has wal_status unreserved: it is past max_slot_wal_keep_size and its WAL will be removed at the next checkpoint (warning: events may be lost)", name),
			"start outboxd now so the slot advances, or raise max_slot_wal_keep_size")
	case s.Active && s.Holder != "" && s.Holder != "outboxd":
		return fail("slot", fmt.Sprintf("replication slot %s is held by PID %d, a client named %q, not outboxd", name, s.ActivePID, s.Holder),
			"stop that consumer of the slot, or give outboxd its own postgres.slot")
	case s.Active:
		// The normal state of a running deployment: check works as a
		// live diagnostic.
		return pass("slot", "%s is streaming to PID %d%s, confirmed_flush_lsn %s, %d bytes of WAL after it, wal_status %s",
			name, s.ActivePID, holder(s), s.ConfirmedFlush, s.UnconfirmedBytes(), s.WALStatus)
	}
	return pass("slot", "%s exists, inactive, confirmed_flush_lsn %s, %d bytes of WAL after it, wal_status %s", name, s.ConfirmedFlush, s.UnconfirmedBytes(), s.WALStatus)
}

// holder describes the connection holding a slot, as far as it is visible.
func holder(s *catalog.Slot) string {
	switch {
	case s.Holder != "" && s.HolderAddr != "":
		return fmt.Sprintf(" (%s from %s)", s.Holder, s.HolderAddr)
	case s.Holder != "":
		return fmt.Sprintf(" (%s)", s.Holder)
	}
	return " (another outboxd, or a client this role cannot see)"
}

// checkRecord is the slot record's line (catalog.SlotRecord), and the
// slot's row when there is one.
func checkRecord(ctx context.Context, conn *pgx.Conn, pg config.Postgres) (Result, *catalog.SlotRecord) {
	schema, name := pg.SlotTableName()
	t := catalog.Table{Schema: schema, Name: name}
	const lost = "only the process that saw the slot would remember it (a restart after the slot is dropped creates a new one silently), and the retention job deletes nothing"
	rec, err := catalog.ReadSlotRecord(ctx, conn.PgConn(), t, pg.Slot)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01":
		var may bool
		if err := conn.QueryRow(ctx, "SELECT has_schema_privilege($1, 'CREATE')", schema).Scan(&may); err != nil || !may {
			return warn("slot record", fmt.Sprintf("%s does not exist and this role may not create it: %s", t, lost),
				"run sql/005_slot_record.sql as the schema's owner (it grants outboxd INSERT, UPDATE, DELETE on the table)"), nil
		}
		return pass("slot record", "%s does not exist; will be created at start", t), nil
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		return warn("slot record", fmt.Sprintf("%s cannot be read by this role: %s", t, lost),
			fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO <outboxd's role>", t)), nil
	case err != nil:
		return queryFailed("slot record", err)[0], nil
	case rec == nil:
		return pass("slot record", "%s holds no row of %s yet; the next start writes it", t, pg.Slot), nil
	}
	return pass("slot record", "%s: outboxd last found %s at %s (%s)", t, pg.Slot, rec.Seen, rec.SeenAt.UTC().Format(time.RFC3339)), rec
}
