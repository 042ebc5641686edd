package retention

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/envelope"
)

// retention.mode drop_partitions: a partition of a partitioned outbox
// (RANGE on creat_en) whose whole range is older than MaxAge goes with
// DROP TABLE, once the slot has confirmed every row it holds. The proof is
// the DELETE's (package comment), taken on the partition itself:
//
//  1. BEGIN; LOCK TABLE the partition IN SHARE MODE. A writer's locks are
//     released after its commit record is inserted, so once the lock is
//     held every transaction that wrote into the partition has committed
//     (or aborted) and none can write into it until the transaction ends.
//     Inserts into the other partitions do not wait: they lock only the
//     partition their row goes to.
//  2. L = pg_current_wal_insert_lsn(), read after the lock: every row the
//     partition holds was committed before L. Then, as for the DELETE,
//     the cut-over lock shared and no marker, no replay hold, and the
//     slot's confirmed_flush_lsn at L or past it (at most ConfirmTimeout):
//     Kafka has every row of the partition.
//  3. With a default partition (which DETACH ... CONCURRENTLY refuses):
//     DETACH PARTITION and DROP TABLE in that same transaction, which takes
//     the outbox's ACCESS EXCLUSIVE lock for a moment (LockTimeout bounds
//     the wait, and so the inserts queued behind it). Without one: the
//     partition is marked with a comment, the transaction commits, and
//     DETACH PARTITION ... CONCURRENTLY detaches it without blocking the
//     outbox's inserts; then 2 again on the detached table (a row may have
//     gone in between the two; the detach waited for its transaction), and
//     DROP TABLE.
//
// A detached table the job has not dropped yet (Kafka went down between,
// outboxd stopped) keeps its comment, and each pass finishes it first; an
// interrupted DETACH ... CONCURRENTLY leaves the partition "detach
// pending", which the pass completes (DETACH PARTITION ... FINALIZE). A
// running `outboxd replay` reads the outbox in one transaction: the locks
// above wait for it to end (at most LockTimeout, then the next pass).

// Observer is told what retention removed and what it keeps; nil: no one.
type Observer interface {
	// Deleted: rows a DELETE batch removed from table.
	Deleted(table string, rows int)
	// Dropped: one partition of table dropped, with its rows.
	Dropped(table string, rows int64)
	// Partitions: after each pass over a partitioned table, the start of
	// its oldest partition's range and when the oldest partition still
	// there became due (zero: none).
	Partitions(table string, oldest, dueSince time.Time)
}

// detachedComment marks a partition the job detaches, until it drops it.
func detachedComment(parent catalog.Table) string {
	return "outboxd retention: detached from " + parent.String() + "; dropped once the replication slot has confirmed its rows"
}

// dropPass drops t's due partitions, oldest first.
func (j *Job) dropPass(ctx context.Context, conn *pgconn.PgConn, t envelope.Table) (dropped int, err error) {
	parent := catalog.Table{Schema: t.Schema, Name: t.Name}
	ps, err := catalog.ReadPartitionedTable(ctx, conn, parent, j.cfg.MaxAge)
	switch {
	case err != nil:
		return 0, fmt.Errorf("read the partitions of %s: %w", parent, err)
	case ps == nil:
		return 0, fmt.Errorf("%s is not a partitioned table: retention.mode drop_partitions drops whole partitions of an outbox partitioned by RANGE (%s); partition it, or use retention.mode delete", parent, t.Route.Columns.CreatEn)
	}
	if err := ps.RangeOn(t.Route.Columns.CreatEn); err != nil {
		return 0, err
	}
	defer func() {
		if dropped > 0 {
			if again, rerr := catalog.ReadPartitionedTable(ctx, conn, parent, j.cfg.MaxAge); rerr == nil && again != nil {
				ps = again
			}
		}
		j.observePartitions(ps)
	}()
	// What an earlier pass began: detached tables, then pending detaches.
	left, err := j.detachedLeft(ctx, conn, parent)
	if err != nil {
		return 0, err
	}
	for _, d := range left {
		if err := j.dropDetached(ctx, conn, parent, d); err != nil {
			return dropped, err
		}
		dropped++
	}
	for _, p := range ps.Due() {
		if err := j.dropPartition(ctx, conn, ps, p); err != nil {
			return dropped, err
		}
		dropped++
	}
	return dropped, nil
}

func (j *Job) observePartitions(ps *catalog.PartitionedTable) {
	if j.cfg.Observer == nil {
		return
	}
	var oldest, dueSince time.Time
	if p, ok := ps.Oldest(); ok {
		oldest = p.From
	}
	if due := ps.Due(); len(due) > 0 {
		dueSince = due[0].To.Add(j.cfg.MaxAge)
	}
	j.cfg.Observer.Partitions(ps.Table.String(), oldest, dueSince)
}

// detachedLeft is the tables the job detached from parent and has not
// dropped yet.
func (j *Job) detachedLeft(ctx context.Context, conn *pgconn.PgConn, parent catalog.Table) ([]catalog.Table, error) {
	res := conn.ExecParams(ctx, `SELECT n.nspname, c.relname FROM pg_catalog.pg_description d
		JOIN pg_catalog.pg_class c ON c.oid = d.objoid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE d.classoid = 'pg_catalog.pg_class'::regclass AND d.objsubid = 0 AND d.description = $1 AND NOT c.relispartition`,
		[][]byte{[]byte(detachedComment(parent))}, nil, nil, nil).Read()
	if res.Err != nil {
		return nil, fmt.Errorf("look for partitions detached from %s: %w", parent, res.Err)
	}
	var out []catalog.Table
	for _, r := range res.Rows {
		out = append(out, catalog.Table{Schema: string(r[0]), Name: string(r[1])})
	}
	return out, nil
}

// dropPartition drops p, a due partition of ps (see above).
func (j *Job) dropPartition(ctx context.Context, conn *pgconn.PgConn, ps *catalog.PartitionedTable, p catalog.Partition) error {
	parent, name := ps.Table, p.Table.Quoted()
	if p.DetachPending {
		// An interrupted DETACH ... CONCURRENTLY: no row can go in any more.
		if err := j.exec(ctx, conn, "COMMENT ON TABLE "+name+" IS "+catalog.QuoteLiteral(detachedComment(parent))); err != nil {
			return err
		}
		if err := j.detach(ctx, conn, parent, p.Table, "FINALIZE"); err != nil {
			return err
		}
		return j.dropDetached(ctx, conn, parent, p.Table)
	}
	rows, err := j.proven(ctx, conn, p.Table, "SHARE", true, func() error {
		if !ps.HasDefault {
			return j.exec(ctx, conn, "COMMENT ON TABLE "+name+" IS "+catalog.QuoteLiteral(detachedComment(parent)))
		}
		if err := j.exec(ctx, conn, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s", parent.Quoted(), name)); err != nil {
			return j.privilege(err, "detach "+p.Name()+" from "+parent.String())
		}
		return j.exec(ctx, conn, "DROP TABLE "+name)
	})
	if err != nil {
		return err
	}
	if ps.HasDefault {
		j.dropped(parent, p.Table, rows)
		return nil
	}
	if err := j.detach(ctx, conn, parent, p.Table, "CONCURRENTLY"); err != nil {
		return err
	}
	return j.dropDetached(ctx, conn, parent, p.Table)
}

// detach runs ALTER TABLE parent DETACH PARTITION part how, outside a
// transaction, with the lock timeout.
func (j *Job) detach(ctx context.Context, conn *pgconn.PgConn, parent, part catalog.Table, how string) error {
	if err := j.exec(ctx, conn, "SET lock_timeout = "+j.lockTimeout()); err != nil {
		return err
	}
	err := j.exec(ctx, conn, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s %s", parent.Quoted(), part.Quoted(), how))
	if rerr := j.exec(ctx, conn, "RESET lock_timeout"); err == nil {
		err = rerr
	}
	if err != nil {
		return j.privilege(err, "detach "+part.String()+" from "+parent.String()+" ("+how+")")
	}
	return nil
}

// dropDetached drops d, a table the job detached from parent, once the
// slot has confirmed every row it holds.
func (j *Job) dropDetached(ctx context.Context, conn *pgconn.PgConn, parent, d catalog.Table) error {
	rows, err := j.proven(ctx, conn, d, "ACCESS EXCLUSIVE", false, func() error {
		return j.exec(ctx, conn, "DROP TABLE "+d.Quoted())
	})
	if err != nil {
		return err
	}
	j.dropped(parent, d, rows)
	return nil
}

func (j *Job) dropped(parent, part catalog.Table, rows int64) {
	j.log.Info("retention: dropped a partition whose rows Kafka has", "table", parent.String(), "partition", part.String(), "rows", rows, "older_than", j.cfg.MaxAge)
	if j.cfg.Observer != nil {
		j.cfg.Observer.Dropped(parent.String(), rows)
	}
}

// proven runs then, in one transaction, once the slot has confirmed every
// row of part, with part locked in mode to the commit: an attached
// partition from before the position the slot must reach (lockFirst), so
// that no writer can add a row the proof does not cover; a detached table
// after it. DETACH ... CONCURRENTLY has waited for every transaction that
// could write into the detached table through the outbox, and an ACCESS
// EXCLUSIVE lock is WAL-logged (for standbys) in this transaction, whose
// record nothing flushes while the outbox is idle: taken first, the slot
// could not reach the position read after it. It returns part's rows.
func (j *Job) proven(ctx context.Context, conn *pgconn.PgConn, part catalog.Table, mode string, lockFirst bool, then func() error) (int64, error) {
	committed := false
	defer func() {
		if !committed {
			_, _ = conn.Exec(context.Background(), "ROLLBACK").ReadAll()
		}
	}()
	if err := j.exec(ctx, conn, "BEGIN; SET LOCAL lock_timeout = "+j.lockTimeout()); err != nil {
		return 0, err
	}
	lock := func() error {
		if err := j.exec(ctx, conn, fmt.Sprintf("LOCK TABLE %s IN %s MODE", part.Quoted(), mode)); err != nil {
			return j.privilege(err, "lock "+part.String())
		}
		return nil
	}
	if lockFirst {
		if err := lock(); err != nil {
			return 0, err
		}
	}
	l, err := catalog.InsertLSN(ctx, conn)
	if err != nil {
		return 0, err
	}
	if err := j.waitConfirmed(ctx, conn, l); err != nil {
		return 0, err
	}
	if !lockFirst {
		if err := lock(); err != nil {
			return 0, err
		}
	}
	res := conn.ExecParams(ctx, "SELECT count(*) FROM "+part.Quoted(), nil, nil, nil, nil).Read()
	if res.Err != nil {
		return 0, fmt.Errorf("count the rows of %s: %w", part, res.Err)
	}
	var rows int64
	if len(res.Rows) == 1 {
		rows, _ = strconv.ParseInt(string(res.Rows[0][0]), 10, 64)
	}
	if err := then(); err != nil {
		return 0, err
	}
	if err := j.exec(ctx, conn, "COMMIT"); err != nil {
		return 0, err
	}
	committed = true
	return rows, nil
}

func (j *Job) exec(ctx context.Context, conn *pgconn.PgConn, sql string) error {
	_, err := conn.Exec(ctx, sql).ReadAll()
	return err
}

func (j *Job) lockTimeout() string {
	return strconv.FormatInt(max(j.cfg.LockTimeout.Milliseconds(), 1), 10)
}

// privilege names the fix of a refused DETACH, DROP or LOCK, and says so
// of a lock not had within the lock timeout.
func (j *Job) privilege(err error, what string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42501":
			return fmt.Errorf("%s: %w: retention.mode drop_partitions needs outboxd's role to own the outbox and its partitions, or to be a member of their owner (GRANT <owner> TO <outboxd's role>)", what, err)
		case "55P03":
			return fmt.Errorf("%s: %w: a transaction held the table past retention.lock_timeout (%s); the next pass tries again", what, err, j.cfg.LockTimeout)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}
