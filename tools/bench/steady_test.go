package main

import (
	"strings"
	"testing"
)

// The steady table gives the Go floor's CPU per event in a column of its
// own when -steady-floor ran one, and has no such column otherwise.
func TestSteadyTableFloorColumn(t *testing.T) {
	cells := []steadyCell{
		{rate: 200, written: 4000, achieved: 200, lat: []float64{1, 2, 3}, cpu: 0.28, wall: 20, floorCPU: 0.15},
		{rate: 2000, written: 40000, achieved: 2000, lat: []float64{1, 2, 3}, cpu: 1.12, wall: 20, floorCPU: 0.72},
	}
	for _, floor := range []string{"", "produce"} {
		r := &report{o: options{steadyRates: []int{200, 2000}, steadyFloor: floor}, steady: &steadyRun{cells: cells}}
		var b strings.Builder
		if _, err := r.writeSteady(&b, func(bool, string, ...any) {}); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		rows := map[int]string{}
		for _, l := range strings.Split(out, "\n") {
			switch {
			case strings.HasPrefix(strings.TrimSpace(l), "200 "):
				rows[200] = l
			case strings.HasPrefix(strings.TrimSpace(l), "2000 "):
				rows[2000] = l
			}
		}
		// outboxd 70.0 and 28.0 µs/event; the floor 37.5 and 18.0.
		want := map[int][]string{200: {"70.0", "37.5"}, 2000: {"28.0", "18.0"}}
		for rate, w := range want {
			row := rows[rate]
			if !strings.Contains(row, w[0]) {
				t.Errorf("floor %q: the %d row has no outboxd %s µs/event: %q", floor, rate, w[0], row)
			}
			if got := strings.Contains(row, w[1]); got != (floor != "") {
				t.Errorf("floor %q: the %d row shows the floor's %s: %v, want %v: %q", floor, rate, w[1], got, floor != "", row)
			}
		}
		if got := strings.Contains(out, "Go floor"); got != (floor != "") {
			t.Errorf("floor %q: header names the Go floor: %v\n%s", floor, got, out)
		}
	}
}
