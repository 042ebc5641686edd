// Package backoff paces retries: exponential delays with jitter, and a
// sleep that a context interrupts. The replication runner retries its
// sessions with it, the consumer package its transient errors.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Delay is lo·2^attempt (attempt counts from 0) capped at hi, with full
// jitter over its upper half, so that retries spread out.
func Delay(attempt int, lo, hi time.Duration) time.Duration {
	d := lo
	for i := 0; i < attempt && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	return d/2 + rand.N(d/2+1)
}

// Sleep waits d; false when ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
