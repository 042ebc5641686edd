package integration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestReplay: `outboxd replay --from T0 --to T1` while the daemon streams
// and a writer keeps committing. It prints how many rows it published,
// exactly the rows whose creat_en is in [T0, T1); each arrives once more,
// identical to its first delivery, and for every aggregate the replayed
// copies follow commit order. Then --id with --route (by topic) replays
// just those rows.
func TestReplay(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 4})
	ctx := context.Background()
	topic := f.topic("comandes")
	cfg := f.config(seedRoute(topic))
	d := f.start(cfg)
	w := newWriter(f, 21, 40, "outbox")
	w.special = nil // creat_en = now(): the range is by creat_en
	now := func() time.Time {
		var ts time.Time
		if err := f.mon.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&ts); err != nil {
			t.Fatal(err)
		}
		return ts
	}
	for i := 0; i < 30; i++ {
		if err := w.txn(ctx, 1+i%7); err != nil {
			t.Fatal(err)
		}
	}
	t0 := now()
	for i := 0; i < 120; i++ {
		if err := w.txn(ctx, 1+i%9); err != nil {
			t.Fatal(err)
		}
	}
	t1 := now()
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	var inRange int
	if err := f.mon.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE creat_en >= $1 AND creat_en < $2", t0, t1).Scan(&inRange); err != nil {
		t.Fatal(err)
	}

	errc := w.inBackground(ctx, 200, 6, 2*time.Millisecond) // the daemon streams meanwhile
	path := f.configFile(cfg)
	r := outboxd(t, f.dsn, "replay", "-c", path, "--from", t0.UTC().Format(time.RFC3339Nano), "--to", t1.UTC().Format(time.RFC3339Nano))
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("published %d rows", inRange)) || !strings.Contains(r.stderr, "acknowledged by Kafka") {
		t.Fatalf("replay of %d rows:\n%v", inRange, r)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}

	var ids []string
	rows, err := f.mon.Query(ctx, "SELECT id::text FROM outbox WHERE creat_en < $1 ORDER BY random() LIMIT 2", t0) // outside the range
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	r = outboxd(t, f.dsn, "replay", "-c", path, "--route", topic, "--id", strings.Join(ids, ","))
	if r.code != 0 || !strings.Contains(r.stdout, "published 2 rows") {
		t.Fatalf("replay of 2 ids:\n%v", r)
	}

	end := f.walLSN()
	rep := w.verify(ctx, topic, "murmur2")
	f.waitConfirmed(end, 30*time.Second)
	if rep.Duplicates != inRange+2 {
		t.Fatalf("%d duplicates, want the %d replayed rows and the 2 ids: %v", rep.Duplicates, inRange, rep)
	}
	// The copies of the range, per aggregate, in commit order.
	msgs := consumeExactly(t, topic, rep.Delivered)
	seen := map[string]bool{}
	pos := map[string]int{} // place in its aggregate's commit order
	for _, order := range w.order {
		for i, id := range order {
			pos[id] = i + 1
		}
	}
	last := map[string]int{}
	replayed := 0
	for _, m := range msgs { // by partition, then offset
		id := header(m, "id_esdeveniment")
		if !seen[id] {
			seen[id] = true
			continue
		}
		if id == ids[0] || id == ids[1] {
			continue
		}
		replayed++
		key := string(m.Key)
		if pos[id] <= last[key] {
			t.Fatalf("aggregate %s: replayed %s (position %d) after position %d", key, id, pos[id], last[key])
		}
		last[key] = pos[id]
	}
	if replayed != inRange {
		t.Fatalf("%d replayed copies of the range, want %d", replayed, inRange)
	}
	t.Logf("replayed %d rows while streaming: %v", inRange, rep)
	d.term()
}
