package replication_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/publish"
	"github.com/outboxd/outboxd/replication"
)

// sentRecord is a record the producer holds: its Acker, the transaction
// it counts toward, whether the broker may refuse it (its route has a
// dead-letter topic).
type sentRecord struct {
	txn       int
	acker     outboxd.Acker
	refusable bool
}

// heldProducer keeps what it is given in flight; txnOf says which
// transaction the record being produced counts toward.
type heldProducer struct {
	inFlight []sentRecord
	txnOf    func() int
}

func (p *heldProducer) Produce(r *outboxd.Record) error {
	p.inFlight = append(p.inFlight, sentRecord{txn: p.txnOf(), acker: r.Ack, refusable: r.Refusable})
	return nil
}

// trackerRoutes are two outbox tables, the first with a dead-letter topic
// (its records are Refusable), the second without, and a row for either.
func trackerRoutes(t *testing.T) (*envelope.Router, [2][]*envelope.Binding, []envelope.Column) {
	t.Helper()
	cols := envelope.Columns{ID: "id", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "carrega", CreatEn: "creat_en"}
	router, err := envelope.NewRouter("comandes", []envelope.Route{
		{Schema: "public", Table: "outbox", Topic: "comandes", DeadLetterTopic: "comandes.dlq", Columns: cols},
		{Schema: "public", Table: "altres", Topic: "altres", Columns: cols}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var bs [2][]*envelope.Binding
	var row []envelope.Column
	for i, table := range []string{"outbox", "altres"} {
		rel := &pglogrepl.RelationMessage{Namespace: "public", RelationName: table}
		for _, c := range []string{"id", "agregat_id", "tipus", "versio", "carrega", "creat_en"} {
			rel.Columns = append(rel.Columns, &pglogrepl.RelationMessageColumn{Name: c, DataType: 25})
		}
		bs[i] = router.Bind(rel)
	}
	for _, v := range []string{"00000000-0000-4000-8000-000000000001", "P-1", "comanda.creada", "1", `{"n": 1}`, "2026-12-03 10:00:00+00"} {
		row = append(row, envelope.Column{Kind: pglogrepl.TupleDataTypeText, Data: []byte(v)})
	}
	return router, bs, row
}

// TestTrackerNeverConfirmsUnacknowledged drives the ack path as the stream
// does (transactions of the tracker as the units of a publisher) with
// random transaction sizes, acknowledgements in random order (as
// completions from different partitions arrive) interleaved with the
// stream, keepalives, random failures and random refusals, each replaced
// by its dead-letter record at a random later point. After every step the
// confirmed position must not pass a transaction with a record that is
// unacknowledged (a refused one until its replacement is acknowledged) or
// failed.
func TestTrackerNeverConfirmsUnacknowledged(t *testing.T) {
	router, bs, row := trackerRoutes(t)
	for seed := uint64(0); seed < 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*7919))
		failRate := []float64{0, 0, 0.001, 0.02}[seed%4]
		// Some seeds have Refusable records that the broker refuses: each is
		// replaced by a dead-letter record, which must be acknowledged too.
		refuseRate := []float64{0, 0.05, 0, 0.01}[(seed/4)%4]
		const start = pglogrepl.LSN(1000)
		tr := replication.NewTracker(start, nil)
		prod := &heldProducer{}
		pub := publish.New(publish.Config{Router: router, Producer: prod, MaxEvents: 1 << 30, MaxBytes: 1 << 40})

		nTxn := 1 + rng.IntN(60)
		ends := make([]pglogrepl.LSN, nTxn)
		pending := make([]int, nTxn) // records (or their replacements) not yet acknowledged OK
		failed := make([]bool, nTxn)
		committed := make([]bool, nTxn)
		var refused []int // transactions of the refused records, in the order of their refusals
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
		replace := func() {
			// The replacements are produced in the order of the refusals.
			prod.txnOf = func() int { x := refused[0]; refused = refused[1:]; return x }
			if err := pub.ReplaceRefused(); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			check("replace")
		}
		ackSome := func(max int) {
			for n := rng.IntN(max + 1); n > 0 && len(prod.inFlight) > 0; n-- {
				j := rng.IntN(len(prod.inFlight))
				r := prod.inFlight[j]
				prod.inFlight[j] = prod.inFlight[len(prod.inFlight)-1]
				prod.inFlight = prod.inFlight[:len(prod.inFlight)-1]
				var err error
				switch {
				case r.refusable && rng.Float64() < refuseRate:
					err = &outboxd.RefusedError{Topic: "comandes", Err: errors.New("injected: too large")}
					refused = append(refused, r.txn)
				case rng.Float64() < failRate:
					err = errors.New("injected delivery failure")
					failed[r.txn] = true
				}
				// Flip the model before the tracker: the check below runs
				// after the tracker has seen it. A refused record stays
				// pending: its replacement takes its place.
				if err == nil {
					pending[r.txn]--
				}
				r.acker.Ack(err)
				check("ack")
				if rng.IntN(3) == 0 {
					replace()
				}
			}
		}

		for i := 0; i < nTxn; i++ {
			x := tr.Begin(time.Unix(int64(i), 0), lsn+1)
			prod.txnOf = func() int { return i }
			// Some transactions carry no outbox row (other tables).
			size := 0
			if rng.IntN(5) > 0 {
				size = 1 + rng.IntN(20)
			}
			for k := 0; k < size; k++ {
				pending[i]++
				if err := pub.Change(x, bs[rng.IntN(2)], row, envelope.Position{CommitLSN: uint64(lsn + 1), Index: uint32(k)}); err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				ackSome(2)
				prod.txnOf = func() int { return i }
			}
			lsn += pglogrepl.LSN(1 + rng.IntN(500))
			ends[i] = lsn
			committed[i] = true
			tr.Commit(x, lsn)
			check("commit")
			if rng.IntN(4) == 0 && len(prod.inFlight) > 0 {
				// A keepalive while records are in flight must not move the position.
				tr.Keepalive(lsn + 10_000)
				check("keepalive")
			}
			ackSome(10)
		}
		for len(prod.inFlight) > 0 || len(refused) > 0 {
			ackSome(len(prod.inFlight))
			replace()
		}

		if fl := pub.State(); fl.Events != 0 || fl.Bytes != 0 || fl.Refused != 0 {
			t.Fatalf("seed %d: %+v still counted in flight", seed, fl)
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
		st := tr.State()
		if st.Confirmed != want {
			t.Fatalf("seed %d: confirmed %s, want %s (first failed txn %d)", seed, st.Confirmed, want, firstFailed)
		}
		if (firstFailed >= 0) != (pub.State().Err != nil) {
			t.Fatalf("seed %d: err %v with first failed txn %d", seed, pub.State().Err, firstFailed)
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
	tr := replication.NewTracker(100, nil)
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

// A transaction whose end lies below the position the tracker started from
// (or already reached from a keepalive) never moves the position back.
func TestTrackerNeverMovesBack(t *testing.T) {
	tr := replication.NewTracker(500, nil)
	x := tr.Begin(time.Now(), 0)
	x.Hold()
	x.Release(nil)
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
	tr := replication.NewTracker(500, nil)
	x := tr.Begin(time.Now(), 450)
	x.Hold()
	x.Release(nil)
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

// TestTrackerSettled: nothing still to come can move the position once the
// oldest waiting transaction is open (it cannot be confirmed before it is
// read to its end) or failed; a failure also keeps keepalives from moving
// it.
func TestTrackerSettled(t *testing.T) {
	tr := replication.NewTracker(100, nil)
	if !tr.State().Settled {
		t.Fatal("an empty tracker is settled")
	}
	x := tr.Begin(time.Now(), 150)
	x.Hold()
	tr.Commit(x, 160)
	open := tr.Begin(time.Now(), 250)
	open.Hold()
	if tr.State().Settled {
		t.Fatal("a committed transaction waits for an acknowledgement: not settled")
	}
	x.Release(nil)
	if st := tr.State(); !st.Settled || st.Confirmed != 160 || st.Open != 1 {
		t.Fatalf("only the open transaction left: %+v", st)
	}
	tr2 := replication.NewTracker(100, nil)
	y := tr2.Begin(time.Now(), 150)
	y.Hold()
	y.Hold()
	tr2.Commit(y, 160)
	y.Release(errors.New("refused"))
	if st := tr2.State(); !st.Settled || st.Confirmed != 100 {
		t.Fatalf("a failed transaction at the head: %+v", st)
	}
	y.Release(nil)
	tr2.Keepalive(900)
	if st := tr2.State(); st.Confirmed != 100 {
		t.Fatalf("a keepalive after a failure moved the position to %s", st.Confirmed)
	}
}

// TestTrackerReportsConfirmedTransactions: every transaction that carried
// records is reported once confirmed, with its commit time, in commit
// order (commit-to-acknowledgement latency); one without records is not.
func TestTrackerReportsConfirmedTransactions(t *testing.T) {
	var got []int64
	tr := replication.NewTracker(100, func(commitTime time.Time) { got = append(got, commitTime.Unix()) })
	a := tr.Begin(time.Unix(1, 0), 150)
	a.Hold()
	tr.Commit(a, 160)
	empty := tr.Begin(time.Unix(2, 0), 250)
	tr.Commit(empty, 260)
	b := tr.Begin(time.Unix(3, 0), 350)
	b.Hold()
	tr.Commit(b, 360)
	b.Release(nil)
	if len(got) != 0 {
		t.Fatalf("reported %v before the first transaction was acknowledged", got)
	}
	a.Release(nil)
	if fmt.Sprint(got) != "[1 3]" {
		t.Fatalf("reported %v, want [1 3]", got)
	}
}
