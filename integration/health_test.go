package integration_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

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
	_, metrics, err := d.Get(ctx, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(metrics))
	if err != nil {
		t.Fatalf("/metrics is not Prometheus text: %v", err)
	}
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
