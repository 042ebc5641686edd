package republish

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/envelope"
)

// markBatch bounds the ids of one UPDATE.
const markBatch = 1000

// How long a mark may take. Every acknowledgement waits for its mark, so an
// UPDATE that never returns would wedge them all, for good: one blocked
// behind a lock another session holds (an open transaction, the polling
// relay's FOR UPDATE), or sent on a connection that died without a reset.
// The server gives up on a lock after markLockTimeout and on the statement
// after markStatementTimeout (lock_timeout and statement_timeout of the
// mark connection); outboxd gives up on the connection after markDeadline.
// The marks then fail (an outage: the stream replays and marks again on a
// new connection), well before kafka.delivery_timeout (30 s by default)
// would end the session with a reason that names the broker.
const (
	markLockTimeout      = 5 * time.Second
	markStatementTimeout = 10 * time.Second
	markDeadline         = markStatementTimeout + 5*time.Second
)

// Marker sets publicat_en = now() on a row once Kafka acknowledged its
// record (postgres.mark_published), for the teams whose dashboards read
// it. The mark is part of the row's acknowledgement: the record's Acker
// (the stream's tracker, or the snapshot's count) hears of it only after
// the UPDATE committed, so the slot never passes a row whose mark a crash
// could lose. A failed UPDATE fails the record: the stream replays it.
type Marker struct {
	conn   *pgconn.Config
	tables map[string]markTable // by schema.table

	mu    sync.Mutex
	queue []mark
	wake  chan struct{}
}

type markTable struct{ update string } // UPDATE ... WHERE id = ANY($1)

type mark struct {
	table string
	id    []byte
	next  outboxd.Acker
}

// NewMarker marks rows of the tables that have a publicat_en column,
// through its own connection to conn.
func NewMarker(conn *pgconn.Config, tables []envelope.Table) *Marker {
	m := &Marker{conn: conn, tables: map[string]markTable{}, wake: make(chan struct{}, 1)}
	for _, t := range tables {
		if t.Route.Columns.PublicatEn == "" {
			continue
		}
		col := catalog.QuoteIdent(t.Route.Columns.PublicatEn)
		m.tables[t.String()] = markTable{update: fmt.Sprintf("UPDATE %s SET %s = now() WHERE %s = ANY($1) AND %s IS NULL",
			t.Quoted(), col, catalog.QuoteIdent(t.Route.Columns.ID), col)}
	}
	return m
}

// Wrap returns the Acker of a record of table whose row has this id: on
// success it marks the row, then tells next; a failure goes to next at
// once. id is copied. A table without publicat_en is not marked.
func (m *Marker) Wrap(table string, id []byte, next outboxd.Acker) outboxd.Acker {
	if _, ok := m.tables[table]; !ok || id == nil {
		return next
	}
	return &markAcker{m: m, mark: mark{table: table, id: append([]byte(nil), id...), next: next}}
}

type markAcker struct {
	m    *Marker
	mark mark
}

func (a *markAcker) Ack(err error) {
	if err != nil {
		a.mark.next.Ack(err)
		return
	}
	m := a.m
	m.mu.Lock()
	m.queue = append(m.queue, a.mark)
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Run marks what Kafka acknowledged until ctx ends. Marks queue up while an
// UPDATE runs and go together in the next one.
func (m *Marker) Run(ctx context.Context) {
	var conn *pgconn.PgConn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		}
		for {
			m.mu.Lock()
			batch := m.queue
			m.queue = nil
			m.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			var err error
			actx, cancel := context.WithTimeout(ctx, markDeadline)
			if conn == nil {
				conn, err = connect(actx, m.conn, "outboxd-mark", markSettings)
			}
			if err == nil {
				err = m.apply(actx, conn, batch)
			}
			timedOut := actx.Err() != nil && ctx.Err() == nil
			cancel()
			if err != nil {
				if conn != nil {
					_ = conn.Close(context.Background())
					conn = nil
				}
				// Returned, not logged: each record's acknowledgement
				// carries it to the stream or the snapshot, which end on it.
				err = markError(err, timedOut)
			}
			for _, mk := range batch {
				mk.next.Ack(err)
			}
		}
	}
}

// apply runs one UPDATE per table and markBatch ids.
func (m *Marker) apply(ctx context.Context, conn *pgconn.PgConn, batch []mark) error {
	byTable := map[string][][]byte{}
	for _, mk := range batch {
		byTable[mk.table] = append(byTable[mk.table], mk.id)
	}
	for table, ids := range byTable {
		for len(ids) > 0 {
			n := min(len(ids), markBatch)
			res := conn.ExecParams(ctx, m.tables[table].update, [][]byte{textArray(ids[:n])}, nil, nil, nil).Read()
			if res.Err != nil {
				return res.Err
			}
			ids = ids[n:]
		}
	}
	return nil
}

// markSettings are the mark connection's timeouts.
var markSettings = map[string]string{
	"lock_timeout":      strconv.FormatInt(markLockTimeout.Milliseconds(), 10),
	"statement_timeout": strconv.FormatInt(markStatementTimeout.Milliseconds(), 10),
}

// markError is a failed mark (timedOut: outboxd gave up waiting) as the
// acknowledgements of its records take it: a missing privilege is
// permanent; anything else is an outage (the records are replayed and
// marked again), said with its cause.
func markError(err error, timedOut bool) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available
		return fmt.Errorf("mark publicat_en: the UPDATE waited longer than lock_timeout (%s) for rows another session holds (an open transaction, the polling relay's FOR UPDATE: see pg_locks and pg_stat_activity); marked again once it lets go: %w", markLockTimeout, err)
	case errors.As(err, &pgErr) && pgErr.Code == "57014": // query_canceled
		return fmt.Errorf("mark publicat_en: the UPDATE ran longer than statement_timeout (%s); marked again: %w", markStatementTimeout, err)
	case timedOut:
		return fmt.Errorf("mark publicat_en: no answer from PostgreSQL within %s: the connection is presumed dead; marked again on a new one: %w", markDeadline, err)
	}
	return privilege(fmt.Errorf("mark publicat_en: %w", err), "mark_published needs UPDATE on the outbox table (GRANT UPDATE (publicat_en) ON ... TO outboxd)")
}
