package integration_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/integration/testenv"
)

// These tests run the real outboxd binary against a real PostgreSQL 15 and a
// real Apache Kafka broker, both started by the project's scripts.

var (
	env    *testenv.Env
	binary string
	dbSeq  atomic.Int32
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		fmt.Println("integration: -short given, SKIPPING the tests against real PostgreSQL and Kafka")
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "outboxd-it-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "outboxd")
	build := exec.Command("go", "build", "-o", binary, "github.com/outboxd/outboxd/cmd/outboxd")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build outboxd:", err)
		return 1
	}
	env, err = testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start services:", err)
		return 1
	}
	defer env.Cleanup()
	return m.Run()
}

func needEnv(t *testing.T) {
	t.Helper()
	if env == nil {
		t.Skip("SKIPPED: -short: no real PostgreSQL/Kafka started")
	}
}

// fixture is one test's database, slot, publication and topics.
type fixture struct {
	t      *testing.T
	name   string
	dsn    string
	db     *pgx.Conn      // for the test's writer
	mon    *pgx.Conn      // for observing the slot, concurrently with the writer
	topics map[string]int // topic -> partitions
}

func newFixture(t *testing.T, schemaSQL string, topics map[string]int) *fixture {
	t.Helper()
	needEnv(t)
	name := fmt.Sprintf("km0_t%d_%d", os.Getpid(), dbSeq.Add(1))
	dsn, err := env.CreateDatabase(name)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	mon, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, name: name, dsn: dsn, db: db, mon: mon, topics: map[string]int{}}
	t.Cleanup(func() {
		// f's connections, which a test may have replaced after a restart.
		f.mon.Close(context.Background())
		// Drop the slot so a finished test retains no WAL; its walsender
		// may take a moment to exit after outboxd was killed.
		for i := 0; i < 50; i++ {
			var left int
			_, _ = f.db.Exec(context.Background(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", f.name)
			if err := f.db.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.name).Scan(&left); err != nil || left == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		f.db.Close(context.Background())
	})
	if _, err := db.Exec(ctx, schemaSQL); err != nil {
		t.Fatal(err)
	}
	for topic, n := range topics {
		full := name + "." + topic
		if err := env.CreateTopic(full, n); err != nil {
			t.Fatal(err)
		}
		f.topics[full] = n
	}
	return f
}

func (f *fixture) topic(short string) string { return f.name + "." + short }

// slot returns confirmed_flush_lsn and restart_lsn of the fixture's slot.
func (f *fixture) slot() (confirmed, restart pglogrepl.LSN) {
	f.t.Helper()
	var c, r string
	err := f.mon.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text, restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1", f.name).Scan(&c, &r)
	if err != nil {
		f.t.Fatalf("read slot: %v", err)
	}
	cl, _ := pglogrepl.ParseLSN(c)
	rl, _ := pglogrepl.ParseLSN(r)
	return cl, rl
}

func (f *fixture) walLSN() pglogrepl.LSN {
	f.t.Helper()
	var s string
	if err := f.mon.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		f.t.Fatal(err)
	}
	l, _ := pglogrepl.ParseLSN(s)
	return l
}

// waitConfirmed waits until the slot has confirmed at least lsn.
func (f *fixture) waitConfirmed(lsn pglogrepl.LSN, timeout time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c, _ := f.slot()
		if c >= lsn {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("slot confirmed %s, still below %s after %s", c, lsn, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// daemonConfig is the YAML for one outboxd run against the fixture.
type daemonConfig struct {
	routes      string // YAML list items under routes:
	partitioner string
	extra       string // more top-level YAML
	dsn         string // instead of the fixture's superuser DSN
	postgres    string // more YAML lines under postgres:, indented
	health      string // more YAML lines under health:, indented
	brokers     string // instead of the shared test broker
}

type daemon struct {
	t      *testing.T
	cmd    *exec.Cmd
	log    *syncWriter
	health string
	done   chan error
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func (f *fixture) config(dc daemonConfig, health string) string {
	brokers := env.KafkaBrokers
	if dc.brokers != "" {
		brokers = dc.brokers
	}
	part := dc.partitioner
	if part == "" {
		part = "murmur2"
	}
	return fmt.Sprintf(`origen: comandes
postgres:
  dsn: "${TEST_DSN}"
  slot: %s
  publication: %s
  status_interval: 200ms
%skafka:
  brokers: ["%s"]
  partitioner: %s
  linger: 2ms
routes:
%s
pipeline:
  backoff_min: 200ms
  backoff_max: 2s
  shutdown_timeout: 20s
health:
  listen: "%s"
  poll_interval: 200ms
%slog:
  level: debug
%s`, f.name, f.name, dc.postgres, brokers, part, dc.routes, health, dc.health, dc.extra)
}

// start runs outboxd and waits until it is streaming.
func (f *fixture) start(dc daemonConfig) *daemon {
	f.t.Helper()
	d := f.spawn(dc)
	d.waitReady(30 * time.Second)
	return d
}

// spawn runs outboxd without waiting for it.
func (f *fixture) spawn(dc daemonConfig) *daemon {
	f.t.Helper()
	health := freePort(f.t)
	path := filepath.Join(f.t.TempDir(), "outboxd.yaml")
	if err := os.WriteFile(path, []byte(f.config(dc, health)), 0o600); err != nil {
		f.t.Fatal(err)
	}
	d := &daemon{t: f.t, log: &syncWriter{w: &bytes.Buffer{}}, health: health, done: make(chan error, 1)}
	d.cmd = exec.Command(binary, "run", "-c", path)
	dsn := f.dsn
	if dc.dsn != "" {
		dsn = dc.dsn
	}
	d.cmd.Env = append(os.Environ(), "TEST_DSN="+dsn)
	d.cmd.Stdout = d.log
	d.cmd.Stderr = d.log
	if err := d.cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	f.t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			_ = d.cmd.Process.Kill()
			<-d.done
		}
		if f.t.Failed() {
			f.t.Logf("outboxd log:\n%s", d.logText())
		}
	})
	return d
}

func (d *daemon) logText() string { return d.log.String() }

func (d *daemon) waitReady(timeout time.Duration) {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-d.done:
			d.done <- err
			d.t.Fatalf("outboxd exited before it was ready: %v\n%s", err, d.logText())
		default:
		}
		resp, err := http.Get("http://" + d.health + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	d.t.Fatalf("outboxd not ready after %s\n%s", timeout, d.logText())
}

// kill is kill -9.
func (d *daemon) kill() {
	d.t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
}

// term sends SIGTERM and requires exit status 0.
func (d *daemon) term() {
	d.t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		if err != nil {
			d.t.Fatalf("outboxd exit after SIGTERM: %v\n%s", err, d.logText())
		}
	case <-time.After(60 * time.Second):
		d.t.Fatalf("outboxd did not exit within 60 s of SIGTERM\n%s", d.logText())
	}
}

// exited waits for the process to end by itself and returns its error.
func (d *daemon) exited(timeout time.Duration) error {
	d.t.Helper()
	select {
	case err := <-d.done:
		return err
	case <-time.After(timeout):
		d.t.Fatalf("outboxd still running after %s\n%s", timeout, d.logText())
		return nil
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func lsn(t *testing.T, s string) pglogrepl.LSN {
	t.Helper()
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
