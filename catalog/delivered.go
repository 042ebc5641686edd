package catalog

import (
	"context"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// Whether Kafka has every outbox row a transaction sees, known without
// reading Kafka. The retention job deletes only such rows; `outboxd replay`
// republishes only such rows, so that no copy comes before the first
// delivery of an earlier event of its aggregate. Both ask here:
//
//  1. BeginDelivery: BEGIN ISOLATION LEVEL REPEATABLE READ, then SELECT
//     pg_current_wal_insert_lsn(). The first statement fixes the
//     transaction's snapshot, then reads the WAL insert position L. A
//     transaction is visible in a snapshot only once its commit record has
//     been inserted, so every row this transaction can see was committed
//     before L. (The insert position rather than pg_current_wal_lsn(), the
//     write position: with synchronous_commit = off a transaction becomes
//     visible before its commit record is written out.)
//  2. ReadDelivery, as often as the caller likes within that transaction:
//     pg_try_advisory_xact_lock_shared(CutoverLock), and the cut-over
//     marker absent: no cut-over is publishing a snapshot, whose rows lie
//     before the slot's position, and none can start until the transaction
//     ends (replication/cutover.go). Then the slot: outboxd confirms a
//     position only when Kafka acknowledged every event of every
//     transaction committed before it, so once confirmed_flush_lsn reaches
//     L, every row the snapshot sees is in Kafka.
//
// Each caller keeps its own verdict on a Delivery that is not delivered
// yet (retention: delete nothing this time; replay: wait, then refuse).
//
// All this proves something only about rows the slot decoded: those
// committed after it was created. A slot created after a row (its
// predecessor dropped) is past it and says nothing about it. Replay only
// needs "the slot is past these rows" (no copy before a first delivery);
// the retention job also asks the slot record (slotrecord.go) whether the
// slot vouches for them.

// Delivery is what the catalogs say, inside a transaction BeginDelivery
// began, about the rows it sees.
type Delivery struct {
	At pglogrepl.LSN // the WAL insert position its snapshot was taken at
	// Cutover, when set, says why the slot's position proves nothing: a
	// cut-over is publishing its snapshot, or one did not finish.
	Cutover string
	Slot    *Slot // nil: the slot does not exist
}

// Delivered reports whether Kafka has every row the transaction sees.
func (d Delivery) Delivered() bool {
	return d.Cutover == "" && d.Slot != nil && d.Slot.ConfirmedFlush >= d.At
}

// BeginDelivery begins a REPEATABLE READ transaction on conn (READ ONLY
// when readOnly) and returns the WAL insert position its snapshot was
// taken at. On an error the caller rolls back (a ROLLBACK outside a
// transaction only warns).
func BeginDelivery(ctx context.Context, conn *pgconn.PgConn, readOnly bool) (pglogrepl.LSN, error) {
	begin := "BEGIN ISOLATION LEVEL REPEATABLE READ"
	if readOnly {
		begin += " READ ONLY"
	}
	if _, err := conn.Exec(ctx, begin).ReadAll(); err != nil {
		return 0, err
	}
	return InsertLSN(ctx, conn)
}

// ReadDelivery reads, in the transaction BeginDelivery began at at,
// whether Kafka has every row it sees. Once it found no cut-over, none can
// start until the transaction ends (it holds the cut-over lock shared).
func ReadDelivery(ctx context.Context, conn *pgconn.PgConn, slot string, at pglogrepl.LSN) (Delivery, error) {
	d := Delivery{At: at}
	rows, err := query(ctx, conn, fmt.Sprintf("SELECT pg_catalog.pg_try_advisory_xact_lock_shared(%d)", CutoverLock(slot)))
	if err != nil {
		return d, fmt.Errorf("take the cut-over lock: %w", err)
	}
	if len(rows) != 1 || str(rows[0][0]) != "t" {
		d.Cutover = CutoverBusy(ctx, conn, slot)
		return d, nil
	}
	marker, err := ReadSlot(ctx, conn, CutoverMarker(slot))
	if err != nil {
		return d, fmt.Errorf("read the cut-over marker slot: %w", err)
	}
	if marker != nil {
		d.Cutover = "a cut-over did not finish: its snapshot rows may not be in Kafka"
		return d, nil
	}
	if d.Slot, err = ReadSlot(ctx, conn, slot); err != nil {
		return d, fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	return d, nil
}
