package integration_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/chaos"
	"github.com/outboxd/outboxd/testenv"
)

// TestFailover is a real PostgreSQL failover under load: a primary and a
// physical streaming standby made from a base backup (testenv's pg.sh
// standby), outboxd streaming through a multi-host DSN (host=primary,standby
// target_session_attrs=read-write) while four writers commit, the primary
// killed with SIGKILL (postmaster and backends), the standby promoted two
// seconds later, as an HA manager would.
//
// PostgreSQL 17 (failover slot, synchronized_standby_slots): outboxd
// reconnects to the new primary and continues from the synchronised slot.
// Nothing lost, order kept, no record of a transaction the new primary
// does not have, the slot never confirmed past what Kafka held;
// duplicates and the recovery time are reported.
//
// PostgreSQL 14 to 16 (no failover slots): the slot does not exist on the
// new primary; outboxd stops with "does not exist" and, once the operator
// forgot the slot (outboxd slot forget) and restarted it, begins at the new primary's
// current position, with the exported snapshot of postgres.snapshot:
// pending (the default), which publishes every row still pending
// (publicat_en NULL): nothing is lost, the window's rows included, at the
// cost of duplicates. The test also reports the reconciliation window
// docs/failover.md gives for snapshot: none (from 10 s before the failure to
// the new slot's creation) and checks that anything lost would lie in it.
func TestFailover(t *testing.T) {
	needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Its own primary and standby: on 17 the primary makes every logical
	// walsender wait for the standby, the other tests' outboxd too. Commit
	// timestamps on, as docs/guarantees.md advises: before 17 the re-created slot's
	// snapshot then publishes each aggregate's rows in commit order (by
	// creat_en, two writers' transactions of one aggregate can swap:
	// TestSnapshotFollowsCommitOrder).
	pg := startEnv(t, "a PostgreSQL of its own", testenv.Options{NoKafka: true, CommitTimestamps: true})
	major, err := pg.PGMajor()
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("km0_failover_%d", dbSeq.Add(1))
	schema, err := chaos.Schema()
	if err != nil {
		t.Fatal(err)
	}
	primaryDSN, err := pg.CreateDatabase(name, schema)
	if err != nil {
		t.Fatal(err)
	}
	const partitions = 4
	standby, dsn, standbyDSN := startStandby(t, pg, name, primaryDSN, partitions)
	cfg := testenv.Config{
		DSN: dsn, Brokers: env.KafkaBrokers, Slot: name, Routes: []testenv.Route{seedRoute(name)},
		Postgres: testenv.Section{"status_interval": "100ms"},
		Pipeline: testenv.Section{"backoff_min": "200ms", "backoff_max": "2s"},
		Health:   testenv.Section{"poll_interval": "500ms"},
		Log:      testenv.Section{"level": "info"},
	}
	td, err := testenv.NewDaemon(t.TempDir(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{Daemon: td, t: t}
	defer func() {
		d.Kill()
		if t.Failed() {
			t.Logf("outboxd log (%s):\n%s", d.LogPath(), d.Log())
		}
		d.Close()
	}()
	ver := &testenv.Verifier{Brokers: env.KafkaBrokers, Topic: name, Partitions: partitions, DSN: dsn, Slot: name, History: true}
	ver.Start(ctx)
	defer ver.Stop()
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	d.waitReady(30 * time.Second)

	// The load runs until the test has seen outboxd recover, whatever the
	// failover took.
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	load := &chaos.Load{DSN: dsn, Writers: 4, Aggregates: 300, Total: math.MaxInt32, Rate: 300, Prefix: "F-"}
	loadDone := make(chan error, 1)
	go func() { loadDone <- load.Run(lctx) }()

	// Before the failure: what check says, and on 17 the standby's copy of
	// the slot following the primary's.
	time.Sleep(4 * time.Second)
	r := outboxd(t, dsn, "check", "-c", d.ConfigPath())
	line := r.line("PASS failover:") + r.line("WARN failover:") + r.line("FAIL failover:")
	t.Logf("check before the failure: %s", line)
	if major >= 17 {
		// The standby's slot sync worker naps up to 30 s between rounds
		// while nothing changes (PostgreSQL's slotsync.c), and a new
		// slot is copied only once the standby has replayed past its
		// position: two naps and a margin.
		eventually(t, 75*time.Second, "the standby has a synchronised copy of the slot", func() bool {
			return slotCopy(t, standbyDSN, name) > 0
		})
		r = outboxd(t, dsn, "check", "-c", d.ConfigPath())
		line = r.line("PASS failover:")
		for _, want := range []string{"slot " + name + " is a failover slot", "waits for the standby of " + standby.Slot, "keeps a synchronised copy"} {
			if !strings.Contains(line, want) {
				t.Errorf("check's failover line lacks %q:\n%s", want, r)
			}
		}
	} else if !strings.Contains(line, "WARN failover: PostgreSQL") || !strings.Contains(line, standby.Slot) {
		t.Errorf("check does not warn about the window, naming the standby:\n%s", r)
	}

	// The old slot's position just before the failure: the check of the
	// confirmed position covers what it confirmed up to here.
	var before pglogrepl.LSN
	if c := slotConfirmed(t, dsn, name); c != "" {
		before = lsn(t, c)
	}
	killed := time.Now()
	if err := pg.KillPG(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // an HA manager's detection
	promoteStart := time.Now()
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	t.Logf("primary killed; standby promoted %.1f s later (pg_ctl promote took %.1f s)", promoted.Sub(killed).Seconds(), promoted.Sub(promoteStart).Seconds())

	var slotCreated time.Time
	if major >= 17 {
		rec, err := recoveredAfter(ctx, ver, load, promoted, 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("FAILOVER PG%d: recovered %.1f s after the promotion (%.1f s after the kill): the first transaction committed after the promotion delivered",
			major, rec.Seconds(), rec.Seconds()+promoted.Sub(killed).Seconds())
	} else {
		// No slot on the new primary: outboxd stops, saying so.
		if err := d.exited(2 * time.Minute); err == nil {
			t.Fatalf("outboxd exited with status 0 after the failover\n%s", d.Log())
		}
		if !strings.Contains(d.Log(), "does not exist") {
			t.Fatalf("outboxd's error does not say the slot does not exist:\n%s", d.Log())
		}
		// The operator's restart: the standby has the slot record too, so
		// outboxd creates a slot only once told to (slot forget); then
		// create_slot (the default) makes a new slot at the new primary's
		// current position.
		forgetSlot(t, dsn, d.ConfigPath(), d.Log())
		time.Sleep(2 * time.Second)
		if err := d.Start(); err != nil {
			t.Fatal(err)
		}
		d.waitReady(30 * time.Second)
		// S of docs/failover.md's procedure: when the log says the slot was
		// created (not when outboxd was started: rows in between are in no
		// slot either).
		slotCreated = slotCreatedAt(t, d.Log())
		t.Logf("outboxd stopped after the failover (slot missing); restarted, it created a slot %.1f s after the kill", slotCreated.Sub(killed).Seconds())
	}
	time.Sleep(3 * time.Second) // rows after the recovery too
	stopLoad()
	if err := <-loadDone; err != nil {
		t.Fatalf("load: %v", err)
	}
	// Everything the new primary has, delivered and confirmed.
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var rows int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE creat_en >= $1", slotCreated).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the rows committed since the slot's creation delivered", func() bool { return ver.Distinct() >= rows })
	var wal string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&wal); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the slot confirmed the WAL end", func() bool {
		var c *string
		_ = conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&c)
		return c != nil && lsn(t, *c) >= lsn(t, wal)
	})
	d.term()
	if err := ver.CaughtUp(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	ver.Stop()
	events, err := chaos.Committed(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	// A transaction whose commit its writer saw but the standby never
	// received is not in the new primary's table: it did not happen, for
	// the verifier as for the service.
	var txns []testenv.Txn
	lostByDB := 0
	for _, tx := range load.Txns() {
		if _, ok := events[tx.IDs[0]]; ok {
			txns = append(txns, tx)
		} else {
			lostByDB += len(tx.IDs)
		}
	}
	// Before 17 the window's rows are never delivered: their transactions
	// are left out of the confirmed-position check, which would otherwise
	// count them once the new slot passes them.
	lost := map[string]bool{}
	for _, id := range ver.Final(events, nil).LostIDs {
		lost[id] = true
	}
	// Before 17 the re-created slot is born at its consistent point, past
	// every transaction committed before it: those the old slot had not
	// confirmed are the exported snapshot's to publish (before streaming
	// begins; a crash in between is TestCutoverCrashDuringSnapshot's), not
	// the slot's, so the confirmed-position check leaves them out too.
	var reborn pglogrepl.LSN
	if major < 17 {
		reborn = slotConsistentPoint(t, d.Log())
	}
	snapshots := func(tx testenv.Txn) bool { return tx.U > before && tx.U <= reborn }
	var checked []testenv.Txn
	for _, tx := range txns {
		if !lost[tx.IDs[0]] && !snapshots(tx) {
			checked = append(checked, tx)
		}
	}
	rep := ver.Final(events, checked)
	t.Logf("FAILOVER PG%d: %s", major, rep)
	// What the snapshot's order must not trust: rows of one transaction
	// whose ctids are not in the order of their statements (the free space
	// map handed a backend an earlier page; TestSnapshotKeepsStatementOrder).
	var inverted int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT cmin::text::bigint AS c,
			lag(cmin::text::bigint) OVER (PARTITION BY xmin::text ORDER BY ctid) AS before FROM outbox) s
		WHERE before > c`).Scan(&inverted); err != nil {
		t.Fatal(err)
	}
	t.Logf("FAILOVER PG%d: %d rows sit at a ctid before a row their transaction inserted earlier", major, inverted)
	t.Logf("FAILOVER PG%d: %d rows acknowledged to their writers were lost by the database itself (asynchronous replication), %d commits had an unknown outcome",
		major, lostByDB, load.Ambiguous())
	if major >= 17 {
		if !rep.OK() {
			explainOrder(t, ctx, conn, ver, rep)
			t.Fatalf("after a failover with a failover slot:\n%s", strings.Join(rep.Examples, "\n"))
		}
		return
	}
	// 14 to 16: the window. Everything lost lies in it, and is what the
	// reconciliation query of docs/failover.md finds; nothing else is wrong.
	if rep.OrderErrors+rep.DupDiffer+rep.Mismatch+rep.BadRecords+rep.LSNViolations > 0 {
		explainOrder(t, ctx, conn, ver, rep)
		t.Fatalf("beyond the window:\n%s", strings.Join(rep.Examples, "\n"))
	}
	from := killed.Add(-10 * time.Second)
	crows, err := conn.Query(ctx, "SELECT id::text FROM outbox WHERE creat_en >= $1 AND creat_en < $2", from, slotCreated)
	if err != nil {
		t.Fatal(err)
	}
	inWindow, err := pgx.CollectRows(crows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, id := range inWindow {
		found[id] = true
	}
	outside := 0
	for _, id := range rep.LostIDs {
		if !found[id] {
			outside++
			t.Errorf("row %s was lost outside the reconciliation window", id)
		}
	}
	t.Logf("FAILOVER PG%d: the window: %d rows never delivered (%d records in Kafka of transactions the new primary does not have); the reconciliation query (creat_en from 10 s before the failure to the new slot's creation) returns %d rows, %d lost ones outside it",
		major, rep.Lost, rep.Unknown, len(inWindow), outside)
	// The default postgres.snapshot: pending closes the window: the
	// re-created slot's snapshot publishes every row whose publicat_en is
	// NULL (the load never sets it), the window's among them.
	if rep.Lost > 0 {
		t.Errorf("FAILOVER PG%d: %d rows lost though the re-created slot's snapshot publishes every pending row", major, rep.Lost)
	} else {
		t.Logf("FAILOVER PG%d: no row lost: the re-created slot's snapshot (postgres.snapshot: pending) published the rows still pending (publicat_en NULL), the window's among them", major)
	}
}

// startStandby makes a streaming standby of pg, whose database name is
// at primaryDSN, and the topic name: it returns the standby, the multi-host
// DSN outboxd connects with (the primary first) and the standby's DSN of
// the database.
func startStandby(t *testing.T, pg *testenv.Env, name, primaryDSN string, partitions int) (*testenv.Standby, string, string) {
	t.Helper()
	standby, err := pg.StartStandby()
	if err != nil {
		t.Fatal(err)
	}
	dsn, err := testenv.MultiHostDSN(name, primaryDSN, standby.DSN)
	if err != nil {
		t.Fatal(err)
	}
	standbyDSN, err := testenv.DatabaseDSN(standby.DSN, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.CreateTopic(name, partitions); err != nil {
		t.Fatal(err)
	}
	return standby, dsn, standbyDSN
}

// slotCreatedAt is the time of the last "created replication slot" line
// of an outboxd log.
func slotCreatedAt(t *testing.T, log string) time.Time {
	t.Helper()
	i := strings.LastIndex(log, "created replication slot")
	if i < 0 {
		t.Fatalf("outboxd did not log that it created the slot:\n%s", log)
	}
	line := log[strings.LastIndex(log[:i], "\n")+1:]
	at, err := time.Parse("2006-01-02T15:04:05.000Z0700", strings.Fields(line)[0])
	if err != nil {
		t.Fatalf("the time of %q: %v", line[:min(len(line), 80)], err)
	}
	return at
}

// slotConsistentPoint is the consistent point of the last slot an
// outboxd log says it created with an exported snapshot.
func slotConsistentPoint(t *testing.T, log string) pglogrepl.LSN {
	t.Helper()
	i := strings.LastIndex(log, "created replication slot with an exported snapshot")
	if i < 0 {
		t.Fatalf("outboxd did not log the slot's exported snapshot:\n%s", log)
	}
	line := log[i:]
	line = line[:strings.IndexByte(line+"\n", '\n')]
	_, v, ok := strings.Cut(line, "consistent_point=")
	if !ok {
		t.Fatalf("no consistent point in %q", line)
	}
	p, err := pglogrepl.ParseLSN(strings.Fields(v)[0])
	if err != nil {
		t.Fatalf("the consistent point of %q: %v", line, err)
	}
	return p
}

// slotConfirmed is the confirmed position of slot, "" when it cannot be
// read.
func slotConfirmed(t *testing.T, dsn, slot string) string {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		return ""
	}
	defer conn.Close(context.Background())
	var c *string
	if err := conn.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&c); err != nil || c == nil {
		return ""
	}
	return *c
}

// slotCopy is the confirmed position of the standby's copy of slot, 0
// when it has none yet.
func slotCopy(t *testing.T, dsn, slot string) uint64 {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		return 0
	}
	defer conn.Close(context.Background())
	var c *string
	if err := conn.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1 AND synced", slot).Scan(&c); err != nil || c == nil {
		return 0
	}
	return uint64(lsn(t, *c))
}

// recoveredAfter waits until the first transaction committed after since
// was delivered and returns how long after since that was.
func recoveredAfter(ctx context.Context, ver *testenv.Verifier, load *chaos.Load, since time.Time, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		for _, tx := range load.Txns() {
			if tx.At.After(since) {
				at, err := ver.WaitSeen(ctx, tx.IDs, time.Until(deadline))
				if err != nil {
					return 0, err
				}
				return at.Sub(since), nil
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no transaction committed within %s after the promotion", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFailoverSlotSetting: on PostgreSQL 17 a slot made without FAILOVER
// (by hand here) becomes a failover slot when outboxd starts with the
// default postgres.failover_slot: true, and stops being one with false.
func TestFailoverSlotSetting(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	major, err := env.PGMajor()
	if err != nil {
		t.Fatal(err)
	}
	if major < 17 {
		t.Skipf("SKIPPED: PostgreSQL %d has no failover slots; this test runs on 17 and 18 (make test's PostgreSQL 18 pass, make matrix)", major)
	}
	mustExec(f, fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", f.name))
	failover := func() bool {
		var on bool
		if err := f.mon.QueryRow(context.Background(), "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", f.name).Scan(&on); err != nil {
			t.Fatal(err)
		}
		return on
	}
	if failover() {
		t.Fatal("a slot made without FAILOVER is a failover slot")
	}
	cfg := f.config(seedRoute(f.topic("comandes")))
	d := f.start(cfg)
	if !failover() {
		t.Errorf("outboxd (failover_slot: true by default) did not make the slot a failover slot\n%s", d.Log())
	}
	if !strings.Contains(d.Log(), "changed the slot's failover setting") {
		t.Errorf("no log line says the slot's failover setting changed\n%s", d.Log())
	}
	d.term()
	cfg.Postgres["failover_slot"] = "false"
	d = f.start(cfg)
	if failover() {
		t.Errorf("outboxd with failover_slot: false left the slot a failover slot\n%s", d.Log())
	}
	d.term()
}

// explainOrder logs, for the first aggregates with an order error, every
// record Kafka has of them and their rows as the new primary has them:
// seq, the inserting transaction and its commit time, creat_en.
func explainOrder(t *testing.T, ctx context.Context, conn *pgx.Conn, ver *testenv.Verifier, rep testenv.Report) {
	t.Helper()
	for i, key := range rep.OrderKeys {
		if i == 3 {
			break
		}
		t.Logf("aggregate %s in Kafka, in reading order:\n  %s", key, strings.Join(ver.Records(key), "\n  "))
		rows, err := conn.Query(ctx, `SELECT id::text, (carrega->>'seq')::int, coalesce(carrega->>'writer', ''), xmin::text,
			coalesce(pg_xact_commit_timestamp(xmin)::text, 'NULL'), creat_en::text, ctid::text
			FROM outbox WHERE agregat_id = $1 ORDER BY 2`, key)
		if err != nil {
			t.Logf("read the rows of %s: %v", key, err)
			continue
		}
		var lines []string
		for rows.Next() {
			var id, writer, xmin, commitTS, creat, ctid string
			var seq int
			if err := rows.Scan(&id, &seq, &writer, &xmin, &commitTS, &creat, &ctid); err != nil {
				t.Logf("scan: %v", err)
				break
			}
			lines = append(lines, fmt.Sprintf("seq %d id %s writer %s xmin %s committed %s creat_en %s ctid %s", seq, id, writer, xmin, commitTS, creat, ctid))
		}
		rows.Close()
		t.Logf("aggregate %s in the new primary's table:\n  %s", key, strings.Join(lines, "\n  "))
	}
}

// TestStandbyInstanceKeepsSlotMissing: re-creating a slot that existed is
// the operator's decision, for every instance (docs/failover.md). Two
// instances share a slot: one streams, the other stands by, having only
// ever seen the slot in use. The slot then disappears as it does after a
// PostgreSQL 14-16 failover (here: the active instance is killed and the
// slot dropped; the standby instance is held with SIGSTOP meanwhile, as
// a standby waits out a promotion, so that it next finds no slot). It must
// stop with "does not exist", not create a new slot, whether that slot
// would come with the cut-over snapshot (pending) or without one (none:
// the window would be skipped silently).
func TestStandbyInstanceKeepsSlotMissing(t *testing.T) {
	for _, snapshot := range []string{"pending", "none"} {
		t.Run(snapshot, func(t *testing.T) {
			f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
			ctx := context.Background()
			dc := f.config(seedRoute(f.topic("comandes")))
			dc.Postgres["standby_retry"] = "300ms"
			dc.Postgres["snapshot"] = snapshot
			active := f.start(dc)
			standby := f.spawn(dc)
			eventually(t, 20*time.Second, "the second instance in standby", func() bool {
				st, err := standby.Status(ctx)
				return err == nil && st.State == "standby"
			})
			if err := standby.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			active.kill()
			slots := func() int {
				var n int
				if err := f.mon.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.name).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			eventually(t, 20*time.Second, "the slot dropped once the killed instance's walsender let go of it", func() bool {
				_, _ = f.mon.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", f.name)
				return slots() == 0
			})
			if err := standby.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the standby instance stopped, or created the slot", func() bool {
				return !standby.Running() || slots() > 0
			})
			if slots() > 0 || strings.Contains(standby.Log(), "created replication slot") {
				t.Fatalf("the standby instance re-created the missing slot by itself (snapshot: %s):\n%s", snapshot, standby.Log())
			}
			if err := standby.exited(10 * time.Second); err == nil {
				t.Fatalf("the standby instance exited with status 0:\n%s", standby.Log())
			}
			if !strings.Contains(standby.Log(), "does not exist") {
				t.Fatalf("the standby instance's error does not say the slot does not exist:\n%s", standby.Log())
			}
		})
	}
}

// TestFailoverDuringCutover (PostgreSQL 17): the primary dies while the
// cut-over publishes its snapshot. A standby keeps a copy of every failover
// slot but never of the cut-over's marker (a physical slot), so a copy of
// the slot promoted without its marker would stream from the consistent
// point and never publish the snapshot rows Kafka did not have yet; the
// retention job would then delete them. outboxd therefore makes the slot a
// failover slot only once the snapshot is acknowledged: the promoted
// standby has no slot, outboxd stops ("does not exist"), and its restart
// (the operator's decision) does the cut-over again on the new primary.
// Every pending row reaches Kafka. The retention job runs throughout
// (max_age 1s, every 300 ms) and deletes none of them before: not on the
// old primary while the marker exists, not on the new one while it has no
// slot (outboxd stops beside it) nor during the second cut-over; once that
// is done it deletes them all.
//
// The snapshot is slowed down (one record in flight) so that the kill
// lands in its middle; nothing writes meanwhile, so that a copy of a
// failover slot becomes persistent on the standby (a newer transaction
// than the slot's catalog_xmin would keep the copy temporary until the
// slot moves, and a temporary copy does not survive the promotion).
func TestFailoverDuringCutover(t *testing.T) {
	needEnv(t)
	major, err := env.PGMajor()
	if err != nil {
		t.Fatal(err)
	}
	if major < 17 {
		t.Skipf("SKIPPED: PostgreSQL %d has no failover slots, so no standby keeps a copy of the slot during the cut-over (TestFailover covers the lost slot there); this test runs on 17 and 18 (make test's PostgreSQL 18 pass, make matrix)", major)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pg := startEnv(t, "a PostgreSQL of its own", testenv.Options{NoKafka: true})
	name := fmt.Sprintf("km0_cutover_failover_%d", dbSeq.Add(1))
	primaryDSN, err := pg.CreateDatabase(name, seedSchema)
	if err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(ctx, primaryDSN)
	if err != nil {
		t.Fatal(err)
	}
	// 2 KB rows, 40 MB in all: more than the socket buffers between
	// PostgreSQL and outboxd hold, so that the kill leaves rows the
	// snapshot has not read.
	const backlog = 20000
	if _, err := db.Exec(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega)
		SELECT gen_random_uuid(), 'comanda', 'P-' || (i % 40), 'comanda.creada', jsonb_build_object('seq', i, 'pad', repeat('x', 2000))
		FROM generate_series(1, $1) i`, backlog); err != nil {
		t.Fatal(err)
	}
	// Done now, so that autovacuum assigns no transaction id later.
	if _, err := db.Exec(ctx, "VACUUM ANALYZE outbox"); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(ctx, "SELECT id::text FROM outbox WHERE publicat_en IS NULL")
	if err != nil {
		t.Fatal(err)
	}
	pending, err := pgx.CollectRows(rows, pgx.RowTo[string])
	db.Close(context.Background())
	if err != nil || len(pending) != backlog {
		t.Fatalf("%d pending rows (%v), want %d", len(pending), err, backlog)
	}
	const partitions = 2
	standby, dsn, standbyDSN := startStandby(t, pg, name, primaryDSN, partitions)
	ver := &testenv.Verifier{Brokers: env.KafkaBrokers, Topic: name, Partitions: partitions}
	ver.Start(ctx)
	defer ver.Stop()

	cfg := testenv.Config{
		DSN: dsn, Brokers: env.KafkaBrokers, Slot: name, Routes: []testenv.Route{seedRoute(name)},
		Postgres:  testenv.Section{"status_interval": "100ms"},
		Kafka:     testenv.Section{"linger": "20ms"},
		Pipeline:  testenv.Section{"backoff_min": "200ms", "backoff_max": "2s", "max_in_flight_events": "10"},
		Health:    testenv.Section{"poll_interval": "500ms"},
		Retention: testenv.Section{"max_age": "1s", "interval": "300ms", "confirm_timeout": "1s"},
		Log:       testenv.Section{"level": "info"},
	}
	dir := t.TempDir() // one stream key file for every instance
	start := func() *daemon {
		td, err := testenv.StartDaemon(dir, cfg)
		if err != nil {
			t.Fatal(err)
		}
		d := &daemon{Daemon: td, t: t}
		t.Cleanup(func() {
			d.Kill()
			if t.Failed() {
				t.Logf("outboxd log (%s):\n%s", d.LogPath(), d.Log())
			}
			d.Close()
		})
		return d
	}
	d := start()
	eventually(t, 60*time.Second, "the cut-over's first records in Kafka", func() bool { return ver.Distinct() >= 20 })

	// What a standby can have of the slot: a failover slot is copied
	// (wait for the copy to be persistent, as it is after a while on a
	// quiet primary); a slot that is not one never is.
	primary, err := pgx.Connect(ctx, primaryDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close(context.Background())
	var failover, marker bool
	eventually(t, 90*time.Second, "the standby keeps whatever copy of the slot it will have", func() bool {
		if err := primary.QueryRow(ctx, `SELECT coalesce(bool_or(failover) FILTER (WHERE slot_name = $1), false),
				count(*) FILTER (WHERE slot_name = $2) > 0 FROM pg_replication_slots`, name, catalog.CutoverMarker(name)).Scan(&failover, &marker); err != nil {
			t.Fatal(err)
		}
		return !failover || persistentCopy(standbyDSN, name)
	})
	delivered := ver.Distinct()
	if !marker || delivered >= backlog {
		t.Fatalf("the cut-over finished before the failover (marker %v, %d of %d rows in Kafka): the test needs a slower snapshot", marker, delivered, backlog)
	}
	rowsLeft := func(conn *pgx.Conn) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := rowsLeft(primary); n != backlog {
		t.Fatalf("the retention job deleted %d of the %d pending rows during the cut-over", backlog-n, backlog)
	}
	t.Logf("killing the primary during the cut-over: %d of %d snapshot rows in Kafka, the slot a failover slot: %v, the standby's copy persistent: %v",
		delivered, backlog, failover, persistentCopy(standbyDSN, name))
	if err := pg.KillPG(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}

	// outboxd either streams from a copy of the slot or stops: the
	// promoted standby has no slot and re-creating it is the operator's
	// decision. Then the operator restarts it, with the snapshot at full
	// speed.
	eventually(t, 2*time.Minute, "outboxd stopped, or streaming on the new primary", func() bool {
		if !d.Running() {
			return true
		}
		st, err := d.Status(ctx)
		return err == nil && st.State == "streaming"
	})
	newPrimary, err := pgx.Connect(ctx, standbyDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer newPrimary.Close(context.Background())
	if !d.Running() {
		if err := d.exited(time.Second); err == nil || !strings.Contains(d.Log(), "does not exist") {
			t.Fatalf("outboxd stopped after the failover (%v) without saying the slot does not exist", err)
		}
		if n := rowsLeft(newPrimary); n != backlog {
			t.Fatalf("the retention job deleted %d of the %d pending rows on the new primary before outboxd stopped", backlog-n, backlog)
		}
		cfg.Pipeline["max_in_flight_events"] = "1500"
		d = start()
	}
	if _, err := ver.WaitSeen(ctx, pending, 60*time.Second); err != nil {
		t.Fatalf("snapshot rows lost in a failover during the cut-over (%d of %d rows left in the table): %v", rowsLeft(newPrimary), backlog, err)
	}
	d.waitReady(60 * time.Second)
	eventually(t, 30*time.Second, "the slot a failover slot once its cut-over is done", func() bool {
		var on bool
		return newPrimary.QueryRow(ctx, "SELECT failover FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&on) == nil && on
	})
	eventually(t, 60*time.Second, "the retention job deletes the delivered rows once the cut-over is done", func() bool { return rowsLeft(newPrimary) == 0 })
	d.term()
	t.Logf("after the restart every pending row is in Kafka (%d duplicates)", ver.Dups())
}

// persistentCopy: the standby at dsn keeps a synchronised copy of slot that
// survives a promotion (not a temporary one, still waiting for the
// primary's slot to catch up with it).
func persistentCopy(dsn, slot string) bool {
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		return false
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND synced AND NOT temporary", slot).Scan(&n)
	return err == nil && n > 0
}
