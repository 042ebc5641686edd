package sink

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// TestIdleWarningNotForAPendingKick: records added between the sender's
// taking no round and its going idle open a batch and poke it; the poke
// waits in p.kick, so the sender is not stuck and says nothing (it said
// "sender idle with batches waiting and nothing to wake it" under load, a
// false alarm). Without the kick, the same state is the bug it reports.
func TestIdleWarningNotForAPendingKick(t *testing.T) {
	var out bytes.Buffer
	p := &Producer{log: hclog.New(&hclog.LoggerOptions{Output: &out}), kick: make(chan struct{}, 1),
		parts: []*partition{{topic: "t", id: 1, open: &batch{}}}}
	p.poke()
	p.logIdleWithWork()
	if strings.Contains(out.String(), "sender idle") {
		t.Fatalf("warned with a kick pending:\n%s", out.String())
	}
	<-p.kick
	p.logIdleWithWork()
	if !strings.Contains(out.String(), "sender idle with batches waiting and nothing to wake it") {
		t.Fatalf("no warning with an open batch, no round, no timer and no kick:\n%s", out.String())
	}
}
