// Package clock is the time outboxd reads and waits on. Every component
// takes a Clock instead of calling time.Now or time.After, so that its
// tests move time by hand (clocktest) rather than sleep.
package clock

import (
	"context"
	"time"
)

// Clock is the time a component reads and waits on.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// System is the operating system's clock.
var System Clock = system{}

type system struct{}

func (system) Now() time.Time                         { return time.Now() }
func (system) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Or is c, or System when c is nil (a configuration that leaves its clock
// unset).
func Or(c Clock) Clock {
	if c == nil {
		return System
	}
	return c
}

// Since is the time elapsed on c since t.
func Since(c Clock, t time.Time) time.Duration { return c.Now().Sub(t) }

// Sleep waits d on c; false when ctx ended first.
func Sleep(ctx context.Context, c Clock, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-c.After(d):
		return true
	}
}
