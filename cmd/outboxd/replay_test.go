package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestReplayTime(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct{ in, want string }{
		{"2026-12-03T10:00:00Z", "2026-12-03T10:00:00Z"},
		{"2026-12-03T10:00:00.123456+02:00", "2026-12-03T08:00:00.123456Z"},
		{"2026-12-03 10:00", "2026-12-03T10:00:00Z"},
		{"2026-12-03 10:00:05.5", "2026-12-03T10:00:05.5Z"},
		{"2026-12-03", "2026-12-03T00:00:00Z"},
		{"2026-12-03T10:00:00", "2026-12-03T10:00:00Z"},
		// As PostgreSQL prints a timestamptz (DateStyle ISO), in the
		// session's TimeZone: +hh, +hh:mm, +hh:mm:ss; with or without a
		// fraction.
		{"2026-12-04 11:35:33.065544+00", "2026-12-04T11:35:33.065544Z"},
		{"2026-12-04 11:35:33+00", "2026-12-04T11:35:33Z"},
		{"2026-12-04 17:05:33.065544+05:30", "2026-12-04T11:35:33.065544Z"},
		{"2026-12-04 08:05:33.5-03:30", "2026-12-04T11:35:33.5Z"},
		{"2026-12-04 01:35:33-10", "2026-12-04T11:35:33Z"},
		{"1890-01-01 00:00:00+00:53:28", "1889-12-31T23:06:32Z"},
		{"2026-12-04T11:35:33.065544+00", "2026-12-04T11:35:33.065544Z"},
		{"90m", "2026-12-03T10:30:00Z"},
		{"2026-12-04 11:35:33.065544+", ""},
		{"2026-12-04 11:35:33 UTC", ""},
		{"yesterday", ""},
		{"-1h", ""},
	} {
		got, err := replayTime(tt.in, now)
		if (err != nil) != (tt.want == "") || got != tt.want {
			t.Errorf("replayTime(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

// The command refuses what it cannot do before it connects anywhere.
func TestReplayUsage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "-c", "x.yaml"}, "--from TIME (or --id ID) is required"},
		{[]string{"replay", "-c", "x.yaml", "--id", "a", "--from", "1h"}, "--id excludes --from and --to"},
		{[]string{"replay", "-c", "x.yaml", "--from", "soon"}, `"soon" is not a time`},
		{[]string{"replay", "-c", "/nonexistent/x.yaml", "--id", "a,b", "--id", "c"}, "load config"},
	} {
		var out, errb bytes.Buffer
		if code := realMain(tt.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, code, errb.String(), tt.want)
		}
	}
	var ids idList
	_ = ids.Set("a, b,,c")
	_ = ids.Set("d")
	if ids.String() != "a,b,c,d" {
		t.Errorf("ids = %v", ids)
	}
}
