package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// statusDoc is the part of /status these tests read.
type statusDoc struct {
	State string `json:"state"`
	Ready bool   `json:"ready"`
	Slot  *struct {
		Name              string `json:"name"`
		Plugin            string `json:"plugin"`
		Active            bool   `json:"active"`
		ActivePID         *int32 `json:"active_pid"`
		ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
		RestartLSN        string `json:"restart_lsn"`
		WALStatus         string `json:"wal_status"`
	} `json:"slot"`
	ServerWALLSN     string  `json:"server_wal_lsn"`
	RetainedWALBytes int64   `json:"retained_wal_bytes"`
	UnconfirmedBytes int64   `json:"unconfirmed_bytes"`
	LagSeconds       float64 `json:"lag_seconds"`
	InFlight         struct {
		Events int `json:"events"`
	} `json:"in_flight"`
	Counters struct {
		Events uint64 `json:"events"`
	} `json:"counters"`
	Kafka struct {
		BrokersReachable int `json:"brokers_reachable"`
	} `json:"kafka"`
}

func (d *daemon) status() statusDoc {
	d.t.Helper()
	resp, err := http.Get("http://" + d.health + "/status")
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st statusDoc
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		d.t.Fatal(err)
	}
	return st
}

func (d *daemon) code(path string) int {
	d.t.Helper()
	resp, err := http.Get("http://" + d.health + path)
	if err != nil {
		d.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// eventually polls cond every 100 ms until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestStatusTellsTheTruthAboutTheSlot: /status figures equal
// pg_replication_slots and pg_current_wal_lsn() queried independently; while
// the broker is down the lag grows and /readyz says 503, after it returns
// the lag is ~0 and /readyz 200.
func TestStatusTellsTheTruthAboutTheSlot(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 2})
	ctx := context.Background()
	d := f.start(daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes")), health: "  max_lag: 3s\n"})
	w := newWriter(f, 20, 10, "outbox")
	if err := w.txn(ctx, 20); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.walLSN(), 30*time.Second)

	// Quiet: the figures must equal an independent reading of the server.
	var st statusDoc
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
	d := f.start(daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes")) + fmt.Sprintf(debeziumRoute, f.topic("pagaments"))})
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
	resp, err := http.Get("http://" + d.health + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
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
	if got[f.topic("comandes")] != float64(ra.delivered) || got[f.topic("pagaments")] != float64(rb.delivered) {
		t.Fatalf("outboxd_events_total %v; consumers read %d and %d", got, ra.delivered, rb.delivered)
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

// TestStandbyTakeover: a second outboxd on the same slot stands by (it does
// not crash-loop), says so in /status and /readyz, and takes over within
// seconds of the first one's kill -9; nothing is lost.
func TestStandbyTakeover(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 3})
	ctx := context.Background()
	dc := daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes")), postgres: "  standby_retry: 500ms\n"}
	active := f.start(dc)
	standby := f.spawn(dc)
	eventually(t, 20*time.Second, "the second instance in standby", func() bool {
		st, err := tryStatus(standby.health)
		return err == nil && st.State == "standby"
	})
	if standby.code("/readyz") != 503 || standby.code("/healthz") != 200 {
		t.Fatal("standby must be live (200) and not ready (503)")
	}
	w := newWriter(f, 23, 40, "outbox")
	errc := w.inBackground(ctx, 200, 10, 5*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	active.kill()
	killed := time.Now()
	eventually(t, 15*time.Second, "the standby streaming after the active one died", func() bool {
		st, err := tryStatus(standby.health)
		return err == nil && st.State == "streaming"
	})
	takeover := time.Since(killed)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	rep := w.verify(ctx, f.topic("comandes"), "murmur2")
	if strings.Count(standby.logText(), "standing by") != 1 {
		t.Errorf("the standby should log once that it stands by:\n%s", standby.logText())
	}
	t.Logf("took over %s after kill -9: %+v", takeover.Round(time.Millisecond), rep)
	standby.term()
}

func tryStatus(addr string) (statusDoc, error) {
	var st statusDoc
	resp, err := http.Get("http://" + addr + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&st)
	return st, err
}

// TestLostSlotIsRefused: when max_slot_wal_keep_size made PostgreSQL remove
// WAL the slot needed (wal_status lost), outboxd refuses to stream from it
// and says what to do, rather than silently skipping the missing events.
func TestLostSlotIsRefused(t *testing.T) {
	f := newFixture(t, seedSchema+"CREATE TABLE soroll (id bigserial PRIMARY KEY, farciment text);", map[string]int{"comandes": 1})
	ctx := context.Background()
	dc := daemonConfig{routes: fmt.Sprintf(seedRoute, f.topic("comandes"))}
	d := f.start(dc)
	d.term()
	for _, sql := range []string{"ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()"} {
		if _, err := f.db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = f.mon.Exec(context.Background(), "ALTER SYSTEM RESET max_slot_wal_keep_size")
		_, _ = f.mon.Exec(context.Background(), "SELECT pg_reload_conf()")
	})
	var status string
	eventually(t, 60*time.Second, "the slot lost", func() bool {
		for _, sql := range []string{"INSERT INTO soroll (farciment) SELECT repeat(md5(g::text), 20) FROM generate_series(1, 20000) g", "CHECKPOINT"} {
			if _, err := f.db.Exec(ctx, sql); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.mon.QueryRow(ctx, "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1", f.name).Scan(&status); err != nil {
			t.Fatal(err)
		}
		return status == "lost"
	})
	bad := f.spawn(dc)
	if err := bad.exited(30 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 on a lost slot")
	}
	if log := bad.logText(); !contains(log, "wal_status lost") || !contains(log, "events are missing") {
		t.Fatalf("the error does not explain the lost slot:\n%s", log)
	}
}
