package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/rawproduce"

	"github.com/outboxd/outboxd"
)

// maxRoundBytes bounds one round's batches (the broker's
// socket.request.max.bytes defaults to 100 MiB).
const maxRoundBytes = 32 << 20

// maxRounds is how many rounds may be in flight at once with idempotence;
// without it, one. A round carries at most one batch of a partition, and a
// partition at most maxInFlight batches in flight.
const maxRounds = maxInFlight

func (p *Producer) maxRounds() int {
	if p.cfg.Idempotence {
		return maxRounds
	}
	return 1
}

// batchState is where a batch is on its way (batch.state).
type batchState uint8

const (
	unsent   batchState = iota // in its partition's open batch or queue
	inFlight                   // in a produce request now
	retrying                   // failed with an error a retry may fix; sent again at retryAt, before anything later of its partition
	acked                      // acknowledged by the broker
	failed                     // failed for good (or refused, or fenced): batch.err
)

// round is one pass of the sender: at most one batch per partition, one
// produce request per leader; errs are the batches' outcomes.
type round struct {
	batches    []*batch
	errs       []error
	start, end time.Time
}

// run is the sender: the one goroutine that changes the partitions' send
// state. It takes a round (the next batch of every partition with records
// waiting, once one is full or has waited the linger, or has a batch to
// send again), sends it on a goroutine of its own (send), settles the
// outcomes when it comes back (settle), and completes the batches, in each
// partition's order. It returns once closing and nothing is left, every
// round it started having come back.
func (p *Producer) run() {
	defer close(p.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		for settled := false; !settled; {
			select {
			case rd := <-p.finished:
				p.completeAll(p.settle(rd))
			default:
				settled = true
			}
		}
		now := time.Now()
		retry := p.resolveTopics(now)
		if w := p.producerID(now); w > 0 && (retry == 0 || w < retry) {
			retry = w
		}
		p.mu.Lock()
		rd, wait, drop, exit := p.takeRound(time.Now())
		p.mu.Unlock()
		if drop != nil {
			p.completeAll(drop.batches)
			for i := range drop.records {
				p.failRecord(&drop.records[i].rec, drop.records[i].now, drop.err)
			}
		}
		if exit {
			return
		}
		if rd != nil {
			go p.send(rd)
			continue
		}
		if retry > 0 && (wait == 0 || retry < wait) {
			wait = retry
		}
		if wait > 0 {
			timer.Reset(wait)
		}
		ctxDone := p.ctx.Done()
		if p.ctx.Err() != nil {
			ctxDone = nil // seen: wait for the rounds still out
		}
		select {
		case <-p.kick:
		case <-timer.C:
		case rd := <-p.finished:
			p.completeAll(p.settle(rd))
		case <-ctxDone:
		}
		timer.Stop()
	}
}

// send sends one round and hands it back to the sender goroutine.
// p.finished has room for every round in flight.
func (p *Producer) send(rd *round) {
	rd.errs = p.sendOnce(rd.batches)
	rd.end = time.Now()
	p.finished <- rd
}

// dropped is what a fenced producer fails without sending: batches to
// complete (in their partitions' order) and records that never reached
// one.
type dropped struct {
	batches []*batch
	records []waitingRecord
	err     error
}

// takeRound picks the next round, or says how long to wait for one (0: until
// kicked or a round comes back). After a fence it fails every batch not in
// flight. Called with mu held.
func (p *Producer) takeRound(now time.Time) (rd *round, wait time.Duration, drop *dropped, exit bool) {
	if p.fenced != nil {
		drop = &dropped{err: p.fenced}
		for _, pt := range p.parts {
			for _, b := range pt.sent {
				if b.state == retrying {
					b.state, b.err = failed, p.fenced
				}
			}
			for _, b := range append(pt.queued, pt.open) {
				if b != nil {
					b.state, b.err = failed, p.fenced
					pt.sent = append(pt.sent, b)
				}
			}
			pt.queued, pt.open = nil, nil
			drop.batches = append(drop.batches, pt.pop()...)
		}
		for _, t := range p.topics {
			drop.records = append(drop.records, t.waiting...)
			t.waiting = nil
		}
		return nil, 0, drop, p.closing && p.rounds == 0
	}
	waiting := false
	for _, t := range p.topics {
		waiting = waiting || len(t.waiting) > 0
	}
	if p.closing && !waiting && p.rounds == 0 && !p.hasWork() {
		return nil, 0, nil, true
	}
	if p.rounds >= p.maxRounds() {
		return nil, 0, nil, false // until a round comes back
	}
	// A flush (asked while no round was in flight) sends at once after an
	// idle spell; right after a round it waits as long as that round took
	// (at most the linger): commits arriving back to back then share a
	// request instead of costing the broker (and the consumers it wakes)
	// one each, and the broker is busy with our requests at most half the
	// time (docs/reports/PERFORMANCE.md, issue 15).
	pace := p.paceUntil.Sub(now)
	ready, lingering := false, false
	var oldest, retryAt time.Time
	for _, pt := range p.parts {
		b, fresh, at := p.nextBatch(pt, now)
		switch {
		case b == nil:
			if !at.IsZero() && (retryAt.IsZero() || at.Before(retryAt)) {
				retryAt = at
			}
			continue
		case !fresh || b != pt.open:
			ready = true // a batch to send again, or a full one
		case p.closing || p.due && pace <= 0 || now.Sub(b.created) >= p.cfg.Linger:
			ready = true
		default:
			lingering = true
			if oldest.IsZero() || b.created.Before(oldest) {
				oldest = b.created
			}
		}
		if ready {
			break
		}
	}
	if !ready {
		if lingering {
			wait = p.cfg.Linger - now.Sub(oldest)
			if p.due && pace < wait {
				wait = pace
			}
		}
		if !retryAt.IsZero() && (wait <= 0 || retryAt.Sub(now) < wait) {
			wait = max(retryAt.Sub(now), time.Millisecond)
		}
		return nil, wait, nil, false
	}
	// Like the Java producer, a ready round takes every partition's next
	// batch, lingering or not: one request instead of several.
	rd = &round{start: now}
	size, cut := 0, false
	n := len(p.parts)
	for i := 0; i < n; i++ {
		pt := p.parts[(p.next+i)%n]
		b, fresh, _ := p.nextBatch(pt, now)
		if b == nil {
			continue
		}
		if size > 0 && size+len(b.buf) > maxRoundBytes {
			// The rest goes in the next round; a Flush still holds for it.
			p.next, cut = (p.next+i)%n, true
			break
		}
		if fresh {
			if b == pt.open {
				pt.open = nil
			} else {
				pt.queued[0] = nil
				pt.queued = pt.queued[1:]
			}
			pt.sent = append(pt.sent, b)
		}
		p.stamp(b)
		b.behind = pt.openBefore(b)
		b.state, b.resent = inFlight, !fresh
		pt.inFlight++
		p.inFlight++
		size += len(b.buf)
		rd.batches = append(rd.batches, b)
	}
	if len(rd.batches) == 0 {
		return nil, 0, nil, false
	}
	if !cut {
		p.next = (p.next + 1) % n
	}
	p.rounds++
	if cut {
		return rd, 0, nil, false
	}
	p.due = false
	for _, pt := range p.parts {
		// A partition with several batches queued keeps the flush for
		// its open one.
		p.due = p.due || pt.open != nil && len(pt.queued) > 0
	}
	return rd, 0, nil, false
}

// nextBatch is the batch pt sends next, if it may send one now: its oldest
// batch to send again, alone once nothing of the partition is in flight
// (at its backoff's end: at), or else, while no batch sent again is in
// flight, its next unsent one (fresh), while fewer than the partition's
// limit are in flight. A partition recovering from a failure thus has one
// batch in flight at a time. Called with mu held.
func (p *Producer) nextBatch(pt *partition, now time.Time) (b *batch, fresh bool, at time.Time) {
	if p.cfg.Idempotence && p.pid < 0 {
		return nil, false, time.Time{} // waits for a producer id
	}
	for _, b := range pt.sent {
		switch {
		case b.state == inFlight && b.resent:
			return nil, false, time.Time{} // nothing beside a batch sent again
		case b.state != retrying:
			continue
		case pt.inFlight > 0 || b.reseq:
			return nil, false, time.Time{}
		case now.Before(b.retryAt):
			return nil, false, b.retryAt
		}
		return b, false, time.Time{}
	}
	if p.reset {
		return nil, false, time.Time{} // no new batch under the old producer id
	}
	if pt.pipelined && p.clock().Sub(pt.acked) >= pipelineIdle {
		// The leader may have forgotten this producer meanwhile: the next
		// batch goes alone, until it is acknowledged.
		pt.pipelined = false
	}
	limit := 1
	if p.cfg.Idempotence && pt.pipelined {
		limit = maxInFlight
	}
	if pt.inFlight >= limit || len(pt.sent) >= maxInFlight {
		return nil, false, time.Time{}
	}
	if len(pt.queued) > 0 {
		return pt.queued[0], true, time.Time{}
	}
	return pt.open, pt.open != nil, time.Time{}
}

// pop takes the batches at the head of pt.sent that are settled (acked or
// failed), to be completed in that order. Called with mu held.
func (pt *partition) pop() []*batch {
	n := 0
	for n < len(pt.sent) && (pt.sent[n].state == acked || pt.sent[n].state == failed) {
		n++
	}
	if n == 0 {
		return nil
	}
	done := slices.Clone(pt.sent[:n])
	clear(pt.sent[:n])
	pt.sent = pt.sent[n:]
	return done
}

// settle records the outcomes of a round that came back and returns the
// batches to complete.
func (p *Producer) settle(rd *round) []*batch {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rounds--
	p.paceUntil = rd.end.Add(min(rd.end.Sub(rd.start), p.cfg.Linger))
	now := time.Now()
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
			b.part.pipelined, b.part.acked = true, p.clock()
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
	case stamped && sequenceError(err):
		p.resequence(b, err, now)
	case retriable(err):
		b.attempts++
		if b.attempts >= p.cfg.MaxAttempts {
			p.fail(b, err)
			return
		}
		p.retryLater(b, err, now.Add(backoff(b.attempts, p.retryMin, p.retryMax)))
		p.topics[b.part.topic].stale = true // its leaders are read again first
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
	if b.pid != p.pid {
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
	if !p.reset || p.inFlight > 0 {
		return
	}
	for _, pt := range p.parts {
		for _, b := range pt.sent {
			if b.reseq {
				break
			}
			if b.state == retrying {
				return // settled under the old id first
			}
		}
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
	way := refusalFix(err, stamps[0], time.Now())
	if r.Refusable {
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
	out := make([]outboxd.Header, len(hs))
	for i, h := range hs {
		out[i] = outboxd.Header{Key: h.Key, Value: bytes.Clone(h.Value)}
	}
	return out
}

// fail fails b for good and fences the producer: no later batch may reach
// the broker. An error no replay can fix becomes a RecordError. Called with
// mu held.
func (p *Producer) fail(b *batch, err error) {
	var re *RecordError
	if ae := authFailure(err); ae != nil {
		err = ae
	} else if reason := permanent(err); reason != "" && !errors.As(err, &re) {
		err = &RecordError{Topic: b.part.topic, Reason: reason, Err: err}
	}
	p.fence(b, err)
	b.state, b.err = failed, err
}

// fence stops the producer after b failed for good. Called with mu held.
func (p *Producer) fence(b *batch, err error) {
	if p.fenced != nil {
		return
	}
	p.fenced = fenceError(err)
	if !errors.Is(err, errClosed) {
		p.log.Error("delivery failed; no further records will be sent by this producer",
			"topic", b.part.topic, "partition", b.part.id, "records", b.count, "error", err)
	}
}

// sendOnce sends one produce request per leader broker and returns each
// batch's outcome.
func (p *Producer) sendOnce(todo []*batch) []error {
	errs := make([]error, len(todo))
	groups := map[int32][]int{}
	p.mu.Lock()
	for i, b := range todo {
		if b.part.leader < 0 {
			errs[i] = kafka.LeaderNotAvailable
			continue
		}
		groups[b.part.leader] = append(groups[b.part.leader], i)
	}
	p.mu.Unlock()
	if len(groups) == 1 {
		for _, idx := range groups {
			p.request(todo, idx, errs)
		}
		return errs
	}
	var wg sync.WaitGroup
	for _, idx := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.request(todo, idx, errs)
		}()
	}
	wg.Wait()
	return errs
}

var outPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// request sends the batches todo[idx] (one leader) in one produce request
// and writes each one's outcome into errs.
func (p *Producer) request(todo []*batch, idx []int, errs []error) {
	req := &rawproduce.Request{Acks: int16(kafka.RequireAll), Timeout: int32(p.cfg.WriteTimeout / time.Millisecond)}
	byTopic := map[string]int{}
	var outs []*bytes.Buffer
	defer func() {
		for _, o := range outs {
			if o.Cap() <= 4<<20 {
				outPool.Put(o)
			}
		}
	}()
	sent := idx[:0:0]
	for _, i := range idx {
		b := todo[i]
		var out *bytes.Buffer
		if p.codec != nil {
			out = outPool.Get().(*bytes.Buffer)
			outs = append(outs, out)
		}
		raw, err := b.encode(p.codec, out)
		if err != nil {
			errs[i] = fmt.Errorf("%w: %w", errEncode, err)
			continue
		}
		ti, ok := byTopic[b.part.topic]
		if !ok {
			ti = len(req.Topics)
			byTopic[b.part.topic] = ti
			req.Topics = append(req.Topics, rawproduce.RequestTopic{Topic: b.part.topic})
		}
		req.Topics[ti].Partitions = append(req.Topics[ti].Partitions, rawproduce.RequestPartition{
			Partition: b.part.id, RecordSet: protocol.RawRecordSet{Reader: bytes.NewReader(raw)}})
		sent = append(sent, i)
	}
	if len(sent) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.WriteTimeout)
	res, err := p.rt.RoundTrip(ctx, p.bootstrap(), req)
	cancel()
	if err != nil {
		// kafka-go returns on cancellation or on the request's timeout
		// while its connection may still be writing the request: its
		// buffers go to the garbage collector, never back to a pool.
		outs = nil
		for _, i := range sent {
			todo[i].abandoned = true
		}
	}
	if err == nil {
		if pr, ok := res.(*produce.Response); ok {
			for _, i := range sent {
				errs[i] = partitionResult(pr, todo[i].part)
			}
			return
		}
		err = fmt.Errorf("unexpected produce response %T", res)
	}
	for _, i := range sent {
		errs[i] = err
	}
}

func partitionResult(res *produce.Response, pt *partition) error {
	for _, t := range res.Topics {
		if t.Topic != pt.topic {
			continue
		}
		for _, r := range t.Partitions {
			if r.Partition != pt.id {
				continue
			}
			if r.ErrorCode == 0 {
				return nil
			}
			if r.ErrorMessage != "" {
				return &brokerError{code: kafka.Error(r.ErrorCode), message: r.ErrorMessage}
			}
			return kafka.Error(r.ErrorCode)
		}
	}
	return fmt.Errorf("the produce response has no result for %s/%d", pt.topic, pt.id)
}

// completeAll completes settled batches, in order.
func (p *Producer) completeAll(bs []*batch) {
	for _, b := range bs {
		var err error
		if b.state == failed {
			err = b.err
		}
		p.complete(b, err)
	}
}

// complete tells every record of b its outcome, after observing it.
func (p *Producer) complete(b *batch, err error) {
	p.observe(b.part.topic, int(b.count), b.kvBytes, b.created, err)
	for _, a := range b.acks {
		a.ack.Ack(err)
	}
	b.release()
}

// backoff is min·2^(attempt-1), capped at max.
func backoff(attempt int, min, max time.Duration) time.Duration {
	d := min
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d
}
