package integration_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/testenv"
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

// TestReplayFromPsqlText: `replay --from` takes a creat_en exactly as psql
// prints it (`2026-12-04 11:35:33.065544+00`), in another session time
// zone (`+05:30`) and without a fraction, and replays the rows from that
// instant on.
func TestReplayFromPsqlText(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 2})
	topic := f.topic("comandes")
	cfg := f.config(seedRoute(topic))
	d := f.start(cfg)
	// Ten rows 1.5 s apart from an instant with microseconds (.065544),
	// then one on a whole second.
	mustExec(f, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega, creat_en)
		SELECT gen_random_uuid(), 'comanda', 'P-' || g, 'comanda.creada', '{}', '2026-12-04 11:35:33.065544+00'::timestamptz + g * interval '1.5 s'
		FROM generate_series(0, 9) g`)
	mustExec(f, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega, creat_en)
		VALUES (gen_random_uuid(), 'comanda', 'P-x', 'comanda.creada', '{}', '2026-12-04 11:36:00+00')`)
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	path := f.configFile(cfg)
	for _, tt := range []struct {
		tz, where, want string
		rows            int
	}{
		{"UTC", "agregat_id = 'P-4'", "2026-12-04 11:35:39.065544+00", 7},
		{"Asia/Kolkata", "agregat_id = 'P-4'", "2026-12-04 17:05:39.065544+05:30", 7},
		{"UTC", "agregat_id = 'P-x'", "2026-12-04 11:36:00+00", 1},
	} {
		text := creatEnText(t, f, tt.tz, "SELECT creat_en FROM outbox WHERE "+tt.where)
		if text != tt.want {
			t.Fatalf("creat_en in %s prints %q, want %q", tt.tz, text, tt.want)
		}
		r := outboxd(t, f.dsn, "replay", "-c", path, "--from", text)
		if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("published %d rows", tt.rows)) {
			t.Fatalf("replay --from %q: want %d rows published\n%v", text, tt.rows, r)
		}
	}
	d.term()
}

// creatEnText is the first value query prints in psql (on PATH) with the
// session time zone tz: the text an operator copies. Without psql, the
// server's text output of the value, which psql prints unchanged.
func creatEnText(t *testing.T, f *fixture, tz, query string) string {
	t.Helper()
	if psql, err := exec.LookPath("psql"); err == nil {
		cmd := exec.Command(psql, "-X", "-At", "-d", f.dsn, "-c", query)
		cmd.Env = append(os.Environ(), "PGTZ="+tz)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("psql: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	t.Logf("psql is not on PATH: using the server's text output of the value, which psql prints unchanged")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT set_config('TimeZone', $1, false)", tz); err != nil {
		t.Fatal(err)
	}
	var text string
	if err := conn.QueryRow(ctx, "SELECT ("+query+")::text").Scan(&text); err != nil {
		t.Fatal(err)
	}
	return text
}

// TestReplayWaitsForTheSlot: a replay of rows the slot has not passed yet
// (outboxd stopped while they were committed) waits, saying so, until the
// daemon has delivered them, so that each replayed copy comes after the
// first delivery of the events before it in its aggregate. With the daemon
// still stopped after --wait it refuses, exit 1, having published nothing.
// With the slot gone (the recovery after a lost slot) it publishes at once.
func TestReplayWaitsForTheSlot(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 2})
	ctx := context.Background()
	topic := f.topic("comandes")
	cfg := f.config(seedRoute(topic))
	path := f.configFile(cfg)
	f.start(cfg).term() // the slot exists; nothing streams from it
	event := func(key string, n int) string {
		t.Helper()
		id := fmt.Sprintf("00000000-0000-4000-9000-%06d%06d", n, len(key))
		if _, err := f.db.Exec(ctx, "INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega) VALUES ($1, 'comanda', $2, 'comanda.creada', '{}')", id, key); err != nil {
			t.Fatal(err)
		}
		return id
	}
	keys := []string{"P-1", "P-22", "P-333", "P-4444", "P-55555"}
	first, second := map[string]string{}, map[string]string{}
	var seconds []string
	for _, k := range keys {
		first[k] = event(k, 1)
	}
	for _, k := range keys {
		second[k] = event(k, 2)
		seconds = append(seconds, second[k])
	}

	// Replay the second events alone, while the first are undelivered
	// (the default --wait: a minute).
	cmd, err := testenv.Command(f.dsn, "replay", "-c", path, "--id", strings.Join(seconds, ","))
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var exitErr error
	exited := make(chan struct{})
	go func() { exitErr = cmd.Wait(); close(exited) }()
	defer func() { _ = cmd.Process.Kill(); <-exited }()
	ended := func() bool {
		select {
		case <-exited:
			return true
		default:
			return false
		}
	}
	eventually(t, 60*time.Second, "replay waits for the slot, or ends", func() bool {
		return strings.Contains(stderr.String(), "waiting until the slot has passed them") || ended()
	})
	d := f.start(cfg)
	select {
	case <-exited:
		if exitErr != nil || !strings.Contains(stdout.String(), "published 5 rows") {
			t.Fatalf("replay: %v\n--- stdout\n%s--- stderr\n%s", exitErr, stdout.String(), stderr.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("replay did not end once the daemon streamed\n--- stderr\n%s", stderr.String())
	}
	t.Logf("replay's stderr:\n%s", stderr.String())
	msgs := consumeExactly(t, topic, 15)
	seen := map[string]bool{}
	for _, m := range msgs { // by partition, then offset: an aggregate's records in their order
		id, key := header(m, "id_esdeveniment"), string(m.Key)
		if id == second[key] && !seen[first[key]] {
			t.Fatalf("aggregate %s: its second event reached the topic before its first\n--- replay's stderr\n%s", key, stderr.String())
		}
		seen[id] = true
	}
	d.term()

	// The daemon stopped: a replay of an undelivered row refuses.
	third := event("P-1", 3)
	r := outboxd(t, f.dsn, "replay", "-c", path, "--id", third, "--wait", "2s")
	if r.code != 1 || !strings.Contains(r.stderr, "refused, nothing published") || !strings.Contains(r.stderr, "Start outboxd") {
		t.Fatalf("replay with the daemon stopped: want exit 1 and the refusal\n%v", r)
	}
	t.Logf("replay with the daemon stopped:\n%s", r.stderr)
	if n := f.topicSize(topic); n != 15 {
		t.Fatalf("the refused replay published: %d records, want 15", n)
	}

	// No slot: nothing streams, so replay is the only delivery.
	mustExec(f, fmt.Sprintf("SELECT pg_drop_replication_slot('%s')", f.name))
	r = outboxd(t, f.dsn, "replay", "-c", path, "--id", third, "--wait", "2s")
	if r.code != 0 || !strings.Contains(r.stdout, "published 1 rows") || !strings.Contains(r.stderr, "does not exist") {
		t.Fatalf("replay without a slot:\n%v", r)
	}
	for _, m := range consumeExactly(t, topic, 16) {
		if header(m, "id_esdeveniment") == third {
			return
		}
	}
	t.Fatalf("the row replayed without a slot is not in %s", topic)
}
