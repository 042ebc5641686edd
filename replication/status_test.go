package replication

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/publish/publishtest"
)

func lsnOf(v uint64) pglogrepl.LSN { return pglogrepl.LSN(v) }

// TestStandbyPositions: a status sends the acknowledged position, never the
// received one, and nothing at all (zeros, which the walsender ignores)
// until this stream has moved it: the start was read from the slot before
// START_REPLICATION and may be older than the server's.
func TestStandbyPositions(t *testing.T) {
	for _, tc := range []struct {
		name         string
		received     uint64
		st           State
		write, flush uint64
	}{
		{"stale start, a transaction received", 900, State{Confirmed: 500}, 0, 0},
		{"stale start, nothing received", 0, State{Confirmed: 500}, 0, 0},
		{"moved", 900, State{Confirmed: 700, Moved: true}, 900, 700},
		{"moved past what was received (keepalive)", 600, State{Confirmed: 800, Moved: true}, 800, 800},
	} {
		w, f := standbyPositions(lsnOf(tc.received), tc.st)
		if uint64(w) != tc.write || uint64(f) != tc.flush {
			t.Errorf("%s: write %d flush %d, want %d %d", tc.name, w, f, tc.write, tc.flush)
		}
	}
}

// TestFatalStopConfirmsOnlyWhatKafkaAcknowledged: a bad row stops the
// stream while an earlier transaction waits for Kafka. While it waits, the
// stream answers the server but takes nothing from it: a transaction that
// arrives is not produced, and keepalives past everything do not move the
// position. Once the earlier transaction is acknowledged its end is the
// final position, and the COPY is ended.
func TestFatalStopConfirmsOnlyWhatKafkaAcknowledged(t *testing.T) {
	// A status goes out only when the server asks for one (and once as the
	// stream begins to settle, and at its end).
	s, w, prod := newWalsenderStream(t, Config{StatusInterval: time.Hour}, outboxRoute(""), 0x100)
	done := runStream(context.Background(), s)
	w.xlog(0x1000, relationMsg())
	w.txn(0x1000, 0x1010, "P-1")
	first := prod.Record(t, 0)
	w.xlog(0x2000, beginMsg(0x2000))
	w.xlog(0x2000, insertMsg("bad"))
	w.keepalive(0x9000, true)
	w.txn(0x3000, 0x3010, "P-3")
	w.keepalive(0x9100, true)
	// The stream has read everything: it answered both keepalives.
	for _, f := range w.waitFlushes(3) {
		if f > 0x100 {
			t.Fatalf("while settling a status confirmed %s, before anything was acknowledged", f)
		}
	}
	first.Ack.Ack(nil)
	if err := waitErr(t, done, 15*time.Second); !IsFatal(err) {
		t.Fatalf("want the bad row's fatal error, got %v", err)
	}
	fl := w.flushes()
	for _, f := range fl {
		if f > 0x1010 {
			t.Fatalf("a status confirmed %s, past the last acknowledged transaction (0/1010): %v", f, fl)
		}
	}
	if fl[len(fl)-1] != 0x1010 || !w.ended() {
		t.Fatalf("final position %s (want 0/1010), CopyDone %v", fl[len(fl)-1], w.ended())
	}
	if n := prod.Len(); n != 1 {
		t.Fatalf("%d records produced, want only the one before the bad row", n)
	}
}

// TestCleanStopReplacesARefusal: a Refusable record refused while the
// stream stops is dead-lettered before the final status, and its
// transaction (and every later one) is confirmed only once the dead letter
// is acknowledged.
func TestCleanStopReplacesARefusal(t *testing.T) {
	s, w, prod := newWalsenderStream(t, Config{StatusInterval: time.Hour}, outboxRoute("dlq"), 0x100)
	stop := &stopSignal{events: s.events, stopped: make(chan struct{})}
	s.events = stop
	ctx, cancel := context.WithCancel(context.Background())
	done := runStream(ctx, s)
	w.xlog(0x1000, relationMsg())
	w.txn(0x1000, 0x1010, "P-1", "P-2")
	w.txn(0x2000, 0x2010, "P-3")
	a, big, c := prod.Record(t, 0), prod.Record(t, 1), prod.Record(t, 2)
	a.Ack.Ack(nil)
	c.Ack.Ack(nil)
	cancel()
	w.keepalive(0x2010, false) // wakes the read
	<-stop.stopped
	big.Ack.Ack(&outboxd.RefusedError{Topic: big.Topic, Key: big.Key, Headers: big.Headers, Size: 2 << 20, Err: errInjected})
	dl := prod.Record(t, 3)
	if dl.Topic != "dlq" || string(dl.Key) != "P-2" {
		t.Fatalf("dead letter to %q with key %q", dl.Topic, dl.Key)
	}
	// A status the server asks for now: the dead letter is in flight.
	sent := len(w.flushes())
	w.keepalive(0x2010, true)
	for _, f := range w.waitFlushes(sent + 1) {
		if f >= 0x1010 {
			t.Fatalf("confirmed %s before the dead letter was acknowledged", f)
		}
	}
	dl.Ack.Ack(nil)
	if err := waitErr(t, done, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	if fl := w.flushes(); fl[len(fl)-1] != 0x2010 || !w.ended() {
		t.Fatalf("flushes %v, CopyDone %v; want a final 0/2010", fl, w.ended())
	}
}

// TestStatusDueAfterManyAcknowledgements: at a fast drain a status is due
// every statusEvery acknowledgements, not only every status_interval.
func TestStatusDueAfterManyAcknowledgements(t *testing.T) {
	prod := &publishtest.Producer{}
	s := newTestStream(mustRouter(t, outboxRoute("")), prod, 100, Config{MaxInFlightEvents: 1 << 20, MaxInFlightBytes: 1 << 30})
	msgs := [][]byte{relationMsg(), beginMsg(200)}
	for range statusEvery {
		msgs = append(msgs, insertMsg("P-1"))
	}
	for _, m := range msgs {
		if err := s.handleMessage(m); err != nil {
			t.Fatal(err)
		}
	}
	for i := range statusEvery - 1 {
		prod.Record(t, i).Ack.Ack(nil)
	}
	if s.farAhead() {
		t.Fatalf("due after %d acknowledgements", statusEvery-1)
	}
	prod.Record(t, statusEvery-1).Ack.Ack(nil)
	if !s.farAhead() {
		t.Fatalf("not due after %d acknowledgements", statusEvery)
	}
}
