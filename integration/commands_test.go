package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/testenv"
)

// The operator commands (check, status, slot drop) run through the built
// binary against the real services.

// cmdResult is one finished outboxd command.
type cmdResult struct {
	stdout, stderr string
	code           int
}

func (r cmdResult) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

// line returns the stdout line that starts with prefix ("FAIL wal_level:").
func (r cmdResult) line(prefix string) string {
	for _, l := range strings.Split(r.stdout, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// outboxd runs the binary with dsn for the configuration's postgres.dsn.
func outboxd(t *testing.T, dsn string, args ...string) cmdResult {
	t.Helper()
	cmd, err := testenv.Command(dsn, args...)
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("outboxd %v: %v", args, err)
	}
	return cmdResult{out.String(), errb.String(), cmd.ProcessState.ExitCode()}
}

// configFile writes cfg and returns its path.
func (f *fixture) configFile(cfg testenv.Config) string {
	f.t.Helper()
	path := filepath.Join(f.t.TempDir(), "outboxd.yaml")
	if err := cfg.WriteFile(path); err != nil {
		f.t.Fatal(err)
	}
	return path
}

// wantCheckFails requires a non-zero exit and a FAIL line for check name
// that contains every want.
func wantCheckFails(t *testing.T, r cmdResult, name string, want ...string) {
	t.Helper()
	if r.code != 1 {
		t.Fatalf("check: want exit 1\n%s", r)
	}
	l := r.line("FAIL " + name + ":")
	if l == "" {
		t.Fatalf("check: no FAIL %s line\n%s", name, r)
	}
	for _, w := range want {
		if !strings.Contains(l, w) {
			t.Errorf("check: the FAIL %s line lacks %q: %s", name, w, l)
		}
	}
	if !strings.Contains(l, " — fix: ") {
		t.Errorf("check: the FAIL line has no fix hint: %s", l)
	}
}

// TestCheckPassesOnAGoodSetup: on the seed schema with its topic, check
// passes every line, before the first run (slot and publication to be
// created) and after a clean stop (both exist).
func TestCheckPassesOnAGoodSetup(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 3})
	dc := f.config(seedRoute(f.topic("comandes")))
	path := f.configFile(dc)
	major, err := env.PGMajor()
	if err != nil {
		t.Fatal(err)
	}
	// The failover line: a pass on 17, the window's warning before.
	failover := func(state string) string {
		if major >= 17 {
			return "PASS failover: slot " + f.name + " " + state
		}
		return fmt.Sprintf("WARN failover: PostgreSQL %d has no failover slots", major)
	}
	allPass := func(r cmdResult, want ...string) {
		t.Helper()
		t.Logf("check:\n%s", r)
		if r.code != 0 {
			t.Fatalf("check on a good setup:\n%s", r)
		}
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		for _, l := range lines {
			// Before PostgreSQL 17 the failover line warns about the window
			// a failover loses (it cannot pass: no failover slots).
			if major < 17 && strings.HasPrefix(l, "WARN failover: PostgreSQL ") {
				continue
			}
			if !strings.HasPrefix(l, "PASS ") {
				t.Errorf("not a PASS line: %s", l)
			}
		}
		if len(lines) < 11 {
			t.Errorf("%d lines, want at least 11 checks\n%s", len(lines), r)
		}
		for _, w := range want {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("output lacks %q\n%s", w, r)
			}
		}
		if !strings.Contains(r.line("PASS database:"), "connected to postgres://postgres@") {
			t.Errorf("the database line does not show the DSN\n%s", r)
		}
	}
	allPass(outboxd(t, f.dsn, "check", "-c", path),
		"PASS wal_level: logical", "PASS slot: "+f.name+" does not exist; will be created",
		"PASS publication: "+f.name+" does not exist; will be created", "PASS topic "+f.topic("comandes")+": exists, 3 partition(s)",
		"PASS table public.outbox: id uuid, agregat_id text, tipus text, versio integer, carrega jsonb, creat_en timestamp with time zone",
		"PASS kafka idempotence: the brokers give outboxd a producer id",
		"PASS streaming: on: the server streams transactions larger than logical_decoding_work_mem",
		failover("will be created for the cut-over, and made a failover slot once its snapshot is in Kafka"))

	// Against a running instance: the normal state of a deployment, so
	// check works as a live diagnostic and names the slot's holder.
	d := f.start(dc)
	allPass(outboxd(t, f.dsn, "check", "-c", path),
		"PASS slot: "+f.name+" is streaming to PID ", "(outboxd from 127.0.0.1)", "PASS max_wal_senders: ", "ours among them",
		failover("is a failover slot"))
	d.term()
	allPass(outboxd(t, f.dsn, "check", "-c", path),
		"PASS slot: "+f.name+" exists, inactive", "PASS publication: "+f.name+" publishes inserts of public.outbox",
		"PASS max_replication_slots: our slot already exists")

	// A topic that does not exist is reported as one the broker will create
	// when it auto-creates (outboxd's producer asks it to), and check itself
	// does not create it.
	missing := f.topic("absent")
	allPass(outboxd(t, f.dsn, "check", "-c", f.configFile(f.config(seedRoute(missing)))),
		"PASS topic "+missing+": does not exist; will be created if the broker's auto.create.topics.enable is true")
	if n := topicPartitions(t, missing); n != 0 {
		t.Errorf("check created topic %s (%d partitions): it must only look", missing, n)
	}
}

// topicPartitions counts a topic's partitions without asking for it by name.
func topicPartitions(t *testing.T, topic string) int {
	t.Helper()
	conn, err := kafka.Dial("tcp", env.KafkaBrokers)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	parts, err := conn.ReadPartitions()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range parts {
		if p.Topic == topic {
			n++
		}
	}
	return n
}

// TestCheckNamesWhatTheLostSlotSnapshotMisses: where a failover loses the
// slot (before PostgreSQL 17; on 17, failover_slot: false), the snapshot
// of the re-created slot publishes again the pending rows of a table with
// a publicat_en column whose rows stay in it, and nothing else. check's
// failover line names the tables it covers, and a warning names each route
// it does not: a logical-message route, a table without publicat_en ("-")
// and a table whose service deletes each row in the inserting transaction
// (told by its statistics: inserted and deleted alike, empty).
func TestCheckNamesWhatTheLostSlotSnapshotMisses(t *testing.T) {
	schema := seedSchema + `
CREATE TABLE events (id UUID PRIMARY KEY, agregat TEXT NOT NULL, agregat_id TEXT NOT NULL, tipus TEXT NOT NULL,
	versio INTEGER NOT NULL DEFAULT 1, carrega JSONB NOT NULL, creat_en TIMESTAMPTZ NOT NULL DEFAULT now());
CREATE TABLE fleeting (LIKE outbox INCLUDING ALL);`
	f := newFixture(t, schema, map[string]int{"comandes": 1, "events": 1, "fleeting": 1, "missatges": 1})
	ctx := context.Background()
	// The service of fleeting deletes each event in its own transaction,
	// on a connection of its own whose end sends its statistics.
	svc, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if _, err := svc.Exec(ctx, `BEGIN;
			INSERT INTO fleeting (id, agregat, agregat_id, tipus, carrega) VALUES ('00000000-0000-0000-0000-00000000000`+fmt.Sprint(i)+`', 'comanda', 'P-1', 'comanda.creada', '{}');
			DELETE FROM fleeting;
			COMMIT`); err != nil {
			t.Fatal(err)
		}
	}
	svc.Close(ctx)
	eventually(t, 30*time.Second, "the statistics of fleeting count its inserts", func() bool {
		var n int64
		return f.mon.QueryRow(ctx, "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = 'fleeting'::regclass").Scan(&n) == nil && n == 5
	})

	cfg := f.config(seedRoute(f.topic("comandes")),
		testenv.Route{Table: "public.events", Topic: f.topic("events"), More: testenv.Section{"columns": `{publicat_en: "-"}`}},
		testenv.Route{Table: "public.fleeting", Topic: f.topic("fleeting")},
		testenv.Route{Message: f.name, Topic: f.topic("missatges")})
	cfg.Postgres["failover_slot"] = "false" // PostgreSQL 17 loses the slot too
	r := outboxd(t, f.dsn, "check", "-c", f.configFile(cfg))
	t.Logf("check:\n%s", r)
	if r.code != 0 {
		t.Fatalf("check fails (warnings should not):\n%s", r)
	}
	main := r.line("WARN failover: ")
	if !strings.Contains(main, "pending (publicat_en NULL) of public.outbox, which covers") || strings.Contains(main, "public.events") || strings.Contains(main, "public.fleeting") {
		t.Errorf("the failover line does not name public.outbox alone as covered: %s", main)
	}
	for prefix, want := range map[string]string{
		fmt.Sprintf("WARN failover message prefix %q: ", f.name): "logical messages are in no table",
		"WARN failover public.events: ":                          `columns.publicat_en is "-"`,
		"WARN failover public.fleeting: ":                        "empty though 5 rows were inserted and 5 deleted",
	} {
		if l := r.line(prefix); !strings.Contains(l, want) || !strings.Contains(l, " — fix: ") {
			t.Errorf("check has no warning %q...%q with a fix; the line: %q", prefix, want, l)
		}
	}
	if l := r.line("WARN failover public.outbox"); l != "" {
		t.Errorf("check warns about a covered table: %s", l)
	}
}

// TestCheckFailsOnWalLevelReplica: a second throwaway cluster with
// wal_level=replica.
func TestCheckFailsOnWalLevelReplica(t *testing.T) {
	needEnv(t)
	replica := startEnv(t, "a wal_level=replica cluster", testenv.Options{NoKafka: true, WALLevel: "replica"})
	dsn, err := replica.CreateDatabase("km0_replica", seedSchema)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, env: env, name: "km0_replica", dsn: dsn} // the main broker
	r := outboxd(t, dsn, "check", "-c", f.configFile(f.config(seedRoute("km0_replica.comandes"))))
	wantCheckFails(t, r, "wal_level", "wal_level is replica", "wal_level = logical", "restart")
	if l := r.line("PASS table public.outbox:"); l == "" {
		t.Errorf("the other checks still run after wal_level fails\n%s", r)
	}
}

// TestCheckFails: each broken setup fails check with its line.
func TestCheckFails(t *testing.T) {
	tests := []struct {
		name  string
		setup func(f *fixture) (testenv.Config, string) // config and the DSN outboxd uses
		check string
		want  []string
	}{
		{"MissingColumn", func(f *fixture) (testenv.Config, string) {
			route := seedRoute(f.topic("comandes"))
			route.More = testenv.Section{"columns": "{tipus: kind}"}
			return f.config(route), f.dsn
		}, "table public.outbox", []string{"column kind (columns.tipus) does not exist", "set routes[].columns.tipus to one of: agregat, agregat_id"}},
		{"TimestampWithoutTimeZone", func(f *fixture) (testenv.Config, string) {
			mustExec(f, "ALTER TABLE outbox ALTER COLUMN creat_en TYPE timestamp")
			return f.config(seedRoute(f.topic("comandes"))), f.dsn
		}, "table public.outbox", []string{"timestamp without time zone", "TYPE timestamptz"}},
		{"RoleWithoutReplication", func(f *fixture) (testenv.Config, string) {
			role := f.name + "_norepl"
			mustExec(f, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD 'pw-norepl-9'", role))
			mustExec(f, fmt.Sprintf("GRANT SELECT ON outbox TO %s", role))
			f.t.Cleanup(func() { _, _ = f.mon.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE IF EXISTS "+role) })
			return f.config(seedRoute(f.topic("comandes"))), roleDSN(f, role, "pw-norepl-9")
		}, "role", []string{"neither REPLICATION nor SUPERUSER", "REPLICATION (see sql/003_role.sql)"}},
		{"MissingPublication", func(f *fixture) (testenv.Config, string) {
			cfg := f.config(seedRoute(f.topic("comandes")))
			cfg.Postgres["create_publication"] = "false"
			return cfg, f.dsn
		}, "publication", []string{"does not exist and postgres.create_publication is false", "sql/002_publication.sql"}},
		{"UnreachableBroker", func(f *fixture) (testenv.Config, string) {
			cfg := f.config(seedRoute(f.topic("comandes")))
			cfg.Brokers = freePort(f.t) // nothing listens there
			return cfg, f.dsn
		}, "kafka", []string{"0 of 1 brokers reachable", "refused"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
			dc, dsn := tc.setup(f)
			r := outboxd(t, dsn, "check", "-c", f.configFile(dc))
			wantCheckFails(t, r, tc.check, tc.want...)
			if l := r.line("PASS database:"); l == "" {
				t.Errorf("no PASS database line\n%s", r)
			}
			if strings.Contains(r.stdout+r.stderr, "pw-norepl-9") {
				t.Errorf("the password is in the output\n%s", r)
			}
		})
	}
}

func mustExec(f *fixture, sql string) {
	f.t.Helper()
	if _, err := f.db.Exec(context.Background(), sql); err != nil {
		f.t.Fatal(err)
	}
}

func roleDSN(f *fixture, role, password string) string {
	cfg, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		f.t.Fatal(err)
	}
	return fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", role, password, cfg.Host, cfg.Port, cfg.Database)
}

// TestCheckInvalidConfig: an invalid file is a FAIL config line and exit 2.
func TestCheckInvalidConfig(t *testing.T) {
	needEnv(t)
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte("origen: x\nbogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := outboxd(t, "", "check", "-c", path)
	if r.code != 2 || !strings.HasPrefix(r.stdout, "FAIL config: ") || !strings.Contains(r.line("FAIL config:"), "line 2") {
		t.Fatalf("check on an invalid file:\n%s", r)
	}
}

// TestSlotDropCommand: refuses an active slot, refuses without --yes (and
// says what would be lost), drops with --yes, then reports it absent; the
// next start creates it again.
func TestSlotDropCommand(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	dc := f.config(seedRoute(f.topic("comandes")))
	path := f.configFile(dc)
	d := f.start(dc)

	r := outboxd(t, f.dsn, "slot", "drop", "-c", path, "--yes")
	if r.code != 1 || !strings.Contains(r.stderr, "is active for PID") || !strings.Contains(r.stderr, "stop outboxd first") {
		t.Fatalf("slot drop of an active slot:\n%s", r)
	}
	d.term()
	exists := func() bool {
		var n int
		if err := f.mon.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	confirmed, _ := f.slot()
	mustExec(f, "CREATE TABLE filler AS SELECT g FROM generate_series(1, 1000) g") // WAL after the confirmed position

	r = outboxd(t, f.dsn, "slot", "drop", "-c", path)
	if r.code != 2 || !strings.Contains(r.stdout, "WARNING") || !strings.Contains(r.stdout, "confirmed_flush_lsn "+confirmed.String()) ||
		!strings.Contains(r.stdout, "of WAL written after it") || !strings.Contains(r.stderr, "without --yes") {
		t.Fatalf("slot drop without --yes:\n%s", r)
	}
	if !exists() {
		t.Fatal("the slot was dropped without --yes")
	}

	r = outboxd(t, f.dsn, "slot", "drop", "-c", path, "--yes")
	if r.code != 0 || !strings.Contains(r.stdout, "dropped replication slot "+f.name) {
		t.Fatalf("slot drop --yes:\n%s", r)
	}
	if exists() {
		t.Fatal("slot drop --yes exited 0 but the slot is still in pg_replication_slots")
	}

	r = outboxd(t, f.dsn, "slot", "drop", "-c", path, "--yes")
	if r.code != 1 || !strings.Contains(r.stderr, "does not exist") {
		t.Fatalf("slot drop of an absent slot:\n%s", r)
	}
	// Dropped with outboxd's own command: the slot record forgets it, and
	// the next start creates it (a slot dropped otherwise stops outboxd:
	// TestDroppedSlotKeepsUndeliveredRows).
	f.start(dc).term()
	if !exists() {
		t.Fatal("the start after slot drop --yes did not create the slot")
	}
}

// TestStatusCommand: status of a running daemon, by --url and by -c, as
// text and as JSON; an unreachable instance is exit 1.
func TestStatusCommand(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	dc := f.config(seedRoute(f.topic("comandes")))
	d := f.start(dc)

	r := outboxd(t, f.dsn, "status", "--url", "http://"+d.Addr())
	if r.code != 0 || !strings.HasPrefix(r.stdout, "state: streaming\n") {
		t.Fatalf("status --url:\n%s", r)
	}
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if k, _, ok := strings.Cut(l, ": "); !ok || strings.ContainsAny(k, " {") {
			t.Errorf("not a key: value line: %q", l)
		}
	}
	t.Logf("status:\n%s", r)
	r = outboxd(t, f.dsn, "status", "-c", d.ConfigPath())
	if r.code != 0 || !strings.Contains(r.stdout, "state: streaming") {
		t.Fatalf("status -c:\n%s", r)
	}
	r = outboxd(t, f.dsn, "status", "--url", d.Addr(), "--json")
	var doc map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &doc) != nil || doc["state"] != "streaming" {
		t.Fatalf("status --json:\n%s", r)
	}
	d.term()

	r = outboxd(t, f.dsn, "status", "--url", "http://"+d.Addr())
	if r.code != 1 || !strings.Contains(r.stderr, "no outboxd answers at http://"+d.Addr()+"/status") {
		t.Fatalf("status of a stopped instance:\n%s", r)
	}
}
