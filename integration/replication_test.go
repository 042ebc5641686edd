package integration_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/testenv"
)

// TestSlotHoldsWhileBrokerDown: with the broker stopped, new rows must not
// move confirmed_flush_lsn; once it is back, every row arrives and the slot
// catches up.
func TestSlotHoldsWhileBrokerDown(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 3})
	ctx := context.Background()
	d := f.start(f.config(seedRoute(f.topic("comandes"))))
	w := newWriter(f, 3, 40, "outbox")
	for i := 0; i < 20; i++ {
		if err := w.txn(ctx, 5); err != nil {
			t.Fatal(err)
		}
	}
	f.waitConfirmed(f.walLSN(), 30*time.Second)

	if err := env.StopKafka(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = env.StartKafka()
		}
	}()
	commitOf := f.watchCommits()
	walBefore := f.walLSN()
	first := len(w.committed)
	for i := 0; i < 30; i++ {
		if err := w.txn(ctx, 1+i%4); err != nil {
			t.Fatal(err)
		}
	}
	after := f.walLSN()
	// The first undelivered transaction's commit: a slot confirmed past it
	// would not deliver it again (the WAL position read before the writes
	// is not a bound: outboxd rightly confirms a keepalive's WAL end while
	// it has nothing pending).
	before := commitOf(w.committed[first])
	if before < walBefore || before > after {
		t.Fatalf("the first transaction's commit at %s is not between %s and %s", before, walBefore, after)
	}
	// Sample the slot for a while: outboxd retries, reconnects and
	// replays, but the rows are not in Kafka, so the slot must not pass
	// the commit of the first of them.
	var maxSeen pglogrepl.LSN
	for deadline := time.Now().Add(12 * time.Second); time.Now().Before(deadline); {
		c, _ := f.slot()
		maxSeen = max(maxSeen, c)
		if c > before {
			t.Fatalf("broker down: confirmed_flush_lsn moved to %s, past %s where the first unacknowledged transaction commits", c, before)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := env.StartKafka(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	rep := w.verify(ctx, f.topic("comandes"), "murmur2")
	f.waitConfirmed(after, 60*time.Second)
	t.Logf("during the outage the slot stayed at <= %s (rows from %s to %s); after: %+v", maxSeen, before, after, rep)
	d.term()
}

// TestIdleOutboxDoesNotPinWAL: the outbox stays idle while another table
// writes tens of MB of WAL; the slot follows the WAL end.
func TestIdleOutboxDoesNotPinWAL(t *testing.T) {
	f := newFixture(t, seedSchema+"CREATE TABLE soroll (id bigserial PRIMARY KEY, farciment text);", map[string]int{"comandes": 1})
	ctx := context.Background()
	d := f.start(f.config(seedRoute(f.topic("comandes"))))
	w := newWriter(f, 6, 5, "outbox")
	if err := w.txn(ctx, 3); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	start := f.walLSN()
	for i := 0; i < 8; i++ {
		if _, err := f.db.Exec(ctx, "INSERT INTO soroll (farciment) SELECT repeat(md5(g::text), 20) FROM generate_series(1, 10000) g"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.db.Exec(ctx, "CHECKPOINT"); err != nil {
		t.Fatal(err)
	}
	written := f.walLSN() - start
	if written < 32<<20 {
		t.Fatalf("the noise wrote only %d bytes of WAL", written)
	}
	// The slot must follow: unconfirmed and retained WAL become small.
	var unconfirmed, retained pglogrepl.LSN
	deadline := time.Now().Add(40 * time.Second)
	for {
		cur := f.walLSN()
		c, r := f.slot()
		unconfirmed, retained = cur-c, cur-r
		if unconfirmed < 1<<20 && retained < 8<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d MB of other WAL the slot retains %d bytes, %d unconfirmed", written>>20, retained, unconfirmed)
		}
		// Keep a trickle of WAL so the walsender has something to report.
		_, _ = f.db.Exec(ctx, "INSERT INTO soroll (farciment) VALUES ('x')")
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("other tables wrote %d MB of WAL; the slot retains %d KB, %d KB unconfirmed", written>>20, retained>>10, unconfirmed>>10)
	// The outbox still works afterwards.
	if err := w.txn(ctx, 2); err != nil {
		t.Fatal(err)
	}
	w.verify(ctx, f.topic("comandes"), "murmur2")
	d.term()
}

// TestLostSlotIsRefused: when max_slot_wal_keep_size made PostgreSQL remove
// WAL the slot needed (wal_status lost), outboxd refuses to stream from it
// and says what to do, rather than silently skipping the missing events.
func TestLostSlotIsRefused(t *testing.T) {
	f := newFixture(t, seedSchema+"CREATE TABLE soroll (id bigserial PRIMARY KEY, farciment text);", map[string]int{"comandes": 1})
	dc := f.config(seedRoute(f.topic("comandes")))
	d := f.start(dc)
	d.term()
	loseSlot(t, f)
	bad := f.spawn(dc)
	if err := bad.exited(30 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 on a lost slot")
	}
	if log := bad.Log(); !strings.Contains(log, "wal_status lost") || !strings.Contains(log, "events are missing") {
		t.Fatalf("the error does not explain the lost slot:\n%s", log)
	}
}

// TestPublicationChangedUnderRunningOutboxd: a publication that stops
// covering the outbox turns readiness off with the fix; a dropped one stops
// outboxd with a clear error.
func TestPublicationChangedUnderRunningOutboxd(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	ctx := context.Background()
	d := f.start(f.config(seedRoute(f.topic("comandes"))))
	if _, err := f.db.Exec(ctx, "ALTER PUBLICATION "+f.name+" DROP TABLE outbox"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "/readyz 503 naming the publication", func() bool {
		code, b, err := d.Get(ctx, "/readyz")
		if err != nil {
			return false
		}
		var body struct{ Reasons []string }
		_ = json.Unmarshal(b, &body)
		return code == 503 && len(body.Reasons) > 0 && strings.Contains(strings.Join(body.Reasons, ";"), "does not cover public.outbox")
	})
	if _, err := f.db.Exec(ctx, "ALTER PUBLICATION "+f.name+" ADD TABLE outbox"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "/readyz 200 again", func() bool { return d.code("/readyz") == 200 })

	if _, err := f.db.Exec(ctx, "DROP PUBLICATION "+f.name); err != nil {
		t.Fatal(err)
	}
	w := newWriter(f, 31, 3, "outbox")
	if err := w.txn(ctx, 1); err != nil {
		t.Fatal(err)
	}
	after := f.walLSN() // past the row's commit
	if err := d.exited(30 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 after its publication was dropped")
	}
	if log := d.Log(); !strings.Contains(log, "publication") || !strings.Contains(log, "does not exist") {
		t.Fatalf("the error does not name the publication:\n%s", log)
	}
	// PostgreSQL 18 skips the missing publication with a warning and
	// streams on: an outboxd that went on would confirm the server's
	// position, past the row it never received.
	if confirmed, _ := f.slot(); confirmed >= after {
		t.Fatalf("the slot confirmed %s, past the row committed while the publication was missing (before %s)", confirmed, after)
	}
}

// loseSlot makes the server remove WAL the fixture's slot needs
// (max_slot_wal_keep_size 1MB, WAL written into the table soroll, and
// checkpoints) until its wal_status is lost, then resets the setting: a
// lost slot stays lost.
func loseSlot(t *testing.T, f *fixture) {
	t.Helper()
	ctx := context.Background()
	reset := func() {
		_, _ = f.mon.Exec(context.Background(), "ALTER SYSTEM RESET max_slot_wal_keep_size")
		_, _ = f.mon.Exec(context.Background(), "SELECT pg_reload_conf()")
	}
	t.Cleanup(reset)
	for _, sql := range []string{"ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()"} {
		mustExec(f, sql)
	}
	eventually(t, 60*time.Second, "the slot lost", func() bool {
		for _, sql := range []string{"INSERT INTO soroll (farciment) SELECT repeat(md5(g::text), 20) FROM generate_series(1, 20000) g", "CHECKPOINT"} {
			mustExec(f, sql)
		}
		var status string
		if err := f.mon.QueryRow(ctx, "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1", f.name).Scan(&status); err != nil {
			t.Fatal(err)
		}
		return status == "lost"
	})
	reset()
}

// TestSlotInvalidatedForIdleness (PostgreSQL 18+): a slot left unused for
// longer than idle_replication_slot_timeout is invalidated at the next
// checkpoint (invalidation_reason idle_timeout) while its wal_status can
// still read reserved. check FAILs the slot line naming the reason and the
// setting, and outboxd refuses to stream from it instead of retrying for
// ever. Its own PostgreSQL: the setting invalidates every idle slot.
func TestSlotInvalidatedForIdleness(t *testing.T) {
	needEnv(t)
	major, err := env.PGMajor()
	if err != nil {
		t.Fatal(err)
	}
	if major < 18 {
		t.Skipf("SKIPPED: PostgreSQL %d has no idle_replication_slot_timeout (18+); it runs in make test's PostgreSQL 18 pass and make matrix", major)
	}
	pg := startEnv(t, "a PostgreSQL of its own", testenv.Options{NoKafka: true})
	f := newFixtureOn(t, &testenv.Env{Dir: pg.Dir, PGDSN: pg.PGDSN, KafkaBrokers: env.KafkaBrokers}, seedSchema, map[string]int{"comandes": 1})
	dc := f.config(seedRoute(f.topic("comandes")))
	f.start(dc).term()
	for _, sql := range []string{"ALTER SYSTEM SET idle_replication_slot_timeout = '1s'", "SELECT pg_reload_conf()"} {
		mustExec(f, sql)
	}
	ctx := context.Background()
	eventually(t, 60*time.Second, "the slot invalidated for idleness", func() bool {
		time.Sleep(1100 * time.Millisecond)
		mustExec(f, "CHECKPOINT")
		var reason string
		if err := f.mon.QueryRow(ctx, "SELECT coalesce(invalidation_reason, '') FROM pg_replication_slots WHERE slot_name = $1", f.name).Scan(&reason); err != nil {
			t.Fatal(err)
		}
		return reason == "idle_timeout"
	})
	for _, sql := range []string{"ALTER SYSTEM RESET idle_replication_slot_timeout", "SELECT pg_reload_conf()"} {
		mustExec(f, sql)
	}
	r := outboxd(t, f.dsn, "check", "-c", f.configFile(dc))
	if l := r.line("FAIL slot:"); !strings.Contains(l, "idle_timeout") || !strings.Contains(l, "idle_replication_slot_timeout") {
		t.Fatalf("check does not fail the slot naming idle_timeout and the setting:\n%s", r)
	}
	bad := f.spawn(dc)
	if err := bad.exited(30 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 on a slot invalidated for idleness")
	}
	if log := bad.Log(); !strings.Contains(log, "idle_timeout") || !strings.Contains(log, "events are missing") {
		t.Fatalf("the error does not explain the invalidated slot:\n%s", log)
	}
}
