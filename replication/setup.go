package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// Table is one published outbox table.
type Table struct{ Schema, Name string }

func (t Table) String() string { return t.Schema + "." + t.Name }

func (t Table) quoted() string { return quoteIdent(t.Schema) + "." + quoteIdent(t.Name) }

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// query runs one simple-protocol query (allowed on a replication=database
// connection) and returns its rows as text; NULL becomes "".
func query(ctx context.Context, conn *pgconn.PgConn, sql string) ([][]string, error) {
	results, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, err
	}
	var rows [][]string
	for _, r := range results {
		if r.Err != nil {
			return nil, r.Err
		}
		for _, row := range r.Rows {
			vals := make([]string, len(row))
			for i, v := range row {
				vals[i] = string(v)
			}
			rows = append(rows, vals)
		}
	}
	return rows, nil
}

// slotInfo is the slot as pg_replication_slots shows it.
type slotInfo struct {
	confirmed pglogrepl.LSN
	walStatus string
}

// prepare checks the server and makes sure the publication and the slot
// exist, creating them when allowed. It returns the slot's confirmed flush
// position, where streaming resumes.
func (r *Runner) prepare(ctx context.Context, conn *pgconn.PgConn, mayCreateSlot bool) (slotInfo, error) {
	rows, err := query(ctx, conn, "SHOW wal_level")
	if err != nil {
		return slotInfo{}, fmt.Errorf("read wal_level: %w", err)
	}
	if len(rows) == 1 && rows[0][0] != "logical" {
		return slotInfo{}, Fatal(fmt.Errorf("wal_level is %q: set wal_level = logical in postgresql.conf and restart PostgreSQL", rows[0][0]))
	}
	rows, err = query(ctx, conn, "SELECT setting::bigint FROM pg_catalog.pg_settings WHERE name = 'wal_sender_timeout'")
	if err != nil {
		return slotInfo{}, fmt.Errorf("read wal_sender_timeout: %w", err)
	}
	if len(rows) == 1 {
		var ms int64
		fmt.Sscan(rows[0][0], &ms)
		timeout := time.Duration(ms) * time.Millisecond
		r.mu.Lock()
		r.status.WALSenderTimeout = timeout
		r.mu.Unlock()
		if timeout > 0 && 2*r.cfg.IdleStatusInterval >= timeout {
			return slotInfo{}, Fatal(fmt.Errorf("postgres.idle_status_interval (%s) must be under half the server's wal_sender_timeout (%s), or the server may drop the connection while outboxd waits for Kafka", r.cfg.IdleStatusInterval, timeout))
		}
	}
	if err := r.ensurePublication(ctx, conn); err != nil {
		return slotInfo{}, err
	}
	return r.ensureSlot(ctx, conn, mayCreateSlot)
}

func (r *Runner) ensurePublication(ctx context.Context, conn *pgconn.PgConn) error {
	pub := r.cfg.Publication
	rows, err := query(ctx, conn, "SELECT pubinsert FROM pg_catalog.pg_publication WHERE pubname = "+quoteLiteral(pub))
	if err != nil {
		return fmt.Errorf("read publication: %w", err)
	}
	if len(rows) == 0 {
		if !r.cfg.CreatePublication {
			return Fatal(fmt.Errorf("publication %q does not exist: create it as the tables' owner (see sql/002_publication.sql) or set postgres.create_publication: true", pub))
		}
		names := make([]string, len(r.cfg.Tables))
		for i, t := range r.cfg.Tables {
			names[i] = t.quoted()
		}
		sql := fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')", quoteIdent(pub), strings.Join(names, ", "))
		if _, err := query(ctx, conn, sql); err != nil {
			if hasCode(err, "42501") {
				return Fatal(fmt.Errorf("create publication %q: %w: only the tables' owner or a superuser can; run sql/002_publication.sql as the owner", pub, err))
			}
			if hasCode(err, "42P01") {
				return Fatal(fmt.Errorf("create publication %q: %w: check the routes' table names", pub, err))
			}
			return fmt.Errorf("create publication %q: %w", pub, err)
		}
		r.log.Info("created publication", "publication", pub, "tables", strings.Join(names, ", "))
		return nil
	}
	if rows[0][0] != "t" {
		return Fatal(fmt.Errorf("publication %q does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", pub, quoteIdent(pub)))
	}
	rows, err = query(ctx, conn, "SELECT schemaname, tablename FROM pg_catalog.pg_publication_tables WHERE pubname = "+quoteLiteral(pub))
	if err != nil {
		return fmt.Errorf("read publication tables: %w", err)
	}
	published := map[string]bool{}
	for _, row := range rows {
		published[row[0]+"."+row[1]] = true
	}
	var missing []string
	for _, t := range r.cfg.Tables {
		if !published[t.String()] {
			missing = append(missing, t.quoted())
		}
		delete(published, t.String())
	}
	if len(missing) > 0 {
		return Fatal(fmt.Errorf("publication %q does not cover %s: ALTER PUBLICATION %s ADD TABLE %s", pub, strings.Join(missing, ", "), quoteIdent(pub), strings.Join(missing, ", ")))
	}
	for extra := range published {
		r.log.Warn("publication covers a table without a route; an insert into it stops outboxd", "publication", pub, "table", extra)
	}
	return nil
}

func (r *Runner) ensureSlot(ctx context.Context, conn *pgconn.PgConn, mayCreate bool) (slotInfo, error) {
	slot := r.cfg.Slot
	read := func() ([][]string, error) {
		return query(ctx, conn, "SELECT plugin, slot_type, database = current_database(), coalesce(confirmed_flush_lsn::text, ''), coalesce(wal_status, '') FROM pg_catalog.pg_replication_slots WHERE slot_name = "+quoteLiteral(slot))
	}
	rows, err := read()
	if err != nil {
		return slotInfo{}, fmt.Errorf("read replication slot: %w", err)
	}
	if len(rows) == 0 {
		if !mayCreate {
			return slotInfo{}, Fatal(fmt.Errorf("replication slot %q does not exist (dropped while outboxd ran?): events committed since it was dropped are not in any slot; outboxd will not recreate it silently. Recreate it deliberately (restart with postgres.create_slot: true) after reconciling", slot))
		}
		_, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
		if err != nil {
			if hasCode(err, "42501") {
				return slotInfo{}, Fatal(fmt.Errorf("create replication slot %q: %w: the role needs the REPLICATION attribute (ALTER ROLE ... REPLICATION, as a superuser)", slot, err))
			}
			return slotInfo{}, fmt.Errorf("create replication slot %q: %w", slot, err)
		}
		r.log.Info("created replication slot", "slot", slot)
		if rows, err = read(); err != nil || len(rows) == 0 {
			return slotInfo{}, fmt.Errorf("read replication slot after creating it: %v", err)
		}
	}
	row := rows[0]
	if row[1] != "logical" || row[0] != "pgoutput" {
		return slotInfo{}, Fatal(fmt.Errorf("replication slot %q is a %s slot with plugin %q; outboxd needs a logical pgoutput slot: use another slot name", slot, row[1], row[0]))
	}
	if row[2] != "t" {
		return slotInfo{}, Fatal(fmt.Errorf("replication slot %q belongs to another database", slot))
	}
	if row[4] == "lost" {
		return slotInfo{}, Fatal(fmt.Errorf("replication slot %q has wal_status lost: the WAL it needed was removed (max_slot_wal_keep_size); events are missing; drop and recreate the slot after reconciling the outbox", slot))
	}
	lsn, err := pglogrepl.ParseLSN(row[3])
	if err != nil {
		return slotInfo{}, fmt.Errorf("parse confirmed_flush_lsn %q: %w", row[3], err)
	}
	return slotInfo{confirmed: lsn, walStatus: row[4]}, nil
}

func hasCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
