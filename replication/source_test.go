package replication

import (
	"reflect"
	"testing"
)

// TestParseTimelineHistory: a history file after two promotions, as
// TIMELINE_HISTORY returns it (timelines 1 and 2 ended; this is 3).
func TestParseTimelineHistory(t *testing.T) {
	got, err := timelines(3, []byte("1\t0/3000000\tno recovery target specified\n\n2\t0/5A0F2C8\tno recovery target specified\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]Timeline{1: {0, 0x3000000}, 2: {0x3000000, 0x5A0F2C8}, 3: {0x5A0F2C8, 0}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("timelines %v, want %v", got, want)
	}
	if _, err := timelines(2, []byte("1 nonsense\n")); err == nil {
		t.Fatal("a bad switch point parsed")
	}
}
