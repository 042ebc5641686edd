package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/integration/testenv"
)

const seedSchema = `
CREATE TABLE outbox (
    id           UUID        PRIMARY KEY,
    agregat      TEXT        NOT NULL,
    agregat_id   TEXT        NOT NULL,
    tipus        TEXT        NOT NULL,
    versio       INTEGER     NOT NULL DEFAULT 1,
    carrega      JSONB       NOT NULL,
    creat_en     TIMESTAMPTZ NOT NULL DEFAULT now(),
    publicat_en  TIMESTAMPTZ
);
CREATE INDEX outbox_pendents ON outbox (creat_en) WHERE publicat_en IS NULL;
CREATE TABLE comandes (id TEXT PRIMARY KEY, client TEXT NOT NULL, estat TEXT NOT NULL);
`

const seedRoute = `  - table: public.outbox
    topic: %s
`

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
	f       *fixture
	rng     *rand.Rand
	order   map[string][]string // aggregate -> event ids in commit order
	events  map[string]event
	n       int
	aggs    int
	table   string // "outbox" (seed columns) or "pagaments.outboxevent" (Debezium columns)
	special []string
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
	type pending struct{ id, key string }
	var rows []pending
	b := &pgx.Batch{}
	for i := 0; i < size; i++ {
		w.n++
		key := fmt.Sprintf("P-2026-%06d", w.rng.IntN(w.aggs))
		id := fmt.Sprintf("%08x-0000-4000-8000-%012x", w.rng.Uint32(), w.n)
		carrega := fmt.Sprintf(`{"id": %q, "n": %d, "linies": [{"producte": "formatge-curat", "quantitat": %d, "preu_centims": 1450}], "nota": "àèò \"cometes\" \\ \n"}`, key, w.n, w.rng.IntN(9))
		creat := "now()"
		if w.n%97 == 0 {
			creat = "'" + w.special[(w.n/97)%len(w.special)] + "'::timestamptz"
		}
		versio := 1 + w.n%3
		switch w.table {
		case "outbox":
			b.Queue("INSERT INTO comandes (id, client, estat) VALUES ($1, 'anna', 'creada') ON CONFLICT (id) DO UPDATE SET estat = 'actualitzada'", key)
			b.Queue(fmt.Sprintf("INSERT INTO outbox (id, agregat, agregat_id, tipus, versio, carrega, creat_en) VALUES ($1, 'comanda', $2, $3, $4, $5, %s)", creat),
				id, key, fmt.Sprintf("comanda.t%d", w.n%5), versio, carrega)
		default:
			b.Queue(fmt.Sprintf("INSERT INTO %s (id, aggregatetype, aggregateid, type, payload, timestamp) VALUES ($1, 'pagament', $2, $3, $4, %s)", w.table, creat),
				id, key, "pagament.autoritzat", carrega)
		}
		rows = append(rows, pending{id, key})
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	for _, r := range rows {
		w.order[r.key] = append(w.order[r.key], r.id)
	}
	return nil
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

// report is what a verification found.
type report struct {
	delivered, distinct, duplicates int
}

// verify reads the whole topic and checks every record against the rows:
// nothing missing, nothing unknown, each record exactly as the contract
// says, duplicates identical, per-aggregate first deliveries in commit order.
func (w *writer) verify(ctx context.Context, topic, partitioner string) report {
	t := w.f.t
	t.Helper()
	w.load(ctx)
	cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	msgs, err := testenv.Consume(cctx, env.KafkaBrokers, topic, len(w.events))
	if err != nil {
		t.Fatalf("consume %s: got %d of %d records: %v", topic, len(msgs), len(w.events), err)
	}
	// Anything beyond the expected count (duplicates) arrives promptly.
	tctx, tcancel := context.WithTimeout(ctx, 2*time.Second)
	defer tcancel()
	all, _ := testenv.Consume(tctx, env.KafkaBrokers, topic, 0)
	if len(all) > len(msgs) {
		msgs = all
	}

	nParts := w.f.topics[topic]
	first := map[string]kafka.Message{}
	firstOrder := map[string][]string{} // aggregate -> ids in first-delivery order
	rep := report{delivered: len(msgs)}
	for _, m := range msgs { // sorted by partition, then offset
		id := header(m, "id_esdeveniment")
		e, ok := w.events[id]
		if !ok {
			t.Fatalf("record %s/%d@%d has unknown id_esdeveniment %q", m.Topic, m.Partition, m.Offset, id)
		}
		if prev, dup := first[id]; dup {
			rep.duplicates++
			if string(prev.Value) != string(m.Value) || string(prev.Key) != string(m.Key) || prev.Partition != m.Partition {
				t.Fatalf("duplicate of %s differs:\n%s\n%s", id, prev.Value, m.Value)
			}
			continue
		}
		first[id] = m
		checkRecord(t, m, e)
		if want := wantPartition(partitioner, m.Key, nParts); m.Partition != want {
			t.Fatalf("key %q in partition %d, %s says %d of %d", m.Key, m.Partition, partitioner, want, nParts)
		}
		firstOrder[e.key] = append(firstOrder[e.key], id)
	}
	rep.distinct = len(first)
	var missing []string
	for id := range w.events {
		if _, ok := first[id]; !ok {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d committed rows never reached %s, e.g. %v", len(missing), len(w.events), topic, missing[:min(5, len(missing))])
	}
	for key, want := range w.order {
		if !reflect.DeepEqual(firstOrder[key], want) {
			t.Fatalf("aggregate %s: first deliveries %v, commit order %v", key, firstOrder[key], want)
		}
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

// checkRecord checks key, headers and envelope of one record, field by field
// and type by type, as a relay consumer reads them.
func checkRecord(t *testing.T, m kafka.Message, e event) {
	t.Helper()
	if string(m.Key) != e.key {
		t.Fatalf("%s: key %q, want %q", e.id, m.Key, e.key)
	}
	if len(m.Headers) != 2 || header(m, "tipus") != e.tipus || header(m, "id_esdeveniment") != e.id {
		t.Fatalf("%s: headers %v", e.id, m.Headers)
	}
	var env map[string]json.RawMessage
	if err := json.Unmarshal(m.Value, &env); err != nil {
		t.Fatalf("%s: value is not JSON: %v\n%s", e.id, err, m.Value)
	}
	if len(env) != 6 {
		t.Fatalf("%s: envelope has %d fields: %s", e.id, len(env), m.Value)
	}
	var (
		id, tipus, origen string
		versio, dataMs    json.Number
		dades, carrega    any
	)
	for field, dst := range map[string]any{"id_esdeveniment": &id, "tipus": &tipus, "origen": &origen, "versio": &versio, "data_ms": &dataMs, "dades": &dades} {
		if err := json.Unmarshal(env[field], dst); err != nil {
			t.Fatalf("%s: field %s: %v in %s", e.id, field, err, m.Value)
		}
	}
	if id != e.id || tipus != e.tipus || origen != "comandes" {
		t.Fatalf("%s: envelope %s", e.id, m.Value)
	}
	if versio.String() != fmt.Sprint(e.versio) || dataMs.String() != fmt.Sprint(e.dataMs) {
		t.Fatalf("%s: versio %s data_ms %s, want %d and %d", e.id, versio, dataMs, e.versio, e.dataMs)
	}
	_ = json.Unmarshal([]byte(e.carrega), &carrega)
	if !reflect.DeepEqual(dades, carrega) {
		t.Fatalf("%s: dades %v, carrega %v", e.id, dades, carrega)
	}
}
