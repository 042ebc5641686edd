package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"reflect"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/testenv"
)

// event is one committed outbox row, as the database holds it.
type event struct {
	id, key, tipus string
	versio         int64
	carrega        string
	dataMs         int64
}

// writer inserts outbox rows the way a service does: state and event in one
// transaction. It remembers the commit order of every aggregate.
type writer struct {
	f     *fixture
	rng   *rand.Rand
	order map[string][]string // aggregate -> event ids in commit order
	// committed: every event id committed, in commit order.
	committed []string
	events    map[string]event
	n         int
	aggs      int
	table     string // "outbox" (seed columns) or "pagaments.outboxevent" (Debezium columns)
	special   []string
	// keyPrefix, when set, replaces the aggregates' "P-2026-": the
	// aggregates of a transaction kept open beside others, whose rows in
	// comandes the others must not wait for.
	keyPrefix string
	// skip: rows outboxd must never publish (the relay published them);
	// verify counts a record of one of them as unknown.
	skip map[string]bool
}

func newWriter(f *fixture, seed uint64, aggregates int, table string) *writer {
	return &writer{f: f, rng: rand.New(rand.NewPCG(seed, 1)), order: map[string][]string{}, events: map[string]event{}, aggs: aggregates, table: table,
		// Timestamps with odd offsets, microseconds and before the epoch.
		special: []string{"1969-12-31 23:59:59.9995+00", "2026-03-29 02:30:00.123456+05:30", "2026-10-25 02:59:59.999999-03", "2001-02-03 04:05:06+00:09:21"}}
}

// txn commits one transaction with size outbox rows.
func (w *writer) txn(ctx context.Context, size int) error {
	tx, err := w.f.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	rows, err := w.insert(ctx, tx, size)
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	w.record(rows)
	return nil
}

// pendingRow is a row inserted in a transaction not committed yet.
type pendingRow struct{ id, key string }

// insert inserts size outbox rows in tx, and returns them for record once tx
// commits.
func (w *writer) insert(ctx context.Context, tx pgx.Tx, size int) ([]pendingRow, error) {
	var rows []pendingRow
	b := &pgx.Batch{}
	for i := 0; i < size; i++ {
		w.n++
		key := fmt.Sprintf("%s%06d", w.prefix(), w.rng.IntN(w.aggs))
		id := fmt.Sprintf("%08x-0000-4000-8000-%012x", w.rng.Uint32(), w.n)
		carrega := fmt.Sprintf(`{"id": %q, "n": %d, "linies": [{"producte": "formatge-curat", "quantitat": %d, "preu_centims": 1450}], "nota": "àèò \"cometes\" \\ \n"}`, key, w.n, w.rng.IntN(9))
		creat := "now()"
		if w.n%97 == 0 && len(w.special) > 0 {
			creat = "'" + w.special[(w.n/97)%len(w.special)] + "'::timestamptz"
		}
		versio := 1 + w.n%3
		switch w.table {
		case "outbox":
			b.Queue("INSERT INTO comandes (id, client, mercat, estat) VALUES ($1, 'anna', 'girona', 'creada') ON CONFLICT (id) DO UPDATE SET estat = 'actualitzada'", key)
			b.Queue(fmt.Sprintf("INSERT INTO outbox (id, agregat, agregat_id, tipus, versio, carrega, creat_en) VALUES ($1, 'comanda', $2, $3, $4, $5, %s)", creat),
				id, key, fmt.Sprintf("comanda.t%d", w.n%5), versio, carrega)
		default:
			b.Queue(fmt.Sprintf("INSERT INTO %s (id, aggregatetype, aggregateid, type, payload, timestamp) VALUES ($1, 'pagament', $2, $3, $4, %s)", w.table, creat),
				id, key, "pagament.autoritzat", carrega)
		}
		rows = append(rows, pendingRow{id, key})
	}
	return rows, tx.SendBatch(ctx, b).Close()
}

func (w *writer) prefix() string {
	if w.keyPrefix != "" {
		return w.keyPrefix
	}
	return "P-2026-"
}

// record records rows, inserted by a transaction that committed, in
// commit order.
func (w *writer) record(rows []pendingRow) {
	for _, r := range rows {
		w.order[r.key] = append(w.order[r.key], r.id)
		w.committed = append(w.committed, r.id)
	}
}

// txns commits n transactions of 1+i%mod rows; a failure ends the test.
func (w *writer) txns(ctx context.Context, n, mod int) {
	w.f.t.Helper()
	for i := 0; i < n; i++ {
		if err := w.txn(ctx, 1+i%mod); err != nil {
			w.f.t.Fatal(err)
		}
	}
}

// backlog commits n transactions of size rows each.
func (w *writer) backlog(ctx context.Context, n, size int) {
	w.f.t.Helper()
	for i := 0; i < n; i++ {
		if err := w.txn(ctx, size); err != nil {
			w.f.t.Fatal(err)
		}
	}
}

// inBackground commits n transactions of 1+i%mod rows, pausing between
// them; the channel yields the first error, or nil when all committed.
func (w *writer) inBackground(ctx context.Context, n, mod int, pause time.Duration) <-chan error {
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			if err := w.txn(ctx, 1+i%mod); err != nil {
				errc <- err
				return
			}
			time.Sleep(pause)
		}
		errc <- nil
	}()
	return errc
}

// untilStopped commits transactions of 1+i%mod rows, pausing between
// them, until stop is closed, then after more (so the writes go on across
// whatever the test does meanwhile, however long it takes on a loaded
// machine); the channel yields the first error, or nil at the end.
func (w *writer) untilStopped(ctx context.Context, stop <-chan struct{}, after, mod int, pause time.Duration) <-chan error {
	errc := make(chan error, 1)
	go func() {
		left := -1 // until stop is closed
		for i := 0; left != 0; i++ {
			if err := w.txn(ctx, 1+i%mod); err != nil {
				errc <- err
				return
			}
			if left > 0 {
				left--
			} else {
				select {
				case <-stop:
					left = after
				default:
				}
			}
			time.Sleep(pause)
		}
		errc <- nil
	}()
	return errc
}

// load reads back every row the writer committed, with data_ms computed by
// the database (truncated toward zero, as the relay's int() does).
func (w *writer) load(ctx context.Context) {
	q := `SELECT id::text, agregat_id, tipus, versio, carrega::text, trunc(extract(epoch FROM creat_en) * 1000)::bigint FROM outbox`
	if w.table != "outbox" {
		q = `SELECT id::text, aggregateid, type, 1, payload::text, trunc(extract(epoch FROM timestamp) * 1000)::bigint FROM ` + w.table
	}
	rows, err := w.f.db.Query(ctx, q)
	if err != nil {
		w.f.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var e event
		if err := rows.Scan(&e.id, &e.key, &e.tipus, &e.versio, &e.carrega, &e.dataMs); err != nil {
			w.f.t.Fatal(err)
		}
		w.events[e.id] = e
	}
	if err := rows.Err(); err != nil {
		w.f.t.Fatal(err)
	}
}

// murmur2 is the Java client's hash (org.apache.kafka.common.utils.Utils),
// written from its definition to check the partitioner independently.
func murmur2(data []byte) uint32 {
	const m, r = uint32(0x5bd1e995), 24
	n := len(data)
	h := uint32(0x9747b28c) ^ uint32(n)
	for i := 0; i+4 <= n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := data[n&^3:]
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

func wantPartition(partitioner string, key []byte, n int) int {
	if partitioner == "crc32" {
		return int(crc32.ChecksumIEEE(key) % uint32(n))
	}
	return int((murmur2(key) & 0x7fffffff) % uint32(n))
}

// verify reads the whole topic and checks it against the rows (see
// testenv.Verifier): nothing missing, nothing unknown, each record exactly
// as the contract says and in the partition the partitioner says,
// duplicates identical, per-aggregate first deliveries in commit order.
func (w *writer) verify(ctx context.Context, topic, partitioner string) testenv.Report {
	t := w.f.t
	t.Helper()
	w.load(ctx)
	for id := range w.skip {
		delete(w.events, id)
	}
	committed := map[string]testenv.Event{}
	ids := make([]string, 0, len(w.events))
	for id, e := range w.events {
		committed[id] = testenv.Event{Key: e.key, Tipus: e.tipus}
		ids = append(ids, id)
	}
	for key, all := range w.order {
		var order []string
		for _, id := range all {
			if !w.skip[id] {
				order = append(order, id)
			}
		}
		for i, id := range order {
			e := committed[id]
			if e.Key != key {
				t.Fatalf("the writer committed %s for aggregate %s, the table has it for %q", id, key, e.Key)
			}
			e.Pos = int64(i + 1)
			committed[id] = e
		}
	}
	nParts := w.f.topics[topic]
	v := &testenv.Verifier{Brokers: w.f.env.KafkaBrokers, Topic: topic, Partitions: nParts, Check: func(m kafka.Message) error {
		e, ok := w.events[header(m, "id_esdeveniment")]
		if !ok {
			return nil // Final counts it as unknown
		}
		if want := wantPartition(partitioner, m.Key, nParts); m.Partition != want {
			return fmt.Errorf("key %q in partition %d, %s says %d of %d", m.Key, m.Partition, partitioner, want, nParts)
		}
		return checkRecord(m, e)
	}}
	v.Start(ctx)
	_, err := v.WaitSeen(ctx, ids, 90*time.Second)
	if err == nil {
		// Anything beyond the rows (duplicates) is read too.
		err = v.CaughtUp(ctx, 30*time.Second)
	}
	v.Stop()
	rep := v.Final(committed, nil)
	if err != nil || !rep.OK() {
		t.Fatalf("%s: %v\n%v\n%s", topic, err, rep, strings.Join(rep.Examples, "\n"))
	}
	return rep
}

func header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// routeHeaders counts m's headers but outboxd.stream, which every streamed
// record carries under kafka.deduplicate (the default): the route's own.
func routeHeaders(m kafka.Message) int {
	n := 0
	for _, h := range m.Headers {
		if h.Key != sink.HeaderStream {
			n++
		}
	}
	return n
}

// checkRecord checks key, headers and envelope of one record, field by field
// and type by type, as a relay consumer reads them.
func checkRecord(m kafka.Message, e event) error {
	if string(m.Key) != e.key {
		return fmt.Errorf("%s: key %q, want %q", e.id, m.Key, e.key)
	}
	if routeHeaders(m) != 2 || header(m, "tipus") != e.tipus || header(m, "id_esdeveniment") != e.id {
		return fmt.Errorf("%s: headers %v", e.id, m.Headers)
	}
	var env map[string]json.RawMessage
	if err := json.Unmarshal(m.Value, &env); err != nil {
		return fmt.Errorf("%s: value is not JSON: %v\n%s", e.id, err, m.Value)
	}
	if len(env) != 6 {
		return fmt.Errorf("%s: envelope has %d fields: %s", e.id, len(env), m.Value)
	}
	var (
		id, tipus, origen string
		versio, dataMs    json.Number
		dades, carrega    any
	)
	for field, dst := range map[string]any{"id_esdeveniment": &id, "tipus": &tipus, "origen": &origen, "versio": &versio, "data_ms": &dataMs, "dades": &dades} {
		if err := json.Unmarshal(env[field], dst); err != nil {
			return fmt.Errorf("%s: field %s: %v in %s", e.id, field, err, m.Value)
		}
	}
	if id != e.id || tipus != e.tipus || origen != "comandes" {
		return fmt.Errorf("%s: envelope %s", e.id, m.Value)
	}
	if versio.String() != fmt.Sprint(e.versio) || dataMs.String() != fmt.Sprint(e.dataMs) {
		return fmt.Errorf("%s: versio %s data_ms %s, want %d and %d", e.id, versio, dataMs, e.versio, e.dataMs)
	}
	_ = json.Unmarshal([]byte(e.carrega), &carrega)
	if !reflect.DeepEqual(dades, carrega) {
		return fmt.Errorf("%s: dades %v, carrega %v", e.id, dades, carrega)
	}
	return nil
}
