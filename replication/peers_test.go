package replication

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// TestCheckPeers: a broker that acknowledges nothing while records wait,
// and a server that sends nothing while we read, end the session within
// their timeouts; waiting with nothing in flight is not a failure.
func TestCheckPeers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := &stream{r: &Runner{cfg: Config{DeliveryTimeout: 30 * time.Second, ReceiveTimeout: 20 * time.Second}, log: hclog.NewNullLogger()},
		lastRecv: t0, lastAckAt: t0, pinged: true}
	// Nothing in flight for a long time: fine.
	if err := s.checkPeers(t0.Add(10*time.Second), State{}); err != nil {
		t.Fatal(err)
	}
	s.lastRecv = t0.Add(10 * time.Second)
	// Records in flight, acknowledgements progressing: fine.
	if err := s.checkPeers(t0.Add(15*time.Second), State{Events: 5, Acked: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.checkPeers(t0.Add(25*time.Second), State{Events: 5, Acked: 2}); err != nil {
		t.Fatal(err)
	}
	// No progress for longer than the delivery timeout.
	err := s.checkPeers(t0.Add(56*time.Second), State{Events: 5, Acked: 2})
	if err == nil || !strings.Contains(err.Error(), "broker presumed unreachable") {
		t.Fatalf("delivery timeout: got %v", err)
	}
	// The server silent for longer than the receive timeout.
	s.lastAckAt = t0.Add(56 * time.Second)
	err = s.checkPeers(t0.Add(31*time.Second), State{})
	if err == nil || !strings.Contains(err.Error(), "connection presumed dead") {
		t.Fatalf("receive timeout: got %v", err)
	}
}
