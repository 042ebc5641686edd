package replication_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/replication"
)

type sentRecord struct {
	txn       int
	acker     outboxd.Acker
	refusable bool
}

// TestTrackerNeverConfirmsUnacknowledged drives the tracker with random
// transaction sizes, acknowledgements in random order (as completions from
// different partitions arrive) interleaved with the stream, keepalives, and
// random failures. After every step the confirmed position must not pass a
// transaction with a record that is unacknowledged or failed.
func TestTrackerNeverConfirmsUnacknowledged(t *testing.T) {
	for seed := uint64(0); seed < 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*7919))
		failRate := []float64{0, 0, 0.001, 0.02}[seed%4]
		// Some seeds have Refusable records that the broker refuses: each is
		// replaced by a dead-letter record, which must be acknowledged too.
		refuseRate := []float64{0, 0.05, 0, 0.01}[(seed/4)%4]
		route := &envelope.Binding{Name: "public.outbox"}
		const start = pglogrepl.LSN(1000)
		tr := replication.NewTracker(start, 1<<30, 1<<40)

		nTxn := 1 + rng.IntN(60)
		ends := make([]pglogrepl.LSN, nTxn)
		pending := make([]int, nTxn) // records not yet acknowledged OK
		failed := make([]bool, nTxn)
		committed := make([]bool, nTxn)
		var inFlight []sentRecord
		lsn := start

		check := func(step string) {
			st := tr.State()
			for i := 0; i < nTxn; i++ {
				if !committed[i] {
					// An open transaction's position is unknown yet; every
					// later one is larger, so the loop can stop.
					break
				}
				if ends[i] <= st.Confirmed && ends[i] > start && (pending[i] > 0 || failed[i]) {
					t.Fatalf("seed %d, %s: confirmed %s passes txn %d (end %s) with %d unacknowledged records, failed=%v",
						seed, step, st.Confirmed, i, ends[i], pending[i], failed[i])
				}
			}
		}
		ackSome := func(max int) {
			for n := rng.IntN(max + 1); n > 0 && len(inFlight) > 0; n-- {
				j := rng.IntN(len(inFlight))
				r := inFlight[j]
				inFlight[j] = inFlight[len(inFlight)-1]
				inFlight = inFlight[:len(inFlight)-1]
				var err error
				refused := false
				switch {
				case r.refusable && rng.Float64() < refuseRate:
					err = &outboxd.RefusedError{Topic: "t", Err: errors.New("injected: too large")}
					refused = true
				case rng.Float64() < failRate:
					err = errors.New("injected delivery failure")
					failed[r.txn] = true
				}
				// Flip the model before the tracker: the check below runs
				// after the tracker has seen it.
				if err == nil {
					pending[r.txn]--
				}
				r.acker.Ack(err)
				check("ack")
				if refused {
					// The stream replaces it; the replacement stays pending.
					rfs := tr.Refusals()
					if len(rfs) != 1 || rfs[0].Route != route {
						t.Fatalf("seed %d: %d refusals after one refused record", seed, len(rfs))
					}
					inFlight = append(inFlight, sentRecord{txn: r.txn, acker: tr.Replace(rfs[0], 10)})
					check("replace")
				}
			}
		}

		for i := 0; i < nTxn; i++ {
			x := tr.Begin(time.Unix(int64(i), 0), 0)
			// Some transactions carry no outbox row (other tables).
			size := 0
			if rng.IntN(5) > 0 {
				size = 1 + rng.IntN(20)
			}
			for k := 0; k < size; k++ {
				pending[i]++
				refusable := rng.IntN(2) == 0
				var rt *envelope.Binding
				if refusable {
					rt = route
				}
				inFlight = append(inFlight, sentRecord{txn: i, acker: tr.Track(x, int64(1+rng.IntN(100)), rt), refusable: refusable})
				ackSome(2)
			}
			lsn += pglogrepl.LSN(1 + rng.IntN(500))
			ends[i] = lsn
			committed[i] = true
			tr.Commit(x, lsn)
			check("commit")
			if rng.IntN(4) == 0 && len(inFlight) > 0 {
				// A keepalive while records are in flight must not move the position.
				tr.Keepalive(lsn + 10_000)
				check("keepalive")
			}
			ackSome(10)
		}
		for len(inFlight) > 0 {
			ackSome(len(inFlight))
		}

		st := tr.State()
		if st.Events != 0 || st.Bytes != 0 {
			t.Fatalf("seed %d: %d records / %d bytes still counted in flight", seed, st.Events, st.Bytes)
		}
		// Liveness: the position reaches the end of the last transaction
		// before the first failed one.
		want := start
		firstFailed := -1
		for i := 0; i < nTxn; i++ {
			if failed[i] {
				firstFailed = i
				break
			}
			want = ends[i]
		}
		if st.Confirmed != want {
			t.Fatalf("seed %d: confirmed %s, want %s (first failed txn %d)", seed, st.Confirmed, want, firstFailed)
		}
		if (firstFailed >= 0) != (st.Err != nil) {
			t.Fatalf("seed %d: err %v with first failed txn %d", seed, st.Err, firstFailed)
		}
		// Idle and healthy: a keepalive moves the position to the WAL end.
		tr.Keepalive(lsn + 5000)
		if st2 := tr.State(); firstFailed < 0 && st2.Confirmed != lsn+5000 {
			t.Fatalf("seed %d: idle keepalive left confirmed at %s", seed, st2.Confirmed)
		} else if firstFailed >= 0 && st2.Confirmed != want {
			t.Fatalf("seed %d: keepalive after a failure moved confirmed to %s", seed, st2.Confirmed)
		}
	}
}

func TestTrackerOpenTransactionBlocksKeepalive(t *testing.T) {
	tr := replication.NewTracker(100, 10, 1000)
	x := tr.Begin(time.Now(), 0)
	tr.Keepalive(500)
	if got := tr.State().Confirmed; got != 100 {
		t.Fatalf("keepalive inside an open transaction moved confirmed to %s", got)
	}
	tr.Commit(x, 200)
	if got := tr.State().Confirmed; got != 200 {
		t.Fatalf("empty transaction: confirmed %s, want 0/C8", got)
	}
}

func TestTrackerBounds(t *testing.T) {
	tr := replication.NewTracker(0, 2, 100)
	if tr.Full(1000) {
		t.Fatal("an oversize record must pass when nothing is in flight")
	}
	x := tr.Begin(time.Now(), 0)
	a := tr.Track(x, 60, nil)
	if !tr.Full(50) {
		t.Fatal("60+50 bytes > 100 must be full")
	}
	if tr.Full(40) {
		t.Fatal("60+40 bytes fits")
	}
	b := tr.Track(x, 10, nil)
	if !tr.Full(1) {
		t.Fatal("2 records is the event bound")
	}
	a.Ack(nil)
	select {
	case <-tr.Wake():
	default:
		t.Fatal("an ack must wake the reader")
	}
	if tr.Full(1) {
		t.Fatal("after one ack there is room")
	}
	b.Ack(nil)
	tr.Commit(x, 42)
	if st := tr.State(); st.Confirmed != 42 || st.Events != 0 || st.Acked != 2 {
		t.Fatalf("state %+v", st)
	}
}

// A transaction whose end lies below the position the tracker started from
// (or already reached from a keepalive) never moves the position back.
func TestTrackerNeverMovesBack(t *testing.T) {
	tr := replication.NewTracker(500, 10, 1000)
	x := tr.Begin(time.Now(), 0)
	tr.Track(x, 1, nil).Ack(nil)
	tr.Commit(x, 400)
	if got := tr.State().Confirmed; got != 500 {
		t.Fatalf("confirmed moved back to %s", got)
	}
	tr.Keepalive(300)
	if got := tr.State().Confirmed; got != 500 {
		t.Fatalf("keepalive moved confirmed back to %s", got)
	}
}

// TestTrackerStartIsNotAPosition: the position a tracker starts from was
// read before the stream began and may be stale; only a position this
// stream reached (a commit or an idle keepalive) counts as moved.
func TestTrackerStartIsNotAPosition(t *testing.T) {
	tr := replication.NewTracker(500, 10, 1000)
	x := tr.Begin(time.Now(), 450)
	tr.Track(x, 1, nil).Ack(nil)
	// A keepalive while a transaction waits: still nothing of this stream's.
	tr.Keepalive(900)
	if st := tr.State(); st.Moved || st.Confirmed != 500 {
		t.Fatalf("before any commit: %+v", st)
	}
	tr.Commit(x, 480) // below the start: never moves back, not moved either
	if st := tr.State(); st.Moved || st.Confirmed != 500 {
		t.Fatalf("a commit below the start: %+v", st)
	}
	tr.Keepalive(600)
	if st := tr.State(); !st.Moved || st.Confirmed != 600 {
		t.Fatalf("an idle keepalive: %+v", st)
	}
}

// TestTrackerRefusedRecordWaitsForItsReplacement: a Refusable record the
// broker refused does not fail its transaction, nor confirm it: the
// transaction waits for the dead-letter record that replaces it.
func TestTrackerRefusedRecordWaitsForItsReplacement(t *testing.T) {
	tr := replication.NewTracker(100, 10, 1000)
	route := &envelope.Binding{Name: "public.outbox"}
	x := tr.Begin(time.Now(), 200)
	good := tr.Track(x, 10, route)
	big := tr.Track(x, 500, route)
	tr.Commit(x, 210)
	good.Ack(nil)
	big.Ack(&outboxd.RefusedError{Topic: "t", Key: []byte("K"), Size: 600, Err: errors.New("too large")})
	st := tr.State()
	if st.Confirmed != 100 || st.Err != nil || st.Settled || st.Refused != 1 || st.Events != 0 {
		t.Fatalf("after the refusal: %+v", st)
	}
	rfs := tr.Refusals()
	if len(rfs) != 1 || rfs[0].Txn.CommitLSN() != 200 || string(rfs[0].Err.Key) != "K" || rfs[0].Route != route {
		t.Fatalf("refusals: %+v", rfs)
	}
	if again := tr.Refusals(); len(again) != 0 {
		t.Fatal("Refusals hands each refusal over once")
	}
	dl := tr.Replace(rfs[0], 50)
	if st := tr.State(); st.Confirmed != 100 || st.Events != 1 {
		t.Fatalf("replacement in flight: %+v", st)
	}
	dl.Ack(nil)
	if st := tr.State(); st.Confirmed != 210 || !st.Settled {
		t.Fatalf("replacement acknowledged: %+v", st)
	}
	// The same refusal of a record that is not Refusable is a failure.
	y := tr.Begin(time.Now(), 300)
	a := tr.Track(y, 10, nil)
	tr.Commit(y, 310)
	a.Ack(&outboxd.RefusedError{Topic: "t", Err: errors.New("too large")})
	if st := tr.State(); st.Err == nil || st.Confirmed != 210 || st.Refused != 0 {
		t.Fatalf("not refusable: %+v", st)
	}
}

// TestTrackerSettled: nothing still to come can move the position once the
// oldest waiting transaction is open (it cannot be confirmed before it is
// read to its end) or failed.
func TestTrackerSettled(t *testing.T) {
	tr := replication.NewTracker(100, 10, 1000)
	if !tr.State().Settled {
		t.Fatal("an empty tracker is settled")
	}
	x := tr.Begin(time.Now(), 150)
	a := tr.Track(x, 1, nil)
	tr.Commit(x, 160)
	open := tr.Begin(time.Now(), 250)
	tr.Track(open, 1, nil)
	if tr.State().Settled {
		t.Fatal("a committed transaction waits for an acknowledgement: not settled")
	}
	a.Ack(nil)
	if st := tr.State(); !st.Settled || st.Confirmed != 160 || st.Open != 1 {
		t.Fatalf("only the open transaction left: %+v", st)
	}
	tr2 := replication.NewTracker(100, 10, 1000)
	y := tr2.Begin(time.Now(), 150)
	b := tr2.Track(y, 1, nil)
	tr2.Track(y, 1, nil)
	tr2.Commit(y, 160)
	b.Ack(errors.New("refused"))
	if st := tr2.State(); !st.Settled || st.Confirmed != 100 {
		t.Fatalf("a failed transaction at the head: %+v", st)
	}
}
