// Package backoff paces retries: exponential delays with jitter, waited on
// a clock (clock.Sleep). The replication runner retries its sessions with
// it, the sink a produce request, the consumer package its transient
// errors.
package backoff

import (
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
