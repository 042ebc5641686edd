package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/integration/testenv"
)

const debeziumSchema = `
CREATE SCHEMA pagaments;
CREATE TABLE pagaments.outboxevent (
    id            UUID        PRIMARY KEY,
    aggregatetype TEXT        NOT NULL,
    aggregateid   TEXT        NOT NULL,
    type          TEXT        NOT NULL,
    payload       JSONB       NOT NULL,
    timestamp     TIMESTAMPTZ NOT NULL DEFAULT now()
);
`

const debeziumRoute = `  - table: pagaments.outboxevent
    topic: %s
    columns: {id: id, agregat_id: aggregateid, tipus: type, versio: "-", carrega: payload, creat_en: timestamp}
`

// TestEndToEnd: thousands of rows in transactions of mixed sizes, many
// aggregates, two tables (seed and Debezium column names) routed to two
// topics; every record exactly as specified, per-aggregate commit order.
func TestEndToEnd(t *testing.T) {
	f := newFixture(t, seedSchema+debeziumSchema, map[string]int{"comandes": 6, "pagaments": 4})
	ctx := context.Background()
	d := f.start(daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes")) + fmt.Sprintf(debeziumRoute, f.topic("pagaments"))})

	seed := newWriter(f, 1, 300, "outbox")
	dbz := newWriter(f, 2, 50, "pagaments.outboxevent")
	sizes := []int{1, 1, 2, 5, 10, 50, 200, 1, 3, 500}
	for i := 0; seed.n < 4000; i++ {
		if err := seed.txn(ctx, sizes[i%len(sizes)]); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			if err := dbz.txn(ctx, 5*(1+i%7)); err != nil {
				t.Fatal(err)
			}
		}
	}
	end := f.walLSN()
	r1 := seed.verify(ctx, f.topic("comandes"), "murmur2")
	r2 := dbz.verify(ctx, f.topic("pagaments"), "murmur2")
	f.waitConfirmed(end, 30*time.Second)
	t.Logf("comandes: %+v, pagaments: %+v", r1, r2)
	if r1.duplicates+r2.duplicates != 0 {
		t.Errorf("no crash happened, yet %d duplicates", r1.duplicates+r2.duplicates)
	}
	d.term()
}

// TestSlotHoldsWhileBrokerDown: with the broker stopped, new rows must not
// move confirmed_flush_lsn; once it is back, every row arrives and the slot
// catches up.
func TestSlotHoldsWhileBrokerDown(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 3})
	ctx := context.Background()
	d := f.start(daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes")), extra: "  # broker outage test\n"})
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
	before := f.walLSN()
	for i := 0; i < 30; i++ {
		if err := w.txn(ctx, 1+i%4); err != nil {
			t.Fatal(err)
		}
	}
	after := f.walLSN()
	// Sample the slot for a while: outboxd retries, reconnects and
	// replays, but the rows are not in Kafka, so the slot must not pass
	// the position where they begin.
	var maxSeen pglogrepl.LSN
	for deadline := time.Now().Add(12 * time.Second); time.Now().Before(deadline); {
		c, _ := f.slot()
		maxSeen = max(maxSeen, c)
		if c > before {
			t.Fatalf("broker down: confirmed_flush_lsn moved to %s, past %s where unacknowledged rows start", c, before)
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

// TestRestartKill9: kill -9 at random moments while a writer runs, restart
// each time: nothing missing, per-aggregate order of first deliveries kept.
func TestRestartKill9(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 4})
	ctx := context.Background()
	dc := daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes"))}
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
	d.term()
}

// TestRestartSigterm: SIGTERM while rows are being written, restart:
// nothing missing and nothing duplicated. Uses the crc32 partitioner.
func TestRestartSigterm(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 5})
	ctx := context.Background()
	dc := daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes")), partitioner: "crc32"}
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
	if rep.duplicates != 0 {
		t.Fatalf("SIGTERM and restart produced %d duplicates: %+v", rep.duplicates, rep)
	}
	t.Logf("SIGTERM mid-stream and restart: %+v", rep)
	d.term()
}

// TestIdleOutboxDoesNotPinWAL: the outbox stays idle while another table
// writes tens of MB of WAL; the slot follows the WAL end.
func TestIdleOutboxDoesNotPinWAL(t *testing.T) {
	f := newFixture(t, seedSchema+"CREATE TABLE soroll (id bigserial PRIMARY KEY, farciment text);", map[string]int{"comandes": 1})
	ctx := context.Background()
	d := f.start(daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes"))})
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

// TestAlterTableMidStream: columns are found by name from each Relation
// message, so dropping and adding columns while streaming changes nothing
// for consumers.
func TestAlterTableMidStream(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 2})
	ctx := context.Background()
	d := f.start(daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes"))})
	w := newWriter(f, 8, 20, "outbox")
	if err := w.txn(ctx, 10); err != nil {
		t.Fatal(err)
	}
	// Shift every column after agregat one position left, then add two at
	// the end, one of them between inserts of the same transaction.
	for _, sql := range []string{
		"ALTER TABLE outbox DROP COLUMN agregat",
		"ALTER TABLE outbox ADD COLUMN nota TEXT DEFAULT 'x'",
	} {
		if _, err := f.db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
		// The writer names agregat; give it a column of that name back at
		// the end of the table (a new attnum), so its inserts still work.
		if sql == "ALTER TABLE outbox DROP COLUMN agregat" {
			if _, err := f.db.Exec(ctx, "ALTER TABLE outbox ADD COLUMN agregat TEXT"); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.txn(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, agregat_id, tipus, carrega) VALUES ('00000000-0000-4000-8000-00000000aaaa', 'P-2026-000001', 'comanda.nota', '{\"abans\": true}')"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "ALTER TABLE outbox ADD COLUMN extra INTEGER"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, agregat_id, tipus, carrega, extra) VALUES ('00000000-0000-4000-8000-00000000bbbb', 'P-2026-000001', 'comanda.nota', '{\"despres\": true}', 7)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	w.order["P-2026-000001"] = append(w.order["P-2026-000001"], "00000000-0000-4000-8000-00000000aaaa", "00000000-0000-4000-8000-00000000bbbb")
	rep := w.verify(ctx, f.topic("comandes"), "murmur2")
	t.Logf("across ALTER TABLE: %+v", rep)
	d.term()
}

// TestBadRowStopsWithClearError: a row that cannot become a record (here a
// versio that is not a number, in a table without the seed's types) stops
// outboxd with an error naming the table, the column and the reason; the
// rows before it are delivered and the slot does not pass it.
func TestBadRowStopsWithClearError(t *testing.T) {
	schema := `CREATE TABLE outbox (id TEXT PRIMARY KEY, agregat TEXT, agregat_id TEXT, tipus TEXT, versio TEXT, carrega TEXT, creat_en TIMESTAMPTZ DEFAULT now());`
	f := newFixture(t, schema, map[string]int{"comandes": 1})
	ctx := context.Background()
	d := f.start(daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes"))})
	good := "INSERT INTO outbox (id, agregat, agregat_id, tipus, versio, carrega) VALUES ('%s', 'comanda', 'K-1', 'comanda.creada', '%s', '%s')"
	if _, err := f.db.Exec(ctx, fmt.Sprintf(good, "ok-1", "2", `{"a": 1}`)); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	before := f.walLSN()
	if _, err := f.db.Exec(ctx, fmt.Sprintf(good, "bad-1", "dos", `{"a": 2}`)); err != nil {
		t.Fatal(err)
	}
	err := d.exited(30 * time.Second)
	if err == nil {
		t.Fatal("outboxd exited 0 on a bad row")
	}
	log := d.logText()
	for _, want := range []string{"public.outbox", `column "versio"`, `"dos" is not an integer`} {
		if !contains(log, want) {
			t.Errorf("the error does not say %q:\n%s", want, log)
		}
	}
	if c, _ := f.slot(); c > before {
		t.Errorf("the slot moved to %s, past the bad row at %s", c, before)
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	msgs, _ := testenv.Consume(cctx, env.KafkaBrokers, f.topic("comandes"), 0)
	if len(msgs) != 1 || header(msgs[0], "id_esdeveniment") != "ok-1" {
		t.Errorf("want exactly the good row in Kafka, got %d records", len(msgs))
	}
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
	d := f.start(daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes"))})
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
	if !contains(d.logText(), "retrying") {
		t.Error("outboxd never logged a retry: the restart was not noticed")
	}
	t.Logf("PostgreSQL restarted fast and immediate: %+v", rep)
	d.term()
}

// TestSigtermInsideLargeTransaction: SIGTERM while a 40,000-row transaction
// is streaming. outboxd finishes the transaction, waits for Kafka, confirms
// and exits 0; the restart produces no duplicates.
func TestSigtermInsideLargeTransaction(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 3})
	ctx := context.Background()
	dc := daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes"))}
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
	var st struct {
		Counters struct {
			Events uint64 `json:"events"`
		} `json:"counters"`
	}
	deadline := time.Now().Add(30 * time.Second)
	for st.Counters.Events <= 5 {
		if time.Now().After(deadline) {
			t.Fatal("the big transaction never started streaming")
		}
		resp, err := http.Get("http://" + d.health + "/status")
		if err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
		}
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
	if rep.duplicates != 0 {
		t.Fatalf("SIGTERM at %d acknowledged records inside a transaction, then restart: %d duplicates", st.Counters.Events, rep.duplicates)
	}
	t.Logf("SIGTERM with %d of 40,005 records acknowledged: %+v", st.Counters.Events, rep)
	d.term()
}

// TestLeastPrivilegeRoleAndNoSecrets: outboxd runs as a role with only LOGIN,
// REPLICATION and SELECT on the outbox (sql/003_role.sql), on a publication
// created by the owner; its password never appears in a log line. With a
// wrong password it stops at once with a clear error, again without the
// password.
func TestLeastPrivilegeRoleAndNoSecrets(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 2})
	ctx := context.Background()
	const password = "s3cret-Pa55-do-not-log"
	role := f.name + "_role"
	for _, sql := range []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'", role, password),
		fmt.Sprintf("GRANT SELECT ON outbox TO %s", role),
		fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE outbox WITH (publish = 'insert')", f.name),
	} {
		if _, err := f.db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _, _ = f.mon.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	cfg, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	dsn := func(pw string) string {
		return fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", role, pw, cfg.Host, cfg.Port, cfg.Database)
	}
	dc := daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes")), dsn: dsn(password), postgres: "  create_publication: false\n"}
	d := f.start(dc)
	w := newWriter(f, 11, 20, "outbox")
	for i := 0; i < 10; i++ {
		if err := w.txn(ctx, 1+i); err != nil {
			t.Fatal(err)
		}
	}
	w.verify(ctx, f.topic("comandes"), "murmur2")
	d.term()
	if log := d.logText(); contains(log, password) {
		t.Fatalf("the password is in the log:\n%s", log)
	}

	const wrong = "Wr0ng-pa55word-also-secret"
	dc.dsn = dsn(wrong)
	bad := f.spawn(dc)
	if err := bad.exited(30 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 with a wrong password")
	}
	log := bad.logText()
	if contains(log, wrong) || contains(log, password) {
		t.Fatalf("a password is in the log:\n%s", log)
	}
	if !contains(log, "password authentication failed") || !contains(log, "check postgres.dsn") {
		t.Fatalf("the error does not say what is wrong:\n%s", log)
	}

	// The role loses REPLICATION: a clear error naming the privilege.
	if _, err := f.db.Exec(ctx, "ALTER ROLE "+role+" NOREPLICATION"); err != nil {
		t.Fatal(err)
	}
	dc.dsn = dsn(password)
	noRepl := f.spawn(dc)
	if err := noRepl.exited(30 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 without the REPLICATION privilege")
	}
	if log := noRepl.logText(); !contains(log, "REPLICATION") || contains(log, password) {
		t.Fatalf("the error does not name the missing privilege (or shows the password):\n%s", log)
	}
}

// TestMissingTopicAutoCreated: like the Java producer, outboxd asks the
// broker to create a missing topic; with auto.create.topics.enable=true (the
// test broker's setting) the events arrive.
func TestMissingTopicAutoCreated(t *testing.T) {
	f := newFixture(t, seedSchema, nil)
	ctx := context.Background()
	topic := f.name + ".autocreada"
	d := f.start(daemonConfig{routes: fmt.Sprintf(seedRoute, topic)})
	w := newWriter(f, 12, 5, "outbox")
	for i := 0; i < 5; i++ {
		if err := w.txn(ctx, 2); err != nil {
			t.Fatal(err)
		}
	}
	f.topics[topic] = 1 // the broker's num.partitions
	rep := w.verify(ctx, topic, "murmur2")
	t.Logf("auto-created topic: %+v", rep)
	d.term()
}
