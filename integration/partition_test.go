package integration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// Partitioned outbox tables, and routes of every kind (partitioned,
// mixed-case, logical messages) together with retention.

// partitionedOutbox is the seed's outbox partitioned by month of creat_en,
// as pg_partman lays out a busy one: the primary key holds the partition
// key, and there is one partition per month (outbox_pYYYYMM) from three
// months ago to next month.
const partitionedOutbox = dropSchema + `
DO $$ BEGIN
	FOR m IN -3..1 LOOP
		EXECUTE format('CREATE TABLE %I PARTITION OF outbox FOR VALUES FROM (%L) TO (%L)',
			'outbox_p' || to_char(date_trunc('month', now()) + m * interval '1 month', 'YYYYMM'),
			date_trunc('month', now()) + m * interval '1 month', date_trunc('month', now()) + (m + 1) * interval '1 month');
	END LOOP;
END $$;
CREATE INDEX outbox_pendents ON outbox (creat_en) WHERE publicat_en IS NULL;`

// Where rows land in partitionedOutbox, as creat_en expressions.
const (
	lastMonth = "now() - interval '40 days'"                              // an earlier month's partition
	nextMonth = "date_trunc('month', now()) + interval '1 month 1 day'"   // next month's
	inMonths  = "date_trunc('month', now()) + interval '%d months 1 day'" // %d months on
	monthName = "'outbox_p' || to_char(date_trunc('month', now()) + interval '%d months', 'YYYYMM')"
)

// TestPartitionedOutbox: an outbox partitioned by month routes like a plain
// one, as public.outbox. outboxd creates its publication with
// publish_via_partition_root; the cut-over snapshot publishes the pending
// rows of every partition; rows of every partition are streamed, also of
// partitions created or attached while it runs, and detaching one changes
// nothing. A publication without publish_via_partition_root fails check
// and stops outboxd at start, both with the ALTER PUBLICATION that fixes
// it, before any row; once fixed, the rows committed meanwhile (which
// pgoutput still names by their partition) are delivered as the table's.
func TestPartitionedOutbox(t *testing.T) {
	f := newFixture(t, partitionedOutbox, map[string]int{"comandes": 3})
	ctx := context.Background()
	topic := f.topic("comandes")
	cfg := f.config(seedRoute(topic))
	path := f.configFile(cfg)

	// Before the first start: the relay published some rows, others wait.
	pending := append(insertRows(t, f.db, "outbox", 3, lastMonth, false), insertRows(t, f.db, "outbox", 3, "now()", false)...)
	insertRows(t, f.db, "outbox", 4, "now()", true)
	if r := outboxd(t, f.dsn, "check", "-c", path); r.code != 0 {
		t.Fatalf("check on a partitioned outbox: want exit 0\n%s", r)
	}
	d := f.start(cfg)
	var viaRoot bool
	if err := f.mon.QueryRow(ctx, "SELECT pubviaroot FROM pg_publication WHERE pubname = $1", f.name).Scan(&viaRoot); err != nil || !viaRoot {
		t.Fatalf("the publication outboxd created: publish_via_partition_root %t (%v), want true", viaRoot, err)
	}
	streamed := append(insertRows(t, f.db, "outbox", 2, "now()", false), insertRows(t, f.db, "outbox", 2, lastMonth, false)...)
	wantRecords(t, topic, ids(pending, streamed))

	// Partitions come and go while it runs, as pg_partman makes them.
	mustExec(f, fmt.Sprintf(`DO $$ BEGIN
		EXECUTE format('CREATE TABLE %%I PARTITION OF outbox FOR VALUES FROM (%%L) TO (%%L)', %s,
			date_trunc('month', now()) + interval '2 months', date_trunc('month', now()) + interval '3 months');
		EXECUTE format('CREATE TABLE %%I (LIKE outbox INCLUDING DEFAULTS)', %s);
		EXECUTE format('ALTER TABLE outbox ATTACH PARTITION %%I FOR VALUES FROM (%%L) TO (%%L)', %s,
			date_trunc('month', now()) + interval '3 months', date_trunc('month', now()) + interval '4 months');
		EXECUTE format('ALTER TABLE outbox DETACH PARTITION %%I', %s);
	END $$`, fmt.Sprintf(monthName, 2), fmt.Sprintf(monthName, 3), fmt.Sprintf(monthName, 3), fmt.Sprintf(monthName, -3)))
	later := insertRows(t, f.db, "outbox", 2, fmt.Sprintf(inMonths, 2), false)
	later = append(later, insertRows(t, f.db, "outbox", 2, fmt.Sprintf(inMonths, 3), false)...)
	later = append(later, insertRows(t, f.db, "outbox", 2, "now()", false)...)
	for _, r := range later[:4] {
		if !strings.HasPrefix(r.part, "outbox_p") {
			t.Fatalf("row %s landed in %s, want a new partition", r.id, r.part)
		}
	}
	wantRecords(t, topic, ids(pending, streamed, later))
	eventually(t, 30*time.Second, "/readyz 200 with the partitions changed", func() bool { return d.code("/readyz") == 200 })
	d.term()

	// A publication without publish_via_partition_root, and a row
	// committed meanwhile: pgoutput names it by its partition.
	mustExec(f, fmt.Sprintf("ALTER PUBLICATION %q SET (publish_via_partition_root = false)", f.name))
	meanwhile := insertRows(t, f.db, "outbox", 1, "now()", false)
	fix := fmt.Sprintf(`ALTER PUBLICATION "%s" SET (publish_via_partition_root = true)`, f.name)
	r := outboxd(t, f.dsn, "check", "-c", path)
	wantCheckFails(t, r, "publication", "publish_via_partition_root off", fix)
	if !strings.Contains(r.line("PASS table public.outbox:"), "partitioned") {
		t.Errorf("check: the table's line does not say it is partitioned\n%s", r)
	}
	log := exitedWith1(t, f.spawn(cfg), 60*time.Second)
	if !strings.Contains(lastLine(log), fix) || strings.Contains(log, "streaming") {
		t.Fatalf("outboxd on that publication: want it to stop at start with %q, before any row\n%s", fix, log)
	}
	if passed := f.slotPassed(meanwhile[0].id); len(passed) > 0 {
		t.Fatalf("the slot passed the row committed meanwhile")
	}
	mustExec(f, fix)
	d = f.start(cfg)
	wantRecords(t, topic, ids(pending, streamed, later, meanwhile))
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	d.term()
}

// TestRoutesOfEveryKind: a partitioned table, a mixed-case table and a
// message route in one configuration: check passes, every route delivers,
// mark_published marks the rows of both tables, retention prunes both, and
// replay republishes rows of both (of two partitions).
func TestRoutesOfEveryKind(t *testing.T) {
	schema := partitionedOutbox + `
CREATE SCHEMA "Vendes";
CREATE TABLE "Vendes"."Outbox.Events" (id UUID PRIMARY KEY, agregat TEXT NOT NULL, agregat_id TEXT NOT NULL, tipus TEXT NOT NULL,
	versio INTEGER NOT NULL DEFAULT 1, carrega JSONB NOT NULL, creat_en TIMESTAMPTZ NOT NULL DEFAULT now(), publicat_en TIMESTAMPTZ);`
	f := newFixture(t, schema, map[string]int{"comandes": 2, "vendes": 1, "missatges": 1})
	ctx := context.Background()
	const vendes = `"Vendes"."Outbox.Events"`
	cfg := f.config(
		testenv.Route{Message: f.name, Topic: f.topic("missatges")},
		seedRoute(f.topic("comandes")),
		testenv.Route{Table: "'" + vendes + "'", Topic: f.topic("vendes")},
	)
	cfg.Postgres["mark_published"] = "true"
	cfg.Retention = map[string]string{"max_age": "1h", "interval": "300ms", "confirm_timeout": "1s"}
	path := f.configFile(cfg)
	r := outboxd(t, f.dsn, "check", "-c", path)
	if r.code != 0 || r.line("PASS table public.outbox:") == "" || r.line(`PASS table `+vendes+":") == "" || r.line("PASS publication:") == "" {
		t.Fatalf("check: want exit 0 with a PASS line for each table and the publication\n%s", r)
	}
	d := f.start(cfg)

	oldOutbox := insertRows(t, f.db, "outbox", 10, "now() - interval '2 hours'", false)
	oldVendes := insertRows(t, f.db, vendes, 10, "now() - interval '2 hours'", false)
	youngOutbox := append(insertRows(t, f.db, "outbox", 3, "now()", false), insertRows(t, f.db, "outbox", 2, nextMonth, false)...)
	youngVendes := insertRows(t, f.db, vendes, 5, "now()", false)
	for i := 1; i <= 3; i++ {
		msg := fmt.Sprintf(`{"id_esdeveniment": "m-%d", "agregat_id": "P-1", "tipus": "t", "versio": 1, "dades": {}}`, i)
		if _, err := f.db.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2)", f.name, msg); err != nil {
			t.Fatal(err)
		}
	}
	wantRecords(t, f.topic("comandes"), ids(oldOutbox, youngOutbox))
	wantRecords(t, f.topic("vendes"), ids(oldVendes, youngVendes))
	wantRecords(t, f.topic("missatges"), []string{"m-1", "m-2", "m-3"})

	marked := func(table string, rows []outboxRow) int {
		var n int
		if err := f.mon.QueryRow(ctx, "SELECT count(publicat_en) FROM "+table+" WHERE id = ANY($1::uuid[])", ids(rows)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	eventually(t, 30*time.Second, "the young rows of both tables marked published", func() bool {
		return marked("outbox", youngOutbox) == len(youngOutbox) && marked(vendes, youngVendes) == len(youngVendes)
	})
	eventually(t, 60*time.Second, "the old rows of both tables deleted", func() bool {
		return f.count("outbox", ids(oldOutbox)) == 0 && f.count(vendes, ids(oldVendes)) == 0
	})
	if n, m := f.count("outbox", ids(youngOutbox)), f.count(vendes, ids(youngVendes)); n != len(youngOutbox) || m != len(youngVendes) {
		t.Fatalf("young rows left: %d of %d in outbox, %d of %d in %s", n, len(youngOutbox), m, len(youngVendes), vendes)
	}

	r = outboxd(t, f.dsn, "replay", "-c", path, "--from", "1h")
	if r.code != 0 || !strings.Contains(r.stdout, "published 10 rows") || !strings.Contains(r.stdout, "public.outbox -> "+f.topic("comandes")+": 5") {
		t.Fatalf("replay of the young rows of both tables:\n%s", r)
	}
	// Every row once, and the young ones once more.
	twice := func(topic string, all, replayed []string) {
		t.Helper()
		got := map[string]int{}
		for _, m := range consumeExactly(t, topic, len(all)+len(replayed)) {
			got[header(m, "id_esdeveniment")]++
		}
		for _, id := range replayed {
			got[id]--
		}
		for _, id := range all {
			if got[id] != 1 {
				t.Fatalf("%s: %s delivered %d times, not counting the replay", topic, id, got[id])
			}
		}
	}
	twice(f.topic("comandes"), ids(oldOutbox, youngOutbox), ids(youngOutbox))
	twice(f.topic("vendes"), ids(oldVendes, youngVendes), ids(youngVendes))
	d.term()
}
