package integration_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/testenv"
)

// Transport security against real services: a second PostgreSQL (ssl = on,
// a hostssl-only pg_hba.conf) and a second broker with SASL_SSL, SSL (a
// client certificate required) and SASL_PLAINTEXT listeners, both made by
// testenv's scripts with a throwaway CA of their own. The broker keeps its
// PLAINTEXT listener, which the tests' own consumers read from.

// The secured broker's listeners.
const (
	plaintext     = "PLAINTEXT" // the one every broker of testenv has
	saslSSL       = "SASL_SSL"
	mTLS          = "MTLS"
	saslPlaintext = "SASL_PLAINTEXT"
)

// secured is started once, by TestMain in the background when the whole
// suite runs, else by the first test that needs it, and shared; TestMain
// removes it.
var secured struct {
	once sync.Once
	env  *testenv.Env
	err  error
}

func startSecured() {
	secured.once.Do(func() {
		secured.env, secured.err = testenv.Start(testenv.Options{PostgresTLS: true, Listeners: []testenv.Listener{
			{Name: saslSSL, Protocol: "SASL_SSL"}, {Name: mTLS, Protocol: "SSL"}, {Name: saslPlaintext, Protocol: "SASL_PLAINTEXT"}}})
	})
}

func securedEnv(t *testing.T) *testenv.Env {
	t.Helper()
	needEnv(t)
	startSecured() // or wait for TestMain's start to finish
	if secured.err != nil {
		t.Fatal(secured.err)
	}
	return secured.env
}

// stopSecured removes the secured services, once a start under way ended.
func stopSecured() {
	secured.once.Do(func() {})
	if secured.env != nil {
		secured.env.Cleanup()
	}
}

// secure is what outboxd needs to reach the secured services.
type secure struct {
	env                *testenv.Env
	pki                testenv.PKI
	user, passwordFile string
	password           string // the SASL user's, for the tests that look for it
}

func newSecure(t *testing.T) *secure {
	t.Helper()
	e := securedEnv(t)
	pki, err := e.PKI()
	if err != nil {
		t.Fatal(err)
	}
	user, pwFile, err := e.KafkaSASL()
	if err != nil {
		t.Fatal(err)
	}
	pw, err := os.ReadFile(pwFile)
	if err != nil {
		t.Fatal(err)
	}
	return &secure{env: e, pki: pki, user: user, passwordFile: pwFile, password: string(pw)}
}

// kafka points cfg at listener with the given kafka.tls and kafka.sasl
// (YAML flow maps; "" leaves the section out).
func (s *secure) kafka(t *testing.T, cfg *testenv.Config, listener, tls, sasl string) {
	t.Helper()
	cfg.Brokers = s.env.KafkaBrokers
	if listener != plaintext {
		addr, err := s.env.KafkaListener(listener)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Brokers = addr
	}
	if tls != "" {
		cfg.Kafka["tls"] = tls
	}
	if sasl != "" {
		cfg.Kafka["sasl"] = sasl
	}
}

// tlsCA is kafka.tls trusting the environment's CA, plus more keys.
func (s *secure) tlsCA(more string) string {
	return fmt.Sprintf("{enable: true, ca_file: %q%s}", s.pki.CAFile, more)
}

// mtls is kafka.tls with the environment's client certificate.
func (s *secure) mtls() string {
	return s.tlsCA(fmt.Sprintf(", cert_file: %q, key_file: %q", s.pki.CertFile, s.pki.KeyFile))
}

// sasl is kafka.sasl for mechanism with the broker's user and its password
// file.
func (s *secure) sasl(mechanism string) string {
	return fmt.Sprintf("{mechanism: %s, username: %s, password_file: %q}", mechanism, s.user, s.passwordFile)
}

// exitedWith1 requires that d ended by itself with exit status 1, and
// returns its log.
func exitedWith1(t *testing.T, d *daemon, timeout time.Duration) string {
	t.Helper()
	start := time.Now()
	exited, err := d.Exited(timeout)
	if !exited {
		t.Fatalf("outboxd still running after %s\n%s", timeout, d.Log())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("want exit status 1, got %v\n%s", err, d.Log())
	}
	t.Logf("exited with status 1 after %s", time.Since(start).Round(100*time.Millisecond))
	return d.Log()
}

// lastLine is the last non-empty line of s: the line outboxd exits with.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestSecuredKafkaDelivers: outboxd delivers through each kind of secured
// listener of a real broker (SASL_SSL with SCRAM-SHA-512 and with PLAIN,
// SSL with a client certificate, SASL_PLAINTEXT with SCRAM-SHA-256): every
// record as the contract says (key, headers, envelope, partition,
// per-aggregate order), the slot confirmed past the last row, and `check`
// passing through the same listener.
func TestSecuredKafkaDelivers(t *testing.T) {
	kafkaOnly(t)
	s := newSecure(t)
	t.Setenv("TEST_SASL_PASSWORD", s.password) // for ${TEST_SASL_PASSWORD}
	for _, tc := range []struct {
		name, listener, tls, sasl string
		rows                      int
	}{
		// The core pipeline: transactions of 1 to 120 rows across 80
		// aggregates.
		{"SASL_SSL SCRAM-SHA-512", saslSSL, s.tlsCA(""), s.sasl("SCRAM-SHA-512"), 600},
		{"SASL_SSL PLAIN", saslSSL, s.tlsCA(""), s.sasl("PLAIN"), 60},
		{"SSL client certificate", mTLS, s.mtls(), "", 60},
		{"SASL_PLAINTEXT SCRAM-SHA-256", saslPlaintext, "", fmt.Sprintf("{mechanism: SCRAM-SHA-256, username: %s, password: \"${TEST_SASL_PASSWORD}\"}", s.user), 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixtureOn(t, s.env, seedSchema, map[string]int{"comandes": 4})
			ctx := context.Background()
			cfg := f.config(seedRoute(f.topic("comandes")))
			s.kafka(t, &cfg, tc.listener, tc.tls, tc.sasl)
			d := f.start(cfg)
			w := newWriter(f, uint64(tc.rows), 80, "outbox")
			sizes := []int{1, 2, 5, 10, 50, 1, 3, 120}
			for i := 0; w.n < tc.rows; i++ {
				if err := w.txn(ctx, min(sizes[i%len(sizes)], tc.rows-w.n)); err != nil {
					t.Fatal(err)
				}
			}
			end := f.walLSN()
			rep := w.verify(ctx, f.topic("comandes"), "murmur2")
			f.waitConfirmed(end, 30*time.Second)
			if rep.Duplicates != 0 {
				t.Errorf("no crash happened, yet %d duplicates", rep.Duplicates)
			}
			r := outboxd(t, f.dsn, "check", "-c", f.configFile(cfg))
			if l := r.line("PASS kafka:"); r.code != 0 || !strings.Contains(l, cfg.Brokers) {
				t.Errorf("check through %s:\n%s", tc.listener, r)
			}
			d.term()
		})
	}
}

// TestKafkaSecurityFailuresLoseNothing: a wrong password, an untrusted
// certificate, a wrong server name, a missing client certificate and SASL
// towards a listener without it each stop outboxd with exit status 1 and one line naming the failure as TLS or
// SASL with its fix; `check` fails its kafka line with the same; and
// nothing is lost: the slot never passes the rows written meanwhile, which
// arrive once the configuration is fixed.
func TestKafkaSecurityFailuresLoseNothing(t *testing.T) {
	kafkaOnly(t)
	s := newSecure(t)
	f := newFixtureOn(t, s.env, seedSchema, map[string]int{"comandes": 3})
	ctx := context.Background()
	topic := f.topic("comandes")
	good := f.config(seedRoute(topic))
	s.kafka(t, &good, saslSSL, s.tlsCA(""), s.sasl("SCRAM-SHA-512"))
	d := f.start(good)
	w := newWriter(f, 21, 15, "outbox")
	w.txns(ctx, 10, 3)
	w.verify(ctx, topic, "murmur2")
	d.term()

	// Rows that no broker has yet: the slot must stay before them.
	pendingFrom := len(w.committed)
	w.txns(ctx, 10, 4)
	undelivered := w.committed[pendingFrom:]
	wrongPassword := f.t.TempDir() + "/wrong-password"
	if err := os.WriteFile(wrongPassword, []byte("not-"+s.password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, listener, tls, sasl string
		want                      []string // in the exit line and in check's kafka line
	}{
		{"wrong password", saslSSL, s.tlsCA(""), fmt.Sprintf("{mechanism: SCRAM-SHA-512, username: %s, password_file: %q}", s.user, wrongPassword),
			[]string{"SASL: authentication failed", "kafka.sasl.username"}},
		{"wrong password PLAIN", saslSSL, s.tlsCA(""), fmt.Sprintf("{mechanism: PLAIN, username: %s, password_file: %q}", s.user, wrongPassword),
			[]string{"SASL: authentication failed", "kafka.sasl.username"}},
		{"untrusted certificate", saslSSL, "{enable: true}", s.sasl("SCRAM-SHA-512"),
			[]string{"TLS: the broker's certificate is not signed by a trusted CA", "kafka.tls.ca_file"}},
		{"wrong server name", saslSSL, s.tlsCA(", server_name: broker.invalid"), s.sasl("SCRAM-SHA-512"),
			[]string{`TLS: the broker's certificate is not valid for "broker.invalid"`, "kafka.tls.server_name"}},
		{"no client certificate", mTLS, s.tlsCA(""), "",
			[]string{"TLS: the broker refused the handshake", "kafka.tls.cert_file"}},
		{"SASL on a listener without it", plaintext, "", s.sasl("SCRAM-SHA-512"),
			[]string{"SASL: the broker does not take kafka.sasl.mechanism on this listener"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := f.config(seedRoute(topic))
			s.kafka(t, &cfg, tc.listener, tc.tls, tc.sasl)
			log := exitedWith1(t, f.spawn(cfg), 60*time.Second)
			exit := lastLine(log)
			t.Logf("exit line: %s", exit)
			for _, want := range tc.want {
				if !strings.Contains(exit, want) {
					t.Errorf("the exit line lacks %q: %s", want, exit)
				}
			}
			if passed := f.slotPassed(undelivered...); len(passed) > 0 {
				c, _ := f.slot()
				t.Fatalf("the slot confirmed %s, past undelivered rows %v", c, passed)
			}
			r := outboxd(t, f.dsn, "check", "-c", f.configFile(cfg))
			t.Logf("check: %s", r.line("FAIL kafka:"))
			wantCheckFails(t, r, "kafka", tc.want...)
		})
	}

	// A SASL listener without kafka.sasl answers the API versions, then
	// closes the connection: check says so (the daemon retries: a closed
	// connection may as well be an outage).
	cfg := f.config(seedRoute(topic))
	s.kafka(t, &cfg, saslSSL, s.tlsCA(""), "")
	r := outboxd(t, f.dsn, "check", "-c", f.configFile(cfg))
	wantCheckFails(t, r, "kafka", "the listener may need TLS (kafka.tls.enable) or SASL (kafka.sasl)")

	// Fixed: every row arrives, the ones written meanwhile included.
	d = f.start(good)
	end := f.walLSN()
	w.verify(ctx, topic, "murmur2")
	f.waitConfirmed(end, 30*time.Second)
	d.term()
}

// TestPostgresTLS: against a PostgreSQL that accepts only TLS (ssl = on,
// hostssl-only pg_hba.conf), outboxd connects with verify-full, set through
// postgres.tls over a DSN that says sslmode=disable, through the DSN's own
// sslmode and sslrootcert, and with a client certificate instead of a
// password; each run delivers and its walsender connection is encrypted. A
// wrong CA, and no TLS at all, stop it at once with exit status 1 and a
// line that says what to fix; check fails its database line the same way.
func TestPostgresTLS(t *testing.T) {
	s := newSecure(t)
	f := newFixtureOn(t, s.env, seedSchema, map[string]int{"comandes": 2})
	ctx := context.Background()
	topic := f.topic("comandes")
	w := newWriter(f, 31, 10, "outbox")
	pc, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	// The role the client certificate (CN outboxd) authenticates as.
	for _, sql := range []string{
		"DO $$ BEGIN CREATE ROLE outboxd LOGIN REPLICATION; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
		"GRANT SELECT ON outbox TO outboxd",
		fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE outbox WITH (publish = 'insert')", f.name),
	} {
		if _, err := f.db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = f.db.Exec(context.Background(), "REVOKE ALL ON outbox FROM outboxd")
	})
	url := func(user, query string) string {
		return fmt.Sprintf("postgres://%s@%s:%d/%s?%s", user, pc.Host, pc.Port, pc.Database, query)
	}
	tlsKeys := func(more string) string {
		return fmt.Sprintf("{mode: verify-full, ca_file: %q%s}", s.pki.CAFile, more)
	}
	for _, tc := range []struct {
		name, dsn, tls string
	}{
		{"postgres.tls over sslmode=disable", url("postgres", "sslmode=disable"), tlsKeys("")},
		{"the DSN's sslmode and sslrootcert", url("postgres", "sslmode=verify-full&sslrootcert="+s.pki.CAFile), ""},
		{"client certificate", url("outboxd", "sslmode=disable"), tlsKeys(fmt.Sprintf(", cert_file: %q, key_file: %q", s.pki.CertFile, s.pki.KeyFile))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := f.config(seedRoute(topic))
			cfg.DSN = tc.dsn
			if tc.tls != "" {
				cfg.Postgres["tls"] = tc.tls
			}
			d := f.start(cfg)
			var ssl bool
			if err := f.mon.QueryRow(ctx, "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_replication_slots r ON r.active_pid = s.pid WHERE r.slot_name = $1", f.name).Scan(&ssl); err != nil || !ssl {
				t.Errorf("outboxd's walsender connection: ssl %v, %v", ssl, err)
			}
			w.txns(ctx, 5, 5)
			end := f.walLSN()
			w.verify(ctx, topic, "murmur2")
			f.waitConfirmed(end, 30*time.Second)
			d.term()
		})
	}

	for _, tc := range []struct {
		name, dsn, tls string
		want           []string // in the exit line and in check's database line
	}{
		{"wrong CA", url("postgres", "sslmode=disable"), fmt.Sprintf("{mode: verify-full, ca_file: %q}", s.pki.OtherCAFile),
			[]string{"TLS", "not signed by", "postgres.tls.ca_file"}},
		{"no TLS", url("postgres", "sslmode=disable"), "",
			[]string{"no encryption", "postgres.tls.mode"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := f.config(seedRoute(topic))
			cfg.DSN = tc.dsn
			if tc.tls != "" {
				cfg.Postgres["tls"] = tc.tls
			}
			exit := lastLine(exitedWith1(t, f.spawn(cfg), 30*time.Second))
			t.Logf("exit line: %s", exit)
			for _, want := range tc.want {
				if !strings.Contains(exit, want) {
					t.Errorf("the exit line lacks %q: %s", want, exit)
				}
			}
			r := outboxd(t, tc.dsn, "check", "-c", f.configFile(cfg))
			t.Logf("check: %s", r.line("FAIL database:"))
			wantCheckFails(t, r, "database", tc.want...)
		})
	}
}

// TestPostgresCAFileAlone: postgres.tls.ca_file without a mode verifies the
// server (verify-full), over a DSN that names no sslmode (libpq's default
// would be prefer: TLS with no certificate check). With the CA that signed
// the server's certificate outboxd streams over TLS; with another CA it
// stops at once with exit status 1 and the fix, and check fails the same.
func TestPostgresCAFileAlone(t *testing.T) {
	s := newSecure(t)
	f := newFixtureOn(t, s.env, seedSchema, map[string]int{"comandes": 1})
	ctx := context.Background()
	pc, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	dsn := fmt.Sprintf("postgres://postgres@%s:%d/%s", pc.Host, pc.Port, pc.Database)
	t.Setenv("PGSSLMODE", "")

	cfg := f.config(seedRoute(f.topic("comandes")))
	cfg.DSN = dsn
	cfg.Postgres["tls"] = fmt.Sprintf("{ca_file: %q}", s.pki.CAFile)
	d := f.start(cfg)
	var ssl bool
	if err := f.mon.QueryRow(ctx, "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_replication_slots r ON r.active_pid = s.pid WHERE r.slot_name = $1", f.name).Scan(&ssl); err != nil || !ssl {
		t.Errorf("outboxd's walsender connection: ssl %v, %v", ssl, err)
	}
	if strings.Contains(d.Log(), "reaches PostgreSQL at") {
		t.Errorf("a TLS warning for a loopback server:\n%s", d.Log())
	}
	d.term()

	cfg.Postgres["tls"] = fmt.Sprintf("{ca_file: %q}", s.pki.OtherCAFile)
	exit := lastLine(exitedWith1(t, f.spawn(cfg), 30*time.Second))
	t.Logf("exit line: %s", exit)
	want := []string{"TLS", "not signed by", "postgres.tls.ca_file"}
	for _, w := range want {
		if !strings.Contains(exit, w) {
			t.Errorf("the exit line lacks %q: %s", w, exit)
		}
	}
	wantCheckFails(t, outboxd(t, dsn, "check", "-c", f.configFile(cfg)), "database", want...)
}

// TestSASLClosedIsNotAWrongPassword (issue 19 item 8): a proxy before the
// broker's SASL_PLAINTEXT listener closes each connection when the client
// sends its SaslAuthenticate request, as a broker restarting under its
// clients (a rolling restart) does. That is an outage: `check` names a
// closed connection, not a wrong password (before, kafka-go's reading of
// the end as SASL_AUTHENTICATION_FAILED made it say "SASL: authentication
// failed: check kafka.sasl.username ..."), and passes once the proxy lets
// the authentication through.
func TestSASLClosedIsNotAWrongPassword(t *testing.T) {
	kafkaOnly(t)
	s := newSecure(t)
	f := newFixtureOn(t, s.env, seedSchema, map[string]int{"comandes": 1})
	target, err := s.env.KafkaListener(saslPlaintext)
	if err != nil {
		t.Fatal(err)
	}
	p := newSASLCutter(t, target)
	cfg := f.config(seedRoute(f.topic("comandes")))
	s.kafka(t, &cfg, saslPlaintext, "", s.sasl("SCRAM-SHA-256"))
	cfg.Brokers = p.addr
	path := f.configFile(cfg)
	p.cut.Store(true)
	r := outboxd(t, f.dsn, "check", "-c", path)
	t.Logf("check: %s", r.line("FAIL kafka:"))
	wantCheckFails(t, r, "kafka", "the broker closed the connection: it may be restarting")
	if strings.Contains(r.stdout, "SASL: authentication failed") {
		t.Fatalf("a closed connection taken for a wrong password:\n%s", r)
	}
	if p.cuts.Load() == 0 {
		t.Fatal("the proxy saw no SaslAuthenticate request: the test did not close one")
	}
	p.cut.Store(false)
	if r := outboxd(t, f.dsn, "check", "-c", path); !strings.Contains(r.line("PASS kafka:"), p.addr) {
		t.Fatalf("check with the authentication let through:\n%s", r)
	}
}

// saslCutter is a TCP proxy to a broker that, while cut is set, closes a
// connection (both ways) when the client's next request is a
// SaslAuthenticate.
type saslCutter struct {
	addr string
	cut  atomic.Bool
	cuts atomic.Int32
}

func newSASLCutter(t *testing.T, target string) *saslCutter {
	t.Helper()
	p := &saslCutter{}
	p.addr = proxyTo(t, target, func(down, up net.Conn) {
		done := make(chan struct{})
		go func() { defer close(done); _, _ = io.Copy(down, up); down.Close() }()
		p.forward(down, up) // closes up, which ends the copy
		<-done
	})
	return p
}

// forward copies the client's requests to the broker, one whole request at
// a time.
func (p *saslCutter) forward(down, up net.Conn) {
	defer down.Close()
	defer up.Close()
	const saslAuthenticate = 36 // the request's API key
	for {
		var size [4]byte
		if _, err := io.ReadFull(down, size[:]); err != nil {
			return
		}
		req := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(down, req); err != nil || len(req) < 2 {
			return
		}
		if p.cut.Load() && binary.BigEndian.Uint16(req) == saslAuthenticate {
			p.cuts.Add(1)
			return
		}
		if _, err := up.Write(append(size[:], req...)); err != nil {
			return
		}
	}
}
