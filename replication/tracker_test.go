package replication_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
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
		m := &ackModel{t: t, seed: seed, rng: rng, start: 1000, lsn: 1000,
			failRate: []float64{0, 0, 0.001, 0.02}[seed%4],
			// Some seeds have Refusable records that the broker refuses: each is
			// replaced by a dead-letter record, which must be acknowledged too.
			refuseRate: []float64{0, 0.05, 0, 0.01}[(seed/4)%4]}
		m.tr = replication.NewTracker(m.start, nil)
		m.pub = publish.New(publish.Config{Router: router, Producer: &m.prod, MaxEvents: 1 << 30, MaxBytes: 1 << 40})

		for i := range 1 + rng.IntN(60) {
			m.ends, m.pending, m.failed = append(m.ends, 0), append(m.pending, 0), append(m.failed, false)
			x := m.tr.Begin(time.Unix(int64(i), 0), m.lsn+1)
			// Some transactions carry no outbox row (other tables).
			size := 0
			if rng.IntN(5) > 0 {
				size = 1 + rng.IntN(20)
			}
			for k := range size {
				m.prod.txnOf = func() int { return i }
				m.pending[i]++
				if err := m.pub.Change(x, bs[rng.IntN(2)], row, envelope.Position{CommitLSN: m.lsn + 1, Index: uint32(k)}); err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				m.ackSome(2)
			}
			m.lsn += pglogrepl.LSN(1 + rng.IntN(500))
			m.ends[i] = m.lsn
			m.tr.Commit(x, m.lsn)
			m.check("commit")
			if rng.IntN(4) == 0 && len(m.prod.inFlight) > 0 {
				// A keepalive while records are in flight must not move the position.
				m.tr.Keepalive(m.lsn + 10_000)
				m.check("keepalive")
			}
			m.ackSome(10)
		}
		for len(m.prod.inFlight) > 0 || len(m.refused) > 0 {
			m.ackSome(len(m.prod.inFlight))
			m.replace()
		}
		m.checkEnd()
	}
}

// ackModel is what TestTrackerNeverConfirmsUnacknowledged expects of the
// tracker, transaction by transaction (every one in ends is committed).
type ackModel struct {
	t                    *testing.T
	seed                 uint64
	rng                  *rand.Rand
	failRate, refuseRate float64
	tr                   *replication.Tracker
	pub                  *publish.Publisher
	prod                 heldProducer
	start, lsn           pglogrepl.LSN

	ends    []pglogrepl.LSN
	pending []int // records (or their replacements) not yet acknowledged OK
	failed  []bool
	refused []int // transactions of the refused records, in the order of their refusals
}

// check: the confirmed position passes no committed transaction with a
// record unacknowledged or failed.
func (m *ackModel) check(step string) {
	st := m.tr.State()
	for i, end := range m.ends {
		if end != 0 && end <= st.Confirmed && end > m.start && (m.pending[i] > 0 || m.failed[i]) {
			m.t.Fatalf("seed %d, %s: confirmed %s passes txn %d (end %s) with %d unacknowledged records, failed=%v",
				m.seed, step, st.Confirmed, i, end, m.pending[i], m.failed[i])
		}
	}
}

// replace has the publisher replace the refused records, in the order of
// their refusals.
func (m *ackModel) replace() {
	m.prod.txnOf = func() int { x := m.refused[0]; m.refused = m.refused[1:]; return x }
	if err := m.pub.ReplaceRefused(); err != nil {
		m.t.Fatalf("seed %d: %v", m.seed, err)
	}
	m.check("replace")
}

// ackSome tells up to max records in flight, picked at random, their
// outcome: most are acknowledged, some refused or failed.
func (m *ackModel) ackSome(max int) {
	for n := m.rng.IntN(max + 1); n > 0 && len(m.prod.inFlight) > 0; n-- {
		j := m.rng.IntN(len(m.prod.inFlight))
		r := m.prod.inFlight[j]
		m.prod.inFlight[j] = m.prod.inFlight[len(m.prod.inFlight)-1]
		m.prod.inFlight = m.prod.inFlight[:len(m.prod.inFlight)-1]
		var err error
		switch {
		case r.refusable && m.rng.Float64() < m.refuseRate:
			err = &outboxd.RefusedError{Topic: "comandes", Err: errors.New("injected: too large")}
			m.refused = append(m.refused, r.txn)
		case m.rng.Float64() < m.failRate:
			err = errors.New("injected delivery failure")
			m.failed[r.txn] = true
		}
		// Flip the model before the tracker: the check below runs after
		// the tracker has seen it. A refused record stays pending: its
		// replacement takes its place.
		if err == nil {
			m.pending[r.txn]--
		}
		r.acker.Ack(err)
		m.check("ack")
		if m.rng.IntN(3) == 0 {
			m.replace()
		}
	}
}

// checkEnd: once every record is answered, nothing is in flight, and the
// position reaches the end of the last transaction before the first
// failed one (liveness); an idle keepalive then moves it to the WAL end,
// unless a transaction failed.
func (m *ackModel) checkEnd() {
	if fl := m.pub.State(); fl.Events != 0 || fl.Bytes != 0 || fl.Refused != 0 {
		m.t.Fatalf("seed %d: %+v still counted in flight", m.seed, fl)
	}
	want, firstFailed := m.start, -1
	for i, end := range m.ends {
		if m.failed[i] {
			firstFailed = i
			break
		}
		want = end
	}
	if got := m.tr.State().Confirmed; got != want {
		m.t.Fatalf("seed %d: confirmed %s, want %s (first failed txn %d)", m.seed, got, want, firstFailed)
	}
	if (firstFailed >= 0) != (m.pub.State().Err != nil) {
		m.t.Fatalf("seed %d: err %v with first failed txn %d", m.seed, m.pub.State().Err, firstFailed)
	}
	m.tr.Keepalive(m.lsn + 5000)
	if got := m.tr.State().Confirmed; firstFailed < 0 && got != m.lsn+5000 {
		m.t.Fatalf("seed %d: idle keepalive left confirmed at %s", m.seed, got)
	} else if firstFailed >= 0 && got != want {
		m.t.Fatalf("seed %d: keepalive after a failure moved confirmed to %s", m.seed, got)
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

// TestTrackerConcurrentReleases: records released from many goroutines at
// once, in random order (a producer's completions), while the stream goes
// on holding and committing, as the lock-free Hold and Release of a
// transaction allow. Just before it releases a record, a worker checks that
// the confirmed position has not passed the record's transaction; at the
// end every transaction is confirmed.
func TestTrackerConcurrentReleases(t *testing.T) {
	const nTxn, perTxn, batch, workers = 400, 7, 40, 4
	tr := replication.NewTracker(1000, nil)
	type rec struct {
		end pglogrepl.LSN
		x   *replication.Txn
	}
	work := make(chan rec, nTxn*perTxn)
	early := make(chan string, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range work {
				if confirmed := tr.State().Confirmed; confirmed >= r.end {
					early <- fmt.Sprintf("confirmed %s passes a transaction ending at %s with a record not released", confirmed, r.end)
					return
				}
				r.x.Release(nil)
			}
		}()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var pending []rec
	for i := range nTxn {
		x := tr.Begin(time.Unix(int64(i), 0), pglogrepl.LSN(2000+10*i))
		end := pglogrepl.LSN(2005 + 10*i)
		for range perTxn {
			x.Hold()
			pending = append(pending, rec{end, x})
		}
		tr.Commit(x, end)
		if (i+1)%batch == 0 || i == nTxn-1 {
			// The records of the last transactions, released in any order
			// while the next ones are held and committed.
			rng.Shuffle(len(pending), func(a, b int) { pending[a], pending[b] = pending[b], pending[a] })
			for _, r := range pending {
				work <- r
			}
			pending = pending[:0]
		}
	}
	close(work)
	wg.Wait()
	select {
	case msg := <-early:
		t.Fatal(msg)
	default:
	}
	if got, want := tr.State().Confirmed, pglogrepl.LSN(2005+10*(nTxn-1)); got != want {
		t.Fatalf("confirmed %s once every record was released, want %s", got, want)
	}
}
