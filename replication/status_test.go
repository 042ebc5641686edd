package replication

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
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
	s, w, prod := newWalsenderStream(t, Config{}, outboxRoute(""), 0x100)
	done := runStream(context.Background(), s)
	w.xlog(0x1000, relationMsg())
	w.txn(0x1000, 0x1010, "P-1")
	first := prod.record(t, 0)
	w.xlog(0x2000, beginMsg(0x2000))
	w.xlog(0x2000, insertMsg("bad"))
	time.Sleep(100 * time.Millisecond)
	w.keepalive(0x9000, true)
	w.txn(0x3000, 0x3010, "P-3")
	w.keepalive(0x9100, false)
	time.Sleep(200 * time.Millisecond)
	settling := w.flushes()
	first.Ack.Ack(nil)
	if err := waitErr(t, done, 15*time.Second); !IsFatal(err) {
		t.Fatalf("want the bad row's fatal error, got %v", err)
	}
	if len(settling) == 0 {
		t.Error("no status answered the keepalive that asked for one while the stream settled")
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
	if n := prod.produced(); n != 1 {
		t.Fatalf("%d records produced, want only the one before the bad row", n)
	}
}

// TestCleanStopReplacesARefusal: a Refusable record refused while the
// stream stops is dead-lettered before the final status, and its
// transaction (and every later one) is confirmed only once the dead letter
// is acknowledged.
func TestCleanStopReplacesARefusal(t *testing.T) {
	s, w, prod := newWalsenderStream(t, Config{}, outboxRoute("dlq"), 0x100)
	ctx, cancel := context.WithCancel(context.Background())
	done := runStream(ctx, s)
	w.xlog(0x1000, relationMsg())
	w.txn(0x1000, 0x1010, "P-1", "P-2")
	w.txn(0x2000, 0x2010, "P-3")
	a, big, c := prod.record(t, 0), prod.record(t, 1), prod.record(t, 2)
	a.Ack.Ack(nil)
	c.Ack.Ack(nil)
	cancel()
	time.Sleep(100 * time.Millisecond)
	big.Ack.Ack(&outboxd.RefusedError{Topic: big.Topic, Key: big.Key, Headers: big.Headers, Size: 2 << 20, Err: errInjected})
	dl := prod.record(t, 3)
	if dl.Topic != "dlq" || string(dl.Key) != "P-2" {
		t.Fatalf("dead letter to %q with key %q", dl.Topic, dl.Key)
	}
	time.Sleep(100 * time.Millisecond)
	for _, f := range w.flushes() {
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
	tr := NewTracker(100, 1<<20, 1<<30)
	s := &stream{tracker: tr}
	x := tr.Begin(time.Now(), 200)
	acks := make([]outboxd.Acker, statusEvery)
	for i := range acks {
		acks[i] = tr.Track(x, 1, nil)
	}
	for _, a := range acks[:statusEvery-1] {
		a.Ack(nil)
	}
	if s.farAhead() {
		t.Fatalf("due after %d acknowledgements", statusEvery-1)
	}
	acks[statusEvery-1].Ack(nil)
	if !s.farAhead() {
		t.Fatalf("not due after %d acknowledgements", statusEvery)
	}
}
