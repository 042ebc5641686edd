package health

import (
	"encoding/json"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/replication"
)

// TestMetricsExposition: /metrics carries the Go runtime and process
// collectors, the build info and the slot's wal_status next to outboxd's own.
func TestMetricsExposition(t *testing.T) {
	snap := healthySnap()
	snap.Slot.WALStatus = "unreserved"
	code, body := get(t, server(t, replication.Status{State: "streaming"}, snap, Limits{}), "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`outboxd_build_info{goversion="` + runtime.Version() + `",version="dev"} 1`,
		`outboxd_slot_wal_status{slot="s",status="unreserved"} 1`,
		`outboxd_slot_wal_status{slot="s",status="reserved"} 0`,
		`outboxd_slot_wal_status{slot="s",status="lost"} 0`,
		"go_goroutines ",
		"go_memstats_heap_alloc_bytes ",
		"process_resident_memory_bytes ",
		"process_open_fds ",
		`outboxd_state{state="streaming"} 1`,
	} {
		if !strings.Contains(body, "\n"+want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestWALStatusAbsentWithoutSlot(t *testing.T) {
	_, body := get(t, server(t, replication.Status{State: "starting"}, Snapshot{}, Limits{}), "/metrics")
	if strings.Contains(body, "outboxd_slot_wal_status{") {
		t.Errorf("a wal_status series without a slot:\n%s", body)
	}
}

// TestSlotStatsMetrics: the slot's pg_stat_replication_slots row becomes
// counters carrying the server's values (a reset on the server is a
// counter reset to Prometheus) and the slot's "stats" in /status; a
// server without the view (PostgreSQL 13) gives neither.
func TestSlotStatsMetrics(t *testing.T) {
	reset := time.Date(2026, 12, 5, 20, 0, 0, 500000000, time.UTC)
	snap := healthySnap()
	snap.Slot.Stats = slotStats(&catalog.SlotStats{SpillTxns: 3, SpillCount: 41, SpillBytes: 303599968, StreamTxns: 2, StreamCount: 17,
		StreamBytes: 1048576, TotalTxns: 1200, TotalBytes: 305000000, StatsReset: reset})
	s := server(t, replication.Status{State: "streaming"}, snap, Limits{})
	_, body := get(t, s, "/metrics")
	for _, want := range []string{
		"# TYPE outboxd_slot_spill_txns_total counter",
		`outboxd_slot_spill_txns_total{slot="s"} 3`,
		`outboxd_slot_spill_count_total{slot="s"} 41`,
		`outboxd_slot_spill_bytes_total{slot="s"} 3.03599968e+08`,
		"# TYPE outboxd_slot_stream_bytes_total counter",
		`outboxd_slot_stream_txns_total{slot="s"} 2`,
		`outboxd_slot_stream_count_total{slot="s"} 17`,
		`outboxd_slot_stream_bytes_total{slot="s"} 1.048576e+06`,
		`outboxd_slot_decoded_txns_total{slot="s"} 1200`,
		`outboxd_slot_decoded_bytes_total{slot="s"} 3.05e+08`,
		"# TYPE outboxd_slot_stats_reset_timestamp_seconds gauge",
		`outboxd_slot_stats_reset_timestamp_seconds{slot="s"} 1.7965008005e+09`,
	} {
		if !strings.Contains(body, "\n"+want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	_, status := get(t, s, "/status")
	var st struct {
		Slot struct {
			Stats map[string]any `json:"stats"`
		} `json:"slot"`
	}
	if err := json.Unmarshal([]byte(status), &st); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"spill_txns": 3.0, "spill_count": 41.0, "spill_bytes": 303599968.0, "stream_txns": 2.0, "stream_count": 17.0,
		"stream_bytes": 1048576.0, "total_txns": 1200.0, "total_bytes": 305000000.0, "stats_reset": "2026-12-05T20:00:00.5Z"}
	if !reflect.DeepEqual(st.Slot.Stats, want) {
		t.Errorf("/status slot.stats %v, want %v", st.Slot.Stats, want)
	}

	// Never reset: no stats_reset series, a null in /status.
	snap.Slot.Stats = slotStats(&catalog.SlotStats{SpillTxns: 1})
	s = server(t, replication.Status{State: "streaming"}, snap, Limits{})
	if _, body = get(t, s, "/metrics"); strings.Contains(body, "outboxd_slot_stats_reset_timestamp_seconds{") || !strings.Contains(body, `outboxd_slot_spill_txns_total{slot="s"} 1`) {
		t.Errorf("never reset:\n%s", body)
	}
	if _, status = get(t, s, "/status"); !strings.Contains(status, `"stats_reset": null`) {
		t.Errorf("never reset: /status %s", status)
	}

	// No statistics (PostgreSQL 13, or a failed read): no series, a null.
	snap.Slot.Stats = slotStats(nil)
	s = server(t, replication.Status{State: "streaming"}, snap, Limits{})
	if _, body = get(t, s, "/metrics"); strings.Contains(body, "outboxd_slot_spill") || strings.Contains(body, "outboxd_slot_decoded") {
		t.Errorf("slot statistics series without statistics:\n%s", body)
	}
	if _, status = get(t, s, "/status"); !strings.Contains(status, `"stats": null`) {
		t.Errorf("no statistics: /status %s", status)
	}
}
