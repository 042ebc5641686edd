package republish

import (
	"context"
	"fmt"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/catalog"
)

// markBatch bounds the ids of one UPDATE.
const markBatch = 1000

// Marker sets publicat_en = now() on a row once Kafka acknowledged its
// record (postgres.mark_published), for the teams whose dashboards read
// it. The mark is part of the row's acknowledgement: the record's Acker
// (the stream's tracker, or the snapshot's count) hears of it only after
// the UPDATE committed, so the slot never passes a row whose mark a crash
// could lose. A failed UPDATE fails the record: the stream replays it.
type Marker struct {
	conn   *pgconn.Config
	tables map[string]markTable // by schema.table
	log    hclog.Logger

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
func NewMarker(conn *pgconn.Config, tables []Table, log hclog.Logger) *Marker {
	m := &Marker{conn: conn, tables: map[string]markTable{}, log: log, wake: make(chan struct{}, 1)}
	for _, t := range tables {
		if t.PublicatEn == "" {
			continue
		}
		col := catalog.QuoteIdent(t.PublicatEn)
		m.tables[t.Name()] = markTable{update: fmt.Sprintf("UPDATE %s SET %s = now() WHERE %s = ANY($1) AND %s IS NULL",
			t.quoted(), col, catalog.QuoteIdent(t.Route.Columns.ID), col)}
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
			if conn == nil {
				conn, err = connect(ctx, m.conn, "outboxd-mark")
			}
			if err == nil {
				err = m.apply(ctx, conn, batch)
			}
			if err != nil {
				if conn != nil {
					_ = conn.Close(context.Background())
					conn = nil
				}
				err = privilege(fmt.Errorf("mark publicat_en: %w", err), "mark_published needs UPDATE on the outbox table (GRANT UPDATE (publicat_en) ON ... TO outboxd)")
				m.log.Debug("mark published failed", "rows", len(batch), "error", err)
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
