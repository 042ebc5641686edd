package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/testenv"
)

// Streamed transactions (issue 33): with postgres.streaming (the default)
// PostgreSQL streams a transaction larger than logical_decoding_work_mem
// before its commit. The tests set it to its minimum, 64kB, for their
// database, so that a few thousand outbox rows are streamed.

// streamingFixture is a fixture whose walsenders stream any transaction
// past 64kB of changes.
func streamingFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t, seedSchema, map[string]int{"comandes": 4})
	// A walsender reads its database's settings when it starts: before
	// outboxd connects.
	mustExec(f, fmt.Sprintf("ALTER DATABASE %s SET logical_decoding_work_mem = '64kB'", f.name))
	return f
}

// bigTxn is a transaction open on a connection of its own, beside the
// writer's small ones on the fixture's.
type bigTxn struct {
	w    *writer
	conn *pgx.Conn
	tx   pgx.Tx
	rows []pendingRow // inserted and not rolled back
}

func beginBig(ctx context.Context, w *writer) *bigTxn {
	t := w.f.t
	t.Helper()
	conn, err := pgx.Connect(ctx, w.f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &bigTxn{w: w, conn: conn, tx: tx}
}

// insert adds n rows; rolledBack: inside a savepoint rolled back at once.
func (b *bigTxn) insert(ctx context.Context, n int, rolledBack bool) {
	t := b.w.f.t
	t.Helper()
	if rolledBack {
		if _, err := b.tx.Exec(ctx, "SAVEPOINT rolled_back"); err != nil {
			t.Fatal(err)
		}
	}
	// Aggregates of their own: the small transactions' upserts into
	// comandes would wait for this one's row locks.
	b.w.keyPrefix = "G-2026-"
	rows, err := b.w.insert(ctx, b.tx, n)
	b.w.keyPrefix = ""
	if err != nil {
		t.Fatal(err)
	}
	if rolledBack {
		if _, err := b.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT rolled_back"); err != nil {
			t.Fatal(err)
		}
		return
	}
	b.rows = append(b.rows, rows...)
}

func (b *bigTxn) commit(ctx context.Context) {
	b.w.f.t.Helper()
	if err := b.tx.Commit(ctx); err != nil {
		b.w.f.t.Fatal(err)
	}
	b.w.record(b.rows)
}

func (b *bigTxn) rollback(ctx context.Context) {
	b.w.f.t.Helper()
	if err := b.tx.Rollback(ctx); err != nil {
		b.w.f.t.Fatal(err)
	}
}

// bigWithSavepoint commits a transaction of 3,000 outbox rows and 1,500
// more in a savepoint rolled back, while small transactions commit between
// its parts.
func bigWithSavepoint(ctx context.Context, w *writer) {
	big := beginBig(ctx, w)
	big.insert(ctx, 1500, false)
	w.txns(ctx, 5, 3) // committed between the segments of the big one
	big.insert(ctx, 1500, true)
	w.txns(ctx, 5, 3)
	big.insert(ctx, 1500, false)
	big.commit(ctx)
}

// streamTxns is pg_stat_replication_slots.stream_txns of the fixture's
// slot: the transactions the server streamed to it.
func (f *fixture) streamTxns() int64 {
	f.t.Helper()
	var n int64
	err := f.mon.QueryRow(context.Background(), "SELECT coalesce((SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = $1), 0)", f.name).Scan(&n)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// plainMetric reads a sample of outboxd's /metrics without labels; 0 when
// absent.
func (d *daemon) plainMetric(ctx context.Context, name string) float64 {
	code, body, err := d.Get(ctx, "/metrics")
	if err != nil || code != http.StatusOK {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			n, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return n
		}
	}
	return 0
}

// TestStreamedTransactions: an outbox transaction large enough to be
// streamed, with a rolled-back savepoint inside, and small transactions
// committed while it is open: every surviving row once, in commit order
// per aggregate, none of the savepoint's; the same transaction rolled
// back: nothing of it. The server did stream (stream_txns), so the rows
// went through Stream Start ... Stream Commit and Stream Abort.
func TestStreamedTransactions(t *testing.T) {
	f := streamingFixture(t)
	ctx := context.Background()
	topic := f.topic("comandes")
	d := f.start(f.config(seedRoute(topic)))
	w := newWriter(f, 33, 200, "outbox")
	w.txns(ctx, 5, 3)

	bigWithSavepoint(ctx, w)

	aborted := beginBig(ctx, w)
	aborted.insert(ctx, 3000, false)
	w.txns(ctx, 5, 3)
	aborted.rollback(ctx)
	w.txns(ctx, 5, 3)

	end := f.walLSN()
	rep := w.verify(ctx, topic, "murmur2")
	f.waitConfirmed(end, 60*time.Second)
	var streamed int64
	eventually(t, 10*time.Second, "pg_stat_replication_slots.stream_txns counts the two big transactions", func() bool {
		streamed = f.streamTxns()
		return streamed >= 2
	})
	counted := d.plainMetric(ctx, "outboxd_streamed_transactions_total")
	t.Logf("%d rows, %d transactions streamed by the server, %v counted by outboxd, %v bytes spilled: %+v",
		len(w.events), streamed, counted, d.plainMetric(ctx, "outboxd_local_spill_bytes_total"), rep)
	if rep.Duplicates != 0 {
		t.Errorf("%d duplicates", rep.Duplicates)
	}
	if counted < 2 {
		t.Errorf("outboxd_streamed_transactions_total %v, want 2 or more", counted)
	}
	d.term()
}

// TestStreamedTransactionKill9: kill -9 of outboxd inside a streamed
// transaction (segments received and spilled, no commit yet), and again
// after its commit while its records are being published (before the slot
// confirms it). Each restart removes the spill files the killed process
// left, the server streams the transaction again from its start, and
// Kafka holds every row once: the restart de-duplication knows the
// replayed positions.
func TestStreamedTransactionKill9(t *testing.T) {
	f := streamingFixture(t)
	ctx := context.Background()
	topic := f.topic("comandes")
	spillDir := t.TempDir()
	dc := f.config(seedRoute(topic))
	dc.Pipeline["spill_dir"] = spillDir
	d := f.start(dc)
	w := newWriter(f, 34, 200, "outbox")
	w.txns(ctx, 5, 3)
	f.waitConfirmed(f.walLSN(), 30*time.Second)

	commitOf := f.watchCommits()

	// 1. Killed inside the stream.
	big := beginBig(ctx, w)
	big.insert(ctx, 4000, false)
	var stale []string
	eventually(t, 30*time.Second, "a spill file of the open transaction", func() bool {
		stale, _ = filepath.Glob(filepath.Join(spillDir, "outboxd-"+f.name+"-*.spill"))
		return len(stale) > 0
	})
	if ev := d.status().Counters.Events; ev != uint64(len(w.committed)) {
		t.Fatalf("%d records before the commit, want the %d of the small transactions", ev, len(w.committed))
	}
	d.kill()
	big.insert(ctx, 1000, true)
	big.insert(ctx, 20000, false)
	w.txns(ctx, 5, 3)
	d = f.start(dc)
	for _, s := range stale {
		if _, err := os.Stat(s); err == nil {
			t.Errorf("stale spill file %s still there after the restart", s)
		}
	}
	big.commit(ctx)
	commitLSN := commitOf(big.rows[0].id)

	// 2. Killed after the commit, before the slot confirms it.
	var st testenv.Status
	for deadline := time.Now().Add(60 * time.Second); st.Counters.Events < 1000; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the big transaction's records never reached Kafka")
		}
		st, _ = d.Status(ctx)
	}
	confirmed, _ := f.slot()
	d.kill()
	t.Logf("killed after the commit with %d records acknowledged, the slot at %s, the transaction's commit at %s", st.Counters.Events, confirmed, commitLSN)
	if confirmed > commitLSN {
		t.Fatalf("the slot had confirmed the transaction (%s) before the kill: the test did not kill before the confirmation", confirmed)
	}
	w.txns(ctx, 5, 3)
	d = f.start(dc)
	end := f.walLSN()
	rep := w.verify(ctx, topic, "murmur2")
	f.waitConfirmed(end, 60*time.Second)
	t.Logf("%d rows, 2 kill -9 around a streamed transaction: %+v; skipped as already in Kafka: %v", len(w.events), rep, d.Metric(ctx, "outboxd_duplicates_skipped_total", topic))
	if rep.Duplicates != 0 {
		t.Errorf("%d duplicates after the kills", rep.Duplicates)
	}
	if n := f.streamTxns(); n < 1 {
		t.Errorf("pg_stat_replication_slots.stream_txns %d: nothing was streamed", n)
	}
	d.term()
}

// TestStreamedTransactionPostgresRestart: PostgreSQL restarted
// (immediate: a crash) while a streamed transaction is open: that
// transaction never commits and nothing of it is published; outboxd
// reconnects by itself, and a streamed transaction committed after the
// restart, with a rolled-back savepoint, is delivered like the small ones
// around it.
func TestStreamedTransactionPostgresRestart(t *testing.T) {
	f := streamingFixture(t)
	ctx := context.Background()
	topic := f.topic("comandes")
	spillDir := t.TempDir()
	dc := f.config(seedRoute(topic))
	dc.Pipeline["spill_dir"] = spillDir
	d := f.start(dc)
	w := newWriter(f, 35, 200, "outbox")
	w.txns(ctx, 5, 3)
	crashed := beginBig(ctx, w)
	crashed.insert(ctx, 3000, false)
	eventually(t, 30*time.Second, "outboxd received the open transaction's stream", func() bool {
		return d.plainMetric(ctx, "outboxd_streamed_transactions_total") >= 1
	})
	if err := env.RestartPG("immediate"); err != nil {
		t.Fatal(err)
	}
	f.reconnect()
	w.txns(ctx, 5, 3)
	bigWithSavepoint(ctx, w)
	w.txns(ctx, 5, 3)
	d.waitReady(30 * time.Second)
	end := f.walLSN()
	rep := w.verify(ctx, topic, "murmur2")
	f.waitConfirmed(end, 60*time.Second)
	t.Logf("%d rows, PostgreSQL crashed inside a streamed transaction: %+v; outboxd counted %v streamed transactions", len(w.events), rep,
		d.plainMetric(ctx, "outboxd_streamed_transactions_total"))
	// The server tells the next session that the crashed transaction is
	// gone (a Stream Abort once it finds it no longer running): its spill
	// file does not outlive it.
	eventually(t, 30*time.Second, "no spill file left", func() bool {
		left, _ := filepath.Glob(filepath.Join(spillDir, "*.spill"))
		return len(left) == 0
	})
	if rep.Duplicates != 0 {
		t.Errorf("%d duplicates", rep.Duplicates)
	}
	d.term()
}

// TestStreamedMigrationBesideTheOutbox (issue 33's case, smaller): a
// migration inserts 200,000 rows into a table outside the publication in
// one transaction while outbox events commit one by one: the server streams
// the migration (its changes go through the publication's filter as they
// come, so outboxd gets empty segments) instead of holding it, and every
// event is delivered once, in order.
func TestStreamedMigrationBesideTheOutbox(t *testing.T) {
	f := streamingFixture(t)
	mustExec(f, "CREATE TABLE soroll (id bigserial PRIMARY KEY, farciment text)")
	ctx := context.Background()
	topic := f.topic("comandes")
	d := f.start(f.config(seedRoute(topic)))
	w := newWriter(f, 36, 200, "outbox")
	w.txns(ctx, 5, 3)
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	stop := make(chan struct{})
	errc := w.untilStopped(ctx, stop, 20, 1, 2*time.Millisecond)
	_, err = conn.Exec(ctx, "INSERT INTO soroll (farciment) SELECT repeat(md5(g::text), 4) FROM generate_series(1, 200000) g")
	close(stop)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	end := f.walLSN()
	rep := w.verify(ctx, topic, "murmur2")
	f.waitConfirmed(end, 60*time.Second)
	var streamTxns, spillBytes int64
	eventually(t, 10*time.Second, "pg_stat_replication_slots.stream_txns counts the migration", func() bool {
		err := f.mon.QueryRow(ctx, "SELECT stream_txns, spill_bytes FROM pg_stat_replication_slots WHERE slot_name = $1", f.name).Scan(&streamTxns, &spillBytes)
		return err == nil && streamTxns >= 1
	})
	t.Logf("%d events beside a 200,000-row migration: %+v; the server streamed %d transactions and spilled %d bytes; outboxd spilled %v bytes",
		len(w.events), rep, streamTxns, spillBytes, d.plainMetric(ctx, "outboxd_local_spill_bytes_total"))
	if rep.Duplicates != 0 {
		t.Errorf("%d duplicates", rep.Duplicates)
	}
	d.term()
}

// TestMessageRouteKeepsLargeTransactionsWhole: pgoutput streams a logical
// message under its transaction's top-level xid, even one written in a
// savepoint (PostgreSQL 14 to 18), so a Stream Abort of the savepoint
// could not drop it. With a route of logical messages outboxd does not ask
// for streaming, and the message of a savepoint rolled back inside a
// transaction large enough to be streamed is never published. (Streaming
// on here publishes it: the guard in Runner.protocol is what this tests.)
func TestMessageRouteKeepsLargeTransactionsWhole(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 4, "missatges": 1})
	mustExec(f, fmt.Sprintf("ALTER DATABASE %s SET logical_decoding_work_mem = '64kB'", f.name))
	ctx := context.Background()
	topic := f.topic("comandes")
	d := f.start(f.config(seedRoute(topic), testenv.Route{Message: f.name, Topic: f.topic("missatges")}))
	w := newWriter(f, 37, 200, "outbox")
	message := func(tx interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, id string) {
		t.Helper()
		if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, '{"id_esdeveniment": "`+id+`", "agregat_id": "P-1", "tipus": "t", "versio": 1, "dades": {}}')`, f.name); err != nil {
			t.Fatal(err)
		}
	}
	big := beginBig(ctx, w)
	big.insert(ctx, 500, false)
	if _, err := big.tx.Exec(ctx, "SAVEPOINT with_message"); err != nil {
		t.Fatal(err)
	}
	message(big.tx, "m-rolled-back")
	big.insert(ctx, 1500, false) // in the savepoint: past logical_decoding_work_mem
	if _, err := big.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT with_message"); err != nil {
		t.Fatal(err)
	}
	big.rows = big.rows[:500]
	message(big.tx, "m-kept")
	big.insert(ctx, 500, false)
	big.commit(ctx)
	message(f.db, "m-after")
	rep := w.verify(ctx, topic, "murmur2")
	wantRecords(t, f.topic("missatges"), []string{"m-kept", "m-after"})
	if !strings.Contains(d.Log(), "streaming large transactions: off (a route takes logical messages") {
		t.Errorf("the log does not say why streaming is off:\n%s", d.Log())
	}
	t.Logf("%+v", rep)
	d.term()
}
