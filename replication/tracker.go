package replication

import (
	"errors"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/envelope"
)

// Tracker is the ack path's bookkeeping. Transactions enter in commit order
// (the order pgoutput sends them); each carries its in-flight records. The
// confirmed position is the end LSN of the newest transaction whose records,
// and those of every earlier transaction, Kafka acknowledged. A failed
// record freezes the confirmed position below its transaction for good: the
// stream must then reconnect and replay from the slot.
//
// A Refusable record that the broker refuses for its own content is not a
// failure: its transaction waits until the stream has put a dead-letter
// record in its place (Refusals, Replace) and Kafka acknowledged that.
//
// Tracker also bounds what is in flight, in records and in bytes.
type Tracker struct {
	maxEvents int
	maxBytes  int64

	mu        sync.Mutex
	queue     []*Txn // unconfirmed transactions, oldest first
	confirmed pglogrepl.LSN
	// moved: confirmed came from this stream (a commit or a keepalive), not
	// from the position the tracker started at, which was read before the
	// stream began and may be older than the server's.
	moved      bool
	refusals   []Refusal
	lastTime   time.Time // commit time of the newest confirmed transaction
	err        error     // first delivery error
	events     int
	bytes      int64
	acked      uint64 // records acknowledged, for counters
	ackedBytes int64
	wake       chan struct{}
	slab       []ticket // tickets handed out from one allocation per 256 records
	// onConfirm, when set, is called (with mu held: keep it cheap) for
	// every transaction confirmed, with its commit time.
	onConfirm func(commitTime time.Time)
}

// Txn is one transaction as seen by the tracker.
type Txn struct {
	t          *Tracker
	pending    int
	committed  bool
	failed     bool
	final      pglogrepl.LSN // the commit LSN Begin announced, for messages
	end        pglogrepl.LSN
	commitTime time.Time
	// pendingSeen: the transaction carried records (a latency sample).
	pendingSeen bool
}

// ticket is the Acker of one record.
type ticket struct {
	x    *Txn
	size int64
	// route, for a Refusable record: whose dead-letter topic takes it
	// when the broker refuses it.
	route *envelope.Binding
}

// Refusal is a Refusable record the broker refused for its own content.
type Refusal struct {
	Txn   *Txn
	Route *envelope.Binding
	Err   *outboxd.RefusedError
}

// Pending reports whether the transaction carried records (it is called by
// the stream's goroutine, the only one that tracks them).
func (x *Txn) Pending() bool {
	x.t.mu.Lock()
	defer x.t.mu.Unlock()
	return x.pendingSeen
}

// CommitLSN is the transaction's commit LSN as its Begin announced it.
func (x *Txn) CommitLSN() pglogrepl.LSN { return x.final }

func (k *ticket) Ack(err error) { k.x.t.ack(k, err) }

// NewTracker starts at the slot's confirmed position.
func NewTracker(start pglogrepl.LSN, maxEvents int, maxBytes int64) *Tracker {
	return &Tracker{maxEvents: maxEvents, maxBytes: maxBytes, confirmed: start, wake: make(chan struct{}, 1)}
}

// OnConfirm registers a function told the commit time of every confirmed
// transaction (for commit-to-acknowledgement latency). Call before use.
func (t *Tracker) OnConfirm(f func(commitTime time.Time)) { t.onConfirm = f }

// Begin opens a transaction; transactions must begin in commit order.
// final is the commit LSN the Begin message announces.
func (t *Tracker) Begin(commitTime time.Time, final pglogrepl.LSN) *Txn {
	x := &Txn{t: t, commitTime: commitTime, final: final}
	t.mu.Lock()
	t.queue = append(t.queue, x)
	t.mu.Unlock()
	return x
}

// Track registers one record of x as in flight and returns its Acker.
// route is set for a Refusable record: a refusal of it then comes back
// through Refusals instead of failing the transaction.
func (t *Tracker) Track(x *Txn, size int64, route *envelope.Binding) outboxd.Acker {
	t.mu.Lock()
	k := t.track(x, size)
	t.mu.Unlock()
	k.route = route
	return k
}

// track counts one more record of x in flight. Called with mu held.
func (t *Tracker) track(x *Txn, size int64) *ticket {
	x.pending++
	x.pendingSeen = true
	t.events++
	t.bytes += size
	if len(t.slab) == 0 {
		t.slab = make([]ticket, 256)
	}
	k := &t.slab[0]
	t.slab = t.slab[1:]
	k.x, k.size = x, size
	return k
}

// Refusals hands over the refused records not yet replaced.
func (t *Tracker) Refusals() []Refusal {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.refusals
	t.refusals = nil
	return out
}

// Replace tracks the record that takes a refused one's place in its
// transaction (its dead-letter record) and releases the refused one, in one
// step, so the transaction never looks complete in between.
func (t *Tracker) Replace(rf Refusal, size int64) outboxd.Acker {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := t.track(rf.Txn, size)
	rf.Txn.pending--
	return k
}

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
	if len(t.queue) == 0 && t.err == nil && walEnd > t.confirmed {
		t.confirmed, t.moved = walEnd, true
		t.lastTime = time.Time{}
	}
	t.mu.Unlock()
}

func (t *Tracker) ack(k *ticket, err error) {
	t.mu.Lock()
	t.events--
	t.bytes -= k.size
	var refused *outboxd.RefusedError
	if err != nil && k.route != nil {
		refused = asRefused(err)
	}
	switch {
	case refused != nil:
		// Not a failure: the record stays pending in its transaction
		// until the stream has replaced it.
		t.refusals = append(t.refusals, Refusal{Txn: k.x, Route: k.route, Err: refused})
	case err != nil:
		k.x.pending--
		k.x.failed = true
		if t.err == nil {
			t.err = err
		}
	default:
		k.x.pending--
		t.acked++
		t.ackedBytes += k.size
	}
	t.advance()
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// advance pops the confirmable prefix of the queue. Called with mu held.
func (t *Tracker) advance() {
	n := 0
	for _, x := range t.queue {
		if !x.committed || x.pending > 0 || x.failed {
			break
		}
		if x.end > t.confirmed {
			t.confirmed, t.moved = x.end, true
			t.lastTime = x.commitTime
		}
		if t.onConfirm != nil && x.pendingSeen {
			t.onConfirm(x.commitTime)
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
	// LastCommit is the commit time of the newest confirmed transaction,
	// zero when the position came from a keepalive.
	LastCommit time.Time
	Err        error // first delivery error, if any
	Events     int   // records in flight
	Bytes      int64 // bytes in flight
	Open       int   // transactions not yet confirmed
	// OldestOpen is the commit time of the oldest transaction not yet
	// confirmed, zero when none is waiting.
	OldestOpen time.Time
	Acked      uint64 // records acknowledged
	AckedBytes int64  // their bytes
	// Settled: no acknowledgement still to come can move Confirmed: nothing
	// waits, or the oldest waiting transaction is still open or failed.
	Settled bool
	// Refused counts refused records waiting to be replaced.
	Refused int
}

// Acked is the number of records acknowledged so far.
func (t *Tracker) Acked() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.acked
}

// State returns a consistent snapshot.
func (t *Tracker) State() State {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := State{Confirmed: t.confirmed, Moved: t.moved, LastCommit: t.lastTime, Err: t.err, Events: t.events, Bytes: t.bytes,
		Open: len(t.queue), Acked: t.acked, AckedBytes: t.ackedBytes, Settled: true, Refused: len(t.refusals)}
	if len(t.queue) > 0 {
		head := t.queue[0]
		st.OldestOpen = head.commitTime
		st.Settled = !head.committed || head.failed
	}
	return st
}

// Full reports whether another record of size bytes must wait. A single
// record larger than the byte bound is let through when nothing else is in
// flight, so it cannot wedge the stream.
func (t *Tracker) Full(size int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.events == 0 {
		return false
	}
	return t.events >= t.maxEvents || t.bytes+size > t.maxBytes
}

// Wake is signalled after acknowledgements.
func (t *Tracker) Wake() <-chan struct{} { return t.wake }

// asRefused is err's RefusedError, if any. Kept apart from ack so that the
// pointer errors.As needs escapes only on this path, not for every record.
//
//go:noinline
func asRefused(err error) *outboxd.RefusedError {
	var refused *outboxd.RefusedError
	if errors.As(err, &refused) {
		return refused
	}
	return nil
}
