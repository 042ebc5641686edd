package sink

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/backoff"
)

// retryMin and retryMax bound the backoff before a batch is sent again,
// and before a producer id is asked for again (backoff.Delay).
const retryMin, retryMax = 100 * time.Millisecond, time.Second

// settle records the outcomes of a round that came back and returns the
// batches to complete.
func (p *Producer) settle(rd *round) []*batch {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rounds--
	p.paceUntil = rd.end.Add(min(rd.end.Sub(rd.start), p.cfg.Linger))
	now := p.clock.Now()
	for i, b := range rd.batches {
		b.part.inFlight--
		p.inFlight--
		p.outcome(b, rd.errs[i], now)
	}
	var done []*batch
	for _, b := range rd.batches {
		done = append(done, b.part.pop()...)
	}
	return done
}

// outcome settles b after the broker's answer err (nil: acknowledged): it
// is acknowledged, to be sent again (retried with backoff up to
// MaxAttempts, after an earlier batch of its partition, split when refused
// for its records, or under a new producer id), or failed, which fences the
// producer. Called with mu held.
func (p *Producer) outcome(b *batch, err error, now time.Time) {
	stamped := b.pid >= 0
	switch {
	case err == nil || stamped && errors.Is(err, kafka.DuplicateSequenceNumber):
		// DUPLICATE_SEQUENCE_NUMBER: a batch sent again that the leader
		// appended already (brokers since 1.0 answer a success instead).
		b.state, b.err = acked, nil
		if stamped && b.pid == p.pid {
			b.part.pipelined, b.part.acked = true, now
		}
	case p.ctx.Err() != nil:
		p.fail(b, errClosed)
	case p.fenced != nil:
		// An earlier batch failed for good: this one's failure may be
		// that one's consequence (a sequence gap); it gets the fence.
		b.state, b.err = failed, p.fenced
	case refusedContent(err) || errors.Is(err, kafka.InvalidMessage) && (b.isolating || b.attempts+1 >= p.cfg.MaxAttempts):
		// CORRUPT_MESSAGE (kafka.InvalidMessage) may be the network's: it
		// is retried like an outage, but once it outlived the attempts
		// (or its batch was already split from one that did) it is the
		// record's.
		p.isolate(b, err, now)
	case p.transactional() && (fencedByAnother(err) || txnStateError(err) || errors.Is(err, kafka.TransactionalIDAuthorizationFailed)):
		p.fail(b, txnFailure("produce", p.cfg.TransactionalID, err))
	case stamped && sequenceError(err):
		p.resequence(b, err, now)
	case retriable(err):
		b.attempts++
		if b.attempts >= p.cfg.MaxAttempts {
			p.fail(b, err)
			return
		}
		p.retryLater(b, err, now.Add(backoff.Delay(b.attempts-1, retryMin, retryMax)))
		p.topics[b.part.topic].stale = true // its leaders are read again first
		if kerr := kafka.Error(0); !errors.As(err, &kerr) {
			p.avoidBroker(b.sentTo, err, now) // no answer: not a broker's error
		}
		p.log.Debug("produce failed; retrying", "topic", b.part.topic, "partition", b.part.id, "attempt", b.attempts, "error", err)
	default:
		p.fail(b, err)
	}
}

// retryLater makes b a batch to send again at at; its partition sends one
// batch at a time until its leader acknowledges one again. Called with mu
// held.
func (p *Producer) retryLater(b *batch, err error, at time.Time) {
	b.state, b.err, b.retryAt = retrying, err, at
	b.part.pipelined = false
}

// resequence handles b refused for its producer id, epoch or sequence
// (idempotence.go): sent behind an earlier batch of its partition that was
// open then (it may have overtaken it: requests to one broker travel on
// connections of their own) or is now, it is sent again after it; otherwise the leader does not know this producer
// as outboxd does, and the producer resets: a new producer id once every
// batch stamped with the old one is settled but b and those after it in
// its partition, which the leader did not append either (it appends a
// producer's batches in sequence); those are then sent again under the
// new id, numbered from 0. An earlier batch of the partition whose fate is
// open is settled under the old id first: the leader may hold it. Called
// with mu held.
func (p *Producer) resequence(b *batch, err error, now time.Time) {
	pt := b.part
	if b.pid != p.pid || b.epoch != p.epoch {
		// Stamped with an id the producer has left: stamped again.
		b.pid = -1
		p.retryLater(b, err, now)
		return
	}
	if p.reset {
		// The producer takes a new id already (a record refused for its
		// content, or another partition's refusal): the leader did not
		// append b, which waits for it.
		p.retryLater(b, err, now)
		b.reseq = true
		return
	}
	if (errors.Is(err, kafka.OutOfOrderSequenceNumber) || errors.Is(err, kafka.UnknownProducerId)) && (b.behind || pt.openBefore(b)) {
		// It overtook an earlier batch, or that one failed: not counted
		// (the earlier one's failure is), sent again after it. If the
		// leader refuses it again with nothing before it, that is a reset.
		p.retryLater(b, err, now)
		return
	}
	b.attempts++
	if b.attempts >= p.cfg.MaxAttempts {
		p.fail(b, err)
		return
	}
	p.retryLater(b, err, now)
	b.reseq = true
	if !p.reset {
		p.reset = true
		p.log.Warn("a partition leader refused a batch for outboxd's producer id or sequence: it does not hold what outboxd last saw it acknowledge "+
			"(records lost by an unclean leader election, or deleted); outboxd takes a new producer id once the batches in flight are settled and sends the refused batches again",
			"topic", pt.topic, "partition", pt.id, "producer_id", b.pid, "sequence", b.seq, "error", codeName(err))
	}
}

// openBefore says whether a batch before b in pt.sent is still open (in
// flight or to be sent again). Called with mu held.
func (pt *partition) openBefore(b *batch) bool {
	for _, x := range pt.sent {
		if x == b {
			return false
		}
		if x.state == inFlight || x.state == retrying {
			return true
		}
	}
	return false
}

// resetProducerID drops the producer id once every batch stamped with it is
// settled but those from a batch refused for its sequence on
// (Producer.reset): producerID then asks for a new one, and those batches
// are stamped with it when sent again. Called with mu held.
func (p *Producer) resetProducerID() {
	if !p.resetReady() || p.txn.open() {
		return // a transaction open under the old id commits first (transact)
	}
	p.pid, p.epoch, p.reset = -1, -1, false
	for _, pt := range p.parts {
		for _, b := range pt.sent {
			if b.state == retrying {
				b.pid, b.reseq = -1, false
			}
		}
	}
}

// resetReady says whether the producer is to reset and every batch
// stamped with its id is settled but those refused for their sequence.
// Called with mu held.
func (p *Producer) resetReady() bool {
	if !p.reset || p.inFlight > 0 {
		return false
	}
	for _, pt := range p.parts {
		for _, b := range pt.sent {
			if b.reseq {
				break
			}
			if b.state == retrying {
				return false // settled under the old id first
			}
		}
	}
	return true
}

// isolate handles b refused by the broker for the content of its records
// (refusedContent: too large for the topic's max.message.bytes, which the
// batch can exceed once compressed, as incompressible payloads do; a
// timestamp the topic does not take; a record it calls invalid or
// corrupt). As the Java producer does for a batch too large, it splits b
// in two, in its place before anything later of its partition, keeping
// their sequences, down to a record alone in its batch: a Refusable one is
// refused with an *outboxd.RefusedError (its route dead-letters it) and the
// records after it go on, under a new producer id (resetAfterRefusal); any
// other fails for good with a RecordError that names the way out. Called
// with mu held.
func (p *Producer) isolate(b *batch, err error, now time.Time) {
	pt := b.part
	if b.count > 1 {
		n := b.count
		first, rest, serr := b.split()
		if serr != nil {
			p.fail(b, serr)
			return
		}
		p.log.Debug("the broker refused a batch for a record's content; sending it again in two",
			"topic", pt.topic, "partition", pt.id, "records", n, "error", codeName(err))
		i := slices.Index(pt.sent, b)
		pt.sent = slices.Replace(pt.sent, i, i+1, first, rest)
		p.retryLater(first, err, now)
		p.retryLater(rest, err, now)
		return
	}
	recs, stamps, derr := b.records()
	if derr != nil {
		p.fail(b, derr)
		return
	}
	r := &recs[0]
	way := refusalFix(err, stamps[0], now)
	if r.Refusable {
		// Its dead-letter record goes to another topic, unordered with
		// this partition's later records: those must not prove it
		// delivered to a later session (dedupe.go).
		b.part.proof.unproven = true
		b.state, b.err = failed, &outboxd.RefusedError{Topic: r.Topic, Key: bytes.Clone(r.Key), Headers: cloneHeaders(r.Headers),
			Size: r.WireSize(), Err: fmt.Errorf("%s: %s: %w", codeName(err), way, err)}
		p.resetAfterRefusal(b)
		return
	}
	p.fail(b, &RecordError{Topic: r.Topic, Key: bytes.Clone(r.Key), Err: err,
		Reason: fmt.Sprintf("the broker refused the record (%d bytes) with %s, alone in its batch: %s, or dead-letter such rows (on_error: dead_letter)",
			r.WireSize(), codeName(err), way)})
}

// resetAfterRefusal makes the producer take a new id after b, stamped
// with the current one, was refused for its records' content: its
// sequences are a gap the leader will never see filled. Numbering the
// batches after it down under the same id (what the Java client does only
// for a transactional producer) would lose records: the leader may hold b
// after all (appended on an earlier send whose answer was lost: a broker
// checks a batch's content before it looks for a duplicate, so the retry
// of an appended batch can be refused), or a batch after b (appended by a
// leader that held nothing of this producer and takes any sequence), and
// would answer the next batch numbered into that place as its duplicate:
// acknowledged, never appended. As the Java client does for an idempotent
// producer without a transactional id, the producer resets instead (a new
// id once every batch before b is settled; resetProducerID): the batches
// after b are sent under it from sequence 0 (resequence marks those the
// leader refuses for the gap meanwhile). One InitProducerId per refused
// record, which is rare. Called with mu held.
func (p *Producer) resetAfterRefusal(b *batch) {
	if b.pid < 0 {
		return // not idempotent: no sequence, no gap
	}
	if !p.reset {
		p.reset = true
		p.log.Debug("a record refused for its content leaves a gap in its partition's sequences; outboxd takes a new producer id",
			"topic", b.part.topic, "partition", b.part.id, "producer_id", b.pid, "sequence", b.seq)
	}
}

func cloneHeaders(hs []outboxd.Header) []outboxd.Header {
	if hs == nil {
		return nil
	}
	out := make([]outboxd.Header, 0, len(hs))
	for _, h := range hs {
		if h.Key != HeaderStream { // the producer's own, not the record's
			out = append(out, outboxd.Header{Key: h.Key, Value: bytes.Clone(h.Value)})
		}
	}
	return out
}

// fail fails b for good and fences the producer: no later batch may reach
// the broker. An error no replay can fix becomes a RecordError. Called with
// mu held.
func (p *Producer) fail(b *batch, err error) {
	var re *RecordError
	var te *TransactionError
	var ie *IdempotenceError
	if ae := authFailure(err); ae != nil {
		err = ae
	} else if reason := permanent(err); reason != "" && !errors.As(err, &re) && !errors.As(err, &te) && !errors.As(err, &ie) {
		err = &RecordError{Topic: b.part.topic, Reason: reason, Err: err}
	}
	p.fence(err)
	b.state, b.err = failed, err
}

// fence stops the producer after a batch failed for good. The failure is
// returned, not logged: the batch's Ackers get it, which ends the stream
// (the runner logs it once). Called with mu held.
func (p *Producer) fence(err error) {
	if p.fenced != nil {
		return
	}
	p.fenced = fenceError(err)
	if fencedByAnother(err) && p.transactional() {
		// Said here too: the session whose records fail may have ended
		// already (its replication connection lost, as an instance
		// frozen while another took its slot over finds it).
		p.log.Warn("fenced: another outboxd took this slot's transactional id over (or the coordinator aborted this one's transaction, open past its timeout); "+
			"the transaction this one held open is aborted, nothing of it reaches a read_committed consumer",
			"transactional_id", p.cfg.TransactionalID, "error", codeName(err))
	}
}
