package integration_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/testenv"
)

// Issue 19, items 10 to 14, against the real services: what a configuration
// may not smuggle in, the TLS warning, and the health server's bounds.

// TestConfigRefusesUnsafeValues: a variable in a URL DSN's hosts that would
// turn a verify-full DSN into a plaintext one, a variable set but empty, a
// password with a / not percent-encoded, and aliases that stand for far more
// than the file holds are each a configuration error that says what to do,
// before anything connects; nothing of the password is printed.
func TestConfigRefusesUnsafeValues(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	pc, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	hostPort := fmt.Sprintf("%s:%d", pc.Host, pc.Port)
	ca, err := filepath.Abs("../config/testdata/ca.pem") // a CA that signed nothing here
	if err != nil {
		t.Fatal(err)
	}
	// A filter of 20 columns of 20 values, aliased by 100 overrides: 40,000
	// values in a few KB.
	var cols []string
	for i := 1; i <= 20; i++ {
		cols = append(cols, fmt.Sprintf("c%d: *v", i))
	}
	cols[0] = "c1: &v [" + strings.TrimSuffix(strings.Repeat("x, ", 20), ", ") + "]"
	bomb := "\n      - &o {topic: x, when: {" + strings.Join(cols, ", ") + "}}" + strings.Repeat("\n      - *o", 99)

	for _, tc := range []struct {
		name   string
		env    map[string]string
		change func(*testenv.Config)
		want   []string
		secret string // never printed
	}{
		{name: "a host variable that injects sslmode=disable",
			env: map[string]string{"TEST_PGHOST": hostPort + "/" + pc.Database + "?sslmode=disable&x="},
			change: func(c *testenv.Config) {
				c.Postgres["dsn"] = fmt.Sprintf(`"postgres://%s@${TEST_PGHOST}/%s?sslmode=verify-full&sslrootcert=%s"`, pc.User, pc.Database, ca)
			},
			want: []string{"${TEST_PGHOST} stands in the hosts of the URL"}},
		{name: "a variable set but empty",
			env:    map[string]string{"TEST_LISTEN": ""},
			change: func(c *testenv.Config) { c.Health["listen"] = `"${TEST_LISTEN}"` },
			want:   []string{"health.listen: environment variable TEST_LISTEN is set but empty"}},
		{name: "a password with a / not percent-encoded",
			change: func(c *testenv.Config) {
				c.Postgres["dsn"] = fmt.Sprintf(`"postgres://%s:99/Zq9secret@%s/%s"`, pc.User, hostPort, pc.Database)
			},
			want: []string{"an @ after the host", "/ as %2F", "postgres.password_file"}, secret: "Zq9secret"},
		{name: "aliases that stand for 40,000 values",
			change: func(c *testenv.Config) { c.Routes[0].More = testenv.Section{"overrides": bomb} },
			want:   []string{"the aliases (*name) stand for more than 10000 values"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			cfg := f.config(seedRoute(f.topic("comandes")))
			tc.change(&cfg)
			path := f.configFile(cfg)
			r := outboxd(t, f.dsn, "check", "-c", path)
			l := r.line("FAIL config:")
			t.Logf("check: %s", l)
			if r.code != 2 || l == "" {
				t.Errorf("check: want exit 2 and a FAIL config line\n%s", r)
			}
			for _, w := range tc.want {
				if !strings.Contains(l, w) {
					t.Errorf("check: the FAIL config line lacks %q: %s", w, l)
				}
			}
			if l := r.line("PASS database:"); l != "" {
				t.Errorf("check connected: %s", l)
			}
			run := outboxdWithin(t, f.dsn, 30*time.Second, "run", "-c", path)
			if run.code != 2 || !strings.Contains(run.stderr, tc.want[0]) {
				t.Errorf("run: want exit 2 (configuration) with %q\n%s", tc.want[0], run)
			}
			for _, out := range []string{r.stdout, r.stderr, run.stdout, run.stderr} {
				if tc.secret != "" && strings.Contains(out, tc.secret[:4]) {
					t.Errorf("a piece of the password is printed:\n%s", out)
				}
			}
		})
	}
}

// TestPostgresTLSWarning: a DSN whose second host is not on this machine
// and that connects below verify-full (here sslmode=disable) is a warning
// at start and a WARN tls line in check, naming that host and not the
// loopback one. (outboxd connects to the first host, which answers; the
// second is only looked up, a name under .invalid that never resolves.)
func TestPostgresTLSWarning(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	pc, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	const far = "replica.invalid:5432"
	cfg := f.config(seedRoute(f.topic("comandes")))
	cfg.DSN = fmt.Sprintf("postgres://%s@%s:%d,%s/%s?sslmode=disable", pc.User, pc.Host, pc.Port, far, pc.Database)
	d := f.start(cfg)
	want := "reaches PostgreSQL at " + far + " in plaintext"
	line := ""
	for _, l := range strings.Split(d.Log(), "\n") {
		if strings.Contains(l, want) {
			line = l
		}
	}
	if !strings.Contains(line, "[WARN]") || !strings.Contains(line, "postgres.tls.mode: verify-full") {
		t.Errorf("no start warning %q with its fix:\n%s", want, d.Log())
	}
	if strings.Contains(line, fmt.Sprintf("%s:%d", pc.Host, pc.Port)) {
		t.Errorf("the warning names the loopback host: %s", line)
	}
	d.term()
	r := outboxd(t, cfg.DSN, "check", "-c", f.configFile(cfg))
	if l := r.line("WARN tls:"); !strings.Contains(l, want) || !strings.Contains(l, "fix: set postgres.tls.mode: verify-full") {
		t.Errorf("check: no WARN tls line %q\n%s", want, r)
	}
	// The same database by its loopback address alone: no warning.
	cfg.DSN = f.dsn
	if r := outboxd(t, cfg.DSN, "check", "-c", f.configFile(cfg)); r.line("WARN tls:") != "" {
		t.Errorf("check warns on a loopback DSN:\n%s", r)
	}
}

// TestHealthServerBounds: a kept-alive connection that stays idle is
// closed by the server; the profiler answers GET only and refuses a
// profile longer than 30 s (it would hold a connection and a CPU profile
// that long).
func TestHealthServerBounds(t *testing.T) {
	kafkaOnly(t)
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	cfg := f.config(seedRoute(f.topic("comandes")))
	cfg.Health["pprof"] = "true"
	d := f.start(cfg)

	client := &http.Client{Timeout: 20 * time.Second}
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{http.MethodPost, "/debug/pprof/symbol", http.StatusMethodNotAllowed},
		{http.MethodGet, "/debug/pprof/profile?seconds=3600", http.StatusBadRequest},
		{http.MethodGet, "/debug/pprof/heap?seconds=3600", http.StatusBadRequest},
		{http.MethodGet, "/debug/pprof/heap", http.StatusOK},
	} {
		req, _ := http.NewRequest(tc.method, "http://"+d.Addr()+tc.path, strings.NewReader(""))
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("%s %s: %v", tc.method, tc.path, err)
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.code)
		}
	}

	c, err := net.Dial("tcp", d.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: outboxd\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// The server's idle timeout is 30 s; a loaded machine gets three times
	// that.
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(90 * time.Second))
	_, err = br.ReadByte()
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("an idle kept-alive connection still open after %s", time.Since(start).Round(time.Second))
	}
	if !errors.Is(err, io.EOF) {
		t.Errorf("idle connection: %v, want the server to close it (EOF)", err)
	}
	t.Logf("the server closed the idle connection after %s", time.Since(start).Round(time.Second))
}

// TestBadRowNamedByIDOnly: the error of a row that cannot become a record
// (here a versio that is not a number) names the row by its table and id,
// and quotes nothing else it holds: neither its agregat_id (the record key)
// nor the bad value. The same text is /status's last_error.
func TestBadRowNamedByIDOnly(t *testing.T) {
	f := newFixture(t, looseSchema, map[string]int{"comandes": 1})
	cfg := f.config(seedRoute(f.topic("comandes")))
	cfg.Postgres["snapshot"] = "none"
	d := f.start(cfg)
	if _, err := f.db.Exec(context.Background(), "INSERT INTO outbox (id, agregat, agregat_id, tipus, versio, carrega) VALUES ('bad-1', 'comanda', 'Zq9-key', 'comanda.creada', 'Zq9-value', '{}')"); err != nil {
		t.Fatal(err)
	}
	if err := d.exited(30 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 on a bad row")
	}
	log := d.Log()
	if !strings.Contains(log, `outbox row id="bad-1" in public.outbox, column "versio": not an integer`) {
		t.Errorf("the error does not name the row by id:\n%s", log)
	}
	if strings.Contains(log, "Zq9-") {
		t.Errorf("the log quotes the row's content:\n%s", log)
	}
}

// outboxdWithin is outboxd (commands_test.go) for a command that may not end
// by itself (run with a configuration that should have been refused): it is
// killed after timeout, and the result says so.
func outboxdWithin(t *testing.T, dsn string, timeout time.Duration, args ...string) cmdResult {
	t.Helper()
	cmd, err := testenv.Command(dsn, args...)
	if err != nil {
		t.Fatal(err)
	}
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(timeout, func() { _ = cmd.Process.Kill() })
	err = cmd.Wait()
	if !timer.Stop() {
		errb.WriteString(fmt.Sprintf("\n(still running after %s: killed)", timeout))
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("outboxd %v: %v", args, err)
	}
	return cmdResult{out.String(), errb.String(), cmd.ProcessState.ExitCode()}
}

// TestCredentialsInURLsNeverPrinted (issue 35, item 3): a schema
// registry's URL with user info (Go's HTTP client sends it as basic
// authentication) and an OTLP endpoint with a token in its query reach no
// log line, no /status, no check output; a tracing.endpoint with user info
// is refused (the exporter would not send it) without quoting it; a DSN
// whose password holds an @ in its query is not printed either.
func TestCredentialsInURLsNeverPrinted(t *testing.T) {
	kafkaOnly(t)
	f := newFixture(t, seedSchema, map[string]int{"secrets": 1})
	const regSecret, tokSecret, dsnSecret = "RegS3cretPw", "TokS3cretQ", "DsnS3cret"
	dir := t.TempDir()
	schemaFile := filepath.Join(dir, "comanda-creada.json")
	if err := os.WriteFile(schemaFile, []byte(`{"type": "object"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// Nothing listens at the registry's address: outboxd waits for it,
	// logging why, and check fails its line.
	registry := "http://reguser:" + regSecret + "@" + freePort(t) + "/apis/ccompat/v7"
	cfg := f.config(testenv.Route{Table: "public.outbox", Topic: f.topic("secrets"), More: testenv.Section{
		"value":  "payload",
		"schema": `{registry: "` + registry + `", subject_strategy: record, auto_register: true, schemas: {comanda.creada: "` + schemaFile + `"}}`}})
	cfg.Tracing = testenv.Section{"endpoint": "http://" + freePort(t) + "/?api_token=" + tokSecret}
	d := f.spawn(cfg)
	eventually(t, 30*time.Second, "outboxd waiting for the registry", func() bool {
		return strings.Contains(d.Log(), "schema registry unreachable")
	})
	check := outboxd(t, f.dsn, "check", "-c", d.ConfigPath())
	d.kill()
	// Then streaming (no registry), for /status.
	traced := f.config(seedRoute(f.topic("secrets")))
	traced.Tracing = cfg.Tracing
	d2 := f.start(traced)
	_, status, err := d2.Get(context.Background(), "/status")
	if err != nil {
		t.Fatal(err)
	}
	d2.kill()
	for what, text := range map[string]string{"the log": d.Log(), "the streaming one's log": d2.Log(), "/status": string(status), "check": check.String()} {
		for _, secret := range []string{regSecret, tokSecret} {
			if strings.Contains(text, secret) {
				t.Errorf("%s holds %s:\n%s", what, secret, text)
			}
		}
	}
	if !strings.Contains(check.stdout, "schema registry routes[0]") {
		t.Errorf("check has no registry line:\n%s", check)
	}

	// User info in tracing.endpoint: refused, not quoted.
	cfg.Tracing = testenv.Section{"endpoint": "http://tk:" + tokSecret + "@" + freePort(t)}
	r := outboxd(t, f.dsn, "check", "-c", f.configFile(cfg))
	if !strings.Contains(r.String(), "tracing.endpoint: holds credentials") || strings.Contains(r.String(), tokSecret) {
		t.Errorf("tracing.endpoint with user info: want it refused without the secret:\n%s", r)
	}

	// A DSN without a path whose password, in its query, holds an @ (the
	// user info, as libpq reads it, would run to it).
	u, err := url.Parse(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	bad := "postgres://" + u.Host + "?dbname=" + strings.TrimPrefix(u.Path, "/") + "&user=nobody&password=p@" + dsnSecret + "&sslmode=disable"
	cfg = f.config(seedRoute(f.topic("secrets")))
	cfg.DSN = bad
	r = outboxd(t, bad, "check", "-c", f.configFile(cfg))
	if strings.Contains(r.String(), dsnSecret) || !strings.Contains(r.String(), "where the user info ends is in doubt") {
		t.Errorf("check prints the DSN's password, or does not refuse the DSN:\n%s", r)
	}
}
