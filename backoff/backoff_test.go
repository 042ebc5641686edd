package backoff_test

import (
	"testing"
	"time"

	"github.com/outboxd/outboxd/backoff"
)

func TestDelay(t *testing.T) {
	lo, hi := 100*time.Millisecond, time.Second
	for attempt, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		for i := 0; i < 50; i++ {
			if d := backoff.Delay(attempt, lo, hi); d < want/2 || d > want {
				t.Fatalf("Delay(%d) = %s, want within [%s, %s]", attempt, d, want/2, want)
			}
		}
	}
}
