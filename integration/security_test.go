package integration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
