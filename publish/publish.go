// Package publish is the one path from a change to Kafka: a row or a
// logical message read from the WAL (the replication stream), or a row read
// from its table (the cut-over snapshot and replay, in republish). Both
// callers import it; it imports neither.
//
// A Publisher, serving one producer from one goroutine, owns everything
// between a change and the outcome of its records:
//
//   - Change builds one record per route that takes the change
//     (envelope.Router.Build), with the row's id for
//     postgres.mark_published (Config.Mark wraps the record's Acker), and
//     hands it to the producer;
//   - on_error: a change that cannot become a record on a route stops the
//     publication (a *BadRowError with the way out) or, on a route with a
//     dead-letter topic (DeadLetters), becomes its dead-letter record with
//     the reason (DeadLetter);
//   - a record the broker refuses for its own content comes back as a
//     refusal, which ReplaceRefused turns into its dead-letter record in the
//     same unit;
//   - the in-flight bound, in records and in bytes (Full, Wake, Wait,
//     Drain), and the delivery timeout (Check);
//   - what it did (Counts: records handed over, acknowledged and their
//     bytes, dead-lettered, dropped), which /status and /metrics show for
//     the stream (its runner adds up its sessions') and a snapshot's or
//     replay's progress for theirs.
//
// What a record's acknowledgement counts toward is the caller's Unit, held
// once for every record handed to the producer and released once with its
// outcome. The stream's unit is a transaction in replication's Tracker,
// which confirms a WAL position only once every record of that transaction
// and of every earlier one has been released without error. The snapshot
// and replay have none (a nil Unit): their unit is the publication as a
// whole, and Drain returns only once every record is acknowledged.
//
// A refused record does not release its unit: the unit stays held until
// ReplaceRefused has held it again for the record's dead-letter record, and
// only then is the refused one released. So a unit never looks complete
// while a refused record's replacement is not acknowledged, and no position
// passes it. For the publication as a whole the same holds: a refusal
// counts as in flight until its replacement is.
package publish

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/envelope"
)

// Producer publishes records asynchronously (sink.Producer): every accepted
// record's Acker is told its outcome later.
type Producer interface {
	// Produce copies the record; an error means the producer takes
	// nothing more (the record's Acker has been told).
	Produce(r *outboxd.Record) error
}

// Tracer follows a record from its commit to Kafka's answer
// (tracing.Tracer): Start returns the Acker to put in next's place, which
// tells next the outcome exactly once, and may set the record's
// traceparent header.
type Tracer interface {
	Start(rec *outboxd.Record, pos envelope.Position, source string, next outboxd.Acker) outboxd.Acker
}

// Unit is what the acknowledgements of records count toward (for the
// stream, a transaction: replication.Txn).
type Unit interface {
	// Hold: one more record of the unit is in flight.
	Hold()
	// Release: one record's outcome, nil once Kafka acknowledged it (or
	// its replacement is held), the failure otherwise. Called once per
	// Hold, possibly from another goroutine.
	Release(err error)
}

// Config is what a Publisher needs.
type Config struct {
	Router   *envelope.Router
	Producer Producer
	// Mark, when set, wraps the Acker of the record of a row of table
	// whose id is id (postgres.mark_published: republish.Marker.Wrap): its
	// outcome counts only once the row is marked published.
	Mark func(table string, id []byte, next outboxd.Acker) outboxd.Acker
	// Trace, when set, makes a span of every record (tracing.Tracer).
	Trace Tracer
	// MaxEvents bounds the records in flight (at least 1); MaxBytes their
	// bytes (0: no bound).
	MaxEvents int
	MaxBytes  int64
	// DeliveryTimeout: Kafka acknowledging nothing for this long while
	// records wait means an unreachable broker (Check); 0: never.
	DeliveryTimeout time.Duration
	// Source names where a change without a commit LSN comes from, in the
	// outboxd.lsn header of its dead-letter record and in the log
	// ("replay", "snapshot 0/16B3748").
	Source string
	// Again ends the error of a bad row: how to go on once its route has a
	// dead-letter topic ("start again").
	Again string
	Clock clock.Clock // nil: the system's
	Log   hclog.Logger
}

// Publisher hands changes to a producer as records and follows their
// outcomes. Its methods but State, Counts, Acked, Full and Wake are for one
// goroutine; acknowledgements come from any.
type Publisher struct {
	router    *envelope.Router
	prod      Producer
	mark      func(table string, id []byte, next outboxd.Acker) outboxd.Acker
	trace     Tracer
	maxEvents int64
	maxBytes  int64
	timeout   time.Duration
	source    string
	again     string
	clock     clock.Clock
	log       hclog.Logger

	// The publishing goroutine's: the envelope's memory and the record
	// handed to the producer, reused from change to change (a local would
	// escape to the heap through the interface); tickets, one allocation
	// per 256 records; the delivery timeout's progress (Check).
	sc         envelope.Scratch
	rec        outboxd.Record
	slab       []ticket
	lastBack   uint64
	lastBackAt time.Time

	wake chan struct{}
	// In flight is what went out and did not come back (inFlight). The
	// publishing goroutine writes out, the acknowledgements back: each on
	// a cache line of its own.
	out          tally // records handed to the producer, replacements included
	deadLettered atomic.Uint64
	dropped      atomic.Uint64
	_            [64]byte
	back         tally // records Kafka answered: acknowledged, failed or refused
	// deadOut: dead-letter records handed over and not answered yet
	// (provable: records handed over meanwhile prove no position).
	deadOut atomic.Int64
	_       [64]byte

	mu       sync.Mutex
	refusals []refusal // refused records not replaced yet, oldest first
	err      error     // the first delivery failure
	failed   count     // of back, the failed records
	refused  count     // and the refused ones
	replaced uint64    // of out, the replacements of refused records
}

// New returns a Publisher; it starts nothing.
func New(cfg Config) *Publisher {
	p := &Publisher{router: cfg.Router, prod: cfg.Producer, mark: cfg.Mark, trace: cfg.Trace,
		maxEvents: int64(max(cfg.MaxEvents, 1)), maxBytes: cfg.MaxBytes, timeout: cfg.DeliveryTimeout,
		source: cfg.Source, again: cfg.Again, clock: clock.Or(cfg.Clock), log: cfg.Log, wake: make(chan struct{}, 1)}
	if p.log == nil {
		p.log = hclog.NewNullLogger()
	}
	return p
}

// DeadLetters reports whether a change that cannot become a record on b's
// route, or a record of it the broker refuses, goes to a dead-letter topic
// (routes[].on_error: dead_letter) rather than stopping outboxd.
func DeadLetters(b *envelope.Binding) bool {
	return b.Route != nil && b.Route.DeadLetterTopic != ""
}

// Change publishes one change of u (a row, or a logical message's content
// as its only column) at pos: one record per binding of bs whose route
// takes it, in order. A change read from its table has no position: pos is
// zero, and its records carry no position headers. The records reference
// row only until the producer has copied them.
//
// The error is a *BadRowError for a change that cannot become a record on
// a route that stops on it, or the delivery failure that fenced the
// producer.
func (p *Publisher) Change(u Unit, bs []*envelope.Binding, row []envelope.Column, pos envelope.Position) error {
	for i, b := range bs {
		rec := &p.rec
		var verdict envelope.Verdict
		var err error
		*rec, verdict, err = p.router.Build(b, row, pos, &p.sc)
		rec.Pos.Route = uint32(i) // a change's records are told apart by their route
		switch {
		case err != nil:
			if !DeadLetters(b) {
				return p.badRow(b, pos, err)
			}
			if err := p.DeadLetter(u, b, row, err, pos); err != nil {
				return err
			}
			continue
		case verdict == envelope.Dropped:
			p.dropped.Add(1)
			continue
		case verdict == envelope.Filtered:
			continue
		}
		if !p.provable() {
			rec.Pos = outboxd.Pos{}
		}
		var refusable *envelope.Binding
		if rec.Refusable = DeadLetters(b); rec.Refusable {
			refusable = b
		}
		k := p.hold(u, rec.Size(), refusable, pos.CommitLSN)
		rec.Ack = k
		if p.mark != nil {
			// publicat_en is set before the acknowledgement counts (a
			// message has no row: not marked).
			rec.Ack = p.mark(b.Name, rec.RowID, k)
		}
		if err := p.produce(rec, pos); err != nil {
			return err
		}
	}
	return nil
}

// DeadLetter publishes, in u, the dead-letter record of a change at pos
// that cannot become a record on b's route (DeadLetters(b) must hold), with
// reason: the unit completes only once Kafka acknowledged it.
func (p *Publisher) DeadLetter(u Unit, b *envelope.Binding, row []envelope.Column, reason error, pos envelope.Position) error {
	at := p.label(pos.CommitLSN)
	rec := &p.rec
	*rec = p.router.DeadLetter(b, row, reason, at, p.clock.Now())
	p.log.Warn("row dead-lettered", "table", b.Name, "topic", rec.Topic, "lsn", at, "reason", reason.Error())
	p.deadLettered.Add(1)
	rec.Ack = p.deadLetterAck(p.hold(u, rec.Size(), nil, pos.CommitLSN))
	return p.produce(rec, pos)
}

// provable says whether a record handed over now may carry its stream
// position, which proves after a restart that the partition holds every
// record of the stream routed there up to it (sink/dedupe.go): not while a
// dead-letter record of the session is unacknowledged. Were the session to
// end before Kafka has it, the row it stands for would be in no topic, and
// a later session that routes that row otherwise (kafka.batch_bytes
// raised, the dead-letter topic created, a schema changed in the registry)
// would take a later record of its partition as proof that the row is
// there, and skip it. A record without a position is never skipped: at
// worst a duplicate.
func (p *Publisher) provable() bool { return p.deadOut.Load() == 0 }

// deadLetterAck counts a dead-letter record in deadOut until its outcome,
// which it passes on to next.
func (p *Publisher) deadLetterAck(next outboxd.Acker) outboxd.Acker {
	p.deadOut.Add(1)
	return &deadLetterAcker{p: p, next: next}
}

type deadLetterAcker struct {
	p    *Publisher
	next outboxd.Acker
}

func (a *deadLetterAcker) Ack(err error) {
	a.p.deadOut.Add(-1) // in Kafka (or the session is over): positions prove again
	a.next.Ack(err)
}

// BadRowError is a change that cannot become a record on a route without a
// dead-letter topic: which row, where, and the way out. No retry can fix
// it (Permanent).
type BadRowError struct{ err error }

func (e *BadRowError) Error() string     { return e.err.Error() }
func (e *BadRowError) Unwrap() error     { return e.err }
func (e *BadRowError) Permanent() string { return e.err.Error() }

func (p *Publisher) badRow(b *envelope.Binding, pos envelope.Position, err error) error {
	if pos.CommitLSN != 0 {
		err = fmt.Errorf("transaction committed at %s: %w", pglogrepl.LSN(pos.CommitLSN), err)
	}
	if b.Route == nil {
		return &BadRowError{err} // the reason names the way out
	}
	return &BadRowError{fmt.Errorf("%w. A committed row cannot be changed: to move past it, set on_error: dead_letter and a dead_letter_topic on the route of %s (the row then goes to that topic with the reason) and %s", err, b.Name, p.again)}
}

// label is where a change comes from, for a dead-letter record's
// outboxd.lsn header and the log: its commit LSN, or the Source.
func (p *Publisher) label(commitLSN pglogrepl.LSN) string {
	if commitLSN == 0 {
		return p.source
	}
	return commitLSN.String()
}

// produce hands rec, of a change at pos, to the producer, which copies
// it; rec is cleared, so that nothing keeps the change's memory alive.
// With a Tracer, the record's span starts here and its Acker, outermost,
// ends it.
func (p *Publisher) produce(rec *outboxd.Record, pos envelope.Position) error {
	if p.trace != nil {
		rec.Ack = p.trace.Start(rec, pos, p.source, rec.Ack)
	}
	err := p.prod.Produce(rec)
	*rec = outboxd.Record{}
	if err == nil {
		return nil
	}
	// The producer told the record's Acker. A delivery failure fenced it
	// and says why better than the fence does.
	if first := p.State().Err; first != nil {
		return first
	}
	return err
}

// ReplaceRefused puts a dead-letter record in the place of every record
// the broker refused for its own content, in the refused record's unit:
// the replacement is held before the refused record is released, so the
// unit never looks complete in between. Every refusal is replaced, even
// after a produce failed: the failed produce fails its replacement, so
// each unit ends one way or the other (one left out would wait for ever).
// It returns the first error.
func (p *Publisher) ReplaceRefused() error {
	var first error
	for {
		p.mu.Lock()
		if len(p.refusals) == 0 {
			p.mu.Unlock()
			return first
		}
		rf := p.refusals[0]
		p.mu.Unlock()

		at := p.label(rf.lsn)
		rec := &p.rec
		*rec = p.router.DeadLetterRefused(rf.b, rf.err, at, p.clock.Now())
		p.log.Warn("record refused by the broker dead-lettered", "table", rf.b.Name, "topic", rec.Topic, "lsn", at, "reason", rf.err.Error())
		p.deadLettered.Add(1)
		p.mu.Lock()
		p.replaced++ // with the hold: Counts' Records never moves back
		rec.Ack = p.deadLetterAck(p.hold(rf.u, rec.Size(), nil, rf.lsn))
		p.refusals[0] = refusal{}
		if p.refusals = p.refusals[1:]; len(p.refusals) == 0 {
			p.refusals = nil
		}
		p.mu.Unlock()
		if rf.u != nil {
			rf.u.Release(nil) // replaced: its place is held by rec
		}
		if err := p.produce(rec, envelope.Position{CommitLSN: rf.lsn}); err != nil && first == nil {
			first = err
		}
	}
}
