package replication

import (
	"reflect"
	"testing"
)

// TestParseTimelineHistory: a history file after two promotions, as
// TIMELINE_HISTORY returns it (timelines 1 and 2 ended; this is 3).
func TestParseTimelineHistory(t *testing.T) {
	got, err := parseTimelineHistory([]byte("1\t0/3000000\tno recovery target specified\n\n2\t0/5A0F2C8\tno recovery target specified\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[uint32]uint64{1: 0x3000000, 2: 0x5A0F2C8}; !reflect.DeepEqual(got, want) {
		t.Fatalf("ends %v, want %v", got, want)
	}
	if _, err := parseTimelineHistory([]byte("1 nonsense\n")); err == nil {
		t.Fatal("a bad switch point parsed")
	}
}
