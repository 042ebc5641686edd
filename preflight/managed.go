package preflight

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/postgres"
)

// markers are settings each managed service documents; recognise reads
// them with current_setting(name, true), which neither fails on a setting
// that does not exist nor misses one set only for the database or role (a
// placeholder, which pg_settings does not list).
var markers = []string{
	"rds.extensions", "rds.logical_replication",
	"cloudsql.logical_decoding", "cloudsql.iam_authentication",
	"alloydb.logical_decoding", "alloydb.iam_authentication",
	"azure.extensions",
	"neon.timeline_id", "neon.tenant_id",
}

// auroraVersion names the function only Aurora PostgreSQL has among the
// settings recognise reads.
const auroraVersion = "aurora_version()"

// recognise names the managed service the server is on from its settings
// (and Aurora's aurora_version function); nil when it recognises none.
func recognise(ctx context.Context, conn *pgx.Conn) (*postgres.Service, error) {
	rows, err := conn.Query(ctx, `SELECT name FROM pg_catalog.pg_settings WHERE name ~ '^((rds|cloudsql|alloydb|azure|neon)\.|(apg|aurora)_)'
		UNION SELECT m FROM unnest($1::text[]) m WHERE current_setting(m, true) IS NOT NULL
		UNION SELECT $2 FROM pg_catalog.pg_proc WHERE proname = 'aurora_version'`, markers, auroraVersion)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	return serviceOf(names), nil
}

// serviceOf is the managed service whose settings are among names (as
// pg_settings names them), nil if none. Aurora has RDS's settings too,
// so its own marks are looked for first.
func serviceOf(names []string) *postgres.Service {
	has := func(prefix string) bool {
		for _, n := range names {
			if strings.HasPrefix(n, prefix) {
				return true
			}
		}
		return false
	}
	for _, c := range []struct {
		prefixes []string
		svc      postgres.Service
	}{
		{[]string{auroraVersion, "apg_", "aurora_"}, postgres.Aurora},
		{[]string{"rds."}, postgres.RDS},
		{[]string{"alloydb."}, postgres.AlloyDB},
		{[]string{"cloudsql."}, postgres.CloudSQL},
		{[]string{"azure."}, postgres.Azure},
		{[]string{"neon."}, postgres.Neon},
	} {
		for _, p := range c.prefixes {
			if has(p) {
				svc := c.svc
				return &svc
			}
		}
	}
	return nil
}
