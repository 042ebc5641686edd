package replication

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/publish/publishtest"
)

// TestCheckPeers: a broker that acknowledges nothing while records wait,
// and a server that sends nothing while we read, end the session within
// their timeouts; waiting with nothing in flight is not a failure.
func TestCheckPeers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	prod := &publishtest.Producer{}
	s := newTestStream(mustRouter(t, outboxRoute("")), prod, 0x100, Config{DeliveryTimeout: 30 * time.Second, ReceiveTimeout: 20 * time.Second})
	s.lastRecv, s.pinged = t0, true
	// Nothing in flight for a long time: fine.
	if err := s.checkPeers(t0.Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	s.lastRecv = t0.Add(10 * time.Second)
	for _, m := range [][]byte{relationMsg(), beginMsg(0x1000), insertMsg("P-1"), insertMsg("P-2"), insertMsg("P-3"), commitMsg(0x1000, 0x1010)} {
		if err := s.handleMessage(m); err != nil {
			t.Fatal(err)
		}
	}
	// Records in flight, acknowledgements progressing: fine.
	if err := s.checkPeers(t0.Add(15 * time.Second)); err != nil {
		t.Fatal(err)
	}
	prod.Record(t, 0).Ack.Ack(nil)
	if err := s.checkPeers(t0.Add(25 * time.Second)); err != nil {
		t.Fatal(err)
	}
	// No progress for longer than the delivery timeout.
	err := s.checkPeers(t0.Add(56 * time.Second))
	if err == nil || !strings.Contains(err.Error(), "broker presumed unreachable") {
		t.Fatalf("delivery timeout: got %v", err)
	}
	// The server silent for longer than the receive timeout.
	err = s.checkPeers(t0.Add(31 * time.Second))
	if err == nil || !strings.Contains(err.Error(), "connection presumed dead") {
		t.Fatalf("receive timeout: got %v", err)
	}
}
