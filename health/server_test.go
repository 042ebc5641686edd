package health

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/clock/clocktest"
	"github.com/outboxd/outboxd/replication"
)

type fakeSource struct{ st replication.Status }

func (f fakeSource) Status() replication.Status { return f.st }

func server(t *testing.T, st replication.Status, snap Snapshot, limits Limits) *Server {
	t.Helper()
	return serverOn(t, clock.System, st, snap, limits)
}

// serverOn is a server whose monitor, and so the server, reads c.
func serverOn(t *testing.T, c clock.Clock, st replication.Status, snap Snapshot, limits Limits) *Server {
	t.Helper()
	mon := &Monitor{cfg: MonitorConfig{Clock: c}}
	mon.last = snap
	s, err := Listen("127.0.0.1:0", fakeSource{st}, mon, NewMetrics(nil), limits, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.ln.Close() })
	return s
}

func get(t *testing.T, s *Server, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.srv.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func healthySnap() Snapshot {
	return Snapshot{At: time.Now(), Slot: &SlotInfo{Name: "s", Plugin: "pgoutput", Active: true, WALStatus: "reserved"},
		Brokers: 1, BrokersReachable: 1, RetainedBytes: 1000}
}

func TestEndpoints(t *testing.T) {
	now := time.Now()
	streaming := replication.Status{State: "streaming", LastStatusSent: now, WALSenderTimeout: time.Minute}
	tests := []struct {
		name           string
		st             func() replication.Status
		snap           func() Snapshot
		healthz, ready int
		reason         string
	}{
		{"healthy", func() replication.Status { return streaming }, healthySnap, 200, 200, ""},
		{"wedged: no status for longer than wal_sender_timeout", func() replication.Status {
			s := streaming
			s.LastStatusSent = now.Add(-2 * time.Minute)
			return s
		}, healthySnap, 503, 200, "no standby status sent"},
		{"standby is alive but not ready", func() replication.Status {
			return replication.Status{State: "standby", LastStatusSent: now.Add(-time.Hour), WALSenderTimeout: time.Minute}
		}, healthySnap, 200, 503, "state is standby"},
		{"backoff is alive but not ready", func() replication.Status { return replication.Status{State: "backoff"} }, healthySnap, 200, 503, "state is backoff"},
		{"stopped is dead", func() replication.Status { return replication.Status{State: "stopped", LastError: "boom"} }, healthySnap, 503, 503, "stopped"},
		{"lag over the limit", func() replication.Status {
			s := streaming
			s.Tracker.OldestOpen = now.Add(-90 * time.Second)
			return s
		}, healthySnap, 200, 503, "exceeds health.max_lag"},
		{"retained WAL over the limit", func() replication.Status { return streaming }, func() Snapshot {
			s := healthySnap()
			s.RetainedBytes = 5 << 20
			return s
		}, 200, 503, "max_retained_wal_bytes"},
		{"wal_status unreserved", func() replication.Status { return streaming }, func() Snapshot {
			s := healthySnap()
			s.Slot.WALStatus = "unreserved"
			return s
		}, 200, 503, "will be removed at the next checkpoint"},
		{"wal_status lost", func() replication.Status { return streaming }, func() Snapshot {
			s := healthySnap()
			s.Slot.WALStatus = "lost"
			return s
		}, 200, 503, "events are missing"},
		{"invalidated for idleness (PostgreSQL 18), wal_status reserved", func() replication.Status { return streaming }, func() Snapshot {
			s := healthySnap()
			s.Slot.InvalidationReason, s.Slot.Unusable = "idle_timeout", "PostgreSQL invalidated it (idle_timeout)"
			return s
		}, 200, 503, "cannot be streamed from: PostgreSQL invalidated it (idle_timeout)"},
		{"no broker reachable", func() replication.Status { return streaming }, func() Snapshot {
			s := healthySnap()
			s.BrokersReachable = 0
			return s
		}, 200, 503, "no Kafka broker"},
		{"slot gone", func() replication.Status { return streaming }, func() Snapshot {
			s := healthySnap()
			s.Slot = nil
			return s
		}, 200, 503, "does not exist"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := server(t, tc.st(), tc.snap(), Limits{MaxLag: time.Minute, MaxRetainedWALBytes: 1 << 20})
			hc, hbody := get(t, s, "/healthz")
			rc, rbody := get(t, s, "/readyz")
			if hc != tc.healthz || rc != tc.ready {
				t.Fatalf("healthz %d (%s), readyz %d (%s); want %d, %d", hc, hbody, rc, rbody, tc.healthz, tc.ready)
			}
			if tc.reason != "" && !strings.Contains(hbody+rbody, tc.reason) {
				t.Fatalf("no %q in %s %s", tc.reason, hbody, rbody)
			}
		})
	}
}

// TestStatusLagAndNoSecrets: /status shows the lag, the counters, the slot
// and the positions (as PostgreSQL writes an LSN), and no credential.
func TestStatusLagAndNoSecrets(t *testing.T) {
	c := clocktest.New()
	st := replication.Status{State: "streaming", LastError: "connect: failed", Events: 7, Confirmed: 0x16B3700}
	st.Tracker.OldestOpen = c.Now().Add(-10 * time.Second)
	snap := healthySnap()
	snap.ServerWAL = 0x16B3748
	s := serverOn(t, c, st, snap, Limits{})
	code, body := get(t, s, "/status")
	if code != 200 {
		t.Fatal(code)
	}
	var doc Status
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.LagSeconds != 10 || doc.Counters.Events != 7 || doc.Slot.Name != "s" || doc.ServerWALLSN != "0/16B3748" || doc.ConfirmedLSN != "0/16B3700" {
		t.Fatalf("status %+v", doc)
	}
	if strings.Contains(strings.ToLower(body), "password") || strings.Contains(body, "dsn") {
		t.Fatalf("/status mentions credentials: %s", body)
	}
}

// TestNoVerdictFromAPollOlderThanTheState: a poll that began before the
// stream created the slot and the publication saw neither; next to the
// streaming state it must not say "does not exist" (readiness probes and
// alerts would see a false alarm), only that the slot has not been read
// since. A poll from after the state began is judged normally.
func TestNoVerdictFromAPollOlderThanTheState(t *testing.T) {
	since := time.Now()
	st := replication.Status{State: replication.StateStreaming, Since: since, LastStatusSent: since, WALSenderTimeout: time.Minute}
	stale := Snapshot{At: since.Add(-time.Second), Brokers: 1, BrokersReachable: 1,
		Publication: `publication p does not exist: CREATE PUBLICATION "p" FOR TABLE "public"."outbox"`}
	var logged strings.Builder
	s := server(t, st, stale, Limits{})
	s.log = hclog.New(&hclog.LoggerOptions{Output: &logged})
	code, body := get(t, s, "/readyz")
	if code != 503 || strings.Contains(body, "does not exist") || !strings.Contains(body, "has not been read since the state became streaming") {
		t.Fatalf("stale poll: %d %s", code, body)
	}
	s.Watch(stale)
	if logged.Len() != 0 {
		t.Fatalf("a stale poll was logged as a problem: %s", logged.String())
	}
	// Starting, before the stream created them: not a problem either.
	s.src = fakeSource{replication.Status{State: replication.StateStarting, Since: since.Add(-time.Minute)}}
	if code, body := get(t, s, "/readyz"); code != 503 || strings.Contains(body, "does not exist") || !strings.Contains(body, "state is starting") {
		t.Fatalf("starting: %d %s", code, body)
	}
	s.src = fakeSource{st}
	fresh := stale
	fresh.At = since.Add(time.Millisecond)
	s.mon.last = fresh
	if code, body := get(t, s, "/readyz"); code != 503 || !strings.Contains(body, "the replication slot does not exist") || !strings.Contains(body, "publication p does not exist") {
		t.Fatalf("fresh poll: %d %s", code, body)
	}
}
