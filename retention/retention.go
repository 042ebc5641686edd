// Package retention deletes outbox rows older than an age, in small
// batches, and never a row whose transaction the slot has not confirmed,
// that is, never a row Kafka may not have yet.
//
// How that is known, in one REPEATABLE READ transaction per batch (the
// proof is catalog.BeginDelivery and catalog.ReadDelivery, which replay
// shares, and the slot record, catalog.SlotRecord):
//
//  0. Before the transaction, the cut-over lock shared for the session
//     (lockCreation): outboxd creates a slot and writes its record under
//     it held exclusively, so the record read in 4 is the slot's read in 3.
//  1. SELECT pg_current_wal_insert_lsn(): the first statement fixes the
//     transaction's snapshot, then reads the WAL insert position L. A
//     transaction is visible in a snapshot only once its commit record has
//     been inserted, so every row this transaction can see was committed
//     before L. (The insert position rather than pg_current_wal_lsn(), the
//     write position: with synchronous_commit = off a transaction becomes
//     visible before its commit record is written out.)
//  2. pg_try_advisory_xact_lock_shared(the cut-over lock), and the cut-over
//     marker absent: no cut-over is publishing a snapshot, whose rows lie
//     before the slot's position, and none can start until this
//     transaction ends (replication/cutover.go); nor is the replay hold
//     there: the snapshot rows of a cut-over given up are the operator's to
//     replay (catalog/cutover.go).
//  3. Wait, at most ConfirmTimeout, until the slot's confirmed_flush_lsn
//     reaches L. outboxd confirms a position only when Kafka acknowledged
//     every event of every transaction committed before it, so from then on
//     every row the snapshot sees is in Kafka.
//  4. The slot vouches for the rows (vouched): a slot decodes only what
//     was committed after it was created, so its position says nothing
//     about older rows. Its record says from which creat_en on it vouches
//     (Since, plus ClockSkew), or that it vouches for every row of a table
//     its cut-over snapshot covered. No record: nothing.
//  5. DELETE, in that same snapshot, at most BatchSize rows whose creat_en
//     is older than MaxAge and that the slot vouches for: rows committed
//     after L are invisible to it, however old their creat_en. A
//     partitioned table is pruned through itself, each row by its
//     partition and place (tableoid, ctid).
//
// If the slot does not reach L in time (Kafka is down, outboxd is stopped or
// behind), the batch deletes nothing and the job tries again later.
//
// With DropPartitions the job drops a partitioned outbox's old
// partitions instead, by the same proof (partitions.go).
package retention

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/postgres"
)

// Config is the job's configuration; durations and BatchSize are positive.
type Config struct {
	Conn *pgconn.Config
	Slot string
	// SlotTable holds the slot record (catalog.SlotRecord): which rows the
	// slot vouches for.
	SlotTable catalog.Table
	Tables    []envelope.Table // each by its first route's creat_en
	// DropPartitions drops old partitions whole instead of deleting old
	// rows (retention.mode drop_partitions).
	DropPartitions bool
	MaxAge         time.Duration
	Interval       time.Duration
	BatchSize      int
	ConfirmTimeout time.Duration
	// LockTimeout bounds each wait for a partition's or the outbox's lock
	// (DropPartitions).
	LockTimeout time.Duration
	Observer    Observer
	// Poll is how often the slot is read while a batch waits (default
	// 100ms).
	Poll time.Duration
	// Clock paces the passes and times a batch's wait (nil: the system's).
	Clock clock.Clock
}

// Job is the retention job of one slot's tables.
type Job struct {
	cfg Config
	log hclog.Logger
}

// New prepares the job; Run runs it.
func New(cfg Config, log hclog.Logger) *Job {
	if cfg.Poll <= 0 {
		cfg.Poll = 100 * time.Millisecond
	}
	cfg.Clock = clock.Or(cfg.Clock)
	return &Job{cfg: cfg, log: log}
}

// notYet is a batch that deleted nothing on purpose: its rows cannot be
// known delivered yet. The job logs a reason once, however its detail (the
// positions) changes from pass to pass.
type notYet struct{ reason, detail string }

func (e *notYet) Error() string {
	if e.detail == "" {
		return e.reason
	}
	return e.reason + " (" + e.detail + ")"
}

// notVouched is a partition the slot does not vouch for (Job.vouched):
// kept, and said once, while the pass goes on with the others.
type notVouched struct{ reason string }

func (e *notVouched) Error() string { return e.reason }

// Run deletes old rows every Interval until ctx ends. Failures are logged
// (once per change) and the next pass tries again.
func (j *Job) Run(ctx context.Context) {
	if j.cfg.DropPartitions {
		j.log.Info("retention: dropping partitions older than max_age once Kafka has their rows", "max_age", j.cfg.MaxAge, "interval", j.cfg.Interval, "lock_timeout", j.cfg.LockTimeout)
	} else {
		j.log.Info("retention: deleting delivered outbox rows older than max_age", "max_age", j.cfg.MaxAge, "interval", j.cfg.Interval, "batch_size", j.cfg.BatchSize)
	}
	var conn *pgconn.PgConn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	lastErr := ""
	var wait time.Duration // the first pass at once
	for {
		if !clock.Sleep(ctx, j.cfg.Clock, wait) {
			return
		}
		var err error
		if conn == nil || conn.IsClosed() {
			conn, err = j.connect(ctx)
		}
		if err == nil {
			err = j.pass(ctx, conn)
		}
		var ny *notYet
		var nv *notVouched
		waiting := errors.As(err, &ny)
		key := ""
		switch {
		case waiting:
			key = ny.reason
		case errors.As(err, &nv):
			waiting, key = true, nv.reason
		case err != nil:
			key = err.Error()
		}
		switch {
		case ctx.Err() != nil:
			return
		case key == lastErr:
			if err != nil {
				j.log.Debug("retention: nothing deleted", "reason", err)
			}
		case waiting:
			j.log.Info("retention: nothing deleted for now", "reason", err)
		case err != nil:
			j.log.Warn("retention: pass failed; trying again", "error", err, "in", j.cfg.Interval)
		}
		lastErr = key
		if err != nil && !waiting && conn != nil {
			_ = conn.Close(context.Background())
			conn = nil
		}
		wait = j.cfg.Interval
	}
}

func (j *Job) connect(ctx context.Context) (*pgconn.PgConn, error) {
	conn, err := postgres.Connect(ctx, j.cfg.Conn, postgres.Session{App: "outboxd-retention"})
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return conn, nil
}

// pass prunes each table (deletePass or dropPass). A table that fails does not keep the others from being pruned; a reason to
// wait (notYet) holds for every table, and ends the pass.
func (j *Job) pass(ctx context.Context, conn *pgconn.PgConn) error {
	var errs []error
	for _, t := range j.cfg.Tables {
		var err error
		if j.cfg.DropPartitions {
			_, err = j.dropPass(ctx, conn, t)
		} else {
			err = j.deletePass(ctx, conn, t)
		}
		var ny *notYet
		switch {
		case errors.As(err, &ny) || ctx.Err() != nil || conn.IsClosed():
			return err
		case err != nil:
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deletePass deletes t's old rows in batches until one comes back short.
func (j *Job) deletePass(ctx context.Context, conn *pgconn.PgConn, t envelope.Table) error {
	total, conflicts := 0, 0
	var err error
	for {
		var n int
		n, err = j.batch(ctx, conn, t)
		total += n
		if hasCode(err, "40001") && conflicts < 5 {
			// A row of the snapshot changed since (postgres.mark_published
			// marked it): a new snapshot sees the new version.
			conflicts++
			continue
		}
		if err != nil || n < j.cfg.BatchSize {
			break
		}
	}
	if total > 0 {
		name := catalog.Table{Schema: t.Schema, Name: t.Name}.String()
		j.log.Info("retention: deleted old rows", "table", name, "rows", total, "older_than", j.cfg.MaxAge)
		if j.cfg.Observer != nil {
			j.cfg.Observer.Deleted(name, total)
		}
	}
	return err
}

// batch deletes at most BatchSize old rows of t that the slot has
// confirmed, in one transaction (see the package comment).
func (j *Job) batch(ctx context.Context, conn *pgconn.PgConn, t envelope.Table) (int, error) {
	unlock, err := j.lockCreation(ctx, conn)
	if err != nil {
		return 0, err
	}
	defer unlock() // after the ROLLBACK below: not inside a failed transaction
	committed := false
	defer func() {
		if !committed {
			_, _ = conn.Exec(context.Background(), "ROLLBACK").ReadAll()
		}
	}()
	l, err := catalog.BeginDelivery(ctx, conn, false)
	if err != nil {
		return 0, err
	}
	if err := j.waitConfirmed(ctx, conn, l); err != nil {
		return 0, err
	}
	since, err := j.vouched(ctx, conn, t)
	if err != nil {
		return 0, err
	}
	from := "-infinity"
	if !since.IsZero() {
		from = since.Format(time.RFC3339Nano)
	}
	table, creat := t.Quoted(), catalog.QuoteIdent(t.Route.Columns.CreatEn)
	// A row by (tableoid, ctid): through a partitioned table, a ctid alone
	// names a row in each partition (a TID scan per partition finds them).
	res := conn.ExecParams(ctx, fmt.Sprintf(`DELETE FROM %s t USING (
		SELECT tableoid, ctid FROM %s WHERE %s < now() - make_interval(secs => $1) AND %s >= $3::timestamptz ORDER BY %s LIMIT $2) old
		WHERE t.tableoid = old.tableoid AND t.ctid = old.ctid`, table, table, creat, creat, creat),
		[][]byte{[]byte(strconv.FormatFloat(j.cfg.MaxAge.Seconds(), 'f', -1, 64)), []byte(strconv.Itoa(j.cfg.BatchSize)), []byte(from)}, nil, nil, nil).Read()
	if err := res.Err; err != nil {
		if hasCode(err, "42501") {
			return 0, fmt.Errorf("delete from %s: %w: the retention job needs DELETE on the outbox table (GRANT DELETE ON ... TO outboxd)", table, err)
		}
		return 0, fmt.Errorf("delete from %s: %w", table, err)
	}
	if _, err := conn.Exec(ctx, "COMMIT").ReadAll(); err != nil {
		return 0, err
	}
	committed = true
	return int(res.CommandTag.RowsAffected()), nil
}

func hasCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// waitConfirmed waits until the slot has confirmed l, at most
// ConfirmTimeout, with no cut-over in progress (catalog.ReadDelivery) and
// no replay hold.
func (j *Job) waitConfirmed(ctx context.Context, conn *pgconn.PgConn, l pglogrepl.LSN) error {
	deadline := j.cfg.Clock.Now().Add(j.cfg.ConfirmTimeout)
	for {
		d, err := catalog.ReadDelivery(ctx, conn, j.cfg.Slot, l)
		if err != nil {
			return err
		}
		switch {
		case d.Cutover != "":
			return &notYet{reason: d.Cutover}
		case d.Slot == nil:
			return &notYet{reason: fmt.Sprintf("replication slot %q does not exist: nothing is known to be delivered", j.cfg.Slot)}
		case d.Delivered():
			// The replay hold is read after the marker was read absent: a
			// start that gives a cut-over up creates the hold before it
			// drops the marker, so either is seen, and no later hold can
			// come (it needs a marker, which needs a cut-over, which waits
			// for the lock this transaction holds). Read before the marker,
			// the hold could be created and the marker dropped between the
			// two reads (make matrix met it on PostgreSQL 18: the rows to
			// replay deleted).
			return j.noHold(ctx, conn)
		case j.cfg.Clock.Now().After(deadline):
			return &notYet{reason: fmt.Sprintf("replication slot %q has not confirmed the transactions of the old rows within %s: Kafka may not have them all (outboxd stopped or behind, or Kafka down)", j.cfg.Slot, j.cfg.ConfirmTimeout),
				detail: fmt.Sprintf("confirmed %s, needs %s", d.Slot.ConfirmedFlush, l)}
		}
		if !clock.Sleep(ctx, j.cfg.Clock, j.cfg.Poll) {
			return ctx.Err()
		}
	}
}

// ClockSkew is how far ahead of the database's clock a creat_en may run
// (a service that sets it from its own clock): a row vouched for by the
// slot record's Since alone must have a creat_en this much past it.
const ClockSkew = time.Minute

// lockCreation takes the cut-over lock shared for the session, before the
// snapshot the proof reads the slot record in: outboxd creates a slot and
// writes its record under the same lock held exclusively, so while the
// job holds it the record it reads and the slot it reads are the same
// slot's. The unlock it returns runs outside a transaction.
func (j *Job) lockCreation(ctx context.Context, conn *pgconn.PgConn) (func(), error) {
	lock := catalog.CutoverLock(j.cfg.Slot)
	res := conn.Exec(ctx, fmt.Sprintf("SELECT pg_catalog.pg_try_advisory_lock_shared(%d)", lock))
	rows, err := res.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("take the cut-over lock: %w", err)
	}
	if len(rows) != 1 || len(rows[0].Rows) != 1 || string(rows[0].Rows[0][0]) != "t" {
		return nil, &notYet{reason: catalog.CutoverBusy(ctx, conn, j.cfg.Slot)}
	}
	return func() {
		_, _ = conn.Exec(context.Background(), fmt.Sprintf("SELECT pg_catalog.pg_advisory_unlock_shared(%d)", lock)).ReadAll()
	}, nil
}

// vouched reads, under lockCreation, from which creat_en on the slot
// vouches for t's rows (catalog.SlotRecord): zero when for all of them
// (it began with a cut-over whose snapshot covered t). A row older
// may have been committed before the slot existed, and its confirmed
// position says nothing about it. No record: nothing is vouched for.
func (j *Job) vouched(ctx context.Context, conn *pgconn.PgConn, t envelope.Table) (time.Time, error) {
	rec, err := catalog.ReadSlotRecord(ctx, conn, j.cfg.SlotTable, j.cfg.Slot)
	switch {
	case hasCode(err, "42P01") || hasCode(err, "42501"):
		return time.Time{}, &notYet{reason: fmt.Sprintf("the slot record %s cannot be read (%v): nothing is known about which rows replication slot %q vouches for; create it (sql/005_slot_record.sql) and grant outboxd INSERT, UPDATE, DELETE on it", j.cfg.SlotTable, err, j.cfg.Slot)}
	case err != nil:
		return time.Time{}, fmt.Errorf("read the slot record %s: %w", j.cfg.SlotTable, err)
	case rec == nil:
		return time.Time{}, &notYet{reason: fmt.Sprintf("no record of replication slot %q in %s yet (outboxd writes it when it finds or creates the slot): nothing is known about which rows it vouches for", j.cfg.Slot, j.cfg.SlotTable)}
	case !rec.Missing.IsZero():
		return time.Time{}, &notYet{reason: fmt.Sprintf("replication slot %q was found missing at %s and outboxd has not recorded the slot since: nothing is known about which rows it vouches for", j.cfg.Slot, rec.Missing.UTC().Format(time.RFC3339))}
	case rec.CoversTable(catalog.Table{Schema: t.Schema, Name: t.Name}):
		return time.Time{}, nil
	}
	return rec.Since.Add(ClockSkew), nil
}

// noHold is a notYet while the replay hold exists: the rows of a cut-over
// given up are the operator's to replay first (catalog/cutover.go).
func (j *Job) noHold(ctx context.Context, conn *pgconn.PgConn) error {
	hold := catalog.ReplayHold(j.cfg.Slot)
	h, err := catalog.ReadSlot(ctx, conn, hold)
	switch {
	case err != nil:
		return fmt.Errorf("read the replay hold slot: %w", err)
	case h != nil:
		return &notYet{reason: fmt.Sprintf("outboxd gave up an unfinished cut-over and advised replaying its snapshot rows (outboxd replay): nothing is deleted until they are replayed and the hold is dropped (SELECT pg_drop_replication_slot(%s))", catalog.QuoteLiteral(hold))}
	}
	return nil
}
