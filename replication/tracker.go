package replication

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
)

// Tracker answers one question: which WAL position is safe to confirm.
// Transactions enter in commit order (the order pgoutput sends them); each
// is a publish.Unit, held once for every record of it in flight and
// released once with that record's outcome. The confirmed position is the
// end LSN of the newest committed transaction whose records, and those of
// every earlier transaction, were all released without error. A failed
// record freezes the confirmed position below its transaction for good:
// the stream must then reconnect and replay from the slot.
//
// A record the broker refused is not released until its dead-letter record
// holds its transaction (publish.Publisher.ReplaceRefused), so the
// transaction waits for that one's acknowledgement too.
type Tracker struct {
	// confirmedTxn, when set, is told the commit time of every transaction
	// confirmed that carried records (with mu held: it must be cheap).
	confirmedTxn func(commitTime time.Time)

	mu        sync.Mutex
	queue     []*Txn // unconfirmed transactions, oldest first
	confirmed pglogrepl.LSN
	// moved: confirmed came from this stream (a commit or a keepalive), not
	// from the position the tracker started at, which was read before the
	// stream began and may be older than the server's.
	moved  bool
	failed bool // a record failed: the position never moves again
}

// Txn is one transaction as seen by the tracker: a publish.Unit.
//
// Its records are held and released without the tracker's lock: pending
// is an atomic count, and only the release that brings it to zero (or
// fails) takes the lock to advance. That is safe because a transaction
// can be confirmed only once committed, and after its commit a record is
// held only in the place of a refused one that still holds it
// (publish.Publisher.ReplaceRefused): pending never passes through zero
// in between.
type Txn struct {
	t          *Tracker
	pending    atomic.Int32 // records held, not released yet
	carried    atomic.Bool  // records were held
	committed  bool         // the fields below: with t.mu held
	failed     bool
	final      pglogrepl.LSN // the commit LSN Begin announced
	end        pglogrepl.LSN
	commitTime time.Time
}

// NewTracker starts at the slot's confirmed position. confirmedTxn, when
// not nil, is told the commit time of every confirmed transaction that
// carried records (commit-to-acknowledgement latency); it is called with
// the tracker locked, so it must be cheap.
func NewTracker(start pglogrepl.LSN, confirmedTxn func(commitTime time.Time)) *Tracker {
	return &Tracker{confirmed: start, confirmedTxn: confirmedTxn}
}

// Begin opens a transaction; transactions must begin in commit order.
// final is the commit LSN the Begin message announces.
func (t *Tracker) Begin(commitTime time.Time, final pglogrepl.LSN) *Txn {
	x := &Txn{t: t, commitTime: commitTime, final: final}
	t.mu.Lock()
	t.queue = append(t.queue, x)
	t.mu.Unlock()
	return x
}

// Hold counts one more record of x in flight.
func (x *Txn) Hold() {
	x.pending.Add(1)
	if !x.carried.Load() {
		x.carried.Store(true)
	}
}

// Release is one record's outcome: nil, it no longer holds x; an error,
// x failed.
func (x *Txn) Release(err error) {
	if err == nil && x.pending.Add(-1) > 0 {
		return // x cannot be confirmed yet: no need to look
	}
	t := x.t
	t.mu.Lock()
	if err != nil {
		x.pending.Add(-1)
		x.failed, t.failed = true, true
	}
	t.advance()
	t.mu.Unlock()
}

// Carried reports whether records of the transaction went out.
func (x *Txn) Carried() bool { return x.carried.Load() }

// CommitLSN is the transaction's commit LSN as its Begin announced it.
func (x *Txn) CommitLSN() pglogrepl.LSN { return x.final }

// Commit closes x at the transaction's end LSN.
func (t *Tracker) Commit(x *Txn, end pglogrepl.LSN) {
	t.mu.Lock()
	x.committed = true
	x.end = end
	t.advance()
	t.mu.Unlock()
}

// Keepalive lets the confirmed position follow the server's WAL end while
// nothing is in flight and no transaction is open: everything before walEnd
// has been sent to us and acknowledged, so the slot need not retain it.
func (t *Tracker) Keepalive(walEnd pglogrepl.LSN) {
	t.mu.Lock()
	if len(t.queue) == 0 && !t.failed && walEnd > t.confirmed {
		t.confirmed, t.moved = walEnd, true
	}
	t.mu.Unlock()
}

// advance pops the confirmable prefix of the queue. Called with mu held.
func (t *Tracker) advance() {
	n := 0
	for _, x := range t.queue {
		if !x.committed || x.pending.Load() > 0 || x.failed {
			break
		}
		if x.end > t.confirmed {
			t.confirmed, t.moved = x.end, true
		}
		if t.confirmedTxn != nil && x.carried.Load() {
			t.confirmedTxn(x.commitTime)
		}
		n++
	}
	if n > 0 {
		clear(t.queue[:n])
		t.queue = t.queue[n:]
	}
}

// State is a snapshot of the tracker.
type State struct {
	Confirmed pglogrepl.LSN
	// Moved: Confirmed came from this stream, a position the server has
	// sent; until then it is the start, which may be stale.
	Moved bool
	Open  int // transactions not yet confirmed
	// OldestOpen is the commit time of the oldest transaction not yet
	// confirmed, zero when none is waiting.
	OldestOpen time.Time
	// Settled: no outcome still to come can move Confirmed: nothing waits,
	// or the oldest waiting transaction is still open or failed.
	Settled bool
}

// State returns a consistent snapshot.
func (t *Tracker) State() State {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := State{Confirmed: t.confirmed, Moved: t.moved, Open: len(t.queue), Settled: true}
	if len(t.queue) > 0 {
		head := t.queue[0]
		st.OldestOpen = head.commitTime
		st.Settled = !head.committed || head.failed
	}
	return st
}
