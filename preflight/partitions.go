package preflight

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/envelope"
)

// checkPartitions reports, for each routed table that is partitioned, its
// partitions (and whether rows created now and tomorrow have one to go
// to), and what retention.mode drop_partitions would do with them: the
// catalog.PartitionedTable the retention job reads.
func checkPartitions(ctx context.Context, conn *pgx.Conn, cfg target) []Result {
	drop := cfg.Retention.MaxAge > 0 && cfg.Retention.Mode == config.RetentionDropPartitions
	var out []Result
	for _, t := range cfg.routing.Tables() {
		ps, err := catalog.ReadPartitionedTable(ctx, conn.PgConn(), t.Table, cfg.Retention.MaxAge)
		name := "partitions " + t.String()
		switch {
		case err != nil:
			out = append(out, queryFailed(name, err)...)
			continue
		case ps == nil && drop:
			out = append(out, fail("retention "+t.String(), fmt.Sprintf("retention.mode is drop_partitions, but %s is not a partitioned table", t),
				fmt.Sprintf("partition it by RANGE (%s), or set retention.mode: delete", t.Route.Columns.CreatEn)))
			continue
		case ps == nil:
			continue
		}
		out = append(out, partitionsPresent(ctx, conn, cfg, ps))
		if drop {
			out = append(out, partitionsDue(ctx, conn, cfg, t, ps)...)
		}
	}
	return out
}

// partitionsPresent is the partitions line: what is there, the
// publication's publish_via_partition_root, and room for now's and
// tomorrow's rows.
func partitionsPresent(ctx context.Context, conn *pgx.Conn, cfg target, ps *catalog.PartitionedTable) Result {
	name := "partitions " + ps.Table.String()
	var ranged []catalog.Partition
	for _, p := range ps.Parts {
		if !p.Default {
			ranged = append(ranged, p)
		}
	}
	detail := fmt.Sprintf("%d partition(s)", len(ranged))
	if len(ranged) > 0 && ps.RangeOn(ps.Column) == nil {
		detail += fmt.Sprintf(" by RANGE (%s) from %s to %s", ps.Column, bound(ranged[0].From, "MINVALUE"), bound(ranged[len(ranged)-1].To, "MAXVALUE"))
	}
	if ps.HasDefault {
		detail += " and a default one"
	}
	var viaRoot *bool
	_ = conn.QueryRow(ctx, "SELECT pubviaroot FROM pg_publication WHERE pubname = $1", cfg.Postgres.Publication).Scan(&viaRoot)
	switch {
	case viaRoot == nil:
		detail += fmt.Sprintf("; publication %s is not there yet (outboxd creates it with publish_via_partition_root)", cfg.Postgres.Publication)
	case *viaRoot:
		detail += fmt.Sprintf("; publication %s has publish_via_partition_root", cfg.Postgres.Publication)
	default:
		detail += fmt.Sprintf("; publication %s has publish_via_partition_root off (the publication line says what to do)", cfg.Postgres.Publication)
	}
	if ps.RangeOn(ps.Column) != nil {
		return pass(name, "%s", detail)
	}
	create := fmt.Sprintf("create the next partitions ahead of time (CREATE TABLE ... PARTITION OF %s FOR VALUES FROM (...) TO (...)), or let pg_partman create them (its premake)", ps.Table)
	switch {
	case !ps.Now && !ps.HasDefault:
		return fail(name, detail+"; no partition takes the rows created now: the service's inserts fail", create)
	case !ps.Now:
		return warn(name, detail+"; no partition takes the rows created now: they go to the default partition, which retention never drops", create)
	case !ps.Tomorrow && !ps.HasDefault:
		return warn(name, detail+"; no partition takes the rows created in 24 hours: from then on the service's inserts fail", create)
	case !ps.Tomorrow:
		return warn(name, detail+"; no partition takes the rows created in 24 hours: from then on they go to the default partition, which retention never drops", create)
	}
	return pass(name, "%s; rows created now and in 24 hours have a partition", detail)
}

func bound(t time.Time, none string) string {
	if t.IsZero() {
		return none
	}
	return t.Format(time.RFC3339)
}

// partitionsDue is the retention line of drop_partitions: the partitions
// the next pass would drop, and whether the role may.
func partitionsDue(ctx context.Context, conn *pgx.Conn, cfg target, t envelope.Table, ps *catalog.PartitionedTable) []Result {
	name := "retention " + t.String()
	column := t.Route.Columns.CreatEn
	if err := ps.RangeOn(column); err != nil {
		return []Result{fail(name, err.Error(), fmt.Sprintf("partition the outbox by RANGE (%s), or set retention.mode: delete", column))}
	}
	var out []Result
	var owns bool
	var owner, role string
	if err := conn.QueryRow(ctx, `SELECT pg_has_role(current_user, c.relowner, 'USAGE'), quote_ident(pg_get_userbyid(c.relowner)), quote_ident(current_user)
		FROM pg_class c WHERE c.oid = $1::regclass`, t.Quoted()).Scan(&owns, &owner, &role); err != nil {
		return queryFailed(name, err)
	}
	if !owns {
		out = append(out, fail(name, fmt.Sprintf("retention.mode drop_partitions detaches and drops partitions, which only %s's owner (%s) may do", t, owner),
			fmt.Sprintf("GRANT %s TO %s (membership of the owner role), or set retention.mode: delete (which needs DELETE only)", owner, role)))
	}
	if r := partmanRetention(ctx, conn, t); r != nil {
		out = append(out, *r)
	}
	due := ps.Due()
	var names []string
	for _, p := range due {
		names = append(names, p.Name())
	}
	how := "DETACH PARTITION ... CONCURRENTLY, then DROP TABLE"
	if ps.HasDefault {
		how = "DETACH PARTITION and DROP TABLE in one transaction, waiting at most retention.lock_timeout for the lock (a default partition rules CONCURRENTLY out); never the default partition"
	}
	switch {
	case len(due) > 0:
		out = append(out, pass(name, "the next pass drops %d partition(s) older than %s, each once the slot has confirmed its rows: %s (%s)", len(due), cfg.Retention.MaxAge, strings.Join(names, ", "), how))
	default:
		next := "none"
		if p, ok := ps.Oldest(); ok && !p.To.IsZero() {
			next = fmt.Sprintf("%s, at %s", p.Name(), p.To.Add(cfg.Retention.MaxAge).Format(time.RFC3339))
		}
		out = append(out, pass(name, "no partition is older than %s yet; the first due: %s (%s)", cfg.Retention.MaxAge, next, how))
	}
	return out
}

// partmanRetention is a WARN when pg_partman keeps t with a retention of
// its own: it drops partitions whether Kafka has their rows or not.
func partmanRetention(ctx context.Context, conn *pgx.Conn, t envelope.Table) *Result {
	var schema string
	if err := conn.QueryRow(ctx, "SELECT quote_ident(extnamespace::regnamespace::text) FROM pg_extension WHERE extname = 'pg_partman'").Scan(&schema); err != nil {
		return nil // not installed (or not readable): nothing to say
	}
	var retention *string
	parent := t.Schema + "." + t.Name
	if err := conn.QueryRow(ctx, "SELECT retention FROM "+schema+".part_config WHERE parent_table = $1", parent).Scan(&retention); err != nil || retention == nil {
		return nil
	}
	res := warn("retention "+t.String(), fmt.Sprintf("pg_partman keeps %s with a retention of its own (%s): it drops partitions whether Kafka has their rows or not", parent, *retention),
		fmt.Sprintf("UPDATE %s.part_config SET retention = NULL WHERE parent_table = '%s' (pg_partman still creates the partitions; outboxd drops them)", schema, parent))
	return &res
}
