// Package testenv starts real PostgreSQL and Kafka servers on loopback for Go
// tests, using the scripts in the integration folder (pg.sh, kafka.sh,
// services.sh). Each Env lives in its own temporary directory; Cleanup stops
// and removes everything it started.
//
// When OUTBOXD_TEST_PG_DSN and OUTBOXD_TEST_KAFKA_BROKERS are both set, Start
// reuses those services instead and starts nothing (the process-control
// methods then return ErrExternal).
package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"
)

// Environment variables that make Start reuse already running services.
const (
	EnvPGDSN        = "OUTBOXD_TEST_PG_DSN"
	EnvKafkaBrokers = "OUTBOXD_TEST_KAFKA_BROKERS"
)

// ErrExternal is returned by process-control methods of an Env that reuses
// externally provided services.
var ErrExternal = errors.New("testenv: services are external (OUTBOXD_TEST_* set); cannot control them")

// Env describes a running PostgreSQL + Kafka pair.
type Env struct {
	Dir          string // state directory ("" for external services)
	PGDSN        string // postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable
	KafkaBrokers string // "host:port"

	External bool // services were provided via OUTBOXD_TEST_* and are not managed
	// Attached: the services were started by `services.sh up Dir` outside
	// this process (Attach); Cleanup leaves them running.
	Attached bool

	scripts string
	mu      sync.Mutex
	cleaned bool
}

// Start starts PostgreSQL and Kafka in a fresh temporary directory (or reuses
// external ones, see package doc).
func Start() (*Env, error) {
	dsn, brokers := os.Getenv(EnvPGDSN), os.Getenv(EnvKafkaBrokers)
	if dsn != "" && brokers != "" {
		return &Env{PGDSN: dsn, KafkaBrokers: brokers, External: true}, nil
	}
	scripts, err := ScriptsDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outboxd-test-")
	if err != nil {
		return nil, err
	}
	// The PostgreSQL server runs as the postgres OS user and must traverse it.
	if err := os.Chmod(dir, 0o755); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	e := &Env{Dir: dir, scripts: scripts}
	if _, err := e.run("services.sh", "up", dir); err != nil {
		e.Cleanup()
		return nil, err
	}
	if err := e.loadEnv(); err != nil {
		e.Cleanup()
		return nil, err
	}
	return e, nil
}

// Attach uses the services that `services.sh up dir` started and left
// running (for repeated benchmark runs); Cleanup leaves them alone.
func Attach(dir string) (*Env, error) {
	scripts, err := ScriptsDir()
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	e := &Env{Dir: abs, scripts: scripts, Attached: true}
	if err := e.loadEnv(); err != nil {
		return nil, err
	}
	return e, nil
}

// ScriptsDir returns the integration folder holding pg.sh, kafka.sh and
// services.sh: OUTBOXD_INTEGRATION_DIR if set, else the parent of this
// package's source folder, else the first integration/ folder found walking up
// from the working directory.
func ScriptsDir() (string, error) {
	ok := func(d string) bool {
		_, err := os.Stat(filepath.Join(d, "services.sh"))
		return err == nil
	}
	if d := os.Getenv("OUTBOXD_INTEGRATION_DIR"); d != "" {
		if ok(d) {
			return d, nil
		}
		return "", fmt.Errorf("testenv: OUTBOXD_INTEGRATION_DIR=%s has no services.sh", d)
	}
	if _, file, _, found := runtime.Caller(0); found {
		if d := filepath.Dir(filepath.Dir(file)); ok(d) {
			return d, nil
		}
	}
	wd, err := os.Getwd()
	if err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			if ok(filepath.Join(d, "integration")) {
				return filepath.Join(d, "integration"), nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	return "", errors.New("testenv: cannot locate the integration scripts (set OUTBOXD_INTEGRATION_DIR)")
}

func (e *Env) run(script string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(e.scripts, script)}, args...)...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("testenv: %s %s: %w\n%s", script, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// ReadEnvFile reads the KEY=VALUE lines the scripts write (pg.env, kafka.env).
func ReadEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			m[k] = v
		}
	}
	return m, sc.Err()
}

func (e *Env) loadEnv() error {
	pg, err := ReadEnvFile(filepath.Join(e.Dir, "pg.env"))
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	k, err := ReadEnvFile(filepath.Join(e.Dir, "kafka.env"))
	if err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	e.PGDSN, e.KafkaBrokers = pg["OUTBOXD_PG_DSN"], k["OUTBOXD_KAFKA_BROKERS"]
	if e.PGDSN == "" || e.KafkaBrokers == "" {
		return errors.New("testenv: env files lack OUTBOXD_PG_DSN / OUTBOXD_KAFKA_BROKERS")
	}
	return nil
}

// Cleanup stops and removes everything Start started. Safe to call twice;
// a no-op for external services.
func (e *Env) Cleanup() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.External || e.Attached || e.cleaned || e.Dir == "" {
		return
	}
	e.cleaned = true
	if out, err := e.run("services.sh", "down", e.Dir); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: cleanup: %v\n%s", err, out)
	}
	_ = os.RemoveAll(e.Dir)
}

func (e *Env) control(script string, args ...string) error {
	if e.External {
		return ErrExternal
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cleaned {
		return errors.New("testenv: environment already cleaned up")
	}
	_, err := e.run(script, args...)
	return err
}

// StopKafka stops the broker gracefully (SIGTERM), keeping its data.
func (e *Env) StopKafka() error { return e.control("kafka.sh", "stop", e.Dir) }

// KillKafka kills the broker with SIGKILL, keeping its data.
func (e *Env) KillKafka() error { return e.control("kafka.sh", "kill", e.Dir) }

// StartKafka (re)starts the broker on the same address with the same data and
// waits until it is ready. A no-op when it is running.
func (e *Env) StartKafka() error { return e.control("kafka.sh", "start", e.Dir) }

// StopPG stops PostgreSQL ("fast" or "immediate"), keeping its data.
func (e *Env) StopPG(mode string) error { return e.control("pg.sh", "stop", e.Dir, mode) }

// StartPG starts PostgreSQL again on the same port.
func (e *Env) StartPG() error { return e.control("pg.sh", "start", e.Dir) }

// RestartPG restarts PostgreSQL on the same port; mode is "fast" or
// "immediate" (crash-like: no shutdown checkpoint, recovery on start).
func (e *Env) RestartPG(mode string) error { return e.control("pg.sh", "restart", e.Dir, mode) }

// CreateTopic creates topic with the given partitions (replication 1) and
// waits until metadata shows all partitions with a leader. An existing topic
// is not an error.
func (e *Env) CreateTopic(topic string, partitions int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return CreateTopic(ctx, e.KafkaBrokers, topic, partitions)
}

// CreateDatabase runs CREATE DATABASE name (an existing one is fine) and
// returns a DSN for it as the postgres superuser.
func (e *Env) CreateDatabase(name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.PGDSN)
	if err != nil {
		return "", fmt.Errorf("testenv: connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P04" { // duplicate_database
			return "", fmt.Errorf("testenv: create database %q: %w", name, err)
		}
	}
	u, err := url.Parse(e.PGDSN)
	if err != nil {
		return "", fmt.Errorf("testenv: parse DSN: %w", err)
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

func splitBrokers(brokers string) []string {
	var out []string
	for _, b := range strings.Split(brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// CreateTopic creates a topic via the cluster controller (replication factor
// 1) and waits until all partitions have a leader. brokers is "h:p[,h:p...]".
func CreateTopic(ctx context.Context, brokers, topic string, partitions int) error {
	if partitions <= 0 {
		partitions = 1
	}
	bs := splitBrokers(brokers)
	if len(bs) == 0 {
		return errors.New("testenv: no brokers")
	}
	create := func() error {
		conn, err := kafka.DialContext(ctx, "tcp", bs[0])
		if err != nil {
			return err
		}
		defer conn.Close()
		ctrl, err := conn.Controller()
		if err != nil {
			return err
		}
		cc, err := kafka.DialContext(ctx, "tcp", net.JoinHostPort(ctrl.Host, fmt.Sprint(ctrl.Port)))
		if err != nil {
			return err
		}
		defer cc.Close()
		err = cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1})
		if errors.Is(err, kafka.TopicAlreadyExists) {
			return nil
		}
		return err
	}
	var err error
	for {
		if err = create(); err == nil {
			break
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return fmt.Errorf("testenv: create topic %q: %w (last error: %v)", topic, ctx.Err(), err)
		}
	}
	for {
		ps, err := readPartitions(ctx, bs[0], topic)
		if err == nil && len(ps) >= partitions && allLed(ps) {
			return nil
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return fmt.Errorf("testenv: topic %q not ready: %w (last: %d partitions, err %v)", topic, ctx.Err(), len(ps), err)
		}
	}
}

func allLed(ps []kafka.Partition) bool {
	for _, p := range ps {
		if p.Leader.Host == "" || p.Leader.ID < 0 {
			return false
		}
	}
	return true
}

func readPartitions(ctx context.Context, broker, topic string) ([]kafka.Partition, error) {
	conn, err := kafka.DialContext(ctx, "tcp", broker)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	return conn.ReadPartitions(topic)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Consume reads all partitions of topic from the first offset (no consumer
// group, one reader per partition) until want messages were read or ctx ends.
// The result is sorted by partition, then offset, and carries Partition,
// Offset, Key, Value, Headers and Time. If ctx ends first, the messages read
// so far are returned together with an error. With want <= 0 it reads until
// ctx ends and returns everything without error (useful to assert "exactly N,
// no more": consume with a short deadline).
func Consume(ctx context.Context, brokers, topic string, want int) ([]kafka.Message, error) {
	bs := splitBrokers(brokers)
	if len(bs) == 0 {
		return nil, errors.New("testenv: no brokers")
	}
	var parts []kafka.Partition
	for {
		ps, err := readPartitions(ctx, bs[0], topic)
		if err == nil && len(ps) > 0 {
			parts = ps
			break
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			if want <= 0 {
				return nil, nil
			}
			return nil, fmt.Errorf("testenv: consume %q: no partitions: %w (last error: %v)", topic, ctx.Err(), err)
		}
	}

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan kafka.Message, 256)
	var wg sync.WaitGroup
	readers := make([]*kafka.Reader, 0, len(parts))
	for _, p := range parts {
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers:   bs,
			Topic:     topic,
			Partition: p.ID,
			MinBytes:  1,
			MaxBytes:  16 << 20,
			MaxWait:   100 * time.Millisecond,
		})
		if err := r.SetOffset(kafka.FirstOffset); err != nil {
			cancel()
			for _, rr := range append(readers, r) {
				_ = rr.Close()
			}
			wg.Wait()
			return nil, err
		}
		readers = append(readers, r)
		wg.Add(1)
		go func(r *kafka.Reader) {
			defer wg.Done()
			for {
				m, err := r.ReadMessage(cctx)
				if err != nil {
					return
				}
				select {
				case ch <- m:
				case <-cctx.Done():
					return
				}
			}
		}(r)
	}

	var msgs []kafka.Message
	var err error
loop:
	for want <= 0 || len(msgs) < want {
		select {
		case m := <-ch:
			msgs = append(msgs, m)
		case <-ctx.Done():
			if want > 0 {
				err = fmt.Errorf("testenv: consumed %d of %d messages from %q: %w", len(msgs), want, topic, ctx.Err())
			}
			break loop
		}
	}
	cancel()
	for _, r := range readers {
		_ = r.Close()
	}
	wg.Wait()
	sort.SliceStable(msgs, func(i, j int) bool {
		if msgs[i].Partition != msgs[j].Partition {
			return msgs[i].Partition < msgs[j].Partition
		}
		return msgs[i].Offset < msgs[j].Offset
	})
	return msgs, err
}
