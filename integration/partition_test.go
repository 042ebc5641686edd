package integration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Partitioned outbox tables.

// partitionedOutbox is the seed's outbox partitioned by month of creat_en,
// as pg_partman lays out a busy one: the primary key holds the partition
// key, and there is one partition per month (outbox_pYYYYMM) from three
// months ago to next month.
const partitionedOutbox = `CREATE TABLE outbox (
    id UUID NOT NULL, agregat TEXT NOT NULL, agregat_id TEXT NOT NULL, tipus TEXT NOT NULL,
    versio INTEGER NOT NULL DEFAULT 1, carrega JSONB NOT NULL, creat_en TIMESTAMPTZ NOT NULL DEFAULT now(),
    publicat_en TIMESTAMPTZ, PRIMARY KEY (id, creat_en)) PARTITION BY RANGE (creat_en);
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
