package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/postgres"
)

// prepare checks the server and makes sure the publication and the slot
// exist, creating them when allowed. It returns the slot's confirmed flush
// position, where streaming resumes, and the cutover of a slot whose
// pending rows must be published first.
func (r *Runner) prepare(ctx context.Context, conn *pgconn.PgConn) (pglogrepl.LSN, *cutover, error) {
	srv, err := catalog.ReadServer(ctx, conn)
	if err != nil {
		return 0, nil, fmt.Errorf("read server settings: %w", err)
	}
	if srv.WALLevel != "logical" {
		return 0, nil, Fatal(fmt.Errorf("wal_level is %q: set wal_level = logical in postgresql.conf and restart PostgreSQL", srv.WALLevel))
	}
	r.serverSettings(srv)
	if t := srv.WALSenderTimeout; t > 0 && 2*r.cfg.IdleStatusInterval >= t {
		return 0, nil, Fatal(fmt.Errorf("postgres.idle_status_interval (%s) must be under half the server's wal_sender_timeout (%s), or the server may drop the connection while outboxd waits for Kafka", r.cfg.IdleStatusInterval, t))
	}
	if err := r.ensurePublication(ctx, conn, srv.Version); err != nil {
		return 0, nil, err
	}
	// A column a route reads and the table lacks would fail every row:
	// stop now, naming the configuration line.
	problems, err := catalog.CheckColumns(ctx, conn, r.cfg.Tables)
	if err != nil {
		return 0, nil, err
	}
	if len(problems) > 0 {
		return 0, nil, Fatal(fmt.Errorf("routes: %s: correct the configuration or the table", strings.Join(problems, "; ")))
	}
	return r.ensureSlot(ctx, conn, srv)
}

// ensurePublication creates the publication when absent (and allowed), and
// stops on any problem that would keep a routed table's events from
// reaching outboxd. A table published without a route only warns: an
// insert into it stops outboxd when it comes.
func (r *Runner) ensurePublication(ctx context.Context, conn *pgconn.PgConn, version int) error {
	pub, err := catalog.ReadPublication(ctx, conn, r.cfg.Publication, version)
	if err != nil {
		return fmt.Errorf("read publication: %w", err)
	}
	if !pub.Exists && r.cfg.CreatePublication {
		sql := catalog.CreateSQL(r.cfg.Publication, r.cfg.Tables)
		if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
			switch {
			case hasCode(err, "42501"):
				return Fatal(fmt.Errorf("create publication %q: %w: only the tables' owner or a superuser can; run sql/002_publication.sql as the owner", r.cfg.Publication, err))
			case hasCode(err, "42P01"):
				return Fatal(fmt.Errorf("create publication %q: %w: check the routes' table names", r.cfg.Publication, err))
			}
			return fmt.Errorf("create publication %q: %w", r.cfg.Publication, err)
		}
		r.log.Info("created publication", "publication", r.cfg.Publication, "sql", sql)
		return nil
	}
	var stop []string
	for _, p := range pub.Check(r.cfg.Tables) {
		if p.Kind == catalog.Unrouted {
			r.log.Warn(p.Text, "fix", p.Fix)
			continue
		}
		stop = append(stop, p.String())
	}
	if len(stop) > 0 {
		if !pub.Exists {
			stop = append(stop, "or set postgres.create_publication: true")
		}
		return Fatal(errors.New(strings.Join(stop, "; ")))
	}
	return nil
}

// ensureSlot returns the slot's confirmed position, where streaming
// resumes, creating the slot when absent and allowed: postgres.create_slot
// and outboxd has not seen it: neither a session of this process
// (Runner.slotSeen) nor any earlier process (its row in the slot record,
// catalog.SlotRecord). The slot found or created is recorded. A slot is
// a failover slot where the server has them and postgres.failover_slot
// asks for one; a slot created, or kept from an unfinished cut-over, with
// pending rows to publish first comes with its cutover (cutover.go), and
// becomes a failover slot only once they are published.
func (r *Runner) ensureSlot(ctx context.Context, conn *pgconn.PgConn, srv catalog.Server) (pglogrepl.LSN, *cutover, error) {
	name := r.cfg.Slot
	if err := r.readRecord(ctx, conn); err != nil {
		return 0, nil, err
	}
	mayCreate := r.cfg.CreateSlot && !r.slotSeen
	slot, hasMarker, err := r.readSlot(ctx, conn)
	if err != nil {
		return 0, nil, err
	}
	switch {
	case hasMarker && r.cfg.Snapshot == nil:
		// The hold before the marker goes: retention must not delete the
		// rows the operator is told to replay (catalog/cutover.go).
		marker, hold := catalog.CutoverMarker(name), catalog.ReplayHold(name)
		if _, err := scalar(ctx, conn, "SELECT pg_create_physical_replication_slot("+catalog.QuoteLiteral(hold)+")"); err != nil && !hasCode(err, "42710") {
			return 0, nil, slotError(fmt.Errorf("create the replay hold slot %q: %w", hold, err))
		}
		// The hold stands for the snapshot: once the operator has
		// replayed its rows and dropped it, the slot vouches for the rows
		// before it as a finished cut-over's does.
		if slot != nil {
			if err := r.writeRecord(ctx, conn, true, r.cfg.SnapshotTables); err != nil {
				return 0, nil, err
			}
		}
		r.log.Warn("an earlier cut-over did not finish, and postgres.snapshot is now none: giving it up; its snapshot rows may not all be in Kafka. "+
			"Republish them (outboxd replay --from the creat_en of the oldest row the relay had not published), then drop the hold: the retention job deletes nothing until then",
			"slot", name, "marker", marker, "drop_hold", "SELECT pg_drop_replication_slot("+catalog.QuoteLiteral(hold)+")")
		if _, err := scalar(ctx, conn, "SELECT pg_drop_replication_slot("+catalog.QuoteLiteral(marker)+")"); err != nil {
			return 0, nil, fmt.Errorf("drop the cut-over marker slot %q: %w", marker, err)
		}
	case hasMarker || slot == nil && mayCreate && r.cfg.Snapshot != nil:
		s, cut, err := r.beginCutover(ctx, conn, srv)
		if err != nil {
			return 0, nil, err
		}
		if cut != nil {
			return cut.at, cut, nil
		}
		slot = s // another instance finished the cut-over
	}
	if slot == nil {
		switch {
		case r.slotSeen:
			return 0, nil, r.gone(ctx, conn)
		case !mayCreate:
			return 0, nil, Fatal(fmt.Errorf("replication slot %q does not exist and postgres.create_slot is false: reconcile the events committed since the old slot's position, if any (outboxd replay), then set postgres.create_slot: true, or create the slot (SELECT pg_create_logical_replication_slot('%s', 'pgoutput'))", name, name))
		}
		if slot, err = r.createRecorded(ctx, conn, srv); err != nil {
			return 0, nil, err
		}
	}
	switch {
	case slot.Type != "logical" || slot.Plugin != "pgoutput":
		return 0, nil, Fatal(fmt.Errorf("replication slot %q is a %s slot with plugin %q; outboxd needs a logical pgoutput slot: use another slot name", name, slot.Type, slot.Plugin))
	case !slot.SameDatabase:
		return 0, nil, Fatal(fmt.Errorf("replication slot %q belongs to database %s, not postgres.dsn's", name, slot.Database))
	case slot.Unusable() != "":
		return 0, nil, Fatal(fmt.Errorf("replication slot %q cannot be streamed from: %s; events are missing; drop and recreate the slot after reconciling the outbox", name, slot.Unusable()))
	}
	if err := r.alignFailover(ctx, conn, srv, slot); err != nil {
		return 0, nil, err
	}
	if r.record != nil && !r.record.Missing.IsZero() {
		if err := r.rehired(ctx, conn, slot); err != nil {
			return 0, nil, err
		}
	}
	if err := r.writeRecord(ctx, conn, false, nil); err != nil {
		return 0, nil, err
	}
	return slot.ConfirmedFlush, nil, nil
}

// createRecorded creates the slot without a snapshot and records it, under
// the cut-over lock (withCreationLock).
func (r *Runner) createRecorded(ctx context.Context, conn *pgconn.PgConn, srv catalog.Server) (*catalog.Slot, error) {
	err := r.withCreationLock(ctx, conn, func() error {
		if _, err := r.createSlot(ctx, conn, srv, false); err != nil {
			return err
		}
		return r.writeRecord(ctx, conn, true, nil)
	})
	if err != nil {
		return nil, err
	}
	slot, err := catalog.ReadSlot(ctx, conn, r.cfg.Slot)
	if err != nil || slot == nil {
		return nil, fmt.Errorf("read replication slot after creating it: %v", err)
	}
	return slot, nil
}

// failover says whether a slot created on srv is a failover slot: where the
// server has them and postgres.failover_slot asks for it. A standby
// (decoding on a standby, PostgreSQL 16+) cannot create one: only a
// primary's slots are synchronised.
func (r *Runner) failover(srv catalog.Server) bool {
	return r.cfg.FailoverSlot && srv.FailoverSlots() && !srv.InRecovery
}

// createSlot creates the logical pgoutput slot, a failover one when
// failover(srv), or with an exported snapshot when export (the cut-over),
// never both: a standby's slot sync worker copies a failover slot, not the
// cut-over's marker, so the copy promoted after a failover would stream
// from the consistent point without the snapshot rows Kafka does not have
// yet. publishSnapshot makes it a failover slot once they are acknowledged.
func (r *Runner) createSlot(ctx context.Context, conn *pgconn.PgConn, srv catalog.Server, export bool) (pglogrepl.CreateReplicationSlotResult, error) {
	failover := r.failover(srv) && !export
	res, err := pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx, catalog.CreateSlotCommand(r.cfg.Slot, export, failover)))
	if err != nil {
		return res, slotError(fmt.Errorf("create replication slot %q: %w", r.cfg.Slot, err))
	}
	r.slotSeen = true
	r.log.Info("created replication slot", "slot", r.cfg.Slot, "failover", failover, "exported_snapshot", export)
	return res, nil
}

// slotError names the fix of a slot that may not be created.
func slotError(err error) error {
	if hasCode(err, "42501") {
		return Fatal(fmt.Errorf("%w: the role may not replicate: %s", err, postgres.ReplicationFix("<role>")))
	}
	return err
}

// alignFailover makes an existing slot a failover slot, or not, as
// postgres.failover_slot says, on a primary that has them: a slot created
// without it (by hand, or by an outboxd before this setting) becomes one at
// the next start. A slot in use by another instance is that instance's to change:
// this one stands by.
func (r *Runner) alignFailover(ctx context.Context, conn *pgconn.PgConn, srv catalog.Server, slot *catalog.Slot) error {
	if !srv.FailoverSlots() || srv.InRecovery || slot.Failover == r.cfg.FailoverSlot {
		return nil
	}
	if _, err := conn.Exec(ctx, catalog.AlterSlotFailoverCommand(slot.Name, r.cfg.FailoverSlot)).ReadAll(); err != nil {
		if hasCode(err, "55006") { // replication slot is active for PID n
			return &standbyError{err}
		}
		return fmt.Errorf("set failover %t on replication slot %q: %w", r.cfg.FailoverSlot, slot.Name, err)
	}
	r.log.Info("changed the slot's failover setting to match postgres.failover_slot", "slot", slot.Name, "failover", r.cfg.FailoverSlot)
	return nil
}

func hasCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
