package catalog

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// PartitionedTable is what the catalogs say about a partitioned outbox: its key
// and its partitions, each with whether its whole range is older than an
// age (what retention.mode drop_partitions drops) and whether a partition
// takes the rows a service inserts now and tomorrow. The retention job and
// `outboxd check` both read it here, so that they agree on which
// partitions are due.
type PartitionedTable struct {
	Table Table
	// Strategy is pg_partitioned_table.partstrat: r (range), l (list), h
	// (hash). Column and Type are the key's column and type when the key is
	// one column (not an expression).
	Strategy     string
	Column, Type string
	Keys         int
	Parts        []Partition // by the start of their range; the default last
	HasDefault   bool
	// Now and Tomorrow: a partition other than the default takes rows
	// whose key is now(), and now() + 1 day.
	Now, Tomorrow bool
}

// Partition is one partition of a PartitionedTable.
type Partition struct {
	Table Table
	Bound string // pg_get_expr(relpartbound): FOR VALUES FROM (...) TO (...), DEFAULT
	// Default is the default partition, which retention never drops.
	Default bool
	// DetachPending: a DETACH PARTITION ... CONCURRENTLY was interrupted;
	// ALTER TABLE ... DETACH PARTITION ... FINALIZE completes it.
	DetachPending bool
	// From and To are the range [From, To); zero: MINVALUE, MAXVALUE (or
	// not a range partition).
	From, To time.Time
	// Due: every key the range holds is older than the age asked for.
	Due bool
}

// Name is the partition's name, schema-qualified as in the logs.
func (p Partition) Name() string { return p.Table.String() }

// ReadPartitionedTable reads t's partitions, each Due when its whole range is
// older than maxAge (by now() on the server). It returns nil, nil when t
// is not a partitioned table the role can see.
func ReadPartitionedTable(ctx context.Context, conn *pgconn.PgConn, t Table, maxAge time.Duration) (*PartitionedTable, error) {
	reg := "pg_catalog.to_regclass(" + QuoteLiteral(t.Quoted()) + ")"
	rows, err := query(ctx, conn, `SELECT pt.partstrat::text, pt.partnatts, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)
		FROM pg_catalog.pg_partitioned_table pt
		LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0] AND pt.partnatts = 1
		WHERE pt.partrelid = `+reg)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	ps := &PartitionedTable{Table: t, Strategy: str(rows[0][0]), Column: str(rows[0][2]), Type: str(rows[0][3])}
	ps.Keys, _ = strconv.Atoi(str(rows[0][1]))
	rows, err = query(ctx, conn, `SELECT n.nspname, c.relname, pg_catalog.pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending
		FROM pg_catalog.pg_inherits i
		JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE i.inhparent = `+reg+` ORDER BY c.relname`)
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		p := Partition{Table: Table{str(r[0]), str(r[1])}, Bound: str(r[2]), DetachPending: str(r[3]) == "t"}
		p.Default = p.Bound == "DEFAULT"
		ps.HasDefault = ps.HasDefault || p.Default
		ps.Parts = append(ps.Parts, p)
	}
	if !ps.timeRange() {
		return ps, nil
	}
	return ps, ps.readRanges(ctx, conn, maxAge)
}

// timeRange: partitioned by RANGE on one column of a date or time type,
// whose bounds readRanges can compare with now().
func (ps *PartitionedTable) timeRange() bool {
	return ps.Strategy == "r" && ps.Keys == 1 && ps.Column != "" && (strings.HasPrefix(ps.Type, "timestamp") || ps.Type == "date")
}

// RangeOn says why retention cannot drop ps's partitions by column: nil
// when ps is partitioned by RANGE on that one column.
func (ps *PartitionedTable) RangeOn(column string) error {
	switch {
	case ps.Strategy != "r":
		return fmt.Errorf("%s is partitioned by %s, not by RANGE (%s): retention.mode drop_partitions drops partitions by the range of their %s", ps.Table, strategyName(ps.Strategy), column, column)
	case ps.Keys != 1 || ps.Column == "" || ps.Column != column:
		return fmt.Errorf("%s is partitioned by RANGE on something other than %s alone: retention.mode drop_partitions drops partitions by the range of their %s", ps.Table, column, column)
	case !ps.timeRange():
		return fmt.Errorf("%s is partitioned by RANGE on %s of type %s: retention.mode drop_partitions needs a timestamp or date", ps.Table, column, ps.Type)
	}
	return nil
}

func strategyName(s string) string {
	switch s {
	case "l":
		return "LIST"
	case "h":
		return "HASH"
	}
	return "RANGE"
}

// Due is the partitions whose whole range is older than the age, oldest
// first.
func (ps *PartitionedTable) Due() []Partition {
	var due []Partition
	for _, p := range ps.Parts {
		if p.Due {
			due = append(due, p)
		}
	}
	return due
}

// Oldest is the partition whose range starts first, the default aside;
// false when there is none.
func (ps *PartitionedTable) Oldest() (Partition, bool) {
	for _, p := range ps.Parts {
		if !p.Default {
			return p, true
		}
	}
	return Partition{}, false
}

// readRanges parses each partition's bounds, and has the server compare
// them, in the key's type, with now() - maxAge, now() and now() + 1 day.
func (ps *PartitionedTable) readRanges(ctx context.Context, conn *pgconn.PgConn, maxAge time.Duration) error {
	var los, his []string
	var idx []int
	for i, p := range ps.Parts {
		if p.Default {
			continue
		}
		lo, hi, err := parseRange(p.Bound)
		if err != nil {
			return fmt.Errorf("partition %s: %w", p.Name(), err)
		}
		los, his, idx = append(los, lo), append(his, hi), append(idx, i)
	}
	if len(idx) > 0 {
		typ := ps.Type
		rows, err := query(ctx, conn, fmt.Sprintf(`SELECT extract(epoch FROM lo::%[1]s::timestamptz), extract(epoch FROM hi::%[1]s::timestamptz),
			COALESCE(hi::%[1]s <= (now() - make_interval(secs => %[2]s))::%[1]s, false),
			(lo IS NULL OR lo::%[1]s <= now()::%[1]s) AND (hi IS NULL OR now()::%[1]s < hi::%[1]s),
			(lo IS NULL OR lo::%[1]s <= (now() + interval '1 day')::%[1]s) AND (hi IS NULL OR (now() + interval '1 day')::%[1]s < hi::%[1]s)
			FROM unnest(%[3]s::text[], %[4]s::text[]) WITH ORDINALITY u(lo, hi, i) ORDER BY i`,
			typ, strconv.FormatFloat(maxAge.Seconds(), 'f', -1, 64), textArray(los), textArray(his)))
		if err != nil {
			return fmt.Errorf("read the ranges of %s's partitions: %w", ps.Table, err)
		}
		if len(rows) != len(idx) {
			return fmt.Errorf("read the ranges of %s's partitions: %d rows for %d partitions", ps.Table, len(rows), len(idx))
		}
		for k, r := range rows {
			p := &ps.Parts[idx[k]]
			p.From, p.To, p.Due = epoch(r[0]), epoch(r[1]), str(r[2]) == "t"
			ps.Now = ps.Now || str(r[3]) == "t"
			ps.Tomorrow = ps.Tomorrow || str(r[4]) == "t"
		}
	}
	// By range start (MINVALUE first), the default last.
	slices.SortStableFunc(ps.Parts, func(a, b Partition) int {
		switch {
		case a.Default != b.Default && a.Default:
			return 1
		case a.Default != b.Default:
			return -1
		}
		return a.From.Compare(b.From)
	})
	return nil
}

// epoch is a Unix time in seconds as text; zero for NULL.
func epoch(v *string) time.Time {
	if v == nil {
		return time.Time{}
	}
	f, err := strconv.ParseFloat(*v, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return time.Time{} // ±infinity: no bound, as MINVALUE and MAXVALUE
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC()
}

// textArray is an ARRAY[...] literal of strs, "" standing for NULL.
func textArray(strs []string) string {
	vals := make([]string, len(strs))
	for i, s := range strs {
		vals[i] = "NULL"
		if s != "" {
			vals[i] = QuoteLiteral(s)
		}
	}
	return "ARRAY[" + strings.Join(vals, ", ") + "]"
}

// parseRange reads the bounds of a one-column range partition,
// "FOR VALUES FROM ('2026-11-01 00:00:00+00') TO ('2026-12-01 00:00:00+00')":
// each the literal's text, "" for MINVALUE or MAXVALUE.
func parseRange(bound string) (lo, hi string, err error) {
	rest, ok := strings.CutPrefix(bound, "FOR VALUES FROM (")
	if !ok {
		return "", "", fmt.Errorf("bound %q is not a range", bound)
	}
	if lo, rest, err = boundValue(rest); err != nil {
		return "", "", fmt.Errorf("bound %q: %w", bound, err)
	}
	if rest, ok = strings.CutPrefix(rest, ") TO ("); !ok {
		return "", "", fmt.Errorf("bound %q: no TO", bound)
	}
	if hi, rest, err = boundValue(rest); err != nil {
		return "", "", fmt.Errorf("bound %q: %w", bound, err)
	}
	if rest != ")" {
		return "", "", fmt.Errorf("bound %q is not a one-column range", bound)
	}
	return lo, hi, nil
}

// boundValue reads MINVALUE, MAXVALUE or a quoted literal from s.
func boundValue(s string) (val, rest string, err error) {
	for _, kw := range []string{"MINVALUE", "MAXVALUE"} {
		if r, ok := strings.CutPrefix(s, kw); ok {
			return "", r, nil
		}
	}
	if !strings.HasPrefix(s, "'") {
		return "", "", errors.New("a bound is neither a literal nor MINVALUE/MAXVALUE")
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] != '\'' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '\'' {
			b.WriteByte('\'')
			i++
			continue
		}
		return b.String(), s[i+1:], nil
	}
	return "", "", errors.New("an unterminated literal")
}

// InsertLSN reads pg_current_wal_insert_lsn(): every transaction whose
// commit a statement of this session has seen (as visible rows, or as the
// release of a lock it waited for) committed before it.
func InsertLSN(ctx context.Context, conn *pgconn.PgConn) (pglogrepl.LSN, error) {
	rows, err := query(ctx, conn, "SELECT pg_catalog.pg_current_wal_insert_lsn()")
	if err != nil {
		return 0, err
	}
	if len(rows) != 1 || rows[0][0] == nil {
		return 0, errors.New("pg_current_wal_insert_lsn: no row")
	}
	return pglogrepl.ParseLSN(*rows[0][0])
}
