package catalog

import (
	"strings"
	"testing"
	"time"
)

// TestParseSlotStats: a row of pg_stat_replication_slots, stats_reset NULL
// or set, and rows that cannot be read.
func TestParseSlotStats(t *testing.T) {
	row := func(vals ...string) []*string {
		out := make([]*string, len(vals))
		for i, v := range vals {
			if v != "NULL" {
				out[i] = &v
			}
		}
		return out
	}
	got, err := parseSlotStats(row("3", "41", "303599968", "2", "17", "1048576", "1200", "305000000", "NULL"))
	if err != nil {
		t.Fatal(err)
	}
	want := SlotStats{SpillTxns: 3, SpillCount: 41, SpillBytes: 303599968, StreamTxns: 2, StreamCount: 17, StreamBytes: 1048576, TotalTxns: 1200, TotalBytes: 305000000}
	if *got != want {
		t.Errorf("got %+v, want %+v", *got, want)
	}
	got, err = parseSlotStats(row("0", "0", "0", "0", "0", "0", "0", "0", "1764966896123456"))
	if err != nil {
		t.Fatal(err)
	}
	if reset := time.Date(2025, 12, 5, 20, 34, 56, 123456000, time.UTC); !got.StatsReset.Equal(reset) {
		t.Errorf("stats_reset %s, want %s", got.StatsReset, reset)
	}
	for _, tc := range []struct {
		row  []*string
		want string
	}{
		{row("1", "2", "3"), "3 columns"},
		{row("1", "x", "3", "4", "5", "6", "7", "8", "NULL"), "column 2"},
		{row("1", "2", "3", "4", "5", "6", "7", "NULL", "NULL"), "column 8"},
		{row("1", "2", "3", "4", "5", "6", "7", "8", "yesterday"), "stats_reset"},
	} {
		if _, err := parseSlotStats(tc.row); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %q", tc.row, err, tc.want)
		}
	}
	if (Server{Version: 130020}).HasSlotStats() || !(Server{Version: 140000}).HasSlotStats() {
		t.Error("pg_stat_replication_slots is PostgreSQL 14's")
	}
}
