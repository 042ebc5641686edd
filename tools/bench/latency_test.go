package main

import (
	"fmt"
	"strings"
	"testing"
)

// TestScanTags: every tagged row of a pgoutput stream is found once,
// whatever the boundaries of the reads, and nothing else is.
func TestScanTags(t *testing.T) {
	var stream strings.Builder
	want := map[[2]int64]int{}
	for i := int64(0); i < 50; i++ {
		// An Insert's bytes around the carrega, as pgoutput sends them.
		fmt.Fprintf(&stream, "I\x00\x00@\x01N\x00\x08t\x00\x00\x00\x24{\"id\": \"P-2026-%06d\", \"bench_c\": %d, \"bench_t\": %d}\n", i, i%7, 1733000000000000+i*1000)
		want[[2]int64{i % 7, 1733000000000000 + i*1000}]++
		if i%10 == 0 {
			stream.WriteString(`C{"bench_c" without a time}`) // noise
		}
	}
	for _, chunk := range []int{1, 3, 7, 64, 1 << 20} {
		got := map[[2]int64]int{}
		var buf []byte
		s := stream.String()
		for len(s) > 0 {
			n := min(chunk, len(s))
			buf = scanTags(append(buf, s[:n]...), func(c, ts int64) { got[[2]int64{c, ts}]++ })
			s = s[n:]
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("reads of %d bytes: got %v\nwant %v", chunk, got, want)
		}
		if len(buf) > 200 {
			t.Errorf("reads of %d bytes: %d bytes kept after the stream", chunk, len(buf))
		}
	}
}
