package integration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// binaryColumns adds to the seed's outbox a column of every type outboxd
// reads in binary format besides the seed's own, each with a default that
// picks among edge values (the extremes, infinities, years BC and past
// 9999, fractions with trailing zeros).
var binaryColumns = []struct{ name, def string }{
	{"t_bool", "boolean DEFAULT random() < 0.5"},
	{"t_i2", "smallint DEFAULT (ARRAY[-32768, 32767, 0, -1, 7])[1 + floor(random() * 5)::int]"},
	{"t_i8", "bigint DEFAULT (ARRAY[-9223372036854775808, 9223372036854775807, 0, -42, floor(random() * 1e15)::bigint])[1 + floor(random() * 5)::int]"},
	{"t_oid", "oid DEFAULT floor(random() * 4294967295)::bigint::oid"},
	{"t_date", "date DEFAULT (ARRAY['infinity', '-infinity', '0100-07-04 BC', '1999-12-31', '2026-02-28']::date[])[1 + floor(random() * 5)::int]"},
	{"t_ts", "timestamp DEFAULT (ARRAY[localtimestamp, 'infinity', '0001-01-01 00:00:00 BC', '2026-09-10 07:33:20.12', '1969-12-31 23:59:59.9995']::timestamp[])[1 + floor(random() * 5)::int]"},
	{"t_tstz", "timestamptz DEFAULT (ARRAY[clock_timestamp(), 'infinity', '-infinity', '0044-03-15 12:00:00+00 BC', '294276-12-31 23:59:59.999999+00', '12026-01-01 00:00:00.5+00'])[1 + floor(random() * 6)::int]"},
	{"t_bytea", `bytea DEFAULT (ARRAY['\x'::bytea, decode(md5(random()::text), 'hex')])[1 + floor(random() * 2)::int]`},
	{"t_uuid", "uuid DEFAULT gen_random_uuid()"},
	{"t_vc", `varchar(20) DEFAULT 'vàr "x"'`},
	{"t_ch", "char(5) DEFAULT 'ab'"},
	{"t_name", "name DEFAULT 'nom'"},
	{"t_json", `json DEFAULT '{"b":  1, "a":[2]}'`},
}

// TestBinaryFormat: with postgres.binary the walsender sends the values in
// binary format and every record is what the text format gives: the seed's
// route record by record (uuid, integer, jsonb, timestamptz with odd
// offsets and before the epoch), and a second route placing a column of
// every other type read in binary in a header, compared with PostgreSQL's
// own text of the value. A column of a type outboxd does not read in
// binary stops it, naming the column and the fix.
func TestBinaryFormat(t *testing.T) {
	var alter []string
	for _, c := range binaryColumns {
		alter = append(alter, fmt.Sprintf("ADD COLUMN %s %s", c.name, c.def))
	}
	f := newFixture(t, seedSchema+"\nALTER TABLE outbox "+strings.Join(alter, ", ")+";", map[string]int{"comandes": 3, "columnes": 1})
	ctx := context.Background()
	var fields []string
	for _, c := range binaryColumns {
		fields = append(fields, fmt.Sprintf("{column: %s, header: %s}", c.name, c.name))
	}
	cfg := f.config(seedRoute(f.topic("comandes")),
		testenv.Route{Table: "public.outbox", Topic: f.topic("columnes"), More: testenv.Section{
			// A second route of a table needs a filter: this one takes every tipus the writer writes.
			"filter": "{tipus: [comanda.t0, comanda.t1, comanda.t2, comanda.t3, comanda.t4]}",
			"fields": "[" + strings.Join(fields, ", ") + "]"}})
	cfg.Postgres["binary"] = "true"
	d := f.start(cfg)

	w := newWriter(f, 14, 40, "outbox")
	w.txns(ctx, 60, 9) // 300 rows
	rep := w.verify(ctx, f.topic("comandes"), "murmur2")
	t.Logf("comandes: %+v", rep)

	// PostgreSQL's text of each value, as the text format would send it
	// with TimeZone UTC.
	if _, err := f.db.Exec(ctx, "SET TimeZone = 'UTC'"); err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range binaryColumns {
		text := "concat(" + c.name + ")" // the output function's text (a cast to text trims char's padding)
		if c.name == "t_bool" {
			text = "CASE WHEN t_bool THEN 'true' ELSE 'false' END" // a boolean header's value
		}
		cols = append(cols, text)
	}
	rows, err := f.db.Query(ctx, "SELECT id::text, "+strings.Join(cols, ", ")+" FROM outbox")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	for rows.Next() {
		vals := make([]string, len(binaryColumns)+1)
		ptrs := make([]any, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		want[vals[0]] = vals[1:]
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	distinct := make([]map[string]bool, len(binaryColumns))
	for _, m := range f.consumeAll(f.topic("columnes"), len(want)) {
		id := header(m, "id_esdeveniment")
		vals, ok := want[id]
		if !ok {
			t.Fatalf("a record of an unknown row %q", id)
		}
		for i, c := range binaryColumns {
			if got := header(m, c.name); got != vals[i] {
				t.Errorf("row %s, %s: header %q, PostgreSQL's text %q", id, c.name, got, vals[i])
			}
			if distinct[i] == nil {
				distinct[i] = map[string]bool{}
			}
			distinct[i][vals[i]] = true
		}
	}
	for i, c := range binaryColumns {
		t.Logf("%s: %d distinct values", c.name, len(distinct[i]))
		if c.name == "t_date" || c.name == "t_ts" || c.name == "t_tstz" {
			var bc, inf bool
			for v := range distinct[i] {
				bc, inf = bc || strings.HasSuffix(v, " BC"), inf || v == "infinity"
			}
			if !bc || !inf {
				t.Errorf("%s: no year BC or no infinity among %d rows: the edges went untested", c.name, len(want))
			}
		}
	}

	// numeric has a binary send function but outboxd does not read it.
	if _, err := f.db.Exec(ctx, "ALTER TABLE outbox ADD COLUMN import numeric DEFAULT 12.50"); err != nil {
		t.Fatal(err)
	}
	w.txns(ctx, 1, 1)
	if err := d.exited(30 * time.Second); err == nil {
		t.Fatal("outboxd exited with status 0 on a numeric column in binary format")
	}
	if log := d.Log(); !strings.Contains(log, `column \"import\" of public.outbox`) && !strings.Contains(log, `column "import" of public.outbox`) || !strings.Contains(log, "postgres.binary: false") {
		t.Errorf("the log does not name the column and the fix:\n%s", log)
	}
}
