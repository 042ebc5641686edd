package replication

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
)

// The cut-over from the polling relay. When outboxd creates its slot, it
// creates it with an exported snapshot and, before it streams, publishes
// the rows that snapshot sees as pending (Config.Snapshot). Every row is
// then published exactly once: a row committed before the slot's
// consistent point is in the snapshot and not in the stream; one committed
// after it is in the stream and not in the snapshot; one the relay
// published is not pending.
//
// The slot starts at the consistent point, past the snapshot's rows, so
// its position protects none of them: only the order of the steps does.
// The slot is not streamed, and so never confirmed, until Kafka has
// acknowledged every snapshot row. A crash or a failure before that must
// publish the pending rows again, and the snapshot cannot be exported
// again: so a marker (catalog.CutoverMarker) exists from before the slot
// is created until the snapshot is acknowledged. A start that finds it
// keeps the slot (catalog.CutoverKeeps): never confirmed, it is still at
// its consistent point and holds every change committed since, logical
// messages and rows no snapshot sees (deleted since, or in a table without
// publicat_en) included. It publishes the rows pending now, in a snapshot
// of its own, then streams from the consistent point. A pending row
// committed before that point is in the new snapshot (nothing deleted it:
// retention waits for the marker); one committed after it is in both, and
// its streamed copy comes after the snapshot's, so first deliveries keep
// their order; rows the unfinished attempt delivered go twice (duplicates,
// no loss). Only a slot that cannot be streamed from any more (lost) is
// dropped and the whole cut-over done again with a new exported snapshot,
// as is one whose marker has no slot (outboxd stopped between the two).
// An advisory lock (catalog.CutoverLock) keeps a second instance, and the
// retention job, out while it happens.
//
// The marker is a physical slot, which no standby keeps: so until the
// marker is dropped the slot is not a failover slot either (PostgreSQL
// 17), and a standby promoted meanwhile has neither. outboxd then stops
// with "does not exist" (Runner.slotSeen) and its restart does the
// cut-over again on the new primary, instead of streaming from a copy of
// the slot whose snapshot rows Kafka may not have.

// cutover is a slot whose pending rows must be acknowledged before
// anything is streamed from it.
type cutover struct {
	// snapshot is the exported snapshot of a slot just created; "" for the
	// slot kept from a cut-over that did not finish, whose rows are read
	// in a snapshot taken when they are published.
	snapshot string
	at       pglogrepl.LSN  // the slot's consistent point
	srv      catalog.Server // where the slot is
}

// beginCutover takes the cut-over lock and creates the marker, then keeps
// the slot of an unfinished earlier attempt (catalog.CutoverKeeps), or
// creates the slot with an exported snapshot. When another instance
// finished the cut-over meanwhile it returns that slot and no cutover.
// Once a slot is created nothing runs on conn until the snapshot is
// imported: any statement there would end the transaction that holds the
// export.
func (r *Runner) beginCutover(ctx context.Context, conn *pgconn.PgConn, srv catalog.Server) (*catalog.Slot, *cutover, error) {
	name, marker := r.cfg.Slot, catalog.CutoverMarker(r.cfg.Slot)
	if !r.cfg.CreateSlot {
		return nil, nil, Fatal(fmt.Errorf("the cut-over of replication slot %q did not finish (its marker slot %q exists): its snapshot rows may not all be in Kafka. Set postgres.create_slot: true to publish the pending rows again, or postgres.snapshot: none to give up on them (then replay them: the retention job waits until you have)", name, marker))
	}
	lock := catalog.CutoverLock(name)
	locked, err := scalar(ctx, conn, fmt.Sprintf("SELECT pg_try_advisory_lock(%d)", lock))
	if err != nil {
		return nil, nil, fmt.Errorf("take the cut-over lock: %w", err)
	}
	if locked != "t" {
		return nil, nil, &standbyError{errors.New(catalog.CutoverBusy(ctx, conn, name))}
	}
	unlock := func() { _, _ = scalar(ctx, conn, fmt.Sprintf("SELECT pg_advisory_unlock(%d)", lock)) }
	slot, cut, err := r.prepareCutover(ctx, conn, srv)
	if err != nil || cut == nil {
		unlock()
	}
	return slot, cut, err
}

// prepareCutover is beginCutover under the cut-over lock.
func (r *Runner) prepareCutover(ctx context.Context, conn *pgconn.PgConn, srv catalog.Server) (*catalog.Slot, *cutover, error) {
	name, marker := r.cfg.Slot, catalog.CutoverMarker(r.cfg.Slot)
	slot, hasMarker, err := r.readSlot(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case !hasMarker && slot != nil:
		return slot, nil, nil // another instance finished it
	case slot != nil && slot.Active:
		return nil, nil, &standbyError{fmt.Errorf("replication slot %q is active for PID %d while its cut-over marker exists", name, slot.ActivePID)}
	case slot == nil && r.slotSeen:
		return nil, nil, r.gone(ctx, conn)
	}
	if !hasMarker {
		if _, err := conn.Exec(ctx, "CREATE_REPLICATION_SLOT "+marker+" PHYSICAL").ReadAll(); err != nil {
			return nil, nil, slotError(fmt.Errorf("create the cut-over marker slot %q: %w", marker, err))
		}
	}
	switch {
	case catalog.CutoverKeeps(slot):
		if err := r.keepCutoverSlot(ctx, conn, srv, slot); err != nil {
			return nil, nil, err
		}
		return nil, &cutover{at: slot.ConfirmedFlush, srv: srv}, nil
	case slot != nil:
		r.log.Warn("an earlier cut-over did not finish and its slot cannot be streamed from: dropping it to publish the pending rows again with a new slot; events committed since its consistent point that are not pending rows (logical messages, rows of tables without publicat_en or deleted since) are in no slot (docs/cutover.md)",
			"slot", name, "marker", marker, "wal_status", slot.WALStatus, "type", slot.Type, "plugin", slot.Plugin, "consistent_point", slot.ConfirmedFlush.String())
		if _, err := scalar(ctx, conn, "SELECT pg_drop_replication_slot("+catalog.QuoteLiteral(name)+")"); err != nil {
			return nil, nil, fmt.Errorf("drop replication slot %q of the unfinished cut-over: %w", name, err)
		}
	case hasMarker:
		r.log.Warn("an earlier cut-over did not finish before its slot was created: creating it now", "slot", name, "marker", marker)
	}
	res, err := r.createSlot(ctx, conn, srv, true)
	if err != nil {
		return nil, nil, err
	}
	at, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return nil, nil, fmt.Errorf("create replication slot %q: consistent point %q: %w", name, res.ConsistentPoint, err)
	}
	r.log.Info("created replication slot with an exported snapshot: publishing the rows it sees as pending before streaming",
		"slot", name, "consistent_point", at.String(), "snapshot", res.SnapshotName)
	return nil, &cutover{snapshot: res.SnapshotName, at: at, srv: srv}, nil
}

// keepCutoverSlot prepares the slot of an unfinished cut-over to be kept.
// A failover slot (made one by an outboxd before the cut-over's slot
// waited for its marker, or by hand) stops being one until its snapshot
// is in Kafka, as a slot created for the cut-over is: a standby's copy
// would stream past the rows Kafka may not have.
func (r *Runner) keepCutoverSlot(ctx context.Context, conn *pgconn.PgConn, srv catalog.Server, slot *catalog.Slot) error {
	if slot.Failover && srv.FailoverSlots() && !srv.InRecovery {
		if _, err := conn.Exec(ctx, catalog.AlterSlotFailoverCommand(slot.Name, false)).ReadAll(); err != nil {
			return fmt.Errorf("set failover false on replication slot %q until its cut-over is done: %w", slot.Name, err)
		}
	}
	r.log.Warn("an earlier cut-over did not finish (a crash or a failure while its snapshot was published): keeping its slot, which holds every change committed since its consistent point, and publishing the rows pending now before streaming from that point; rows delivered before, and pending rows committed since, are delivered twice",
		"slot", slot.Name, "marker", catalog.CutoverMarker(slot.Name), "consistent_point", slot.ConfirmedFlush.String())
	return nil
}

// publishSnapshot publishes the cut-over's snapshot through prod, then
// drops the marker, makes the slot a failover slot where it should be one
// and releases the lock: from then on the slot's position is the only
// bookmark, and a standby may keep a copy of it.
func (r *Runner) publishSnapshot(ctx context.Context, conn *pgconn.PgConn, c *cutover, prod Producer) error {
	if err := r.cfg.Snapshot(ctx, c.snapshot, c.at.String(), prod); err != nil {
		err = fmt.Errorf("cut-over snapshot: %w", err)
		if isPermanent(err) {
			return Fatal(err)
		}
		return err
	}
	// Recorded before the marker goes and the lock is released: from its
	// snapshot on, the slot vouches for every row of the tables the
	// snapshot covered (catalog.SlotRecord).
	if err := r.writeRecord(ctx, conn, true, r.cfg.SnapshotTables); err != nil {
		return err
	}
	marker := catalog.CutoverMarker(r.cfg.Slot)
	if _, err := scalar(ctx, conn, "SELECT pg_drop_replication_slot("+catalog.QuoteLiteral(marker)+")"); err != nil {
		return fmt.Errorf("drop the cut-over marker slot %q: %w", marker, err)
	}
	// The slot as createSlot made it for the cut-over: not a failover
	// slot. Should this fail or outboxd stop here, the next session finds
	// the slot without its marker and aligns it (ensureSlot), before it
	// streams.
	if err := r.alignFailover(ctx, conn, c.srv, &catalog.Slot{Name: r.cfg.Slot}); err != nil {
		return err
	}
	if _, err := scalar(ctx, conn, fmt.Sprintf("SELECT pg_advisory_unlock(%d)", catalog.CutoverLock(r.cfg.Slot))); err != nil {
		return fmt.Errorf("release the cut-over lock: %w", err)
	}
	r.log.Info("cut-over complete: the snapshot is in Kafka; streaming from the slot's consistent point", "slot", r.cfg.Slot, "consistent_point", c.at.String())
	return nil
}

// readSlot reads the slot and whether its cut-over marker exists; a slot
// found is one this process has seen (Runner.slotSeen).
func (r *Runner) readSlot(ctx context.Context, conn *pgconn.PgConn) (*catalog.Slot, bool, error) {
	slot, err := catalog.ReadSlot(ctx, conn, r.cfg.Slot)
	if err != nil {
		return nil, false, fmt.Errorf("read replication slot: %w", err)
	}
	marker, err := catalog.ReadSlot(ctx, conn, catalog.CutoverMarker(r.cfg.Slot))
	if err != nil {
		return nil, false, fmt.Errorf("read the cut-over marker slot: %w", err)
	}
	if slot != nil {
		r.slotSeen = true
	}
	return slot, marker != nil, nil
}

// scalar runs one statement and returns the first column of its first row.
func scalar(ctx context.Context, conn *pgconn.PgConn, sql string) (string, error) {
	res, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return "", err
	}
	if len(res) == 0 || len(res[0].Rows) == 0 || len(res[0].Rows[0]) == 0 {
		return "", errors.New("no row")
	}
	return string(res[0].Rows[0][0]), nil
}
