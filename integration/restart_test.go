package integration_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/testenv"
)

// TestRestartKill9: kill -9 at random moments while a writer runs, restart
// each time: nothing missing, per-aggregate order of first deliveries kept.
func TestRestartKill9(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 4})
	ctx := context.Background()
	dc := f.config(seedRoute(f.topic("comandes")))
	d := f.start(dc)
	w := newWriter(f, 4, 100, "outbox")
	errc := w.inBackground(ctx, 600, 20, 3*time.Millisecond)
	rng := rand.New(rand.NewPCG(7, 7))
	var positions []pglogrepl.LSN
	for round := 0; round < 5; round++ {
		time.Sleep(time.Duration(200+rng.IntN(600)) * time.Millisecond)
		c, _ := f.slot()
		positions = append(positions, c)
		d.kill()
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		d = f.start(dc)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	end := f.walLSN()
	rep := w.verify(ctx, f.topic("comandes"), "murmur2")
	f.waitConfirmed(end, 30*time.Second)
	if positions[0] == positions[len(positions)-1] {
		t.Fatalf("the slot never advanced between kills (%v): the test did not exercise a resume", positions)
	}
	t.Logf("5 kill -9 with the slot at %v: %+v", positions, rep)
	if rep.Duplicates != 0 {
		t.Errorf("%d duplicates after the kills (kafka.deduplicate is on by default)", rep.Duplicates)
	}
	d.term()
}

// TestKill9DrainNoDuplicates (issue 21): kill -9 of outboxd five times
// while it drains a backlog at full speed, restarted each time. Each
// restart replays from the slot's confirmed position, behind what Kafka
// acknowledged; with kafka.deduplicate (the default) every partition's
// tail tells the new session what it holds: every row once, in order, and
// the skipped records counted. With it off, the same kills duplicate (the
// count is logged, for comparison).
func TestKill9DrainNoDuplicates(t *testing.T) {
	for _, dedupe := range []bool{true, false} {
		t.Run(map[bool]string{true: "deduplicate", false: "deduplicate off"}[dedupe], func(t *testing.T) {
			f := newFixture(t, seedSchema, map[string]int{"comandes": 4})
			ctx := context.Background()
			w := newWriter(f, 21, 500, "outbox")
			dc := f.config(seedRoute(f.topic("comandes")))
			if !dedupe {
				dc.Kafka["deduplicate"] = "false"
			}
			f.start(dc).term() // the slot first: the backlog is streamed, not a cut-over snapshot
			w.backlog(ctx, 300, 100)
			rng := rand.New(rand.NewPCG(21, 21))
			var positions []pglogrepl.LSN
			for round := 0; round < 5; round++ {
				d := f.start(dc)
				time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
				c, _ := f.slot()
				positions = append(positions, c)
				d.kill()
				w.txns(ctx, 40, 50) // more backlog for the next round
			}
			d := f.start(dc)
			end := f.walLSN()
			rep := w.verify(ctx, f.topic("comandes"), "murmur2")
			f.waitConfirmed(end, 60*time.Second)
			skipped := d.Metric(ctx, "outboxd_duplicates_skipped_total", f.topic("comandes"))
			t.Logf("5 kill -9 mid-drain, the slot at %v: %+v; this last session skipped %v", positions, rep, skipped)
			if dedupe && rep.Duplicates != 0 {
				t.Errorf("%d duplicates after 5 kill -9 with kafka.deduplicate on", rep.Duplicates)
			}
			d.term()
		})
	}
}

// TestRestartSigterm: SIGTERM while rows are being written, restart:
// nothing missing and nothing duplicated. Uses the crc32 partitioner.
func TestRestartSigterm(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 5})
	ctx := context.Background()
	dc := f.config(seedRoute(f.topic("comandes")))
	dc.Kafka["partitioner"] = "crc32"
	d := f.start(dc)
	w := newWriter(f, 5, 80, "outbox")
	errc := w.inBackground(ctx, 400, 30, 0)
	time.Sleep(700 * time.Millisecond)
	d.term()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	d = f.start(dc)
	end := f.walLSN()
	rep := w.verify(ctx, f.topic("comandes"), "crc32")
	f.waitConfirmed(end, 30*time.Second)
	if rep.Duplicates != 0 {
		t.Fatalf("SIGTERM and restart produced %d duplicates: %+v", rep.Duplicates, rep)
	}
	t.Logf("SIGTERM mid-stream and restart: %+v", rep)
	d.term()
}

// TestSigtermInsideLargeTransaction: SIGTERM while a 40,000-row transaction
// is streaming. outboxd finishes the transaction, waits for Kafka, confirms
// and exits 0; the restart produces no duplicates.
func TestSigtermInsideLargeTransaction(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 3})
	ctx := context.Background()
	dc := f.config(seedRoute(f.topic("comandes")))
	d := f.start(dc)
	w := newWriter(f, 10, 500, "outbox")
	if err := w.txn(ctx, 5); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	if err := w.txn(ctx, 40000); err != nil {
		t.Fatal(err)
	}
	// Stop as soon as part of the big transaction is in Kafka.
	var st testenv.Status
	deadline := time.Now().Add(30 * time.Second)
	for st.Counters.Events <= 5 {
		if time.Now().After(deadline) {
			t.Fatal("the big transaction never started streaming")
		}
		st, _ = d.Status(ctx)
		time.Sleep(2 * time.Millisecond)
	}
	if st.Counters.Events >= 40005 {
		t.Fatalf("the transaction was fully delivered (%d) before SIGTERM: the test did not stop inside it", st.Counters.Events)
	}
	d.term()
	d = f.start(dc)
	if err := w.txn(ctx, 3); err != nil {
		t.Fatal(err)
	}
	end := f.walLSN()
	rep := w.verify(ctx, f.topic("comandes"), "murmur2")
	f.waitConfirmed(end, 30*time.Second)
	if rep.Duplicates != 0 {
		t.Fatalf("SIGTERM at %d acknowledged records inside a transaction, then restart: %d duplicates", st.Counters.Events, rep.Duplicates)
	}
	t.Logf("SIGTERM with %d of 40,005 records acknowledged: %+v", st.Counters.Events, rep)
	d.term()
}

// reconnect replaces the fixture's connections after a server restart.
func (f *fixture) reconnect() {
	f.t.Helper()
	ctx := context.Background()
	var err error
	for i := 0; i < 50; i++ {
		if f.db, err = pgx.Connect(ctx, f.dsn); err == nil {
			if f.mon, err = pgx.Connect(ctx, f.dsn); err == nil {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	f.t.Fatalf("reconnect after restart: %v", err)
}

// TestPostgresRestart: PostgreSQL restarted (fast, then immediate) while
// outboxd streams: it reconnects by itself, nothing is lost.
func TestPostgresRestart(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 3})
	ctx := context.Background()
	d := f.start(f.config(seedRoute(f.topic("comandes"))))
	w := newWriter(f, 9, 50, "outbox")
	for _, mode := range []string{"fast", "immediate"} {
		for i := 0; i < 30; i++ {
			if err := w.txn(ctx, 1+i%10); err != nil {
				t.Fatal(err)
			}
		}
		if err := env.RestartPG(mode); err != nil {
			t.Fatal(err)
		}
		f.reconnect()
		for i := 0; i < 10; i++ {
			if err := w.txn(ctx, 3); err != nil {
				t.Fatal(err)
			}
		}
	}
	d.waitReady(30 * time.Second)
	end := f.walLSN()
	rep := w.verify(ctx, f.topic("comandes"), "murmur2")
	f.waitConfirmed(end, 30*time.Second)
	if !strings.Contains(d.Log(), "retrying") {
		t.Error("outboxd never logged a retry: the restart was not noticed")
	}
	t.Logf("PostgreSQL restarted fast and immediate: %+v", rep)
	d.term()
}

// TestStandbyTakeover: a second outboxd on the same slot stands by (it does
// not crash-loop), says so in /status and /readyz, and takes over within
// seconds of the first one's kill -9; nothing is lost.
func TestStandbyTakeover(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 3})
	ctx := context.Background()
	dc := f.config(seedRoute(f.topic("comandes")))
	dc.Postgres["standby_retry"] = "500ms"
	active := f.start(dc)
	standby := f.spawn(dc)
	eventually(t, 20*time.Second, "the second instance in standby", func() bool {
		st, err := standby.Status(ctx)
		return err == nil && st.State == "standby"
	})
	if standby.code("/readyz") != 503 || standby.code("/healthz") != 200 {
		t.Fatal("standby must be live (200) and not ready (503)")
	}
	// Standing by for a while (several retries): one state, entered once.
	first := standby.status()
	time.Sleep(3 * time.Second)
	if again := standby.status(); again.State != "standby" || !again.Since.Equal(first.Since) {
		t.Errorf("standby re-entered on a retry: since %s, then %s (%s)", first.Since, again.Since, again.State)
	}
	if n := strings.Count(standby.Log(), "standing by"); n != 1 {
		t.Errorf("after 3 s of retries every %s the standby logged %d times that it stands by, want once:\n%s", dc.Postgres["standby_retry"], n, standby.Log())
	}
	w := newWriter(f, 23, 40, "outbox")
	errc := w.inBackground(ctx, 200, 10, 5*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	active.kill()
	killed := time.Now()
	eventually(t, 15*time.Second, "the standby streaming after the active one died", func() bool {
		st, err := standby.Status(ctx)
		return err == nil && st.State == "streaming"
	})
	takeover := time.Since(killed)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	rep := w.verify(ctx, f.topic("comandes"), "murmur2")
	if strings.Count(standby.Log(), "standing by") != 1 {
		t.Errorf("the standby should log once that it stands by:\n%s", standby.Log())
	}
	t.Logf("took over %s after kill -9: %+v", takeover.Round(time.Millisecond), rep)
	standby.term()
}
