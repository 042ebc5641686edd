package health

import (
	"runtime"
	"strings"
	"testing"

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
