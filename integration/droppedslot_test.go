package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/testenv"
)

// A slot dropped by hand while Kafka is down, and outboxd started again by
// its supervisor: the slot record (postgres.slot_table) remembers the slot
// beyond the process that saw it, and the retention job deletes or drops
// only rows the slot vouches for.

// TestDroppedSlotKeepsUndeliveredRows: a table without publicat_en and
// retention.max_age 10m, in each mode. Kafka goes down; 100 rows dated an
// hour ago are committed; the DBA terminates the walsender and drops the
// slot. outboxd exits with status 3, and so does every start after it,
// which a supervisor would make: none creates a slot, and the 100 rows stay
// in the table. The operator runs `outboxd slot forget` with the position
// the error names; the next start creates the slot, and the retention job,
// running every 300 ms, still leaves the 100 rows (the new slot does not
// vouch for rows older than itself): `outboxd replay` puts them in Kafka.
func TestDroppedSlotKeepsUndeliveredRows(t *testing.T) {
	for _, mode := range []string{"delete", "drop_partitions"} {
		t.Run(mode, func(t *testing.T) { droppedSlotRun(t, mode) })
	}
}

func droppedSlotRun(t *testing.T, mode string) {
	schema := seedSchema
	if mode == "drop_partitions" {
		schema = dropSchema
	}
	f := newFixture(t, schema, map[string]int{"comandes": 1})
	ctx := context.Background()
	now := time.Now().UTC()
	if mode == "drop_partitions" {
		mustExec(f, fmt.Sprintf("CREATE TABLE outbox_now PARTITION OF outbox FOR VALUES FROM ('%s') TO ('%s')",
			now.Add(-30*time.Minute).Format(time.RFC3339), now.Add(24*time.Hour).Format(time.RFC3339)))
	}
	topic := f.topic("comandes")
	route := seedRoute(topic)
	route.More = testenv.Section{"columns": `{publicat_en: "-"}`}
	cfg := f.config(route)
	cfg.Retention = map[string]string{"mode": mode, "max_age": "10m", "interval": "300ms", "confirm_timeout": "1s"}
	path := f.configFile(cfg)
	d := f.start(cfg)
	before := insertRows(t, f.db, "outbox", 5, "now()", false)
	f.waitConfirmed(f.walLSN(), 30*time.Second)

	startKafka := stopKafka(t)
	tx, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if mode == "drop_partitions" {
		// The hour-old rows go into outbox_old, whose whole range is older
		// than max_age (due), made with them: empty, it would be dropped
		// at once.
		if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE TABLE outbox_old PARTITION OF outbox FOR VALUES FROM ('%s') TO ('%s')",
			now.Add(-3*time.Hour).Format(time.RFC3339), now.Add(-30*time.Minute).Format(time.RFC3339))); err != nil {
			t.Fatal(err)
		}
	}
	gap := ids(insertRows(t, tx, "outbox", 100, "now() - interval '1 hour'", false))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	dropSlotAsADBA(f)
	// exited waits for d to exit by itself, with want (0: any failure),
	// while the 100 rows stay.
	exited := func(d *daemon, what string, want int) string {
		t.Helper()
		// Meanwhile the 100 rows stay: a daemon that went on (a new slot)
		// would let retention take them within seconds.
		for end := time.Now().Add(60 * time.Second); ; time.Sleep(250 * time.Millisecond) {
			if n := f.count("outbox", gap); n != len(gap) {
				t.Fatalf("%s: the retention job removed %d of the %d rows no slot had delivered\n%s", what, len(gap)-n, len(gap), d.Log())
			}
			if done, _ := d.Exited(0); done || time.Now().After(end) {
				break
			}
		}
		done, err := d.Exited(0)
		var ee *exec.ExitError
		if !done || !errors.As(err, &ee) || want != 0 && ee.ExitCode() != want {
			t.Fatalf("%s: want exit status %d (running: %t, exit: %v)\n%s", what, want, !done, err, d.Log())
		}
		return d.Log()
	}
	exited(d, "the outboxd that saw the slot dropped", 0)
	startKafka()

	// The supervisor's restarts: each refuses, none creates a slot.
	var log string
	for i := 0; i < 2; i++ {
		log = exited(f.spawn(cfg), fmt.Sprintf("restart %d", i+1), 3)
		var n int
		if err := f.mon.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.name).Scan(&n); err != nil || n != 0 {
			t.Fatalf("restart %d created the slot again (%d slots, %v)", i+1, n, err)
		}
	}
	if l := outboxd(t, f.dsn, "check", "-c", path).line("FAIL slot:"); !strings.Contains(l, "though outboxd has seen it") || !strings.Contains(l, "outboxd slot forget --gap-from") {
		t.Errorf("check does not fail the slot outboxd has seen: %q", l)
	}
	if r := outboxd(t, f.dsn, "slot", "forget", "-c", path, "--gap-from", "0/1"); r.code != 2 || !strings.Contains(r.stderr, "is not where the gap begins") {
		t.Fatalf("slot forget with a wrong position: want exit 2\n%s", r)
	}
	forgetSlot(t, f.dsn, path, log)

	// The operator's start: a new slot, and the job running on it.
	d = f.start(cfg)
	after := insertRows(t, f.db, "outbox", 5, "now()", false)
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if n := f.count("outbox", gap); n != len(gap) {
			t.Fatalf("the retention job removed %d of the %d rows committed before the new slot existed\n%s", len(gap)-n, len(gap), d.Log())
		}
	}
	if r := outboxd(t, f.dsn, "replay", "-c", path, "--from", "2h", "--to", "30m"); r.code != 0 {
		t.Fatalf("replay of the gap:\n%s", r)
	}
	wantRecords(t, topic, append(ids(before, after), gap...))
	d.term()
}

// TestSlotMadeByHandAfterADrop: the slot dropped while Kafka is down (100
// undelivered rows dated an hour ago, in a table without publicat_en), the
// outboxd that finds it missing exits, and the DBA creates the slot again
// by hand. The next start streams from it, warning that the events in
// between are in no slot, and the retention job takes it for the new slot
// it is: the 100 rows stay in the table.
func TestSlotMadeByHandAfterADrop(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	ctx := context.Background()
	route := seedRoute(f.topic("comandes"))
	route.More = testenv.Section{"columns": `{publicat_en: "-"}`}
	cfg := f.config(route)
	cfg.Retention = map[string]string{"max_age": "10m", "interval": "300ms", "confirm_timeout": "1s"}
	d := f.start(cfg)
	insertRows(t, f.db, "outbox", 5, "now()", false)
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	startKafka := stopKafka(t)
	gap := ids(insertRows(t, f.db, "outbox", 100, "now() - interval '1 hour'", false))
	dropSlotAsADBA(f)
	if err := d.exited(60 * time.Second); err == nil {
		t.Fatalf("outboxd exited with status 0 after its slot was dropped\n%s", d.Log())
	}
	startKafka()
	mustExec(f, fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", f.name))
	// The position seen stays the old slot's: the one made by hand is not it.
	seen := func() (s string) {
		t.Helper()
		if err := f.mon.QueryRow(ctx, "SELECT seen_lsn::text FROM outboxd_slots WHERE slot = $1", f.name).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	was := seen()
	if err := catalog.SeeSlot(ctx, f.mon.PgConn(), outboxdSlots, f.name); err != nil || seen() != was {
		t.Fatalf("the position seen moved to the slot made by hand (%s, was %s, %v)", seen(), was, err)
	}

	d = f.start(cfg)
	insertRows(t, f.db, "outbox", 5, "now()", false)
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if n := f.count("outbox", gap); n != len(gap) {
			t.Fatalf("the retention job removed %d of the %d rows committed before the slot made by hand\n%s", len(gap)-n, len(gap), d.Log())
		}
	}
	if !strings.Contains(d.Log(), "created again outside outboxd") {
		t.Fatalf("the start on the slot made by hand does not warn of the gap:\n%s", d.Log())
	}
	// Recorded as new, the position seen follows it (RecordKeeper's update).
	before, _ := f.slot()
	if err := catalog.SeeSlot(ctx, f.mon.PgConn(), outboxdSlots, f.name); err != nil {
		t.Fatal(err)
	}
	if s := lsn(t, seen()); s < before {
		t.Fatalf("the position seen is %s, behind the slot's %s", s, before)
	}
	d.term()
}

// outboxdSlots is the slot record's default table.
var outboxdSlots = catalog.Table{Schema: "public", Name: "outboxd_slots"}

// dropSlotAsADBA frees the WAL the slot holds the usual way: its walsender
// terminated, then the slot dropped (outboxd reconnects meanwhile, so
// until the drop finds the slot inactive).
func dropSlotAsADBA(f *fixture) {
	f.t.Helper()
	ctx := context.Background()
	eventually(f.t, 30*time.Second, "the slot dropped", func() bool {
		_, _ = f.mon.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active", f.name)
		_, err := f.mon.Exec(ctx, "SELECT pg_drop_replication_slot($1)", f.name)
		return err == nil
	})
}

// forgetSlot does what the error of a missing slot in log tells the
// operator: outboxd slot forget with the position it names.
func forgetSlot(t *testing.T, dsn, path, log string) {
	t.Helper()
	m := regexp.MustCompile(`slot forget -c \S+ --gap-from ([0-9A-F]+/[0-9A-F]+)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("the error does not name the command and the gap:\n%s", log)
	}
	if r := outboxd(t, dsn, "slot", "forget", "-c", path, "--gap-from", m[1]); r.code != 0 || !strings.Contains(r.stdout, "forgot replication slot") {
		t.Fatalf("slot forget --gap-from %s:\n%s", m[1], r)
	}
}

// TestSlotRecordNeedsItsTable: a role that may not create the slot record
// (no CREATE on public, PostgreSQL 15's default) streams on, says once what
// it loses, and its retention job deletes nothing, saying why. Once the
// shipped sql/005_slot_record.sql made the table, the next start records
// the slot it finds, as found now: rows older than that stay in the table
// (docs/operations.md, upgrading).
func TestSlotRecordNeedsItsTable(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	ctx := context.Background()
	const password = "pw-record-5"
	role := f.name + "_role"
	mustExec(f, fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'", role, password))
	t.Cleanup(func() { _, _ = f.mon.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	mustExec(f, fmt.Sprintf("GRANT SELECT, DELETE ON outbox TO %s", role))
	mustExec(f, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE outbox WITH (publish = 'insert')", f.name))
	// PostgreSQL 15 took CREATE on the public schema from PUBLIC; before,
	// every role may create the record's table there.
	mustExec(f, "REVOKE CREATE ON SCHEMA public FROM PUBLIC")
	topic := f.topic("comandes")
	cfg := f.config(seedRoute(topic))
	cfg.DSN = roleDSN(f, role, password)
	cfg.Postgres["create_publication"] = "false"
	cfg.Retention = testenv.Section{"max_age": "1h", "interval": "300ms", "confirm_timeout": "1s"}
	d := f.start(cfg)
	old := insertRows(t, f.db, "outbox", 20, "now() - interval '2 hours'", false)
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if n := f.count("outbox", ids(old)); n != len(old) {
			t.Fatalf("without a slot record the retention job deleted %d of %d rows\n%s", len(old)-n, len(old), d.Log())
		}
	}
	log := d.Log()
	for _, want := range []string{"cannot keep the slot record", "sql/005_slot_record.sql", "the slot record public.outboxd_slots cannot be read"} {
		if !strings.Contains(log, want) {
			t.Fatalf("the log does not say %q:\n%s", want, log)
		}
	}
	if n := strings.Count(log, "cannot keep the slot record"); n != 1 {
		t.Errorf("the missing slot record said %d times, want once", n)
	}
	wantRecords(t, topic, ids(old))
	d.term()
	if l := outboxd(t, cfg.DSN, "check", "-c", f.configFile(cfg)).line("WARN slot record:"); !strings.Contains(l, "may not create it") || !strings.Contains(l, "sql/005_slot_record.sql") {
		t.Errorf("check does not warn that the slot record cannot be made: %q", l)
	}

	file, err := os.ReadFile(filepath.Join("..", "sql", "005_slot_record.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.PgConn().Exec(ctx, strings.ReplaceAll(string(file), "TO outboxd;", "TO "+role+";")).ReadAll(); err != nil {
		t.Fatalf("sql/005_slot_record.sql: %v", err)
	}
	d = f.start(cfg)
	var covers string
	eventually(t, 10*time.Second, "the slot recorded", func() bool {
		return f.mon.QueryRow(ctx, "SELECT covers::text FROM outboxd_slots WHERE slot = $1", f.name).Scan(&covers) == nil
	})
	if covers != "[]" {
		t.Fatalf("a slot found without a row is recorded as covering %s, as if it had begun with a cut-over", covers)
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if n := f.count("outbox", ids(old)); n != len(old) {
			t.Fatalf("the retention job deleted %d of %d rows older than the slot's record\n%s", len(old)-n, len(old), d.Log())
		}
	}
	d.term()
}

// stopKafka stops the shared broker until the function it returns starts
// it again, or the test ends.
func stopKafka(t *testing.T) (start func()) {
	t.Helper()
	if err := env.StopKafka(); err != nil {
		t.Fatal(err)
	}
	up := false
	t.Cleanup(func() {
		if !up {
			_ = env.StartKafka()
		}
	})
	return func() {
		t.Helper()
		if err := env.StartKafka(); err != nil {
			t.Fatal(err)
		}
		up = true
	}
}
