package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/testenv"
)

// Schema is the seed's plus the service's own state: each order row
// carries the sequence number of its last event.
func Schema() (string, error) {
	seed, err := testenv.SeedSchema()
	if err != nil {
		return "", err
	}
	return seed + "\nALTER TABLE comandes ADD COLUMN seq BIGINT NOT NULL;\n", nil
}

// insertEvent locks the aggregate's order row (insert or update), bumps its
// sequence number and writes the event with that number, in one statement.
// The row lock is held until commit, so for one aggregate the order of seq
// is the commit order, whatever the concurrency.
const insertEvent = `
WITH c AS (
    INSERT INTO comandes AS c (id, client, mercat, estat, seq) VALUES ($1, 'anna', 'girona', 'creada', 1)
    ON CONFLICT (id) DO UPDATE SET seq = c.seq + 1, estat = 'actualitzada'
    RETURNING c.seq)
INSERT INTO outbox (id, agregat, agregat_id, tipus, versio, carrega)
SELECT $2::uuid, 'comanda', $1, $3, 1,
       jsonb_build_object('id', $1::text, 'seq', c.seq, 'writer', $4::int,
                          'linies', jsonb_build_array(jsonb_build_object('producte', 'formatge-curat', 'quantitat', $5::int, 'preu_centims', 1450)))
FROM c`

// Load writes outbox rows the way services do.
type Load struct {
	DSN        string
	Writers    int
	Aggregates int
	Total      int     // rows to commit
	Rate       float64 // rows per second over all writers; 0 = as fast as possible
	TxnRows    int     // rows per transaction; 0: 1 to 500, mostly small (txnSize)
	Prefix     string  // aggregate id prefix
	Logf       func(string, ...any)

	reserved  atomic.Int64
	ambiguous atomic.Int64 // rows whose COMMIT outcome is unknown (connection lost)
	retries   atomic.Int64

	mu   sync.Mutex
	txns []testenv.Txn

	pace   sync.Mutex
	next   time.Time
	seqGen atomic.Uint64
}

// Ambiguous is how many rows were in a transaction whose COMMIT lost its
// connection (they may or may not be in the table; the table decides).
func (l *Load) Ambiguous() int64 { return l.ambiguous.Load() }

// Txns returns the committed transactions so far.
func (l *Load) Txns() []testenv.Txn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]testenv.Txn(nil), l.txns...)
}

// txnSize: mostly small transactions, some large (1 to 500 rows).
func txnSize(r *rand.Rand) int {
	switch p := r.Float64(); {
	case p < 0.6:
		return 1 + r.IntN(10)
	case p < 0.9:
		return 11 + r.IntN(90)
	default:
		return 101 + r.IntN(400)
	}
}

// Run writes until Total rows were committed (or were ambiguous) or ctx ends.
func (l *Load) Run(ctx context.Context) error {
	if l.Logf == nil {
		l.Logf = func(string, ...any) {}
	}
	l.next = time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, l.Writers)
	for w := 0; w < l.Writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			if err := l.writer(ctx, w); err != nil {
				errs <- err
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// reserve takes up to n rows of the budget; 0 when it is spent.
func (l *Load) reserve(n int) int {
	for {
		cur := l.reserved.Load()
		left := int64(l.Total) - cur
		if left <= 0 {
			return 0
		}
		if int64(n) > left {
			n = int(left)
		}
		if l.reserved.CompareAndSwap(cur, cur+int64(n)) {
			return n
		}
	}
}

func (l *Load) wait(ctx context.Context, n int) {
	if l.Rate <= 0 {
		return
	}
	l.pace.Lock()
	at := l.next
	if now := time.Now(); at.Before(now.Add(-time.Second)) {
		at = now // do not burst to catch up after an outage
	}
	l.next = at.Add(time.Duration(float64(n) / l.Rate * float64(time.Second)))
	l.pace.Unlock()
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(at)):
	}
}

func (l *Load) connect(ctx context.Context) (*pgx.Conn, error) {
	delay := 100 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := pgx.Connect(cctx, l.DSN)
		cancel()
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		time.Sleep(delay)
		if delay < time.Second {
			delay *= 2
		}
	}
}

func (l *Load) writer(ctx context.Context, w int) error {
	rng := rand.New(rand.NewPCG(uint64(w)+1, uint64(time.Now().UnixNano())))
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		size := l.TxnRows
		if size <= 0 {
			size = txnSize(rng)
		}
		n := l.reserve(size)
		if n == 0 {
			return nil
		}
		l.wait(ctx, n)
		for {
			if conn == nil || conn.IsClosed() {
				var err error
				if conn, err = l.connect(ctx); err != nil {
					return nil
				}
			}
			err := l.txn(ctx, conn, rng, w, n)
			if err == nil {
				break
			}
			var amb ambiguousError
			if errors.As(err, &amb) {
				l.ambiguous.Add(int64(n))
				conn.Close(context.Background())
				conn = nil
				break
			}
			if ctx.Err() != nil {
				return nil
			}
			// Definitely not committed (a statement failed, a deadlock, the
			// connection was lost before COMMIT): retry with new rows.
			l.retries.Add(1)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				conn.Close(context.Background())
				conn = nil
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	return nil
}

type ambiguousError struct{ error }

func (l *Load) txn(ctx context.Context, conn *pgx.Conn, rng *rand.Rand, w, n int) error {
	type row struct{ key, id string }
	rows := make([]row, n)
	for i := range rows {
		rows[i].key = fmt.Sprintf("%s%05d", l.Prefix, rng.IntN(l.Aggregates))
		s := l.seqGen.Add(1)
		rows[i].id = fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", rng.Uint32(), w, rng.IntN(4096), rng.IntN(4096), s)
	}
	// One lock order for all writers: no deadlocks.
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].key < rows[j].key })
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	tx, err := conn.Begin(tctx)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	for i, r := range rows {
		b.Queue(insertEvent, r.key, r.id, fmt.Sprintf("comanda.t%d", i%5), w, rng.IntN(9)+1)
	}
	if err := tx.SendBatch(tctx, b).Close(); err != nil {
		_ = tx.Rollback(context.Background())
		return err
	}
	if err := tx.Commit(tctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return err // the server refused: not committed
		}
		return ambiguousError{err}
	}
	at := time.Now()
	var u pglogrepl.LSN
	var s string
	if err := conn.QueryRow(tctx, "SELECT pg_current_wal_lsn()::text").Scan(&s); err == nil {
		u, _ = pglogrepl.ParseLSN(s)
	}
	ids := make([]string, n)
	for i, r := range rows {
		ids[i] = r.id
	}
	l.mu.Lock()
	l.txns = append(l.txns, testenv.Txn{U: u, At: at, IDs: ids})
	l.mu.Unlock()
	return nil
}

// Committed reads the outbox table: each row's key, tipus and seq, its
// position in its aggregate's commit order.
func Committed(ctx context.Context, dsn string) (map[string]testenv.Event, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, "SELECT id::text, agregat_id, tipus, (carrega->>'seq')::bigint FROM outbox")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	events := map[string]testenv.Event{}
	for rows.Next() {
		var id string
		var e testenv.Event
		if err := rows.Scan(&id, &e.Key, &e.Tipus, &e.Pos); err != nil {
			return nil, err
		}
		events[id] = e
	}
	return events, rows.Err()
}

// records checks each record as the load wrote it, and keeps the seq it
// carries, to be held against its row's.
type records struct {
	mu  sync.Mutex
	seq map[string]int64
}

// check: the envelope's id and tipus are the headers', dades.id the key.
func (r *records) check(m kafka.Message) error {
	var env struct {
		ID    string `json:"id_esdeveniment"`
		Tipus string `json:"tipus"`
		Dades struct {
			ID  string `json:"id"`
			Seq int64  `json:"seq"`
		} `json:"dades"`
	}
	if err := json.Unmarshal(m.Value, &env); err != nil {
		return fmt.Errorf("value %s: %w", m.Value, err)
	}
	var id, tipus string
	for _, h := range m.Headers {
		switch h.Key {
		case "id_esdeveniment":
			id = string(h.Value)
		case "tipus":
			tipus = string(h.Value)
		}
	}
	if env.ID != id || env.Dades.ID != string(m.Key) || env.Tipus != tipus {
		return fmt.Errorf("headers id %q tipus %q, key %q, value %s", id, tipus, m.Key, m.Value)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seq == nil {
		r.seq = map[string]int64{}
	}
	if _, ok := r.seq[id]; !ok {
		r.seq[id] = env.Dades.Seq
	}
	return nil
}

// mismatches counts the records whose seq differs from their row's.
func (r *records) mismatches(events map[string]testenv.Event, rep *testenv.Report) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, e := range events {
		if s, ok := r.seq[id]; ok && s != e.Pos {
			rep.Mismatch++
			if len(rep.Examples) < 8 {
				rep.Examples = append(rep.Examples, fmt.Sprintf("mismatch: id %s read with seq %d, the row has %d", id, s, e.Pos))
			}
		}
	}
}
