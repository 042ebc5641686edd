package health

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/clock/clocktest"
)

// TestMonitorPollsOnItsClock: the monitor polls at once, then every
// Interval of its clock, and at once when asked (PollNow); a poll that
// cannot reach PostgreSQL says why in the snapshot. Nothing sleeps: the
// test moves the clock when the monitor waits on it.
func TestMonitorPollsOnItsClock(t *testing.T) {
	// A port nothing listens on: every connection is refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	pc, err := pgconn.ParseConfig("host=127.0.0.1 sslmode=disable port=" + port)
	if err != nil {
		t.Fatal(err)
	}
	c := clocktest.New()
	m := NewMonitor(MonitorConfig{Conn: pc, Slot: "outboxd", Brokers: []string{"b"}, Interval: time.Minute, Clock: c,
		Probe: func(context.Context, string) error { return nil }}, hclog.NewNullLogger())
	polls := make(chan Snapshot, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx, func(s Snapshot) { polls <- s })
	}()

	first := <-polls
	if !strings.Contains(first.Err, "connect") || first.BrokersReachable != 1 || !first.At.Equal(c.Now()) {
		t.Fatalf("first poll: %+v; want a connection failure, the broker reachable, dated by the clock", first)
	}
	c.AwaitWaiter(t)
	select {
	case s := <-polls:
		t.Fatalf("a poll before the clock moved: %+v", s)
	default:
	}
	c.Advance(time.Minute)
	if s := <-polls; !s.At.Equal(first.At.Add(time.Minute)) {
		t.Fatalf("second poll dated %s; want %s", s.At, first.At.Add(time.Minute))
	}
	c.AwaitWaiter(t)
	m.PollNow()
	if s := <-polls; !s.At.Equal(first.At.Add(time.Minute)) {
		t.Fatalf("a poll asked for came at %s; want at once (%s)", s.At, first.At.Add(time.Minute))
	}
	cancel()
	<-done
}

// TestNoSlotStatsBefore14: on a server without pg_stat_replication_slots
// (PostgreSQL 13) the poll asks nothing (no connection is touched) and
// says why in one debug line per connection.
func TestNoSlotStatsBefore14(t *testing.T) {
	var logged strings.Builder
	p := poller{log: hclog.New(&hclog.LoggerOptions{Output: &logged, Level: hclog.Debug}), version: 130020}
	for i := 0; i < 3; i++ {
		if st := p.readStats(context.Background(), "outboxd"); st != nil {
			t.Fatalf("statistics from PostgreSQL 13: %+v", st)
		}
	}
	if n := strings.Count(logged.String(), "no slot statistics"); n != 1 || !strings.Contains(logged.String(), "needs PostgreSQL 14") {
		t.Errorf("%d debug lines, want one saying why:\n%s", n, logged.String())
	}
}
