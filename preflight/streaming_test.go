package preflight

import (
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/replication"
)

// TestStreamingLine: check says whether the server will stream, as the
// session decides (replication.StreamingOff), and whether the spill
// directory takes the changes.
func TestStreamingLine(t *testing.T) {
	for _, tc := range []struct {
		name            string
		streaming, msgs bool
		version         int
		dirErr          error
		status          string
		detail          string
	}{
		{"on", true, false, 150000, nil, Pass, "on: the server streams transactions larger than logical_decoding_work_mem (64MB)"},
		{"spill dir", true, false, 150000, errors.New("permission denied"), Warn, "off: pipeline.spill_dir /var/spill cannot take the changes of a streamed transaction (permission denied)"},
		{"setting", false, false, 150000, nil, Warn, "off (postgres.streaming is false"},
		{"old server", true, false, 130000, nil, Warn, "older than PostgreSQL 14"},
		{"message routes", true, true, 150000, nil, Pass, "off (a route takes logical messages"},
		{"both off", false, true, 150000, nil, Warn, "off (postgres.streaming is false"},
	} {
		off := replication.StreamingOff(tc.streaming, tc.msgs, tc.version)
		r := evalStreaming(off, tc.streaming && tc.msgs, "64MB", "/var/spill", tc.dirErr)
		if r.Status != tc.status || !strings.Contains(r.Detail, tc.detail) {
			t.Errorf("%s: %v %q, want %v containing %q", tc.name, r.Status, r.Detail, tc.status, tc.detail)
		}
	}
}
