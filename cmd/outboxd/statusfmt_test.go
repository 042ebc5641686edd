package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestFormatStatus(t *testing.T) {
	body := `{"topics":{"b.t":{"events":2},"a.t":{"last_produce":"2026-01-01T00:00:00Z"}},"counters":{"events":12,"dead_lettered":0},
"lag_seconds":0.25,"slot":{"wal_status":"reserved","name":"s","confirmed_flush_lsn":"0/16B3748","active_pid":null,"active":true,"safe_wal_size":null},
"retained_wal_bytes":12345678,"unknown":[1,"x"],"empty":{},"last_error":"","state":"streaming","in_flight":{"bytes":1023}}`
	var out bytes.Buffer
	if err := formatStatus(&out, []byte(body)); err != nil {
		t.Fatal(err)
	}
	want := `state: streaming
last_error: 
slot.name: s
slot.active: true
slot.active_pid: (none)
slot.wal_status: reserved
slot.confirmed_flush_lsn: 0/16B3748
slot.safe_wal_size: (none)
retained_wal_bytes: 12345678 (11.8 MiB)
lag_seconds: 0.25
in_flight.bytes: 1023 (1023 B)
counters.dead_lettered: 0
counters.events: 12
topics.a.t.last_produce: 2026-01-01T00:00:00Z
topics.b.t.events: 2
empty: {}
unknown[0]: 1
unknown[1]: x
`
	if got := out.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if err := formatStatus(&out, []byte(`[1]`)); err == nil || !strings.Contains(err.Error(), "JSON object") {
		t.Errorf("a JSON array: %v", err)
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 12345678: "11.8 MiB", 5 << 30: "5.0 GiB", 3 << 40: "3.0 TiB", -2048: "-2.0 KiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestDialable(t *testing.T) {
	for in, want := range map[string]string{"127.0.0.1:8080": "127.0.0.1:8080", ":8080": "127.0.0.1:8080", "0.0.0.0:9": "127.0.0.1:9", "[::]:9": "127.0.0.1:9", "h:1": "h:1"} {
		if got := dialable(in); got != want {
			t.Errorf("dialable(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := realMain([]string{"slot"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "slot drop") {
		t.Errorf("outboxd slot: exit %d, %q", code, errb.String())
	}
	errb.Reset()
	if code := realMain([]string{"run", "--yes"}, &out, &errb); code != 2 {
		t.Errorf("run --yes: exit %d", code)
	}
	if code := realMain([]string{"help"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "status") {
		t.Errorf("help: exit %d", code)
	}
}
