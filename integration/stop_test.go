package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// TestFatalStopConfirmsAcknowledgedWork: outboxd stops on a bad row
// (on_error: stop) right behind a backlog of good transactions. Before it
// exits it confirms the ones Kafka acknowledged, so a crash loop does not
// produce them again: after two failed starts and a third with the route
// switched to dead_letter, every good event is on the topic exactly once.
func TestFatalStopConfirmsAcknowledgedWork(t *testing.T) {
	f := newFixture(t, looseSchema, map[string]int{"comandes": 3, "comandes.dlq": 1})
	ctx := context.Background()
	cfg := f.config(seedRoute(f.topic("comandes")))
	cfg.Postgres["snapshot"] = "none" // the loose table has no publicat_en
	f.start(cfg).term()               // creates the slot and the publication
	start, _ := f.slot()

	const good = 200
	ins := "INSERT INTO outbox (id, agregat, agregat_id, tipus, versio, carrega) VALUES ($1, 'comanda', $2, 'comanda.creada', '1', $3)"
	for i := 0; i < good; i++ {
		if _, err := f.db.Exec(ctx, ins, fmt.Sprintf("good-%03d", i), fmt.Sprintf("K-%d", i%17), `{"n": 1}`); err != nil {
			t.Fatal(err)
		}
	}
	lastGood := f.walLSN()
	if _, err := f.db.Exec(ctx, ins, "bad-1", "K-bad", "not JSON"); err != nil {
		t.Fatal(err)
	}
	for run := 1; run <= 2; run++ {
		d := f.spawn(cfg)
		if err := d.exited(60 * time.Second); err == nil {
			t.Fatalf("run %d: outboxd exited 0 on a bad row", run)
		}
		if log := d.Log(); !strings.Contains(log, `id="bad-1"`) {
			t.Fatalf("run %d: the error does not name the row:\n%s", run, log)
		}
		c, _ := f.slot()
		if c < lastGood || c <= start {
			t.Fatalf("run %d: the slot is at %s after the stop, below the acknowledged transactions (%s)", run, c, lastGood)
		}
	}
	dl := f.config(dlqRoute(f.topic("comandes"), f.topic("comandes.dlq")))
	dl.Postgres["snapshot"] = "none"
	d := f.start(dl)
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	d.term()
	msgs := consumeExactly(t, f.topic("comandes"), good)
	seen := map[string]int{}
	for _, m := range msgs {
		seen[header(m, "id_esdeveniment")]++
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s is on the topic %d times", id, n)
		}
	}
	if len(seen) != good {
		t.Errorf("%d distinct events, want %d", len(seen), good)
	}
	if dlq := consumeExactly(t, f.topic("comandes.dlq"), 1); header(dlq[0], "id_esdeveniment") != "bad-1" {
		t.Errorf("the dead-letter topic holds %s", header(dlq[0], "id_esdeveniment"))
	}
}

// TestCleanStopKeepsTheConnectionAlive: a clean stop waits for the broker
// longer than the server's wal_sender_timeout (3 s here). Reading from the
// server and answering its keepalives meanwhile keeps the walsender alive,
// so once the broker returns the final position reaches the server: the log
// says "stopped cleanly" and a restart produces no duplicate.
func TestCleanStopKeepsTheConnectionAlive(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 2})
	ctx := context.Background()
	cfg := f.config(seedRoute(f.topic("comandes")))
	cfg.DSN = f.dsn + "&options=-c%20wal_sender_timeout%3D3s"
	cfg.Postgres["idle_status_interval"] = "1s"
	cfg.Kafka["max_attempts"] = "1000" // retries outlast the outage: the acknowledgements come late, not never
	cfg.Kafka["delivery_timeout"] = "120s"
	cfg.Pipeline["shutdown_timeout"] = "60s"
	d := f.start(cfg)
	w := newWriter(f, 31, 20, "outbox")
	if err := w.txn(ctx, 1); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.walLSN(), 30*time.Second)

	if err := env.StopKafka(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = env.StartKafka()
		}
	})
	for i := 0; i < 10; i++ {
		if err := w.txn(ctx, 3); err != nil {
			t.Fatal(err)
		}
	}
	end := f.walLSN()
	// Every one of them read (a clean stop finishes the open transaction,
	// it does not read further ones): 10 transactions of 3 rows in flight.
	eventually(t, 20*time.Second, "all 30 records in flight", func() bool { return d.status().InFlight.Events >= 30 })
	if err := d.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * time.Second) // well past wal_sender_timeout
	if !d.Running() {
		t.Fatalf("outboxd gave up waiting for the broker:\n%s", d.Log())
	}
	if err := env.StartKafka(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	if err := d.exited(60 * time.Second); err != nil {
		t.Fatalf("exit after the clean stop: %v\n%s", err, d.Log())
	}
	if log := d.Log(); !strings.Contains(log, "stopped cleanly") || strings.Contains(log, "may not have reached PostgreSQL") {
		t.Fatalf("the clean stop did not end cleanly:\n%s", log)
	}
	if c, _ := f.slot(); c < end {
		t.Fatalf("the final position %s did not reach the server (rows end at %s)", c, end)
	}
	d2 := f.start(cfg)
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	d2.term()
	rep := w.verify(ctx, f.topic("comandes"), "murmur2")
	if rep.Duplicates != 0 {
		t.Fatalf("a restart after the clean stop produced %d duplicates: %+v", rep.Duplicates, rep)
	}
}

// TestSignals: SIGHUP is a clean stop (exit 0, nothing produced again); a
// second SIGTERM during a clean stop that waits for an unreachable broker
// exits at once, with status 1, saying so.
func TestSignals(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	ctx := context.Background()
	cfg := f.config(seedRoute(f.topic("comandes")))
	d := f.start(cfg)
	w := newWriter(f, 37, 10, "outbox")
	if err := w.txn(ctx, 5); err != nil {
		t.Fatal(err)
	}
	end := f.walLSN()
	f.waitConfirmed(end, 30*time.Second)
	if err := d.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if err := d.exited(30 * time.Second); err != nil {
		t.Fatalf("SIGHUP: %v\n%s", err, d.Log())
	}
	if !strings.Contains(d.Log(), "stopped cleanly") {
		t.Fatalf("SIGHUP is not a clean stop:\n%s", d.Log())
	}

	// A broker address that never answers: records wait in flight, and
	// the clean stop waits for them up to shutdown_timeout (60 s).
	dead := f.config(seedRoute(f.topic("comandes")))
	dead.Brokers = freePort(t)
	dead.Pipeline["shutdown_timeout"] = "60s"
	d2 := f.spawn(dead)
	if err := d2.WaitState(ctx, "streaming", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := w.txn(ctx, 5); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "records in flight", func() bool { return d2.status().InFlight.Events > 0 })
	if err := d2.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the clean stop under way", func() bool { return strings.Contains(d2.Log(), "stopping") })
	second := time.Now()
	if err := d2.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := d2.exited(10 * time.Second)
	took := time.Since(second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("second SIGTERM: exit %v, want status 1\n%s", err, d2.Log())
	}
	if !strings.Contains(d2.Log(), "second signal (terminated) during the clean stop: exiting at once") {
		t.Fatalf("the second signal is not explained:\n%s", d2.Log())
	}
	t.Logf("exited %s after the second SIGTERM", took.Round(time.Millisecond))
	// Nothing was lost: a normal start delivers the rows that waited.
	d3 := f.start(cfg)
	w.verify(ctx, f.topic("comandes"), "murmur2")
	d3.term()
}

// TestFatalLineFollowsTheLogFormat: under log.format: json every line,
// the last one that says why outboxd stopped included, is a JSON object.
func TestFatalLineFollowsTheLogFormat(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	cfg := f.config(seedRoute(f.topic("comandes")))
	cfg.Log["format"] = "json"
	cfg.Postgres["create_publication"] = "false" // absent and not to be created: fatal
	d := f.spawn(cfg)
	if err := d.exited(30 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 without its publication")
	}
	var last map[string]any
	for _, line := range strings.Split(strings.TrimSpace(d.Log()), "\n") {
		if strings.HasPrefix(line, "==== testenv") {
			continue
		}
		last = nil
		if err := json.Unmarshal([]byte(line), &last); err != nil {
			t.Fatalf("not a JSON line under log.format json: %q", line)
		}
	}
	if msg, _ := last["@message"].(string); last["@level"] != "error" || !strings.Contains(msg, "does not exist") || !strings.Contains(msg, "CREATE PUBLICATION") {
		t.Fatalf("the last line is not the fatal error: %v", last)
	}
}

// debeziumNoTimestamp is Debezium's outbox table without its optional
// timestamp column, with the publicat_en column a polling relay set: the
// cut-over has pending rows and nothing to order them by.
const debeziumNoTimestamp = `CREATE SCHEMA inventory;
CREATE TABLE inventory.outboxevent (id UUID PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL,
	type VARCHAR(255) NOT NULL, payload JSONB, publicat_en TIMESTAMPTZ);
INSERT INTO inventory.outboxevent (id, aggregatetype, aggregateid, type, payload)
	SELECT gen_random_uuid(), 'payment', 'PG-' || g, 'PaymentCaptured', '{}' FROM generate_series(1, 5) g;`

// debeziumNoTimestampRoute routes that table with preset: debezium (whose
// creat_en is the column timestamp) and its publicat_en.
func debeziumNoTimestampRoute(topic string) testenv.Route {
	return testenv.Route{Table: "inventory.outboxevent", Topic: topic,
		More: testenv.Section{"preset": "debezium", "columns": "{publicat_en: publicat_en}"}}
}

// TestFatalErrorStopsEveryPart: the runner's fatal error (a cut-over that
// cannot order its pending rows) stops the daemon at once with that error,
// with exit status 1, whichever part runs beside the runner: the health
// server and monitor (on in every test), mark_published's marker, the
// retention job. (Before, the daemon waited for the retention job, which
// ran until SIGTERM: it hung, silent.)
func TestFatalErrorStopsEveryPart(t *testing.T) {
	f := newFixture(t, debeziumNoTimestamp, map[string]int{"pagaments": 1})
	for _, tt := range []struct {
		part string
		set  func(cfg *testenv.Config)
	}{
		{"health server and monitor", func(*testenv.Config) {}},
		{"mark_published", func(cfg *testenv.Config) { cfg.Postgres["mark_published"] = "true" }},
		{"retention", func(cfg *testenv.Config) {
			cfg.Retention = testenv.Section{"max_age": "1h", "interval": "1s"}
		}},
	} {
		t.Run(tt.part, func(t *testing.T) {
			cfg := f.config(debeziumNoTimestampRoute(f.topic("pagaments")))
			tt.set(&cfg)
			d := f.spawn(cfg)
			// Generous for a loaded machine; the daemon that waited for
			// its retention job never exited at all.
			err := d.exited(90 * time.Second)
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("outboxd exited with %v, want status 1\n%s", err, d.Log())
			}
			if log := d.Log(); !strings.Contains(log, `has no column "timestamp"`) {
				t.Fatalf("the exit does not say why:\n%s", log)
			}
		})
	}
}

// TestMarkFailureStopsTheDaemon: check fails a role that lacks UPDATE on
// publicat_en under mark_published, with the grant; started anyway, the
// marker's permanent failure stops the daemon at once, with the grant, while the retention job and the health server run beside
// it; no row is marked and the slot does not pass the row. The same on a
// preset: debezium route, whose rows were not marked at all before (the
// slot passed them unmarked).
func TestMarkFailureStopsTheDaemon(t *testing.T) {
	for _, tt := range []struct {
		name, schema, table string
		route               func(topic string) testenv.Route
		retention           bool
	}{
		{"retention beside", seedSchema, "public.outbox", seedRoute, true},
		{"preset debezium", debeziumRelayOutbox, "inventory.outboxevent", func(topic string) testenv.Route {
			return testenv.Route{Table: "inventory.outboxevent", Topic: topic, More: testenv.Section{"preset": "debezium", "columns": "{publicat_en: publicat_en}"}}
		}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.schema, map[string]int{"comandes": 1})
			const password = "pw-mark-7"
			role := f.name + "_role"
			mustExec(f, fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'", role, password))
			t.Cleanup(func() { _, _ = f.mon.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
			if tt.table != "public.outbox" {
				mustExec(f, fmt.Sprintf("GRANT USAGE ON SCHEMA inventory TO %s", role))
			}
			mustExec(f, fmt.Sprintf("GRANT SELECT, DELETE ON %s TO %s", tt.table, role))
			mustExec(f, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')", f.name, tt.table))
			cfg := f.config(tt.route(f.topic("comandes")))
			cfg.DSN = roleDSN(f, role, password)
			cfg.Postgres["create_publication"] = "false"
			cfg.Postgres["snapshot"] = "none"
			cfg.Postgres["mark_published"] = "true"
			if tt.retention {
				cfg.Retention = testenv.Section{"max_age": "1h", "interval": "1s"}
			}
			r := outboxd(t, cfg.DSN, "check", "-c", f.configFile(cfg))
			wantCheckFails(t, r, "table "+tt.table, "may not UPDATE publicat_en", "GRANT UPDATE (publicat_en)")
			d := f.start(cfg)
			const id = "00000000-0000-4000-9000-00000000aaaa"
			if tt.table == "public.outbox" {
				mustExec(f, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega) VALUES ('`+id+`', 'comanda', 'P-1', 'comanda.creada', '{}')`)
			} else {
				mustExec(f, `INSERT INTO inventory.outboxevent (id, aggregatetype, aggregateid, type, payload) VALUES ('`+id+`', 'payment', 'PG-1', 'PaymentCaptured', '{}')`)
			}
			err := d.exited(90 * time.Second)
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("outboxd exited with %v, want status 1\n%s", err, d.Log())
			}
			if log := d.Log(); !strings.Contains(log, "permission denied") || !strings.Contains(log, "GRANT UPDATE (publicat_en)") {
				t.Fatalf("the exit does not say what to grant:\n%s", log)
			}
			var marked int
			if err := f.mon.QueryRow(context.Background(), "SELECT count(publicat_en) FROM "+tt.table).Scan(&marked); err != nil || marked != 0 {
				t.Fatalf("%d rows marked (%v)", marked, err)
			}
			if passed := f.slotPassed(id); len(passed) > 0 {
				t.Fatalf("the slot passed the row whose mark failed: %v", passed)
			}
		})
	}
}
