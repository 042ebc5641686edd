package clock_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/clock/clocktest"
)

func TestSleep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c := clocktest.New()
	if clock.Sleep(ctx, c, time.Hour) {
		t.Fatal("Sleep returned true after its context ended")
	}
	woke := make(chan bool)
	go func() { woke <- clock.Sleep(context.Background(), c, time.Hour) }()
	<-c.Waiting // the first Sleep's wait
	<-c.Waiting // this one's
	c.Advance(time.Hour - time.Nanosecond)
	select {
	case <-woke:
		t.Fatal("Sleep returned before its time had passed")
	default:
	}
	c.Advance(time.Nanosecond)
	if !<-woke {
		t.Fatal("Sleep returned false without its context ending")
	}
}

func TestSince(t *testing.T) {
	c := clocktest.New()
	start := c.Now()
	c.Advance(90 * time.Second)
	if got := clock.Since(c, start); got != 90*time.Second {
		t.Fatalf("Since = %s, want 1m30s", got)
	}
	if clock.Or(nil) != clock.System || clock.Or(c) != c {
		t.Fatal("Or does not keep a clock it is given, or does not default to System")
	}
}
