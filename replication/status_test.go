package replication

import (
	"testing"

	"github.com/jackc/pglogrepl"
)

func lsnOf(v uint64) pglogrepl.LSN { return pglogrepl.LSN(v) }

// TestStandbyPositions: a status sends the acknowledged position, never the
// received one, and nothing at all (zeros, which the walsender ignores)
// until this stream has moved it: the start was read from the slot before
// START_REPLICATION and may be older than the server's.
func TestStandbyPositions(t *testing.T) {
	for _, tc := range []struct {
		name         string
		received     uint64
		st           State
		write, flush uint64
	}{
		{"stale start, a transaction received", 900, State{Confirmed: 500}, 0, 0},
		{"stale start, nothing received", 0, State{Confirmed: 500}, 0, 0},
		{"moved", 900, State{Confirmed: 700, Moved: true}, 900, 700},
		{"moved past what was received (keepalive)", 600, State{Confirmed: 800, Moved: true}, 800, 800},
	} {
		w, f := standbyPositions(lsnOf(tc.received), tc.st)
		if uint64(w) != tc.write || uint64(f) != tc.flush {
			t.Errorf("%s: write %d flush %d, want %d %d", tc.name, w, f, tc.write, tc.flush)
		}
	}
}
