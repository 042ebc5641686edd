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
// publish the snapshot again, and the snapshot cannot be exported again:
// so a marker (catalog.CutoverMarker) exists from before the slot is
// created until the snapshot is acknowledged, and a start that finds it
// drops the slot and does the whole cut-over again (the rows the
// unfinished attempt delivered are delivered twice: duplicates, no loss).
// An advisory lock (catalog.CutoverLock) keeps a second instance, and the
// retention job, out while it happens.
//
// The marker is a physical slot, which no standby keeps: so until the
// marker is dropped the slot is not a failover slot either (PostgreSQL
// 17), and a standby promoted meanwhile has neither. outboxd then stops
// with "does not exist" (Runner.slotSeen) and its restart does the
// cut-over again on the new primary, instead of streaming from a copy of
// the slot whose snapshot rows Kafka may not have.

// cutover is a slot just created with an exported snapshot, whose pending
// rows must be acknowledged before anything is streamed.
type cutover struct {
	snapshot string
	at       pglogrepl.LSN  // the slot's consistent point
	srv      catalog.Server // where the slot is
}

// beginCutover takes the cut-over lock and creates the marker and the
// slot with an exported snapshot, dropping the slot of an unfinished
// earlier attempt. When another instance finished the cut-over meanwhile
// it returns that slot and no cutover. Once the slot is created nothing
// runs on conn until the snapshot is imported: any statement there would
// end the transaction that holds the export.
func (r *Runner) beginCutover(ctx context.Context, conn *pgconn.PgConn, srv catalog.Server) (*catalog.Slot, *cutover, error) {
	name, marker := r.cfg.Slot, catalog.CutoverMarker(r.cfg.Slot)
	if !r.cfg.CreateSlot {
		return nil, nil, Fatal(fmt.Errorf("the cut-over of replication slot %q did not finish (its marker slot %q exists): its snapshot rows may not all be in Kafka. Set postgres.create_slot: true to publish the snapshot again (the slot is recreated), or postgres.snapshot: none to give up on them (then replay them: the retention job waits until you have)", name, marker))
	}
	lock := catalog.CutoverLock(name)
	locked, err := scalar(ctx, conn, fmt.Sprintf("SELECT pg_try_advisory_lock(%d)", lock))
	if err != nil {
		return nil, nil, fmt.Errorf("take the cut-over lock: %w", err)
	}
	if locked != "t" {
		return nil, nil, &standbyError{fmt.Errorf("another outboxd instance is publishing the cut-over snapshot of replication slot %q", name)}
	}
	unlock := func() { _, _ = scalar(ctx, conn, fmt.Sprintf("SELECT pg_advisory_unlock(%d)", lock)) }
	slot, hasMarker, err := r.readSlot(ctx, conn)
	if err != nil {
		unlock()
		return nil, nil, err
	}
	if !hasMarker && slot != nil {
		unlock() // another instance finished it
		return slot, nil, nil
	}
	if slot != nil && slot.Active {
		unlock()
		return nil, nil, &standbyError{fmt.Errorf("replication slot %q is active for PID %d while its cut-over marker exists", name, slot.ActivePID)}
	}
	if !hasMarker {
		if _, err := conn.Exec(ctx, "CREATE_REPLICATION_SLOT "+marker+" PHYSICAL").ReadAll(); err != nil {
			unlock()
			return nil, nil, slotError(fmt.Errorf("create the cut-over marker slot %q: %w", marker, err))
		}
	}
	if slot != nil {
		r.log.Warn("an earlier cut-over did not finish (a crash or a failure while its snapshot was published): dropping the slot to publish the snapshot again; rows it delivered are delivered twice",
			"slot", name, "marker", marker)
		if _, err := scalar(ctx, conn, "SELECT pg_drop_replication_slot("+catalog.QuoteLiteral(name)+")"); err != nil {
			unlock()
			return nil, nil, fmt.Errorf("drop replication slot %q of the unfinished cut-over: %w", name, err)
		}
	}
	res, err := r.createSlot(ctx, conn, srv, true)
	if err != nil {
		unlock()
		return nil, nil, err
	}
	at, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		unlock()
		return nil, nil, fmt.Errorf("create replication slot %q: consistent point %q: %w", name, res.ConsistentPoint, err)
	}
	r.log.Info("created replication slot with an exported snapshot: publishing the rows it sees as pending before streaming",
		"slot", name, "consistent_point", at.String(), "snapshot", res.SnapshotName)
	return nil, &cutover{snapshot: res.SnapshotName, at: at, srv: srv}, nil
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
