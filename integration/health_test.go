package integration_test

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/testenv"
)

// TestStatusTellsTheTruthAboutTheSlot: /status figures equal
// pg_replication_slots and pg_current_wal_lsn() queried independently; while
// the broker is down the lag grows and /readyz says 503, after it returns
// the lag is ~0 and /readyz 200.
func TestStatusTellsTheTruthAboutTheSlot(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 2})
	ctx := context.Background()
	cfg := f.config(seedRoute(f.topic("comandes")))
	cfg.Health["max_lag"] = "3s"
	d := f.start(cfg)
	w := newWriter(f, 20, 10, "outbox")
	if err := w.txn(ctx, 20); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.walLSN(), 30*time.Second)

	// Quiet: the figures must equal an independent reading of the server.
	var st testenv.Status
	eventually(t, 10*time.Second, "/status agrees with pg_replication_slots", func() bool {
		var confirmed, restart, walStatus, cur string
		var active bool
		var pid *int32
		err := f.mon.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, restart_lsn::text, wal_status, active, active_pid, pg_current_wal_lsn()::text
			FROM pg_replication_slots WHERE slot_name = $1`, f.name).Scan(&confirmed, &restart, &walStatus, &active, &pid, &cur)
		if err != nil {
			t.Fatal(err)
		}
		st = d.status()
		if st.Slot == nil || pid == nil || st.Slot.ActivePID == nil {
			return false
		}
		curL, restartL, confirmedL := lsn(t, cur), lsn(t, restart), lsn(t, confirmed)
		return st.Slot.Name == f.name && st.Slot.Plugin == "pgoutput" && st.Slot.Active && *st.Slot.ActivePID == *pid &&
			st.Slot.ConfirmedFlushLSN == confirmed && st.Slot.RestartLSN == restart && st.Slot.WALStatus == walStatus &&
			st.ServerWALLSN == cur && st.RetainedWALBytes == int64(curL-restartL) && st.UnconfirmedBytes == int64(curL-confirmedL)
	})
	if st.State != "streaming" || !st.Ready || st.LagSeconds != 0 || st.Kafka.BrokersReachable != 1 || d.code("/readyz") != 200 || d.code("/healthz") != 200 {
		t.Fatalf("quiet and caught up, yet: %+v", st)
	}

	// Broker down: rows wait, the lag grows past max_lag, readiness goes.
	if err := env.StopKafka(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = env.StartKafka()
		}
	}()
	if err := w.txn(ctx, 5); err != nil {
		t.Fatal(err)
	}
	var lags []float64
	eventually(t, 30*time.Second, "lag past max_lag and /readyz 503 while the broker is down", func() bool {
		st = d.status()
		lags = append(lags, st.LagSeconds)
		return st.LagSeconds > 3 && d.code("/readyz") == 503
	})
	for i := 1; i < len(lags); i++ {
		if lags[i] < lags[i-1] {
			t.Fatalf("lag went down while the broker was down: %v", lags)
		}
	}
	if d.code("/healthz") != 200 {
		t.Fatal("/healthz must stay 200 while outboxd waits for the broker (it is not wedged)")
	}
	if err := env.StartKafka(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	eventually(t, 60*time.Second, "lag back to 0 and /readyz 200 after the broker returned", func() bool {
		st = d.status()
		return st.LagSeconds == 0 && st.State == "streaming" && d.code("/readyz") == 200
	})
	w.verify(ctx, f.topic("comandes"), "murmur2")
	t.Logf("lag while the broker was down: %v", lags)
	d.term()
}

// TestMetricsMatchWhatConsumersRead: /metrics parses as Prometheus text and
// outboxd_events_total equals the records a consumer reads.
func TestMetricsMatchWhatConsumersRead(t *testing.T) {
	f := newFixture(t, seedSchema+debeziumSchema, map[string]int{"comandes": 3, "pagaments": 2})
	ctx := context.Background()
	d := f.start(f.config(seedRoute(f.topic("comandes")), debeziumRoute(f.topic("pagaments"))))
	a := newWriter(f, 21, 30, "outbox")
	b := newWriter(f, 22, 30, "pagaments.outboxevent")
	for i := 0; i < 40; i++ {
		if err := a.txn(ctx, 1+i%7); err != nil {
			t.Fatal(err)
		}
		if err := b.txn(ctx, 1+i%3); err != nil {
			t.Fatal(err)
		}
	}
	ra := a.verify(ctx, f.topic("comandes"), "murmur2")
	rb := b.verify(ctx, f.topic("pagaments"), "murmur2")
	families := d.metrics()
	got := map[string]float64{}
	for _, m := range families["outboxd_events_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "topic" {
				got[l.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if got[f.topic("comandes")] != float64(ra.Delivered) || got[f.topic("pagaments")] != float64(rb.Delivered) {
		t.Fatalf("outboxd_events_total %v; consumers read %d and %d", got, ra.Delivered, rb.Delivered)
	}
	for _, name := range []string{"outboxd_commit_to_ack_seconds", "outboxd_produce_seconds", "outboxd_slot_retained_wal_bytes", "outboxd_lag_seconds", "outboxd_state", "outboxd_in_flight_events"} {
		if families[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if h := families["outboxd_commit_to_ack_seconds"].GetMetric()[0].GetHistogram(); h.GetSampleCount() == 0 {
		t.Error("no commit-to-ack latency was observed")
	}
	d.term()
}

// TestReadyzNeverReportsAMissingSlotFalsely: on a fresh database outboxd
// creates the slot and the publication at start. From the first moment to
// ready, with the default 5 s poll interval, /readyz must never say that the
// slot or the publication does not exist (a probe or an alert would see a
// false alarm), and it must become ready long before the next regular poll:
// the stream asks the monitor to read them again as soon as it streams.
func TestReadyzNeverReportsAMissingSlotFalsely(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	ctx := context.Background()
	cfg := f.config(seedRoute(f.topic("comandes")))
	cfg.Health["poll_interval"] = "5s"
	// A busy server: creating the slot waits for the transactions running
	// at that moment to end, so the monitor's first poll sees no slot yet.
	// (On its own connection: the test's writer connection is not safe for
	// the commit from another goroutine while the test polls.)
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	busy, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := busy.Exec(ctx, "SELECT txid_current()"); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(1500*time.Millisecond, func() { _ = busy.Commit(context.Background()) })
	d := f.spawn(cfg)
	started := time.Now()
	var lies []string
	var streamingAt, readyAt time.Time
	for time.Since(started) < 20*time.Second && readyAt.IsZero() {
		code, body, err := d.Get(ctx, "/readyz")
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if strings.Contains(string(body), "does not exist") {
			lies = append(lies, string(body))
		}
		if streamingAt.IsZero() && strings.Contains(string(body), `"state": "streaming"`) {
			streamingAt = time.Now()
		}
		if code == 200 {
			readyAt = time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(lies) > 0 {
		t.Fatalf("/readyz said something does not exist %d times, e.g.:\n%s", len(lies), lies[0])
	}
	if readyAt.IsZero() || streamingAt.IsZero() {
		t.Fatalf("not ready after 20 s:\n%s", d.Log())
	}
	if wait := readyAt.Sub(streamingAt); wait > 2*time.Second {
		t.Fatalf("ready %s after streaming began: it waited for the next 5 s poll", wait)
	}
	t.Logf("ready %s after start, %s after streaming began", readyAt.Sub(started).Round(time.Millisecond), readyAt.Sub(streamingAt).Round(time.Millisecond))
	d.term()
}

// TestBrokersReachableMeansKafkaAnswers: a configured broker address that
// accepts TCP but is not Kafka (here PostgreSQL's port) is not counted as a
// reachable broker by the daemon, as check does not count it either.
func TestBrokersReachableMeansKafkaAnswers(t *testing.T) {
	kafkaOnly(t)
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	u, err := url.Parse(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg := f.config(seedRoute(f.topic("comandes")))
	cfg.Brokers = env.KafkaBrokers + "," + u.Host
	d := f.start(cfg)
	var st testenv.Status
	eventually(t, 10*time.Second, "a poll of both addresses", func() bool {
		st = d.status()
		return st.Kafka.Brokers == 2
	})
	if st.Kafka.BrokersReachable != 1 {
		t.Fatalf("brokers_reachable %d with one Kafka broker and one PostgreSQL port", st.Kafka.BrokersReachable)
	}
	d.term()
}

// TestSlotStatsShowTheServerSpilling: a transaction on a table outside
// the publication, larger than logical_decoding_work_mem, makes the
// server spill it to its disk while decoding for outboxd's slot; /status
// (slot.stats) and /metrics (outboxd_slot_spill_*) show what
// pg_stat_replication_slots says, read independently, and the outbox
// events committed around it are all delivered.
//
// logical_decoding_work_mem is lowered to 64kB for the test's database
// alone (ALTER DATABASE: the walsender reads it when outboxd connects),
// not for the server that other tests share. This test needs a slot that
// spills: with pgoutput streaming (protocol 2, PostgreSQL 14+) the server
// streams such a transaction instead, so it runs outboxd with streaming
// off once outboxd can ask for it.
func TestSlotStatsShowTheServerSpilling(t *testing.T) {
	f := newFixture(t, seedSchema+"CREATE TABLE migracio (id bigint PRIMARY KEY, nota text NOT NULL);", map[string]int{"comandes": 2})
	ctx := context.Background()
	if _, err := f.db.Exec(ctx, "ALTER DATABASE "+f.name+" SET logical_decoding_work_mem = '64kB'"); err != nil {
		t.Fatal(err)
	}
	// Protocol 1 first: the server queues the migration and spills it.
	cfg := f.config(seedRoute(f.topic("comandes")))
	cfg.Postgres["streaming"] = "false"
	d := f.start(cfg)
	w := newWriter(f, 33, 10, "outbox")
	if err := w.txn(ctx, 5); err != nil {
		t.Fatal(err)
	}
	// A migration: 20,000 rows (~2 MB decoded) in one transaction on a
	// table nobody routes.
	if _, err := f.db.Exec(ctx, "INSERT INTO migracio SELECT g, repeat('x', 64) FROM generate_series(1, 20000) g"); err != nil {
		t.Fatal(err)
	}
	if err := w.txn(ctx, 5); err != nil {
		t.Fatal(err)
	}
	w.verify(ctx, f.topic("comandes"), "murmur2")
	f.waitConfirmed(f.walLSN(), 30*time.Second)

	// The server's own account, read now: the migration is decoded, and
	// nothing more spills (only outboxd writes to this database).
	var spillTxns, spillCount, spillBytes, streamTxns, streamBytes, totalTxns int64
	readServer := func() {
		err := f.mon.QueryRow(ctx, `SELECT spill_txns, spill_count, spill_bytes, stream_txns, stream_bytes, total_txns
			FROM pg_stat_replication_slots WHERE slot_name = $1`, f.name).Scan(&spillTxns, &spillCount, &spillBytes, &streamTxns, &streamBytes, &totalTxns)
		if err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, "the server counts the spill (PostgreSQL 14 reports it through its statistics collector)", func() bool {
		readServer()
		return spillTxns > 0
	})
	if spillBytes < 1<<20 || totalTxns < 3 {
		t.Fatalf("pg_stat_replication_slots: spill_txns %d, spill_bytes %d, total_txns %d: the 20,000-row transaction should have spilled over 1 MiB",
			spillTxns, spillBytes, totalTxns)
	}

	var st testenv.Status
	var got map[string]float64
	eventually(t, 10*time.Second, "/status and /metrics show the server's spill figures", func() bool {
		st = d.status()
		got = slotMetrics(d, f.name)
		s := st.Slot.Stats
		// total_txns may still grow: an autovacuum ANALYZE of the new
		// table commits in this database.
		return s != nil && s.SpillTxns == spillTxns && s.SpillCount == spillCount && s.SpillBytes == spillBytes &&
			s.StreamTxns == streamTxns && s.StreamBytes == streamBytes && s.TotalTxns >= totalTxns &&
			got["outboxd_slot_spill_txns_total"] == float64(spillTxns) && got["outboxd_slot_spill_count_total"] == float64(spillCount) &&
			got["outboxd_slot_spill_bytes_total"] == float64(spillBytes) && got["outboxd_slot_stream_txns_total"] == float64(streamTxns) &&
			got["outboxd_slot_stream_bytes_total"] == float64(streamBytes) && got["outboxd_slot_decoded_txns_total"] >= float64(totalTxns)
	})
	t.Logf("server: spill_txns %d, spill_count %d, spill_bytes %d, stream_txns %d, total_txns %d; /metrics %v",
		spillTxns, spillCount, spillBytes, streamTxns, totalTxns, got)
	if st.Slot.Stats.StatsReset != nil || got["outboxd_slot_stats_reset_timestamp_seconds"] != 0 {
		t.Fatalf("stats_reset %v, outboxd_slot_stats_reset_timestamp_seconds %v, before any reset", st.Slot.Stats.StatsReset, got["outboxd_slot_stats_reset_timestamp_seconds"])
	}

	// An operator resets the slot's statistics: the counters fall to 0
	// with the server's, and stats_reset says when.
	before := time.Now().Add(-time.Second)
	if _, err := f.mon.Exec(ctx, "SELECT pg_stat_reset_replication_slot($1)", f.name); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "/status and /metrics show the reset", func() bool {
		st = d.status()
		got = slotMetrics(d, f.name)
		s := st.Slot.Stats
		return s != nil && s.SpillTxns == 0 && s.SpillBytes == 0 && s.StatsReset != nil && s.StatsReset.After(before) &&
			got["outboxd_slot_spill_bytes_total"] == 0 && got["outboxd_slot_stats_reset_timestamp_seconds"] > float64(before.Unix())
	})
	d.term()

	// Streaming on (the default): a migration is streamed, not spilled,
	// and the stream counters move. (The new session decodes again from
	// the slot's restart_lsn, which may lie before the first migration:
	// that one, before the start point, is spilled again, not streamed;
	// the statistics are reset once the session has passed it.)
	d = f.start(f.config(seedRoute(f.topic("comandes"))))
	if err := w.txn(ctx, 1); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	if _, err := f.mon.Exec(ctx, "SELECT pg_stat_reset_replication_slot($1)", f.name); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(ctx, "INSERT INTO migracio SELECT g, repeat('y', 64) FROM generate_series(20001, 40000) g"); err != nil {
		t.Fatal(err)
	}
	if err := w.txn(ctx, 5); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	eventually(t, 10*time.Second, "/status and /metrics show the server streaming", func() bool {
		readServer()
		st = d.status()
		got = slotMetrics(d, f.name)
		s := st.Slot.Stats
		return streamTxns > 0 && streamBytes > 1<<20 && s != nil && s.StreamTxns == streamTxns && s.StreamBytes == streamBytes &&
			got["outboxd_slot_stream_txns_total"] == float64(streamTxns) && got["outboxd_slot_stream_bytes_total"] == float64(streamBytes)
	})
	if spillTxns != 0 || got["outboxd_slot_spill_bytes_total"] != 0 {
		t.Errorf("streamed, yet the server spilled: spill_txns %d, outboxd_slot_spill_bytes_total %v", spillTxns, got["outboxd_slot_spill_bytes_total"])
	}
	t.Logf("streamed: stream_txns %d, stream_bytes %d", streamTxns, streamBytes)
	w.verify(ctx, f.topic("comandes"), "murmur2")
	d.term()
}

// metrics reads d's /metrics, which must parse as Prometheus text.
func (d *daemon) metrics() map[string]*dto.MetricFamily {
	d.t.Helper()
	_, body, err := d.Get(context.Background(), "/metrics")
	if err != nil {
		d.t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		d.t.Fatalf("/metrics is not Prometheus text: %v", err)
	}
	return families
}

// slotMetrics returns the values of d's outboxd_slot_* series labelled
// with slot alone.
func slotMetrics(d *daemon, slot string) map[string]float64 {
	out := map[string]float64{}
	for name, mf := range d.metrics() {
		if !strings.HasPrefix(name, "outboxd_slot_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			if l := m.GetLabel(); len(l) == 1 && l[0].GetName() == "slot" && l[0].GetValue() == slot {
				out[name] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return out
}
