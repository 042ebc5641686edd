package integration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// TestCheckManagedRoles: roles that imitate Amazon RDS's grants decide
// check's role line the way RDS would: a role named rds_replication
// (NOLOGIN, without the REPLICATION attribute) and a login role that is a
// member of it, directly or through another role, pass; a login role
// with neither fails with a fix that names each managed service's way.
// RDS's server refuses the slot to a role that is neither (a vanilla
// server refuses the members too: only check is judged here).
func TestCheckManagedRoles(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	path := f.configFile(f.config(seedRoute(f.topic("comandes"))))
	// rds_replication is the cluster's: it is created by this test alone
	// (tests in this package do not run in parallel) and dropped after.
	mustExec(f, "CREATE ROLE rds_replication NOLOGIN")
	mid, direct, through, neither := f.name+"_rdsmid", f.name+"_rdsdirect", f.name+"_rdsthrough", f.name+"_neither"
	t.Cleanup(func() {
		for _, r := range []string{direct, through, neither, mid, "rds_replication"} {
			_, _ = f.mon.Exec(context.Background(), "DROP OWNED BY "+r+"; DROP ROLE IF EXISTS "+r)
		}
	})
	mustExec(f, "CREATE ROLE "+mid+" NOLOGIN")
	mustExec(f, "GRANT rds_replication TO "+mid)
	for _, r := range []string{direct, through, neither} {
		mustExec(f, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD 'pw-managed-4'", r))
		mustExec(f, "GRANT SELECT ON outbox TO "+r)
	}
	mustExec(f, "GRANT rds_replication TO "+direct)
	mustExec(f, "GRANT "+mid+" TO "+through)

	for _, r := range []string{direct, through} {
		res := outboxd(t, roleDSN(f, r, "pw-managed-4"), "check", "-c", path)
		l := res.line("PASS role:")
		for _, want := range []string{r + " is a member of rds_replication", "Amazon RDS and Aurora's way", "docs/managed-postgres.md#amazon-rds-and-aurora"} {
			if !strings.Contains(l, want) {
				t.Errorf("%s: the PASS role line lacks %q: %q\n%s", r, want, l, res)
			}
		}
	}

	res := outboxd(t, roleDSN(f, neither, "pw-managed-4"), "check", "-c", path)
	wantCheckFails(t, res, "role", "neither REPLICATION nor SUPERUSER nor membership of rds_replication",
		`as a superuser: ALTER ROLE "`+neither+`" REPLICATION`, `Amazon RDS and Aurora: GRANT rds_replication TO "`+neither+`"`,
		"cloudsqlsuperuser", "alloydbsuperuser", "azure_pg_admin", "neon_superuser", "docs/managed-postgres.md")
	if strings.Contains(res.stdout+res.stderr, "pw-managed-4") {
		t.Errorf("the password is in the output\n%s", res)
	}
}

// TestCheckRecognisesManagedServices: a setting that only a managed
// service has (set here for the database: a vanilla server keeps it as a
// placeholder, which pg_settings does not list) makes check name the
// service and its section of docs/managed-postgres.md, and a role that
// may not replicate gets that service's way as the fix; Aurora is told
// from RDS by its aurora_version function. A vanilla server is no service.
func TestCheckRecognisesManagedServices(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	path := f.configFile(f.config(seedRoute(f.topic("comandes"))))
	neither := f.name + "_neither"
	q := `"` + neither + `"` // as check quotes it
	mustExec(f, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD 'pw-managed-5'", neither))
	mustExec(f, "GRANT SELECT ON outbox TO "+neither)
	t.Cleanup(func() {
		_, _ = f.mon.Exec(context.Background(), "DROP OWNED BY "+neither+"; DROP ROLE IF EXISTS "+neither)
	})

	if res := outboxd(t, f.dsn, "check", "-c", path); strings.Contains(res.stdout, " service:") {
		t.Errorf("a vanilla server was recognised as a managed service\n%s", res)
	}
	for _, tc := range []struct {
		name    string
		setup   []string // run as the test's superuser, then undone by ALTER DATABASE ... RESET ALL
		service string
		section string
		grant   string
	}{
		{"RDS", []string{"ALTER DATABASE %s SET rds.extensions = 'pg_stat_statements, pglogical'"},
			"Amazon RDS for PostgreSQL", "#amazon-rds-and-aurora", "GRANT rds_replication TO " + q},
		{"Aurora", []string{"ALTER DATABASE %s SET rds.extensions = 'pg_stat_statements'",
			"CREATE FUNCTION aurora_version() RETURNS text LANGUAGE sql AS $$SELECT '16.4.0'$$"},
			"Amazon Aurora PostgreSQL", "#amazon-rds-and-aurora", "GRANT rds_replication TO " + q},
		{"CloudSQL", []string{"ALTER DATABASE %s SET cloudsql.logical_decoding = on"},
			"Google Cloud SQL for PostgreSQL", "#google-cloud-sql-and-alloydb", "ALTER USER " + q + " WITH REPLICATION (as a member of cloudsqlsuperuser"},
		{"AlloyDB", []string{"ALTER DATABASE %s SET alloydb.logical_decoding = on"},
			"AlloyDB for PostgreSQL", "#google-cloud-sql-and-alloydb", "ALTER USER " + q + " WITH REPLICATION (as a member of alloydbsuperuser"},
		{"Azure", []string{"ALTER DATABASE %s SET azure.extensions = 'pglogical'"},
			"Azure Database for PostgreSQL flexible server", "#azure-database-for-postgresql-flexible-server", "ALTER ROLE " + q + " WITH REPLICATION (as the server's administrator"},
		{"Neon", []string{"ALTER DATABASE %s SET neon.timeline_id = '0123456789abcdef0123456789abcdef'"},
			"Neon", "#neon", "connect as a role created in the Neon Console, CLI or API instead of " + q},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, sql := range tc.setup {
				if strings.Contains(sql, "%s") {
					sql = fmt.Sprintf(sql, f.name)
				}
				mustExec(f, sql)
			}
			t.Cleanup(func() {
				_, _ = f.mon.Exec(context.Background(), "ALTER DATABASE "+f.name+" RESET ALL; DROP FUNCTION IF EXISTS aurora_version()")
			})
			res := outboxd(t, f.dsn, "check", "-c", path)
			if l, want := res.line("PASS service:"), "PASS service: "+tc.service+": see docs/managed-postgres.md"+tc.section; l != want {
				t.Errorf("service line %q; want %q\n%s", l, want, res)
			}
			if l := res.line("PASS role:"); !strings.Contains(l, "superuser") {
				t.Errorf("the test's superuser: role line %q", l)
			}
			res = outboxd(t, roleDSN(f, neither, "pw-managed-5"), "check", "-c", path)
			wantCheckFails(t, res, "role", "on "+tc.service, tc.grant, "docs/managed-postgres.md"+tc.section)
			if l := res.line("FAIL role:"); strings.Contains(l, "as a superuser") {
				t.Errorf("on %s the fix gives a superuser's statement: %s", tc.service, l)
			}
		})
	}
}
