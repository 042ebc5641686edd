package integration_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/testenv"
)

// Outbox housekeeping: rows deleted in the transaction that inserts them,
// and the retention job (retention/).

// TestDeleteInSameTransaction: a service that deletes its outbox row in the
// transaction that inserted it loses nothing: the publication is
// insert-only and the WAL keeps the insert, so every event arrives, with
// outboxd running and with outboxd stopped while they were committed, and
// the table stays empty.
func TestDeleteInSameTransaction(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 3})
	ctx := context.Background()
	topic := f.topic("comandes")
	cfg := f.config(seedRoute(topic))
	want := map[string]string{} // id -> key
	n := 0
	commit := func(rows int) {
		t.Helper()
		tx, err := f.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		var ids []string
		for i := 0; i < rows; i++ {
			n++
			id, key := fmt.Sprintf("00000000-0000-4000-9000-%012d", n), fmt.Sprintf("P-2026-%06d", n%13)
			if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega) VALUES ($1, 'comanda', $2, 'comanda.creada', $3)",
				id, key, fmt.Sprintf(`{"id": %q, "n": %d}`, key, n)); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
			want[id] = key
		}
		if _, err := tx.Exec(ctx, "DELETE FROM outbox WHERE id = ANY($1::uuid[])", ids); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d := f.start(cfg)
	for i := 0; i < 20; i++ {
		commit(1 + i%5)
	}
	d.term()
	for i := 0; i < 20; i++ { // only the WAL has these
		commit(1 + i%5)
	}
	d = f.start(cfg)
	msgs := consumeExactly(t, topic, len(want))
	for _, m := range msgs {
		id := header(m, "id_esdeveniment")
		if key, ok := want[id]; !ok || string(m.Key) != key || header(m, "tipus") != "comanda.creada" {
			t.Fatalf("unexpected record %s key %s headers %v", id, m.Key, m.Headers)
		}
		delete(want, id)
	}
	if len(want) != 0 {
		t.Fatalf("%d events missing", len(want))
	}
	var left int
	if err := f.mon.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&left); err != nil || left != 0 {
		t.Fatalf("the outbox holds %d rows (%v), want 0", left, err)
	}
	d.term()
}

// TestRetentionNeverDeletesUndelivered: the retention job (max_age 1h,
// checking every 300 ms) with postgres.mark_published. Old rows delivered
// while Kafka is up are marked and deleted. With the broker stopped, old
// rows committed meanwhile stay in the table, unmarked, for as long as it
// is down, however many times the job runs; once it is back they are
// delivered, marked and deleted. Young rows stay. Every event is in Kafka.
func TestRetentionNeverDeletesUndelivered(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 2})
	ctx := context.Background()
	topic := f.topic("comandes")
	cfg := f.config(seedRoute(topic))
	cfg.Postgres["mark_published"] = "true"
	cfg.Retention = map[string]string{"max_age": "1h", "interval": "300ms", "batch_size": "40", "confirm_timeout": "1s"}
	d := f.start(cfg)
	var all []string
	insert := func(rows int, age string) []string {
		t.Helper()
		r, err := f.db.Query(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega, creat_en)
			SELECT gen_random_uuid(), 'comanda', 'P-' || (g % 7), 'comanda.creada', jsonb_build_object('n', g), now() - $1::interval
			FROM generate_series(1, $2) g RETURNING id::text`, age, rows)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, ids...)
		return ids
	}
	counts := func(ids []string) (rows, marked int) {
		t.Helper()
		if err := f.mon.QueryRow(ctx, "SELECT count(*), count(publicat_en) FROM outbox WHERE id = ANY($1::uuid[])", ids).Scan(&rows, &marked); err != nil {
			t.Fatal(err)
		}
		return rows, marked
	}

	young := insert(50, "1 minute")
	var old1 []string
	for i := 0; i < 3; i++ {
		old1 = append(old1, insert(100, "2 hours")...)
	}
	eventually(t, 60*time.Second, "the 300 delivered old rows deleted", func() bool { n, _ := counts(old1); return n == 0 })

	if err := env.StopKafka(); err != nil {
		t.Fatal(err)
	}
	kafkaUp := false
	defer func() {
		if !kafkaUp {
			_ = env.StartKafka()
		}
	}()
	var old2 []string
	var first pglogrepl.LSN // right after the first of them committed: at or past its commit's end
	for i := 0; i < 5; i++ {
		old2 = append(old2, insert(40, "3 hours")...)
		if i == 0 {
			first = f.walLSN()
		}
	}
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if n, marked := counts(old2); n != len(old2) || marked != 0 {
			t.Fatalf("with Kafka down: %d of the %d undelivered old rows left, %d marked published", n, len(old2), marked)
		}
		if c, _ := f.slot(); c >= first {
			t.Fatalf("with Kafka down the slot confirmed %s, past the first undelivered transaction (before %s)", c, first)
		}
	}
	if !strings.Contains(d.Log(), "nothing deleted for now") {
		t.Fatalf("the retention job did not wait for the slot while Kafka was down:\n%s", d.Log())
	}
	if err := env.StartKafka(); err != nil {
		t.Fatal(err)
	}
	kafkaUp = true
	eventually(t, 90*time.Second, "the old rows delivered after the outage deleted", func() bool { n, _ := counts(old2); return n == 0 })
	if n, marked := counts(young); n != len(young) || marked != len(young) {
		t.Fatalf("young rows: %d of %d left, %d marked; want all left and marked", n, len(young), marked)
	}

	msgs := f.consumeAll(topic, len(all))
	seen := map[string]bool{}
	for _, m := range msgs {
		seen[header(m, "id_esdeveniment")] = true
	}
	var missing []string
	for _, id := range all {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("%d of %d events not in Kafka, e.g. %v", len(missing), len(all), missing[:min(3, len(missing))])
	}
	t.Logf("%d events delivered; %d old rows deleted after delivery, %d of them held while Kafka was down", len(all), len(old1)+len(old2), len(old2))
	d.term()
}

// outboxRow is a row insertRows inserted: its id, and where it lies (its
// partition and its ctid there).
type outboxRow struct{ id, part, ctid string }

// insertRows inserts n rows into table (the seed's columns) with creat_en
// the SQL expression at, already published by the relay when published,
// and returns them in insertion order.
func insertRows(t *testing.T, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, table string, n int, at string, published bool) []outboxRow {
	t.Helper()
	rows, err := db.Query(context.Background(), fmt.Sprintf(`INSERT INTO %s (id, agregat, agregat_id, tipus, carrega, creat_en, publicat_en)
		SELECT gen_random_uuid(), 'comanda', 'P-' || (g %% 5), 'comanda.creada', jsonb_build_object('n', g), %s, CASE WHEN $2 THEN now() END
		FROM generate_series(1, $1) g RETURNING id::text, tableoid::regclass::text, ctid::text`, table, at), n, published)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxRow, error) {
		var o outboxRow
		return o, r.Scan(&o.id, &o.part, &o.ctid)
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func ids(rows ...[]outboxRow) []string {
	var out []string
	for _, rs := range rows {
		for _, r := range rs {
			out = append(out, r.id)
		}
	}
	return out
}

// wantRecords requires topic to hold exactly one record per id, and no other.
func wantRecords(t *testing.T, topic string, want []string) {
	t.Helper()
	got := map[string]int{}
	for _, m := range consumeExactly(t, topic, len(want)) {
		got[header(m, "id_esdeveniment")]++
	}
	for _, id := range want {
		if got[id] != 1 {
			t.Fatalf("%s holds %d records of %s, want 1 (records by id: %v)", topic, got[id], id, got)
		}
	}
}

// count is how many of ids table holds.
func (f *fixture) count(table string, ids []string) int {
	f.t.Helper()
	var n int
	if err := f.mon.QueryRow(context.Background(), "SELECT count(*) FROM "+table+" WHERE id = ANY($1::uuid[])", ids).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// TestRetentionPartitioned: retention on a partitioned outbox deletes the
// old rows it selected and nothing else. Old rows (in an earlier month's
// partition) and young ones (in this month's) sit at the same ctids: a
// DELETE by ctid alone through the partitioned table would take both.
func TestRetentionPartitioned(t *testing.T) {
	f := newFixture(t, partitionedOutbox, map[string]int{"comandes": 2})
	ctx := context.Background()
	topic := f.topic("comandes")
	// The publication as sql/002_publication.sql makes it.
	mustExec(f, fmt.Sprintf("CREATE PUBLICATION %q FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)", f.name))
	cfg := f.config(seedRoute(topic))
	cfg.Retention = map[string]string{"max_age": "24h", "interval": "300ms", "batch_size": "1000", "confirm_timeout": "1s"}
	d := f.start(cfg)

	tx, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	young := insertRows(t, tx, "outbox", 30, "now() - interval '1 minute'", false)
	old := insertRows(t, tx, "outbox", 30, lastMonth, false)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	youngAt := map[string]bool{}
	for _, r := range young {
		youngAt[r.ctid] = true
	}
	shared := 0
	for _, r := range old {
		if youngAt[r.ctid] && r.part != young[0].part {
			shared++
		}
	}
	if shared == 0 {
		t.Fatalf("no old row shares a ctid with a young one: the test proves nothing (young in %s, old in %s)", young[0].part, old[0].part)
	}
	eventually(t, 60*time.Second, "the old rows deleted", func() bool { return f.count("outbox", ids(old)) == 0 })
	// A few more passes: the young rows stay.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if n := f.count("outbox", ids(young)); n != len(young) {
			t.Fatalf("retention deleted %d of the %d young rows (%d of them at the ctid of an old row in another partition)", len(young)-n, len(young), shared)
		}
	}
	wantRecords(t, topic, ids(young, old))
	t.Logf("%d old rows deleted, %d young ones kept; %d ctids in both partitions", len(old), len(young), shared)
	d.term()
}

// TestRetentionWithMessageRoute: a route of logical messages and a table
// whose rows cannot be deleted (a trigger refuses), both before the outbox
// in the file, do not keep retention from pruning the outbox; the refused
// deletes are logged.
func TestRetentionWithMessageRoute(t *testing.T) {
	schema := seedSchema + `
CREATE TABLE arxiu (LIKE outbox INCLUDING ALL);
CREATE FUNCTION keep_arxiu() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'arxiu keeps its rows'; END $$;
CREATE TRIGGER keep BEFORE DELETE ON arxiu FOR EACH ROW EXECUTE FUNCTION keep_arxiu();`
	f := newFixture(t, schema, map[string]int{"comandes": 1, "arxiu": 1, "missatges": 1})
	ctx := context.Background()
	cfg := f.config(testenv.Route{Message: f.name, Topic: f.topic("missatges")},
		testenv.Route{Table: "public.arxiu", Topic: f.topic("arxiu")}, seedRoute(f.topic("comandes")))
	cfg.Retention = map[string]string{"max_age": "1h", "interval": "300ms", "confirm_timeout": "1s"}
	d := f.start(cfg)
	kept := insertRows(t, f.db, "arxiu", 5, "now() - interval '2 hours'", false)
	old := insertRows(t, f.db, "outbox", 20, "now() - interval '2 hours'", false)
	young := insertRows(t, f.db, "outbox", 5, "now()", false)
	if _, err := f.db.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, '{"id_esdeveniment": "m-1", "agregat_id": "P-1", "tipus": "t", "versio": 1, "dades": {}}')`, f.name); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the old rows deleted", func() bool { return f.count("outbox", ids(old)) == 0 })
	if n := f.count("outbox", ids(young)); n != len(young) {
		t.Fatalf("%d of %d young rows left", n, len(young))
	}
	// arxiu's batch may come in a later pass than outbox's.
	eventually(t, 10*time.Second, "arxiu's refusal in the log", func() bool { return strings.Contains(d.Log(), "arxiu keeps its rows") })
	if n := f.count("arxiu", ids(kept)); n != len(kept) {
		t.Fatalf("arxiu: %d of %d rows left, want all:\n%s", n, len(kept), d.Log())
	}
	wantRecords(t, f.topic("comandes"), ids(old, young))
	wantRecords(t, f.topic("arxiu"), ids(kept))
	wantRecords(t, f.topic("missatges"), []string{"m-1"})
	d.term()
}

// TestMarkPublishedDoesNotWedge (issue 19 item 8): with
// postgres.mark_published every acknowledgement waits for its row's mark,
// so a mark that never returns would wedge them all. Two ways one hangs:
//   - dead connection: the mark connection stops answering without a reset
//     (a proxy between outboxd and PostgreSQL stops forwarding on it; new
//     connections pass). outboxd gives up on it, says so, marks again on a
//     new one, and every row is marked and confirmed. Before, the UPDATE
//     waited for ever and nothing was confirmed again until a restart.
//   - lock held: another session holds a lock the UPDATE needs (here a
//     trigger takes an advisory lock the test holds, as a row lock taken by
//     another transaction would). The server gives up after lock_timeout,
//     /status says so, the slot stays before the row, and once the lock is
//     released the rows are marked and confirmed. Before, nothing said why
//     acknowledgements had stopped.
func TestMarkPublishedDoesNotWedge(t *testing.T) {
	marked := func(f *fixture) (rows, done int) {
		t.Helper()
		if err := f.mon.QueryRow(context.Background(), "SELECT count(*), count(publicat_en) FROM outbox").Scan(&rows, &done); err != nil {
			t.Fatal(err)
		}
		return rows, done
	}
	allMarked := func(f *fixture) bool { rows, done := marked(f); return rows > 0 && rows == done }

	t.Run("dead connection", func(t *testing.T) {
		f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
		ctx := context.Background()
		p := newPGFreezer(t, f.pgAddr())
		cfg := f.config(seedRoute(f.topic("comandes")))
		cfg.DSN = f.dsnThrough(p.addr)
		cfg.Postgres["mark_published"] = "true"
		d := f.start(cfg)
		w := newWriter(f, 41, 5, "outbox")
		w.txns(ctx, 3, 2)
		eventually(t, 30*time.Second, "the first rows marked", func() bool { return allMarked(f) })
		if n := p.freezeMarks(); n == 0 {
			t.Fatal("no mark connection to freeze: the test did not cut one")
		}
		w.txns(ctx, 3, 2)
		f.waitConfirmed(f.walLSN(), 90*time.Second)
		if !allMarked(f) {
			rows, done := marked(f)
			t.Fatalf("confirmed with %d of %d rows marked", done, rows)
		}
		if !strings.Contains(d.Log(), "mark publicat_en: no answer from PostgreSQL") {
			t.Errorf("the log does not say why acknowledgements waited:\n%s", d.Log())
		}
		w.verify(ctx, f.topic("comandes"), "murmur2")
		d.term()
	})

	t.Run("lock held", func(t *testing.T) {
		f := newFixture(t, seedSchema+`
			CREATE FUNCTION wait_for_test() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NEW; END $$;
			CREATE TRIGGER wait_for_test BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION wait_for_test();`, map[string]int{"comandes": 1})
		ctx := context.Background()
		cfg := f.config(seedRoute(f.topic("comandes")))
		cfg.Postgres["mark_published"] = "true"
		d := f.start(cfg)
		holder, err := pgx.Connect(ctx, f.dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close(ctx)
		if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock(4242)"); err != nil {
			t.Fatal(err)
		}
		commitOf := f.watchCommits()
		w := newWriter(f, 42, 5, "outbox")
		w.txns(ctx, 3, 2)
		var why string
		eventually(t, 60*time.Second, "/status saying the mark waited for a lock", func() bool {
			why = d.status().LastError
			return strings.Contains(why, "lock_timeout")
		})
		t.Logf("while the lock is held: %s", why)
		if c, _ := f.slot(); c > commitOf(w.committed[0]) {
			t.Fatalf("the slot confirmed %s, past the first unmarked row's commit %s", c, commitOf(w.committed[0]))
		}
		if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock(4242)"); err != nil {
			t.Fatal(err)
		}
		f.waitConfirmed(f.walLSN(), 90*time.Second)
		if !allMarked(f) {
			rows, done := marked(f)
			t.Fatalf("confirmed with %d of %d rows marked", done, rows)
		}
		d.term()
	})
}

// pgFreezer is a TCP proxy to PostgreSQL that can stop forwarding, both
// ways and without closing anything, on the connections outboxd opened for
// marking rows (application_name outboxd-mark), as a network that drops
// their packets would; other and later connections pass.
type pgFreezer struct {
	addr  string
	mu    sync.Mutex
	marks []chan struct{} // per mark connection: closed when it freezes
}

func newPGFreezer(t *testing.T, target string) *pgFreezer {
	t.Helper()
	p := &pgFreezer{}
	p.addr = proxyTo(t, target, func(down, up net.Conn) {
		// The startup message names the application.
		var head [4]byte
		if _, err := io.ReadFull(down, head[:]); err != nil {
			return
		}
		startup := make([]byte, binary.BigEndian.Uint32(head[:])-4)
		if _, err := io.ReadFull(down, startup); err != nil {
			return
		}
		frozen := make(chan struct{})
		if bytes.Contains(startup, []byte("application_name\x00outboxd-mark\x00")) {
			p.mu.Lock()
			p.marks = append(p.marks, frozen)
			p.mu.Unlock()
		}
		if _, err := up.Write(append(head[:], startup...)); err != nil {
			return
		}
		done := make(chan struct{})
		go func() { defer close(done); freezable(up, down, frozen) }()
		freezable(down, up, frozen)
		<-done
	})
	return p
}

// freezeMarks freezes the mark connections open now and returns how many.
func (p *pgFreezer) freezeMarks() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.marks)
	for _, c := range p.marks {
		close(c)
	}
	p.marks = nil
	return n
}

// freezable copies src to dst until either ends or frozen is closed; then
// it holds both open and forwards nothing.
func freezable(dst, src net.Conn, frozen <-chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-frozen:
			return // both stay open until the end of the test
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// TestGivenUpCutoverHoldsRetention (issue 19 item 8): a cut-over that did
// not finish and is given up (postgres.snapshot: none at the next start)
// leaves snapshot rows that may not be in Kafka, and the log tells the
// operator to replay them. The retention job must not delete them
// meanwhile: outboxd leaves a replay hold slot in the marker's place, the
// job deletes nothing while it exists and says why, and check warns. Once
// the rows are replayed and the hold dropped, the job deletes them. Before,
// the job deleted them at its first pass after the give-up: the rows the
// log said to replay were gone.
func TestGivenUpCutoverHoldsRetention(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	ctx := context.Background()
	topic := f.topic("comandes")
	r, err := f.db.Query(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega, creat_en)
		SELECT gen_random_uuid(), 'comanda', 'P-' || (g % 5), 'comanda.creada', jsonb_build_object('n', g), now() - interval '2 hours'
		FROM generate_series(1, 30) g RETURNING id::text`)
	if err != nil {
		t.Fatal(err)
	}
	old, err := pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	left := func() int {
		t.Helper()
		var n int
		if err := f.mon.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[])", old).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	slotExists := func(name string) bool {
		t.Helper()
		var n int
		if err := f.mon.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	// The first start reaches no broker: its cut-over cannot publish the
	// snapshot, and it is killed.
	first := f.config(seedRoute(topic))
	first.Brokers = freePort(t)
	d := f.spawn(first)
	eventually(t, 60*time.Second, "the cut-over marker", func() bool { return slotExists(catalog.CutoverMarker(f.name)) })
	d.kill()

	// The next start gives it up, with the retention job on.
	cfg := f.config(seedRoute(topic))
	cfg.Postgres["snapshot"] = "none"
	cfg.Retention = map[string]string{"max_age": "1h", "interval": "300ms", "batch_size": "10", "confirm_timeout": "1s"}
	d = f.start(cfg)
	w := newWriter(f, 43, 5, "outbox")
	w.txns(ctx, 3, 2)
	f.waitConfirmed(f.walLSN(), 30*time.Second) // the slot is past the old rows
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if n := left(); n != len(old) {
			t.Fatalf("the retention job deleted %d of the %d rows the log said to replay:\n%s", len(old)-n, len(old), d.Log())
		}
	}
	hold := catalog.ReplayHold(f.name)
	if !slotExists(hold) || !strings.Contains(d.Log(), "advised replaying") || !strings.Contains(d.Log(), hold) {
		t.Fatalf("no replay hold %s, or the log does not say why nothing is deleted:\n%s", hold, d.Log())
	}
	path := f.configFile(cfg)
	if l := outboxd(t, f.dsn, "check", "-c", path).line("WARN replay hold:"); !strings.Contains(l, hold) {
		t.Errorf("check does not warn of the hold: %q", l)
	}

	// The operator replays the rows, then drops the hold.
	if rep := outboxd(t, f.dsn, "replay", "-c", path, "--from", time.Now().Add(-3*time.Hour).UTC().Format(time.RFC3339)); rep.code != 0 {
		t.Fatalf("replay:\n%s", rep)
	}
	seen := map[string]bool{}
	for _, m := range f.consumeAll(topic, len(old)) {
		seen[header(m, "id_esdeveniment")] = true
	}
	for _, id := range old {
		if !seen[id] {
			t.Fatalf("row %s not in Kafka after the replay", id)
		}
	}
	if _, err := f.db.Exec(ctx, "SELECT pg_drop_replication_slot($1)", hold); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the replayed old rows deleted once the hold is dropped", func() bool { return left() == 0 })
	d.term()
}
