// Package clocktest is a clock.Clock a test moves by hand.
package clocktest

import (
	"sync"
	"testing"
	"time"
)

// Clock is a clock.Clock the test moves with Advance. Waiting is signalled
// whenever someone starts waiting on it (After), so that a test can move it
// once the code under test waits.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []timer
	Waiting chan struct{}
}

type timer struct {
	at time.Time
	c  chan time.Time
}

// New starts at an arbitrary fixed time.
func New() *Clock {
	return &Clock{now: time.Unix(1_000_000, 0), Waiting: make(chan struct{}, 1000)}
}

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After fires once Advance has moved the clock d on.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	if d <= 0 {
		ch <- c.now
	} else {
		c.timers = append(c.timers, timer{c.now.Add(d), ch})
	}
	c.mu.Unlock()
	c.Waiting <- struct{}{}
	return ch
}

// Advance moves the clock d on and fires the timers due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
		} else {
			t.c <- c.now
		}
	}
	c.timers = kept
}

// AwaitWaiter returns once someone starts waiting on c (After), and fails
// t if no one does within a minute (a generous bound: a loaded machine
// may be slow to get there).
func (c *Clock) AwaitWaiter(t testing.TB) {
	t.Helper()
	select {
	case <-c.Waiting:
	case <-time.After(time.Minute):
		t.Fatal("no one waited on the clock")
	}
}

// AwaitTimer returns once someone waits on c for d or less from now (a
// timer due by Now()+d), and fails t if no one does within a minute. Unlike
// AwaitWaiter it tells a wait apart from others (a longer one, or one that
// began earlier and still runs).
func (c *Clock) AwaitTimer(t testing.TB, d time.Duration) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		c.mu.Lock()
		due := c.now.Add(d)
		for _, tm := range c.timers {
			if !tm.at.After(due) {
				c.mu.Unlock()
				return
			}
		}
		c.mu.Unlock()
		select {
		case <-c.Waiting:
		case <-deadline:
			t.Fatalf("no one waited on the clock for %s or less", d)
		}
	}
}
