package replication

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/clock/clocktest"
)

// TestRunnerBacksOffOnItsClock: a session that fails (the server hangs up
// at once) is retried after a backoff waited on the runner's clock: the
// runner is in backoff, with the failure as its last error, and tries
// again only once the clock has moved past the delay; a stop ends the wait.
// Nothing sleeps: the test moves the clock when the runner waits on it.
func TestRunnerBacksOffOnItsClock(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var attempts atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			attempts.Add(1)
			c.Close()
		}
	}()
	pc, err := pgconn.ParseConfig("host=127.0.0.1 port=" + strings.TrimPrefix(ln.Addr().String(), "127.0.0.1:") + " user=outboxd sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	c := clocktest.New()
	r := NewRunner(Config{Conn: pc, Slot: "outboxd", BackoffMin: time.Minute, BackoffMax: time.Hour, StandbyRetry: time.Minute, Clock: c},
		nil, nil, hclog.NewNullLogger())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	c.AwaitWaiter(t) // the first backoff
	st := r.Status()
	if n := attempts.Load(); n != 1 || st.State != StateBackoff || !strings.Contains(st.LastError, "connect to PostgreSQL") {
		t.Fatalf("after the first failure: %d attempts, state %s, last error %q; want 1, backoff, connect to PostgreSQL", n, st.State, st.LastError)
	}
	// The first delay is within [BackoffMin/2, BackoffMin].
	c.Advance(time.Minute)
	c.AwaitWaiter(t) // the second backoff
	if n := attempts.Load(); n != 2 {
		t.Fatalf("%d attempts once the clock passed the first delay; want 2", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after a stop during a backoff: %v", err)
	}
	if st := r.Status(); st.State != StateStopped {
		t.Fatalf("state %s after a stop; want stopped", st.State)
	}
}

// TestClassify: a connection failure no retry can fix (a TLS setting, a
// refused login, a missing database or privilege) stops the runner; one
// that may pass (the server is not up yet) is retried.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		fatal bool
	}{
		{"hostssl only", &pgconn.PgError{Code: "28000", Message: `no pg_hba.conf entry for host "127.0.0.1", user "u", database "d", no encryption`}, true},
		{"wrong password", &pgconn.PgError{Code: "28P01"}, true},
		{"no database", &pgconn.PgError{Code: "3D000"}, true},
		{"no REPLICATION", &pgconn.PgError{Code: "42501"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, false},
		{"refused", &net.OpError{Op: "dial", Err: errors.New("connect: connection refused")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := classify(tc.err)
			if IsFatal(err) != tc.fatal || !errors.Is(err, tc.err) {
				t.Fatalf("classify(%v) = %v; want fatal %v, wrapping it", tc.err, err, tc.fatal)
			}
		})
	}
}
