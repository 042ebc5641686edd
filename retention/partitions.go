package retention

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/envelope"
)

// retention.mode drop_partitions: a partition of a partitioned outbox
// (RANGE on creat_en) whose whole range is older than MaxAge goes with
// DROP TABLE, once the slot has confirmed every row it holds. The proof is
// the DELETE's (package comment), taken on the partition, and no table
// lock is held while the slot is awaited (postgres.mark_published's
// UPDATEs through the outbox lock every partition):
//
//  1. The partition's fingerprint (its rows' count and the sum of a hash
//     of their ids), then L = pg_current_wal_insert_lsn(): every row the
//     fingerprint counts was committed before L. Then, as for the DELETE,
//     in a transaction of its own: the cut-over lock shared and no marker,
//     no replay hold, the slot's confirmed_flush_lsn at L or past it (at
//     most ConfirmTimeout), and the slot vouching for the partition's
//     whole range (proven): Kafka has every row the fingerprint counts.
//     That transaction ends there (ROLLBACK), and the cut-over lock with
//     it: steps 2 and 3 hold no advisory lock, only the table locks they
//     name. None is needed: rows in Kafka stay there whatever starts
//     later, and a row that went in after the fingerprint was read is
//     caught by reading it again in 2 or 3.
//  2. With a default partition (which DETACH ... CONCURRENTLY refuses):
//     DETACH PARTITION, the fingerprint again, and DROP TABLE, in one
//     transaction, which takes the outbox's ACCESS EXCLUSIVE lock for a
//     moment (LockTimeout bounds the wait, and so the inserts queued
//     behind it). A fingerprint that changed (a row with an old creat_en
//     went in since 1) rolls back: the next pass proves it.
//  3. Without one: the partition gets a comment holding the fingerprint,
//     and DETACH PARTITION ... CONCURRENTLY detaches it without blocking
//     the outbox's inserts. Then, under an ACCESS EXCLUSIVE lock, the
//     detached table's fingerprint must still be the comment's: a row that
//     went in between (which pgoutput may never send, if its transaction
//     wrote while the partition was "detach pending", and which a later
//     cut-over would not see) keeps the table, and the job says how to
//     publish it again (republishAdvice; the comment carries the bound the
//     partition had, for that). Then DROP TABLE.
//
// A detached table the job has not dropped yet keeps its comment, and each
// pass finishes it first; an interrupted DETACH ... CONCURRENTLY leaves the
// partition "detach pending" (which blocks every other concurrent detach
// of the outbox), and the pass completes it (DETACH PARTITION ...
// FINALIZE) when the comment is outboxd's, or says how when it is not. A
// running `outboxd replay` reads the outbox in one transaction: both
// detaches wait for it (at most LockTimeout, then the next pass).

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

// detachedPrefix starts the comment of a partition the job detaches from
// parent; the fingerprint the proof covered follows it.
func detachedPrefix(parent catalog.Table) string {
	return "outboxd retention: detached from " + parent.String() + " once the replication slot had confirmed its rows; "
}

// fingerprint is a partition's rows as the proof covered them: their count
// and the sum of a 64-bit hash of their ids.
type fingerprint struct {
	rows int64
	sum  string
}

func (f fingerprint) String() string { return fmt.Sprintf("rows %d, id hash sum %s", f.rows, f.sum) }

// boundMarker follows the fingerprint in the comment, then the bound the
// table had as a partition (pg_get_expr(relpartbound)): what a kept table
// needs to go back.
const boundMarker = " as partition "

// detachedComment is the comment of a partition the job detaches: the
// fingerprint the proof covered and the partition's bound.
func detachedComment(parent catalog.Table, f fingerprint, bound string) string {
	return detachedPrefix(parent) + f.String() + boundMarker + bound
}

// parseFingerprint reads the fingerprint after prefix in a detached table's
// comment, and the bound after it ("" when the comment has none: an older
// outboxd wrote it).
func parseFingerprint(comment, prefix string) (f fingerprint, bound string, ok bool) {
	rest, ok := strings.CutPrefix(comment, prefix)
	if !ok {
		return f, "", false
	}
	if _, err := fmt.Sscanf(rest, "rows %d, id hash sum %s", &f.rows, &f.sum); err != nil {
		return f, "", false
	}
	_, bound, _ = strings.Cut(rest, boundMarker)
	return f, bound, true
}

// dropPass drops t's due partitions, oldest first, after what an earlier
// pass left half done.
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
	id := catalog.QuoteIdent(t.Route.Columns.ID)
	prefix := detachedPrefix(parent)
	// An interrupted detach blocks every other: finished first, due or not.
	for _, p := range ps.Parts {
		if !p.DetachPending {
			continue
		}
		if _, ours, err := j.comment(ctx, conn, p.Table, prefix); err != nil {
			return dropped, err
		} else if !ours {
			return dropped, fmt.Errorf("partition %s of %s is detach pending (a DETACH PARTITION ... CONCURRENTLY that did not finish, not outboxd's), and no other partition can be detached concurrently until it is finished: ALTER TABLE %s DETACH PARTITION %s FINALIZE",
				p.Name(), parent, parent.Quoted(), p.Table.Quoted())
		}
		if err := j.detach(ctx, conn, parent, p.Table, "FINALIZE"); err != nil {
			return dropped, err
		}
		if err := j.dropDetached(ctx, conn, parent, p.Table, id); err != nil {
			return dropped, err
		}
		dropped++
	}
	left, err := j.detachedLeft(ctx, conn, prefix)
	if err != nil {
		return dropped, fmt.Errorf("look for partitions detached from %s: %w", parent, err)
	}
	// A detached table kept for its unproven rows does not hold the
	// others back.
	var kept []error
	for _, d := range left {
		if err := j.dropDetached(ctx, conn, parent, d, id); err != nil {
			kept = append(kept, err)
			continue
		}
		dropped++
	}
	for _, p := range ps.Due() {
		if p.DetachPending {
			continue // finished above
		}
		if err := j.dropPartition(ctx, conn, t, ps, p, id); err != nil {
			if errors.As(err, new(*notVouched)) {
				kept = append(kept, err) // a newer partition may be vouched for
				continue
			}
			return dropped, errors.Join(append(kept, err)...)
		}
		dropped++
	}
	return dropped, errors.Join(kept...)
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

// detachedLeft is the tables the job detached (their comment starts with
// prefix) and has not dropped yet.
func (j *Job) detachedLeft(ctx context.Context, conn *pgconn.PgConn, prefix string) ([]catalog.Table, error) {
	res := conn.ExecParams(ctx, `SELECT n.nspname, c.relname FROM pg_catalog.pg_description d
		JOIN pg_catalog.pg_class c ON c.oid = d.objoid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE d.classoid = 'pg_catalog.pg_class'::regclass AND d.objsubid = 0 AND starts_with(d.description, $1) AND NOT c.relispartition`,
		[][]byte{[]byte(prefix)}, nil, nil, nil).Read()
	if res.Err != nil {
		return nil, res.Err
	}
	var out []catalog.Table
	for _, r := range res.Rows {
		out = append(out, catalog.Table{Schema: string(r[0]), Name: string(r[1])})
	}
	return out, nil
}

// comment reads t's comment, and whether it is the job's.
func (j *Job) comment(ctx context.Context, conn *pgconn.PgConn, t catalog.Table, prefix string) (string, bool, error) {
	res := conn.ExecParams(ctx, "SELECT COALESCE(obj_description($1::regclass, 'pg_class'), '')", [][]byte{[]byte(t.Quoted())}, nil, nil, nil).Read()
	if res.Err != nil {
		return "", false, fmt.Errorf("read the comment of %s: %w", t, res.Err)
	}
	c := ""
	if len(res.Rows) == 1 {
		c = string(res.Rows[0][0])
	}
	return c, strings.HasPrefix(c, prefix), nil
}

// fingerprint reads part's fingerprint (id: its id column, quoted).
func (j *Job) fingerprint(ctx context.Context, conn *pgconn.PgConn, part catalog.Table, id string) (fingerprint, error) {
	res := conn.ExecParams(ctx, fmt.Sprintf("SELECT count(*), COALESCE(sum(hashtextextended(%s::text, 0)), 0)::text FROM %s", id, part.Quoted()), nil, nil, nil, nil).Read()
	if res.Err != nil {
		return fingerprint{}, fmt.Errorf("read the rows of %s: %w", part, res.Err)
	}
	var f fingerprint
	if len(res.Rows) == 1 {
		f.rows, _ = strconv.ParseInt(string(res.Rows[0][0]), 10, 64)
		f.sum = string(res.Rows[0][1])
	}
	return f, nil
}

// proven reads part's fingerprint and returns it once the slot has
// confirmed every row it counts (see above); it holds no table lock.
//
// The slot must also vouch for the rows (the DELETE's vouched): the
// partition's range begins at or after the creat_en the slot record
// vouches from, unless it vouches for every row of t.
func (j *Job) proven(ctx context.Context, conn *pgconn.PgConn, t envelope.Table, p catalog.Partition, id string) (fingerprint, error) {
	f, err := j.fingerprint(ctx, conn, p.Table, id)
	if err != nil {
		return f, err
	}
	unlock, err := j.lockCreation(ctx, conn)
	if err != nil {
		return f, err
	}
	defer unlock() // after the ROLLBACK below
	defer func() { _, _ = conn.Exec(context.Background(), "ROLLBACK").ReadAll() }()
	if err := j.exec(ctx, conn, "BEGIN"); err != nil {
		return f, err
	}
	l, err := catalog.InsertLSN(ctx, conn)
	if err != nil {
		return f, err
	}
	if err := j.waitConfirmed(ctx, conn, l); err != nil {
		return f, err
	}
	since, err := j.vouched(ctx, conn, t)
	switch {
	case err != nil:
		return f, err
	case !since.IsZero() && (p.From.IsZero() || p.From.Before(since)):
		return f, &notVouched{fmt.Sprintf("%s may hold rows committed before replication slot %q existed (its range begins before %s, from when the slot record vouches for rows of a table without publicat_en or a slot created without a cut-over snapshot): its confirmed position says nothing about them; drop it by hand once Kafka has its rows", p.Name(), j.cfg.Slot, since.UTC().Format(time.RFC3339))}
	}
	return f, nil
}

// dropPartition drops p, a due partition of ps (see above).
func (j *Job) dropPartition(ctx context.Context, conn *pgconn.PgConn, t envelope.Table, ps *catalog.PartitionedTable, p catalog.Partition, id string) error {
	parent, name := ps.Table, p.Table.Quoted()
	f, err := j.proven(ctx, conn, t, p, id)
	if err != nil {
		return err
	}
	if !ps.HasDefault {
		if err := j.inTransaction(ctx, conn, func() error {
			return j.exec(ctx, conn, "COMMENT ON TABLE "+name+" IS "+catalog.QuoteLiteral(detachedComment(parent, f, p.Bound)))
		}); err != nil {
			return j.privilege(err, "comment on "+p.Name())
		}
		if err := j.detach(ctx, conn, parent, p.Table, "CONCURRENTLY"); err != nil {
			return err
		}
		return j.dropDetached(ctx, conn, parent, p.Table, id)
	}
	err = j.inTransaction(ctx, conn, func() error {
		if err := j.exec(ctx, conn, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s", parent.Quoted(), name)); err != nil {
			return j.privilege(err, "detach "+p.Name()+" from "+parent.String())
		}
		now, err := j.fingerprint(ctx, conn, p.Table, id)
		if err != nil {
			return err
		}
		if now != f {
			return &notYet{reason: fmt.Sprintf("rows went into %s after the slot was seen to confirm its rows; the next pass proves them", p.Name()),
				detail: fmt.Sprintf("%s, then %s", f, now)}
		}
		return j.exec(ctx, conn, "DROP TABLE "+name)
	})
	if err != nil {
		return err
	}
	j.dropped(parent, p.Table, f.rows)
	return nil
}

// inTransaction runs do in a transaction with the lock timeout, and
// commits it when do succeeds.
func (j *Job) inTransaction(ctx context.Context, conn *pgconn.PgConn, do func() error) error {
	committed := false
	defer func() {
		if !committed {
			_, _ = conn.Exec(context.Background(), "ROLLBACK").ReadAll()
		}
	}()
	if err := j.exec(ctx, conn, "BEGIN; SET LOCAL lock_timeout = "+j.lockTimeout()); err != nil {
		return err
	}
	if err := do(); err != nil {
		return err
	}
	if err := j.exec(ctx, conn, "COMMIT"); err != nil {
		return err
	}
	committed = true
	return nil
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

// dropDetached drops d, a table the job detached from parent, when it
// holds the rows its comment's fingerprint says the slot had confirmed.
func (j *Job) dropDetached(ctx context.Context, conn *pgconn.PgConn, parent, d catalog.Table, id string) error {
	prefix := detachedPrefix(parent)
	var proven fingerprint
	err := j.inTransaction(ctx, conn, func() error {
		if err := j.exec(ctx, conn, "LOCK TABLE "+d.Quoted()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			return j.privilege(err, "lock "+d.String())
		}
		c, _, err := j.comment(ctx, conn, d, prefix)
		if err != nil {
			return err
		}
		var bound string
		var ok bool
		if proven, bound, ok = parseFingerprint(c, prefix); !ok {
			return fmt.Errorf("%s was detached by outboxd, but its comment holds no fingerprint of the rows the slot confirmed: kept; drop it by hand once its rows are in Kafka", d)
		}
		now, err := j.fingerprint(ctx, conn, d, id)
		if err != nil {
			return err
		}
		if now != proven {
			return fmt.Errorf("%s holds rows outboxd did not see confirmed by the slot (%s; when proven: %s): a writer added rows with an old creat_en while it was being detached, and they may never reach Kafka. It is kept: publish its rows again through a partition that covers them, then drop it: %s",
				d, now, proven, republishAdvice(parent, d, bound))
		}
		return j.exec(ctx, conn, "DROP TABLE "+d.Quoted())
	})
	if err != nil {
		return err
	}
	j.dropped(parent, d, proven.rows)
	return nil
}

// republishAdvice is the SQL that publishes again the rows of d, a table
// detached from parent that once had bound, and drops it. The rows go back
// into the outbox through a new partition with d's bound: an INSERT that
// the stream publishes, and that retention drops again once the slot has
// confirmed it. (INSERT INTO parent SELECT * FROM d alone finds no
// partition for them; re-attaching d would publish nothing, and the next
// pass would prove and drop its rows unpublished.) Without a known bound,
// the operator writes one that covers the rows' creat_en.
func republishAdvice(parent, d catalog.Table, bound string) string {
	again := catalog.Table{Schema: d.Schema, Name: d.Name + "_again"}
	if bound == "" {
		bound = "FOR VALUES FROM (<the oldest creat_en in it>) TO (<past the newest>)"
	}
	return fmt.Sprintf("BEGIN; CREATE TABLE %s PARTITION OF %s %s; INSERT INTO %s SELECT * FROM %s; DROP TABLE %s; COMMIT; (skip the CREATE TABLE when a partition of %s covers those rows already)",
		again.Quoted(), parent.Quoted(), bound, parent.Quoted(), d.Quoted(), d.Quoted(), parent)
}

func (j *Job) dropped(parent, part catalog.Table, rows int64) {
	j.log.Info("retention: dropped a partition whose rows Kafka has", "table", parent.String(), "partition", part.String(), "rows", rows, "older_than", j.cfg.MaxAge)
	if j.cfg.Observer != nil {
		j.cfg.Observer.Dropped(parent.String(), rows)
	}
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
