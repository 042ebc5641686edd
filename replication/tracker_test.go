package replication_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/replication"
)

type sentRecord struct {
	txn   int
	acker outboxd.Acker
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
				if rng.Float64() < failRate {
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
			}
		}

		for i := 0; i < nTxn; i++ {
			x := tr.Begin(time.Unix(int64(i), 0))
			// Some transactions carry no outbox row (other tables).
			size := 0
			if rng.IntN(5) > 0 {
				size = 1 + rng.IntN(20)
			}
			for k := 0; k < size; k++ {
				pending[i]++
				inFlight = append(inFlight, sentRecord{txn: i, acker: tr.Track(x, int64(1+rng.IntN(100)))})
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
	x := tr.Begin(time.Now())
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
	x := tr.Begin(time.Now())
	a := tr.Track(x, 60)
	if !tr.Full(50) {
		t.Fatal("60+50 bytes > 100 must be full")
	}
	if tr.Full(40) {
		t.Fatal("60+40 bytes fits")
	}
	b := tr.Track(x, 10)
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
	x := tr.Begin(time.Now())
	tr.Track(x, 1).Ack(nil)
	tr.Commit(x, 400)
	if got := tr.State().Confirmed; got != 500 {
		t.Fatalf("confirmed moved back to %s", got)
	}
	tr.Keepalive(300)
	if got := tr.State().Confirmed; got != 500 {
		t.Fatalf("keepalive moved confirmed back to %s", got)
	}
}
