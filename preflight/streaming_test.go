package preflight

import (
	"strings"
	"testing"

	"github.com/outboxd/outboxd/replication"
)

// TestStreamingLine: check says whether the server will stream, as the
// session decides (replication.DecideStreaming), and whether the spill
// directory takes the changes.
func TestStreamingLine(t *testing.T) {
	for _, tc := range []struct {
		name            string
		streaming, msgs bool
		version         int
		badDir          bool
		status          string
		detail          string
	}{
		{"on", true, false, 150000, false, Pass, "on: the server streams transactions larger than logical_decoding_work_mem (64MB)"},
		{"spill dir", true, false, 150000, true, Warn, "off: pipeline.spill_dir /nonexistent/spill cannot take the changes of a streamed transaction ("},
		{"setting", false, false, 150000, false, Warn, "off (postgres.streaming is false"},
		{"old server", true, false, 130000, false, Warn, "older than PostgreSQL 14"},
		{"message routes", true, true, 150000, false, Pass, "off (a route takes logical messages"},
		{"both off", false, true, 150000, false, Warn, "off (postgres.streaming is false"},
	} {
		dir := t.TempDir()
		if tc.badDir {
			dir = "/nonexistent/spill"
		}
		d := replication.DecideStreaming(tc.streaming, tc.msgs, tc.version, dir)
		r := evalStreaming(d, tc.streaming && tc.msgs, "64MB")
		if r.Status != tc.status || !strings.Contains(r.Detail, tc.detail) {
			t.Errorf("%s: %v %q, want %v containing %q", tc.name, r.Status, r.Detail, tc.status, tc.detail)
		}
	}
}
