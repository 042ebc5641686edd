package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

const debeziumSchema = `
CREATE SCHEMA pagaments;
CREATE TABLE pagaments.outboxevent (
    id            UUID        PRIMARY KEY,
    aggregatetype TEXT        NOT NULL,
    aggregateid   TEXT        NOT NULL,
    type          TEXT        NOT NULL,
    payload       JSONB       NOT NULL,
    timestamp     TIMESTAMPTZ NOT NULL DEFAULT now()
);
`

// debeziumRoute routes debeziumSchema's table to topic.
func debeziumRoute(topic string) testenv.Route {
	return testenv.Route{Table: "pagaments.outboxevent", Topic: topic,
		More: testenv.Section{"columns": `{id: id, agregat_id: aggregateid, tipus: type, versio: "-", carrega: payload, creat_en: timestamp, publicat_en: "-"}`}}
}

// TestEndToEnd: thousands of rows in transactions of mixed sizes, many
// aggregates, two tables (seed and Debezium column names) routed to two
// topics; every record exactly as specified, per-aggregate commit order.
func TestEndToEnd(t *testing.T) {
	f := newFixture(t, seedSchema+debeziumSchema, map[string]int{"comandes": 6, "pagaments": 4})
	ctx := context.Background()
	d := f.start(f.config(seedRoute(f.topic("comandes")), debeziumRoute(f.topic("pagaments"))))

	seed := newWriter(f, 1, 300, "outbox")
	dbz := newWriter(f, 2, 50, "pagaments.outboxevent")
	sizes := []int{1, 1, 2, 5, 10, 50, 200, 1, 3, 500}
	for i := 0; seed.n < 4000; i++ {
		if err := seed.txn(ctx, sizes[i%len(sizes)]); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			if err := dbz.txn(ctx, 5*(1+i%7)); err != nil {
				t.Fatal(err)
			}
		}
	}
	end := f.walLSN()
	r1 := seed.verify(ctx, f.topic("comandes"), "murmur2")
	r2 := dbz.verify(ctx, f.topic("pagaments"), "murmur2")
	f.waitConfirmed(end, 30*time.Second)
	t.Logf("comandes: %+v, pagaments: %+v", r1, r2)
	if r1.Duplicates+r2.Duplicates != 0 {
		t.Errorf("no crash happened, yet %d duplicates", r1.Duplicates+r2.Duplicates)
	}
	d.term()
}

// TestAlterTableMidStream: columns are found by name from each Relation
// message, so dropping and adding columns while streaming changes nothing
// for consumers.
func TestAlterTableMidStream(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 2})
	ctx := context.Background()
	d := f.start(f.config(seedRoute(f.topic("comandes"))))
	w := newWriter(f, 8, 20, "outbox")
	if err := w.txn(ctx, 10); err != nil {
		t.Fatal(err)
	}
	// Shift every column after agregat one position left, then add two at
	// the end, one of them between inserts of the same transaction.
	for _, sql := range []string{
		"ALTER TABLE outbox DROP COLUMN agregat",
		"ALTER TABLE outbox ADD COLUMN nota TEXT DEFAULT 'x'",
	} {
		if _, err := f.db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
		// The writer names agregat; give it a column of that name back at
		// the end of the table (a new attnum), so its inserts still work.
		if sql == "ALTER TABLE outbox DROP COLUMN agregat" {
			if _, err := f.db.Exec(ctx, "ALTER TABLE outbox ADD COLUMN agregat TEXT"); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.txn(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, agregat_id, tipus, carrega) VALUES ('00000000-0000-4000-8000-00000000aaaa', 'P-2026-000001', 'comanda.nota', '{\"abans\": true}')"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "ALTER TABLE outbox ADD COLUMN extra INTEGER"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, agregat_id, tipus, carrega, extra) VALUES ('00000000-0000-4000-8000-00000000bbbb', 'P-2026-000001', 'comanda.nota', '{\"despres\": true}', 7)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	w.order["P-2026-000001"] = append(w.order["P-2026-000001"], "00000000-0000-4000-8000-00000000aaaa", "00000000-0000-4000-8000-00000000bbbb")
	rep := w.verify(ctx, f.topic("comandes"), "murmur2")
	t.Logf("across ALTER TABLE: %+v", rep)
	d.term()
}
