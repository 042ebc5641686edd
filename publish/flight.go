package publish

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/envelope"
)

// ticket is the Acker of one record.
type ticket struct {
	p    *Publisher
	u    Unit // nil: the publication as a whole
	size int64
	// b, for a Refusable record: whose dead-letter topic takes it when
	// the broker refuses it.
	b   *envelope.Binding
	lsn pglogrepl.LSN // its change's commit LSN (0: none), for its replacement
}

// refusal is a Refusable record the broker refused for its own content,
// waiting for its dead-letter record; its unit stays held meanwhile.
type refusal struct {
	u   Unit
	b   *envelope.Binding
	lsn pglogrepl.LSN
	err *outboxd.RefusedError
}

// hold counts one more record of u in flight, u's first, and returns its
// Acker. Called by the publishing goroutine only.
func (p *Publisher) hold(u Unit, size int64, b *envelope.Binding, lsn pglogrepl.LSN) *ticket {
	if u != nil {
		u.Hold()
	}
	p.out.n.Add(1)
	p.out.bytes.Add(size)
	if len(p.slab) == 0 {
		p.slab = make([]ticket, 256)
	}
	k := &p.slab[0]
	p.slab = p.slab[1:]
	*k = ticket{p: p, u: u, size: size, b: b, lsn: lsn}
	return k
}

func (k *ticket) Ack(err error) {
	p := k.p
	var refused *outboxd.RefusedError
	if err != nil && k.b != nil {
		refused = asRefused(err)
	}
	switch {
	case refused != nil:
		// Not a failure: the unit stays held until ReplaceRefused has put
		// the record's dead-letter record in its place. Listed before the
		// record is counted back: the publication as a whole never looks
		// idle in between (Drain).
		p.mu.Lock()
		p.refusals = append(p.refusals, refusal{u: k.u, b: k.b, lsn: k.lsn, err: refused})
		p.refused.n, p.refused.bytes = p.refused.n+1, p.refused.bytes+k.size
		p.back.add(k.size)
		p.mu.Unlock()
	case err != nil:
		p.mu.Lock()
		if p.err == nil {
			p.err = err
		}
		p.failed.n, p.failed.bytes = p.failed.n+1, p.failed.bytes+k.size
		p.back.add(k.size)
		p.mu.Unlock()
		if k.u != nil {
			k.u.Release(err)
		}
	default:
		p.back.add(k.size)
		if k.u != nil {
			k.u.Release(nil)
		}
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// asRefused is err's RefusedError, if any. Kept apart from Ack so that the
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

// Full reports whether another record of size bytes must wait. A single
// record larger than the byte bound goes when nothing else is in flight, so
// that it cannot wedge the publication.
func (p *Publisher) Full(size int64) bool {
	n, bytes := p.inFlight()
	if n == 0 {
		return false
	}
	return n >= p.maxEvents || p.maxBytes > 0 && bytes+size > p.maxBytes
}

// inFlight is what went out and has not come back, in records and bytes.
// What came back is read first: it never passes what went out.
func (p *Publisher) inFlight() (n, bytes int64) {
	backN, backBytes := p.back.n.Load(), p.back.bytes.Load()
	return int64(p.out.n.Load() - backN), p.out.bytes.Load() - backBytes
}

// Wake is signalled after every outcome.
func (p *Publisher) Wake() <-chan struct{} { return p.wake }

// progressor is a Producer that learns from Kafka more than the outcomes
// of records (the tails a session's start reads: sink.Producer.Progress).
type progressor interface{ Progress() uint64 }

// Check is the delivery timeout: an error once Kafka has acknowledged
// nothing for DeliveryTimeout while records wait, so that a broker gone
// without a reset is found within it instead of the operating system's TCP
// timeouts. Its clock starts when records begin to wait and again at every
// answer from Kafka a Check sees (an acknowledgement, or a refusal or
// failure, which the caller handles) and at every step of the Producer's
// progress (a partition's tail read); call it whenever the publishing
// goroutine wakes.
func (p *Publisher) Check(now time.Time) error {
	back := p.back.n.Load()
	if pr, ok := p.prod.(progressor); ok {
		back += pr.Progress()
	}
	n, _ := p.inFlight()
	if n == 0 || back != p.lastBack || p.lastBackAt.IsZero() {
		p.lastBack, p.lastBackAt = back, now
		return nil
	}
	if p.timeout > 0 && now.Sub(p.lastBackAt) >= p.timeout {
		return fmt.Errorf("kafka acknowledged nothing for %s with %d records in flight: broker presumed unreachable", p.timeout, n)
	}
	return nil
}

// Wait returns once another record may go (Full(0) no longer holds),
// replacing refused records meanwhile; or the first delivery failure, the
// delivery timeout, ctx's error.
func (p *Publisher) Wait(ctx context.Context) error {
	return p.waitUntil(ctx, func() bool { return !p.Full(0) })
}

// Drain returns once Kafka has answered every record handed over, every
// refused one replaced by its acknowledged dead-letter record; or an error
// as Wait does.
func (p *Publisher) Drain(ctx context.Context) error {
	return p.waitUntil(ctx, p.idle)
}

// idle: nothing in flight, no refusal waiting for its replacement (listed
// before its record comes back: see Ack).
func (p *Publisher) idle() bool {
	if n, _ := p.inFlight(); n > 0 {
		return false
	}
	return p.State().Refused == 0
}

func (p *Publisher) waitUntil(ctx context.Context, done func() bool) error {
	for {
		if err := p.State().Err; err != nil {
			return err
		}
		if err := p.ReplaceRefused(); err != nil {
			return err
		}
		now := p.clock.Now()
		stalled := p.Check(now)
		if done() {
			return nil
		}
		if stalled != nil {
			return stalled
		}
		wait := time.Hour
		if p.timeout > 0 {
			wait = p.lastBackAt.Add(p.timeout).Sub(now)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.wake:
		case <-p.clock.After(wait):
		}
	}
}

// State is what a publication has in flight.
type State struct {
	Events  int   // records in flight
	Bytes   int64 // their bytes
	Refused int   // refused records waiting for their dead-letter record
	Err     error // the first delivery failure, if any
}

// State returns a snapshot.
func (p *Publisher) State() State {
	n, bytes := p.inFlight()
	p.mu.Lock()
	defer p.mu.Unlock()
	return State{Events: int(n), Bytes: bytes, Refused: len(p.refusals), Err: p.err}
}

// tally counts records and their bytes as they go out (written by the
// publishing goroutine only) or come back (by the acknowledgements only),
// so that the two sides do not write the same memory for every record.
type tally struct {
	n     atomic.Uint64
	bytes atomic.Int64
}

func (t *tally) add(size int64) {
	t.n.Add(1)
	t.bytes.Add(size)
}

// count is a tally's figures, or a count kept under Publisher.mu.
type count struct {
	n     uint64
	bytes int64
}

// Counts is what a publisher did.
type Counts struct {
	// Records made from changes and handed to the producer: one per route
	// that takes a change, its dead-letter record included.
	Records    uint64
	Acked      uint64 // records Kafka acknowledged, dead-letter records included
	AckedBytes int64  // their bytes (Record.Size)
	// DeadLettered counts dead-letter records: of changes that could not
	// become a record, and of records the broker refused.
	DeadLettered uint64
	Dropped      uint64 // changes a route's override dropped on purpose
}

// Plus is c and d added, for figures that span publishers (the sessions
// of one stream).
func (c Counts) Plus(d Counts) Counts {
	return Counts{Records: c.Records + d.Records, Acked: c.Acked + d.Acked, AckedBytes: c.AckedBytes + d.AckedBytes,
		DeadLettered: c.DeadLettered + d.DeadLettered, Dropped: c.Dropped + d.Dropped}
}

// Counts returns a snapshot. A record acknowledged is one that came back
// neither failed nor refused; the three are read under the lock their
// failures and refusals are counted under, so the figure never goes back.
func (p *Publisher) Counts() Counts {
	p.mu.Lock()
	out, back := p.out.n.Load(), count{p.back.n.Load(), p.back.bytes.Load()}
	failed, refused, replaced := p.failed, p.refused, p.replaced
	p.mu.Unlock()
	return Counts{Records: out - replaced, Acked: back.n - failed.n - refused.n,
		AckedBytes: back.bytes - failed.bytes - refused.bytes, DeadLettered: p.deadLettered.Load(), Dropped: p.dropped.Load()}
}

// Acked is how many records Kafka has answered (acknowledged, failed or
// refused): its progress.
func (p *Publisher) Acked() uint64 { return p.back.n.Load() }
