// Package testenv is outboxd's one test environment, used by the integration
// tests, the chaos suite, the benchmarks and the demo. It starts, stops,
// kills and restarts a real PostgreSQL and a real Apache Kafka on loopback
// through the scripts in this folder (pg.sh, kafka.sh, services.sh: the only
// place their configuration is written), builds the outboxd binary once per
// process, runs it as a Daemon from a Config, holds the seed schema
// (sql/001_outbox.sql), creates topics, consumes them, and verifies what a
// consumer reads against what was committed.
package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Options choose what Start starts. The zero value starts both services
// with the settings the tests use.
type Options struct {
	NoPostgres, NoKafka bool // start only the other one

	// Dir is the state folder, known before the services start (a cluster's
	// proxies read addresses in it: ClusterDir); "" makes a temporary one.
	// Cleanup removes it.
	Dir string

	// WALLevel is PostgreSQL's wal_level: "" (logical) or "replica", for a
	// test of outboxd's preflight check.
	WALLevel string
	// PGVersion is PostgreSQL's major version, "14" to "17"; "" takes
	// $OUTBOXD_PG_VERSION, and without it 15 (Debian's). See pg-fetch.sh.
	PGVersion string

	// KafkaVersion is the Apache Kafka release, e.g. "2.8.2" (with a
	// ZooKeeper), "3.9.1" or "4.4.0"; "" takes $OUTBOXD_KAFKA_VERSION, and
	// without it 4.1.1. See kafka-fetch.sh and kafka.sh.
	KafkaVersion string

	// NoAutoCreateTopics sets the broker's auto.create.topics.enable=false.
	NoAutoCreateTopics bool
	// KafkaACLs turns the broker's ACLs on (kafka.sh KAFKA_ACLS=on): the
	// PLAINTEXT listener (KafkaBrokers) is a super user, the SASL user may
	// do only what ACLs grant it (Env.KafkaSASL).
	KafkaACLs bool
	// Listeners are client listeners the broker has besides its own
	// PLAINTEXT one (which stays, for the tests' own clients).
	Listeners []Listener
	// KafkaNodes above 1 starts a cluster of that many brokers and a KRaft
	// controller (cluster.go, kafka-cluster.sh) instead of one broker;
	// Brokers are per-broker settings of a cluster, by broker id (1..n).
	KafkaNodes int
	Brokers    map[int]BrokerOptions

	// CommitTimestamps sets PostgreSQL's track_commit_timestamp = on
	// (pg.sh PG_COMMIT_TS=on): the cut-over snapshot and replay then
	// publish in commit order.
	CommitTimestamps bool

	// PostgresTLS starts PostgreSQL with ssl = on and a hostssl-only
	// pg_hba.conf (pg.sh PG_SSL=on): PGDSN then says sslmode=verify-full.
	PostgresTLS bool
}

// Listener is an extra client listener of the broker: it binds a port of its
// own and is advertised at Advertise, e.g. a TCP proxy in front of it, so a
// client that bootstraps there keeps going through the proxy.
type Listener struct {
	Name string // upper case, e.g. "PROXIED"
	// Protocol is the listener's security protocol: "" (PLAINTEXT), "SSL"
	// (a client certificate signed by the environment's CA is required),
	// "SASL_SSL" or "SASL_PLAINTEXT" (PLAIN, SCRAM-SHA-256 and
	// SCRAM-SHA-512 for the user Env.KafkaSASL names). See kafka.sh.
	Protocol string
	// Advertise is the host:port the broker advertises for the listener;
	// "": 127.0.0.1 and its own port.
	Advertise string
}

// spec is the listener as kafka.sh reads it: NAME[:PROTOCOL][=HOST:PORT].
func (l Listener) spec() (string, error) {
	if l.Name == "" {
		return "", fmt.Errorf("testenv: listener %+v needs a Name", l)
	}
	s := l.Name
	if l.Protocol != "" {
		s += ":" + l.Protocol
	}
	if l.Advertise != "" {
		s += "=" + l.Advertise
	}
	return s, nil
}

// Env is a running PostgreSQL and Kafka pair in its own state folder.
type Env struct {
	Dir          string // the scripts' state folder
	PGDSN        string // postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable, "" without PostgreSQL
	KafkaBrokers string // "127.0.0.1:PORT", "" without Kafka

	attached bool // Cleanup leaves the services running (Attach)
	mu       sync.Mutex
	cleaned  bool
	extra    []string // the state folders of standbys (ha.go), removed by Cleanup
}

// Start starts the services in a fresh temporary folder and waits until
// they are ready. Cleanup stops and removes them.
func Start(o Options) (*Env, error) {
	dir := o.Dir
	var err error
	if dir == "" {
		dir, err = os.MkdirTemp("", "outboxd-env-")
	} else {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return nil, err
	}
	// The PostgreSQL server runs as the postgres OS user and must traverse it.
	if err := os.Chmod(dir, 0o755); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	e := &Env{Dir: dir}
	settings, err := o.environ()
	if err == nil {
		err = guard("services.sh", "down", dir)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	switch {
	case o.NoPostgres && o.NoKafka:
		err = errors.New("testenv: Options start neither PostgreSQL nor Kafka")
	case o.NoPostgres && o.KafkaNodes > 1:
		err = e.script(settings, "kafka-cluster.sh", "start", dir)
	case o.NoPostgres:
		err = e.script(settings, "kafka.sh", "start", dir)
	case o.NoKafka:
		err = e.script(settings, "pg.sh", "start", dir)
	default:
		err = e.script(settings, "services.sh", "up", dir)
	}
	if err == nil {
		err = e.load()
	}
	if err != nil {
		e.Cleanup()
		return nil, err
	}
	return e, nil
}

// environ is the scripts' settings for a first start.
func (o Options) environ() ([]string, error) {
	wal := "logical"
	if o.WALLevel != "" {
		wal = o.WALLevel
	}
	ls, err := listenerSpec(o.Listeners)
	if err != nil {
		return nil, err
	}
	pgVersion := o.PGVersion
	if pgVersion == "" {
		pgVersion = os.Getenv("OUTBOXD_PG_VERSION")
	}
	kafkaVersion := o.KafkaVersion
	if kafkaVersion == "" {
		kafkaVersion = os.Getenv("OUTBOXD_KAFKA_VERSION")
	}
	cluster, err := o.clusterEnviron()
	if err != nil {
		return nil, err
	}
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	return append(cluster,
		"PG_VERSION="+pgVersion,
		"PG_WAL_LEVEL="+wal,
		"PG_SSL="+onOff(o.PostgresTLS),
		"PG_COMMIT_TS="+onOff(o.CommitTimestamps),
		"KAFKA_VERSION="+kafkaVersion,
		"KAFKA_AUTO_CREATE="+strconv.FormatBool(!o.NoAutoCreateTopics),
		"KAFKA_ACLS="+onOff(o.KafkaACLs),
		"KAFKA_LISTENERS="+ls,
	), nil
}

// listenerSpec is kafka.sh's KAFKA_LISTENERS for ls.
func listenerSpec(ls []Listener) (string, error) {
	var specs []string
	for _, l := range ls {
		s, err := l.spec()
		if err != nil {
			return "", err
		}
		specs = append(specs, s)
	}
	return strings.Join(specs, ","), nil
}

// Attach uses the services that `testenv/services.sh up dir` started and
// left running (for repeated benchmark runs); Cleanup leaves them alone.
func Attach(dir string) (*Env, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	e := &Env{Dir: abs, attached: true}
	if err := e.load(); err != nil {
		return nil, err
	}
	return e, nil
}

// load reads the addresses the scripts wrote.
func (e *Env) load() error {
	pg, err := readEnvFile(filepath.Join(e.Dir, "pg.env"))
	if err != nil {
		return err
	}
	k, err := readEnvFile(filepath.Join(e.Dir, "kafka.env"))
	if err != nil {
		return err
	}
	e.PGDSN, e.KafkaBrokers = pg["OUTBOXD_PG_DSN"], k["OUTBOXD_KAFKA_BROKERS"]
	if e.PGDSN == "" && e.KafkaBrokers == "" {
		return fmt.Errorf("testenv: no service in %s (no pg.env, no kafka.env)", e.Dir)
	}
	return nil
}

// readEnvFile reads the KEY=VALUE lines the scripts write, a value in
// single quotes (for the shell: a DSN with &) without them; a missing file
// is an empty map.
func readEnvFile(path string) (map[string]string, error) {
	m := map[string]string{}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
				v = v[1 : len(v)-1]
			}
			m[k] = v
		}
	}
	return m, sc.Err()
}

// Cleanup stops and removes everything Start started (the watchdog does it
// if the process ends first: watchdog.go). Safe to call twice; it leaves
// attached services running.
func (e *Env) Cleanup() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.attached || e.cleaned {
		return
	}
	e.cleaned = true
	for _, dir := range e.extra {
		if err := e.script(nil, "pg.sh", "destroy", dir); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: cleanup: %v\n", err)
		}
		unguard("pg.sh", "destroy", dir)
	}
	if err := e.script(nil, "services.sh", "down", e.Dir); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: cleanup: %v\n", err)
	}
	unguard("services.sh", "down", e.Dir)
	_ = os.RemoveAll(e.Dir)
}

func (e *Env) control(script string, args ...string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cleaned {
		return errors.New("testenv: the environment was cleaned up")
	}
	return e.script(nil, script, args...)
}

// StopKafka stops the broker (SIGTERM), keeping its data.
func (e *Env) StopKafka() error { return e.control("kafka.sh", "stop", e.Dir) }

// KillKafka kills the broker with SIGKILL, keeping its data.
func (e *Env) KillKafka() error { return e.control("kafka.sh", "kill", e.Dir) }

// StartKafka starts the broker again on the same ports, listeners and data
// and waits until it is ready; a no-op while it runs.
func (e *Env) StartKafka() error { return e.control("kafka.sh", "start", e.Dir) }

// RestartPG restarts PostgreSQL on the same port; mode is "fast" or
// "immediate" (crash-like: no shutdown checkpoint, recovery on start).
func (e *Env) RestartPG(mode string) error { return e.control("pg.sh", "restart", e.Dir, mode) }

// KafkaListener is the address ("127.0.0.1:port") the named extra listener
// binds (Options.Listeners).
func (e *Env) KafkaListener(name string) (string, error) {
	k, err := readEnvFile(filepath.Join(e.Dir, "kafka.env"))
	if err != nil {
		return "", err
	}
	port := k["KAFKA_"+name+"_PORT"]
	if port == "" {
		return "", fmt.Errorf("testenv: the broker has no listener %s", name)
	}
	return "127.0.0.1:" + port, nil
}

// PKI is the environment's throwaway certificate authority (pki.sh), made
// when a service uses TLS: PEM files.
type PKI struct {
	CAFile            string // the CA that signed the servers' certificates
	CertFile, KeyFile string // a client certificate (CN outboxd) and its key
	OtherCAFile       string // an unrelated CA: a wrong ca_file
}

// PKI is the environment's CA and client certificate; an error when no
// service uses TLS.
func (e *Env) PKI() (PKI, error) {
	m, err := readEnvFile(filepath.Join(e.Dir, "pki", "pki.env"))
	if err != nil {
		return PKI{}, err
	}
	p := PKI{CAFile: m["TLS_CA_FILE"], CertFile: m["TLS_CERT_FILE"], KeyFile: m["TLS_KEY_FILE"], OtherCAFile: m["TLS_OTHER_CA_FILE"]}
	if p.CAFile == "" {
		return PKI{}, fmt.Errorf("testenv: no PKI in %s (no service uses TLS)", e.Dir)
	}
	return p, nil
}

// KafkaSASL is the user the broker's SASL listeners accept and the file
// holding its password (made at the broker's first start).
func (e *Env) KafkaSASL() (user, passwordFile string, err error) {
	k, err := readEnvFile(filepath.Join(e.Dir, "kafka.env"))
	if err != nil {
		return "", "", err
	}
	user, passwordFile = k["KAFKA_SASL_USERNAME"], k["KAFKA_SASL_PASSWORD_FILE"]
	if user == "" || passwordFile == "" {
		return "", "", errors.New("testenv: the broker has no SASL listener")
	}
	return user, passwordFile, nil
}

// KafkaVersion is the Apache Kafka version the broker runs (kafka.sh
// writes it in kafka.env at the first start).
func (e *Env) KafkaVersion() (string, error) {
	k, err := readEnvFile(filepath.Join(e.Dir, "kafka.env"))
	if err != nil {
		return "", err
	}
	if k["KAFKA_VERSION"] == "" {
		return "", fmt.Errorf("testenv: no Kafka version in %s", e.Dir)
	}
	return k["KAFKA_VERSION"], nil
}

// KafkaPID is the broker's process id.
func (e *Env) KafkaPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(e.Dir, "kafka", "broker.pid"))
	if err != nil {
		return 0, fmt.Errorf("testenv: broker pid: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// CreateDatabase creates database name (an existing one is fine), runs
// schema in it when not empty, and returns its DSN (the postgres superuser).
func (e *Env) CreateDatabase(name, schema string) (string, error) {
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
	u.Path, u.RawPath = "/"+name, ""
	dsn := u.String()
	if schema == "" {
		return dsn, nil
	}
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", fmt.Errorf("testenv: connect to %s: %w", name, err)
	}
	defer db.Close(context.Background())
	if _, err := db.Exec(ctx, schema); err != nil {
		return "", fmt.Errorf("testenv: schema of %s: %w", name, err)
	}
	return dsn, nil
}

// CreateTopic creates topic with the given partitions and waits until each
// has a leader; an existing topic is fine.
func (e *Env) CreateTopic(topic string, partitions int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return createTopic(ctx, e.KafkaBrokers, topic, partitions, e.replicationFactor(), nil)
}

// script runs one of the scripts with extra environment.
func (e *Env) script(extraEnv []string, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, err := runScript(ctx, extraEnv, name, args...)
	return err
}

// runScript runs one of testenv's scripts with extra environment and
// returns its standard output; its error carries what it printed.
func runScript(ctx context.Context, extraEnv []string, name string, args ...string) (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(root, "testenv", name)}, args...)...)
	var stdout, all bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(&stdout, &all), &all
	cmd.Env = append(os.Environ(), extraEnv...)
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("testenv: %s %s: %w\n%s", name, strings.Join(args, " "), err, all.String())
	}
	return stdout.String(), nil
}

var root struct {
	once sync.Once
	dir  string
	err  error
}

// Root is the repository's top folder: found from this file's path, or, in
// a binary built with -trimpath, by walking up from the working directory.
func Root() (string, error) {
	root.once.Do(func() {
		ok := func(d string) bool {
			_, err := os.Stat(filepath.Join(d, "testenv", "services.sh"))
			return err == nil
		}
		if _, file, _, found := runtime.Caller(0); found {
			if d := filepath.Dir(filepath.Dir(file)); ok(d) {
				root.dir = d
				return
			}
		}
		if wd, err := os.Getwd(); err == nil {
			for d := wd; ; d = filepath.Dir(d) {
				if ok(d) {
					root.dir = d
					return
				}
				if filepath.Dir(d) == d {
					break
				}
			}
		}
		root.err = errors.New("testenv: cannot find the outboxd repository (run from inside it)")
	})
	return root.dir, root.err
}
