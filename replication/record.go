package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/postgres"
)

// The slot record (catalog.SlotRecord): that outboxd has seen the slot,
// kept in the database so that it outlives the process (Runner.slotSeen
// only lives as long as it), and the position outboxd last found the slot
// at, which names the gap when the slot goes missing.

// readRecord reads the slot's row of the slot record, creating the table
// when it is missing and the role may. A row means outboxd has seen the
// slot (Runner.slotSeen). A table that cannot be made is said once: then
// only this process remembers the slot, and the retention job deletes
// nothing.
func (r *Runner) readRecord(ctx context.Context, conn *pgconn.PgConn) error {
	t := r.cfg.SlotTable
	ok, err := catalog.EnsureSlotTable(ctx, conn, t)
	if err != nil {
		return fmt.Errorf("slot record: %w", err)
	}
	if !ok {
		r.recordMissing(fmt.Errorf("%s does not exist and this role cannot create it", t))
		return nil
	}
	rec, err := catalog.ReadSlotRecord(ctx, conn, t, r.cfg.Slot)
	switch {
	case hasCode(err, "42501"):
		r.recordMissing(err)
		return nil
	case err != nil:
		return fmt.Errorf("read the slot record %s: %w", t, err)
	case rec != nil:
		r.record, r.slotSeen = rec, true
	}
	return nil
}

// writeRecord records the slot (catalog.RecordSlot): fresh when just
// created, covering the cut-over's tables (Config.SnapshotTables) when
// its snapshot is in Kafka. A role that may not write the table is said
// once, as readRecord does.
func (r *Runner) writeRecord(ctx context.Context, conn *pgconn.PgConn, fresh bool, covers []catalog.Table) error {
	if r.noRecord {
		return nil
	}
	err := catalog.RecordSlot(ctx, conn, r.cfg.SlotTable, r.cfg.Slot, fresh, covers)
	switch {
	case hasCode(err, "25006"):
		// A standby (read-only: a multi-host DSN before the promotion, or
		// decoding on a standby): its primary's outboxd writes the record,
		// which the standby replays.
		r.log.Debug("slot record not written: the server is read-only", "table", r.cfg.SlotTable.String())
	case hasCode(err, "42501"):
		r.recordMissing(err)
	case err != nil:
		return fmt.Errorf("write the slot record %s: %w", r.cfg.SlotTable, err)
	}
	return nil
}

// recordMissing says, once, what is lost without the slot record.
func (r *Runner) recordMissing(err error) {
	if r.noRecord {
		return
	}
	r.noRecord = true
	r.log.Warn("cannot keep the slot record: a later outboxd will not know this slot existed, and would create it again silently if it were dropped; the retention job deletes nothing. Create the table (sql/005_slot_record.sql) and grant this role INSERT, UPDATE, DELETE on it",
		"table", r.cfg.SlotTable.String(), "error", err)
}

// SlotGoneError is a slot outboxd has seen and found missing: only the
// operator can decide what to do about the events no slot holds (exit
// status 3, which supervisors do not restart).
type SlotGoneError struct{ msg string }

func (e *SlotGoneError) Error() string { return e.msg }

// gone is the error of a slot outboxd has seen (Runner.slotSeen) and
// found missing, after recording that it was missing: a slot found later
// under its name was made outside outboxd (rehired).
func (r *Runner) gone(ctx context.Context, conn *pgconn.PgConn) error {
	if r.record != nil {
		if err := catalog.MarkSlotMissing(ctx, conn, r.cfg.SlotTable, r.cfg.Slot); err != nil {
			r.log.Warn("could not record that the slot is missing", "table", r.cfg.SlotTable.String(), "error", err)
		}
	}
	return r.slotGone()
}

// rehired records a slot made again outside outboxd after a start had
// found it missing (catalog.SlotRecord.Missing) as new: it vouches for no
// row older than itself, and the events between the old slot's position
// and its creation are in no slot. Under the cut-over lock, as a slot
// outboxd creates (createRecorded).
func (r *Runner) rehired(ctx context.Context, conn *pgconn.PgConn, slot *catalog.Slot) error {
	rec := r.record
	r.log.Warn("replication slot was missing and has been created again outside outboxd: events committed after the old slot's position and before the new one's creation are in no slot; reconcile them (outboxd replay --from the creat_en of the first of them). The retention job treats the slot as new: it deletes no row older than it",
		"slot", r.cfg.Slot, "old_confirmed", rec.Seen.String(), "seen_at", rec.SeenAt.UTC().Format(time.RFC3339),
		"missing_since", rec.Missing.UTC().Format(time.RFC3339), "new_confirmed", slot.ConfirmedFlush.String())
	return r.withCreationLock(ctx, conn, func() error { return r.writeRecord(ctx, conn, true, nil) })
}

// withCreationLock runs do holding the cut-over lock (catalog.CutoverLock)
// exclusively: the retention job holds it shared from before its snapshot
// until it has read the slot, so it reads either the old record and the
// old slot, or the new slot's record (retention.go).
func (r *Runner) withCreationLock(ctx context.Context, conn *pgconn.PgConn, do func() error) error {
	lock := catalog.CutoverLock(r.cfg.Slot)
	locked, err := scalar(ctx, conn, fmt.Sprintf("SELECT pg_try_advisory_lock(%d)", lock))
	if err != nil {
		return fmt.Errorf("take the cut-over lock: %w", err)
	}
	if locked != "t" {
		return &standbyError{errors.New(catalog.CutoverBusy(ctx, conn, r.cfg.Slot))}
	}
	defer func() { _, _ = scalar(ctx, conn, fmt.Sprintf("SELECT pg_advisory_unlock(%d)", lock)) }()
	return do()
}

// slotGone is the error of a slot outboxd has seen (Runner.slotSeen) and
// found missing.
func (r *Runner) slotGone() error {
	const why = "(dropped, or a failover to a standby that did not have it: before PostgreSQL 17 no slot is synchronised to standbys, on 17 only a failover slot, which outboxd's is from the end of its cut-over on)"
	if rec := r.record; rec != nil {
		return Fatal(&SlotGoneError{fmt.Sprintf("replication slot %q does not exist, though outboxd has seen it %s: it had confirmed %s when outboxd last found it (%s, recorded in %s); events committed after that position may be in no slot, and outboxd will not create the slot again until told to. "+
			"Accept the gap (outboxd slot forget -c <config> --gap-from %s), start outboxd, and reconcile the events: outboxd replay --from the creat_en of the first of them (%s or earlier) (docs/operations.md#a-dropped-slot)",
			r.cfg.Slot, why, rec.Seen, rec.SeenAt.UTC().Format(time.RFC3339), r.cfg.SlotTable, rec.Seen, rec.SeenAt.UTC().Format(time.RFC3339))})
	}
	return Fatal(&SlotGoneError{fmt.Sprintf("replication slot %q does not exist, though this outboxd has seen it %s: events committed since it went are not in any slot; outboxd will not recreate it silently. Recreate it deliberately (restart with postgres.create_slot: true) after reconciling (docs/failover.md)", r.cfg.Slot, why)})
}

// RecordKeeper moves the slot record's seen position (catalog.SeeSlot)
// every Every while outboxd runs, so that the gap a missing slot leaves
// is named from a recent position rather than from the session's start.
type RecordKeeper struct {
	Conn  *pgconn.Config
	Table catalog.Table
	Slot  string
	Every time.Duration
	Clock clock.Clock // nil: the system's
	Log   hclog.Logger
}

// Run updates the record until ctx ends, on a connection of its own for
// each update (none held between them); a failure is logged at debug
// level and tried again at the next tick (the record is a hint for the
// operator there, not a proof).
func (k *RecordKeeper) Run(ctx context.Context) {
	c := clock.Or(k.Clock)
	for clock.Sleep(ctx, c, k.Every) {
		if err := k.see(ctx); err != nil && ctx.Err() == nil {
			k.Log.Debug("slot record: could not update the position seen", "table", k.Table.String(), "error", err)
		}
	}
}

func (k *RecordKeeper) see(ctx context.Context) error {
	conn, err := postgres.Connect(ctx, k.Conn, postgres.Session{App: "outboxd-record"})
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return catalog.SeeSlot(ctx, conn, k.Table, k.Slot)
}
