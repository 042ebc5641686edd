// Package chaos is outboxd's fault-injection harness: a load generator that
// writes outbox rows the way services do, a verifier that reads the topic
// from the beginning and checks it against the outbox table (and the slot's
// confirmed position against what Kafka holds), TCP proxies between outboxd
// and each of its peers, and the scenarios of issue 4. `make chaos` runs
// them all (integration/cmd/chaos); TestChaosShort runs a short subset.
//
// See docs/CHAOS.md for the method, its limits and the measured figures.
package chaos

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/integration/testenv"
)

// Env is a PostgreSQL 15 (integration/pg.sh) and a Kafka 4.1 broker
// (started here, see broker) with a proxy in front of each, for outboxd.
type Env struct {
	Dir     string
	scripts string
	Logf    func(format string, args ...any)

	pgPort  int
	PGProxy *Proxy
	// Kafka: Direct is the broker's plain listener (for the harness);
	// outboxd bootstraps at KafkaProxy, which the broker advertises on
	// its second listener.
	KafkaDirect string
	KafkaProxy  *Proxy
	broker      *broker
}

// Start starts both services and both proxies in a fresh directory.
func Start(ctx context.Context, logf func(string, ...any)) (*Env, error) {
	scripts, err := testenv.ScriptsDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outboxd-chaos-")
	if err != nil {
		return nil, err
	}
	// The PostgreSQL server runs as the postgres OS user and must traverse it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	e := &Env{Dir: dir, scripts: scripts, Logf: logf}
	pgErr := make(chan error, 1)
	go func() { _, err := e.script("pg.sh", "start", dir); pgErr <- err }()
	if err := e.startKafka(ctx); err != nil {
		<-pgErr
		e.Close()
		return nil, err
	}
	if err := <-pgErr; err != nil {
		e.Close()
		return nil, err
	}
	env, err := testenv.ReadEnvFile(filepath.Join(dir, "pg.env"))
	if err != nil {
		e.Close()
		return nil, err
	}
	if e.pgPort, err = strconv.Atoi(env["PGPORT"]); err != nil {
		e.Close()
		return nil, fmt.Errorf("chaos: pg.env has no PGPORT: %w", err)
	}
	if e.PGProxy, err = NewProxy(fmt.Sprintf("127.0.0.1:%d", e.pgPort)); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

func (e *Env) startKafka(ctx context.Context) error {
	lib, err := e.script("kafka-fetch.sh")
	if err != nil {
		return err
	}
	// The proxy's port must be known before the broker starts, because
	// the broker advertises it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ports, err := freePorts(3)
	if err != nil {
		ln.Close()
		return err
	}
	b := &broker{dir: filepath.Join(e.Dir, "kafka"), lib: strings.TrimSpace(lib),
		port: ports[0], chaosPort: ports[1], ctrlPort: ports[2], advPort: ln.Addr().(*net.TCPAddr).Port}
	e.broker = b
	e.KafkaDirect = fmt.Sprintf("127.0.0.1:%d", b.port)
	e.KafkaProxy = newProxyOn(ln, fmt.Sprintf("127.0.0.1:%d", b.chaosPort))
	return b.start(ctx)
}

// PGDSN is a DSN for database db: direct, or through the proxy.
func (e *Env) PGDSN(db string, viaProxy bool) string {
	port := e.pgPort
	if viaProxy {
		port = e.PGProxy.ln.Addr().(*net.TCPAddr).Port
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", port, db)
}

// KillKafka kills the broker with SIGKILL (data kept).
func (e *Env) KillKafka() error { return e.broker.signal(syscall.SIGKILL) }

// StartKafka starts the broker again with the same ports and data.
func (e *Env) StartKafka(ctx context.Context) error { return e.broker.start(ctx) }

// RestartPG restarts PostgreSQL, "fast" or "immediate".
func (e *Env) RestartPG(mode string) error {
	_, err := e.script("pg.sh", "restart", e.Dir, mode)
	return err
}

// CreateDatabase creates db (dropping an old one) and runs schema in it.
func (e *Env) CreateDatabase(ctx context.Context, db, schema string) error {
	conn, err := pgx.Connect(ctx, e.PGDSN("postgres", false))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P04" {
			return fmt.Errorf("create database %s: %w", db, err)
		}
	}
	c2, err := pgx.Connect(ctx, e.PGDSN(db, false))
	if err != nil {
		return err
	}
	defer c2.Close(context.Background())
	_, err = c2.Exec(ctx, schema)
	return err
}

// CreateTopic creates topic (replication 1) through the direct listener.
func (e *Env) CreateTopic(ctx context.Context, topic string, partitions int) error {
	return testenv.CreateTopic(ctx, e.KafkaDirect, topic, partitions)
}

// Close stops and removes everything.
func (e *Env) Close() {
	if e.PGProxy != nil {
		e.PGProxy.Close()
	}
	if e.KafkaProxy != nil {
		e.KafkaProxy.Close()
	}
	if e.broker != nil {
		_ = e.broker.signal(syscall.SIGTERM)
	}
	if _, err := e.script("pg.sh", "destroy", e.Dir); err != nil {
		e.Logf("cleanup: %v", err)
	}
	_ = os.RemoveAll(e.Dir)
}

func (e *Env) script(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(e.scripts, name)}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("chaos: %s %s: %w\n%s%s", name, strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String(), nil
}

func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// broker is a single-node KRaft Kafka with the jars integration/kafka.sh
// uses, but with two client listeners: PLAINTEXT (advertised as itself, for
// the harness) and CHAOS (advertised at the proxy's port, for outboxd).
// Kafka answers metadata with the addresses of the listener the request
// came in on, so every connection outboxd makes goes through the proxy.
type broker struct {
	dir, lib                           string
	port, chaosPort, ctrlPort, advPort int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func (b *broker) props() string {
	return fmt.Sprintf(`# written by integration/chaos
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:%[3]d
listeners=PLAINTEXT://127.0.0.1:%[1]d,CHAOS://127.0.0.1:%[2]d,CONTROLLER://127.0.0.1:%[3]d
advertised.listeners=PLAINTEXT://127.0.0.1:%[1]d,CHAOS://127.0.0.1:%[4]d
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CHAOS:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=%[5]s/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
`, b.port, b.chaosPort, b.ctrlPort, b.advPort, b.dir)
}

func (b *broker) java(args ...string) *exec.Cmd {
	base := []string{"-Xms256m", "-Xmx512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError",
		"-Djava.awt.headless=true", "-Dorg.slf4j.simpleLogger.defaultLogLevel=info", "-Dorg.slf4j.simpleLogger.showDateTime=true",
		"-cp", b.lib + "/*"}
	return exec.Command("java", append(base, args...)...)
}

func (b *broker) start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd != nil {
		return nil
	}
	if err := os.MkdirAll(b.dir, 0o755); err != nil {
		return err
	}
	propsPath := filepath.Join(b.dir, "server.properties")
	if err := os.WriteFile(propsPath, []byte(b.props()), 0o644); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(b.dir, "data", "meta.properties")); err != nil {
		out, err := b.java("kafka.tools.StorageTool", "format", "-t", clusterID(), "-c", propsPath, "--ignore-formatted").CombinedOutput()
		if err != nil {
			return fmt.Errorf("chaos: kafka storage format: %w\n%s", err, out)
		}
	}
	logPath := filepath.Join(b.dir, "broker.log")
	lf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := b.java("kafka.Kafka", propsPath)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); lf.Close(); close(done) }()
	b.cmd, b.done = cmd, done
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case <-done:
			b.cmd = nil
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("chaos: kafka exited during startup:\n%s", tail(string(log), 3000))
		default:
		}
		log, _ := os.ReadFile(logPath)
		if bytes.Contains(log, []byte("Kafka Server started")) {
			if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", b.chaosPort), time.Second); err == nil {
				c.Close()
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = cmd.Process.Kill()
			<-done
			b.cmd = nil
			return fmt.Errorf("chaos: kafka not ready after 90 s:\n%s", tail(string(log), 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// signal stops the broker with sig (SIGTERM waits up to 30 s, then kills).
func (b *broker) signal(sig syscall.Signal) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return nil
	}
	_ = b.cmd.Process.Signal(sig)
	select {
	case <-b.done:
	case <-time.After(30 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
	b.cmd = nil
	return nil
}

func clusterID() string {
	for {
		var b [16]byte
		_, _ = rand.Read(b[:])
		id := base64.RawURLEncoding.EncodeToString(b[:])
		if id[0] != '-' {
			return id
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
