package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/testenv"
)

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
	dc := f.config(seedRoute(f.topic("comandes")))
	dc.DSN = dsn(password)
	dc.Postgres["create_publication"] = "false"
	d := f.start(dc)
	w := newWriter(f, 11, 20, "outbox")
	for i := 0; i < 10; i++ {
		if err := w.txn(ctx, 1+i); err != nil {
			t.Fatal(err)
		}
	}
	w.verify(ctx, f.topic("comandes"), "murmur2")
	d.term()
	if log := d.Log(); strings.Contains(log, password) {
		t.Fatalf("the password is in the log:\n%s", log)
	}

	const wrong = "Wr0ng-pa55word-also-secret"
	dc.DSN = dsn(wrong)
	bad := f.spawn(dc)
	if err := bad.exited(30 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 with a wrong password")
	}
	log := bad.Log()
	if strings.Contains(log, wrong) || strings.Contains(log, password) {
		t.Fatalf("a password is in the log:\n%s", log)
	}
	if !strings.Contains(log, "password authentication failed") || !strings.Contains(log, "check postgres.dsn") {
		t.Fatalf("the error does not say what is wrong:\n%s", log)
	}

	// The role loses REPLICATION: a clear error naming the privilege.
	if _, err := f.db.Exec(ctx, "ALTER ROLE "+role+" NOREPLICATION"); err != nil {
		t.Fatal(err)
	}
	dc.DSN = dsn(password)
	noRepl := f.spawn(dc)
	if err := noRepl.exited(30 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 without the REPLICATION privilege")
	}
	if log := noRepl.Log(); !strings.Contains(log, "REPLICATION") || strings.Contains(log, password) {
		t.Fatalf("the error does not name the missing privilege (or shows the password):\n%s", log)
	}
}

// TestSecretsNeverShown: outboxd runs with known secrets, all read from
// files: a PostgreSQL password holding @ / " ' \ : ? # % & = a space and
// non-ASCII letters (it works: the role logs in with it over TLS and every
// row is delivered), the broker's SASL password, and, later, a wrong one of
// each. Through a start, normal operation, a broker outage (stopped, then
// back), a wrong SASL password, a wrong PostgreSQL password and `outboxd
// check` in each state, no secret appears, raw or encoded, in its log,
// /status, /metrics, /healthz, /readyz or check's output.
func TestSecretsNeverShown(t *testing.T) {
	s := newSecure(t)
	f := newFixtureOn(t, s.env, seedSchema, map[string]int{"comandes": 2})
	ctx := context.Background()
	topic := f.topic("comandes")
	const pgPassword = `p@ss/w"rd:'x'\?#%&= ünïcödé-ßecret`
	const wrongPG = `Wr0ng/pg@pass"word%2F`
	wrongSASL := "Wr0ng-sasl-" + f.name
	dir := t.TempDir()
	file := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	pgFile, wrongPGFile, wrongSASLFile := file("pg", pgPassword), file("wrong-pg", wrongPG), file("wrong-sasl", wrongSASL)

	role := f.name + "_secret"
	for _, sql := range []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'", role, strings.ReplaceAll(pgPassword, "'", "''")),
		fmt.Sprintf("GRANT SELECT ON outbox TO %s", role),
		fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE outbox WITH (publish = 'insert')", f.name),
	} {
		if _, err := f.db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = f.mon.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = f.mon.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	pc, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	dsn := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=verify-full&sslrootcert=%s", role, pc.Host, pc.Port, pc.Database, s.pki.CAFile)
	config := func(pgFile, saslFile string) testenv.Config {
		cfg := f.config(seedRoute(topic))
		cfg.DSN = dsn
		cfg.Postgres["password_file"] = fmt.Sprintf("%q", pgFile)
		cfg.Postgres["create_publication"] = "false"
		s.kafka(t, &cfg, saslSSL, s.tlsCA(""), fmt.Sprintf("{mechanism: SCRAM-SHA-512, username: %s, password_file: %q}", s.user, saslFile))
		return cfg
	}

	// Everything outboxd showed, by where it showed it.
	shown := map[string]string{}
	show := func(where, text string) { shown[where] += text }
	endpoints := func(d *daemon, when string) {
		for _, path := range []string{"/status", "/metrics", "/healthz", "/readyz"} {
			_, body, err := d.Get(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			show(when+" "+path, string(body))
		}
	}
	check := func(cfg testenv.Config, when string) cmdResult {
		r := outboxd(t, dsn, "check", "-c", f.configFile(cfg))
		show(when+" check", r.stdout+r.stderr)
		return r
	}

	good := config(pgFile, s.passwordFile)
	d := f.start(good)
	w := newWriter(f, 41, 10, "outbox")
	w.txns(ctx, 8, 3)
	w.verify(ctx, topic, "murmur2")
	endpoints(d, "running")
	if r := check(good, "running"); r.code != 0 {
		t.Errorf("check on the good configuration:\n%s", r)
	}

	// The broker goes away for a while, rows wait, then arrive.
	t.Cleanup(func() { _ = s.env.StartKafka() }) // for the tests after this one, should it fail midway
	if err := s.env.StopKafka(); err != nil {
		t.Fatal(err)
	}
	w.txns(ctx, 4, 2)
	eventually(t, 30*time.Second, "/status to show the broker unreachable", func() bool {
		st := d.status()
		return st.Kafka.BrokersReachable == 0 && !st.Ready
	})
	endpoints(d, "broker down")
	check(good, "broker down")
	if err := s.env.StartKafka(); err != nil {
		t.Fatal(err)
	}
	w.verify(ctx, topic, "murmur2")
	d.term()
	show("log", d.Log())

	// Wrong passwords: a row waits, outboxd stops, check fails.
	if err := w.txn(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  testenv.Config
	}{
		{"wrong SASL password", config(pgFile, wrongSASLFile)},
		{"wrong PostgreSQL password", config(wrongPGFile, s.passwordFile)},
	} {
		show(tc.name+" log", exitedWith1(t, f.spawn(tc.cfg), 60*time.Second))
		if r := check(tc.cfg, tc.name); r.code != 1 {
			t.Errorf("check with a %s: exit %d\n%s", tc.name, r.code, r)
		}
	}

	secrets := []string{"the PostgreSQL password", "the wrong PostgreSQL password", "the SASL password", "the wrong SASL password"}
	for i, secret := range []string{pgPassword, wrongPG, s.password, wrongSASL} {
		for j, form := range secretForms(secret) {
			for where, text := range shown {
				if strings.Contains(text, form) {
					t.Errorf("%s (form %d) is in %s:\n%s", secrets[i], j, where, text)
				}
			}
		}
	}
	if len(shown) < 15 {
		t.Errorf("only %d outputs looked at", len(shown))
	}
}

// secretForms is a secret as it could leak: raw, percent-encoded (a DSN),
// JSON-escaped (a JSON log line or /status).
func secretForms(secret string) []string {
	j, _ := json.Marshal(secret)
	forms := []string{secret, url.QueryEscape(secret), url.PathEscape(secret), strings.Trim(string(j), `"`)}
	return slices.Compact(forms)
}
