package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/rawproduce"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/backoff"
	"github.com/outboxd/outboxd/clock"
)

// run is the sender: it takes a round (the oldest batch of every partition
// with records waiting, once one is full or has waited the linger), sends
// it, retries what failed, and only then takes the next.
func (p *Producer) run() {
	defer close(p.done)
	for {
		retry := p.resolveTopics(p.clock.Now())
		p.mu.Lock()
		round, wait, drop, exit := p.takeRound(p.clock.Now())
		p.sending = len(round) > 0
		p.mu.Unlock()
		if drop != nil {
			for _, b := range drop.batches {
				p.complete(b, drop.err)
			}
			for i := range drop.records {
				p.failRecord(&drop.records[i].rec, drop.records[i].now, drop.err)
			}
		}
		if exit {
			return
		}
		if len(round) > 0 {
			start := p.clock.Now()
			p.send(round)
			end := p.clock.Now()
			p.mu.Lock()
			p.sending = false
			p.paceUntil = end.Add(min(end.Sub(start), p.cfg.Linger))
			p.mu.Unlock()
			continue
		}
		if retry > 0 && (wait == 0 || retry < wait) {
			wait = retry
		}
		var timer <-chan time.Time // nil: until kicked
		if wait > 0 {
			timer = p.clock.After(wait)
		}
		select {
		case <-p.kick:
		case <-timer:
		case <-p.ctx.Done():
		}
	}
}

// send delivers one round: every batch is acknowledged, or retried (alone,
// before anything later) until MaxAttempts, or split when too large, or
// failed, which fences the producer.
func (p *Producer) send(round []*batch) {
	todo := round
	for attempt := 1; ; attempt++ {
		var retry []*batch
		var retryErr []error
		var fatal error
		for i, err := range p.sendOnce(todo) {
			b := todo[i]
			switch {
			case err == nil:
				p.complete(b, nil)
			case p.ctx.Err() != nil:
				fatal = errClosed
				retry, retryErr = append(retry, b), append(retryErr, errClosed)
			case refusedContent(err) || errors.Is(err, kafka.InvalidMessage) && (b.isolating || attempt >= p.cfg.MaxAttempts):
				// CORRUPT_MESSAGE (kafka.InvalidMessage) may be the
				// network's: it is retried like an outage, but once it
				// outlived the attempts (or its batch was already split
				// from one that did) it is the record's.
				if err := p.isolate(b, err); err != nil {
					fatal = err
				}
			case retriable(err):
				retry, retryErr = append(retry, b), append(retryErr, err)
			default:
				fatal = p.fail(b, err)
			}
		}
		if len(retry) == 0 {
			return
		}
		if fatal == nil && attempt < p.cfg.MaxAttempts {
			p.log.Debug("produce failed; retrying", "batches", len(retry), "attempt", attempt, "error", retryErr[0])
			if clock.Sleep(p.ctx, p.clock, backoff.Delay(attempt-1, 100*time.Millisecond, time.Second)) && p.ctx.Err() == nil {
				p.refreshLeaders(retry)
				todo = retry
				continue
			}
		}
		for i, b := range retry {
			p.fence(retryErr[i])
			p.complete(b, retryErr[i])
		}
		return
	}
}

// isolate handles b refused by the broker for the content of its records
// (refusedContent: too large for the topic's max.message.bytes, which the
// batch can exceed once compressed, as incompressible payloads do; a
// timestamp the topic does not take; a record it calls invalid or
// corrupt). As the Java producer does for a batch too large, it splits b
// in two and puts both halves at the head of the partition's queue, before
// anything later, down to a record alone in its batch: a Refusable one is
// refused with an *outboxd.RefusedError and the records after it go on (its
// route dead-letters it); any other fails for good with a RecordError that
// names the way out. It returns the error that fenced the producer, if it
// did.
func (p *Producer) isolate(b *batch, err error) error {
	if b.count > 1 {
		n := b.count
		first, rest, serr := b.split()
		if serr != nil {
			return p.fail(b, serr)
		}
		p.log.Debug("the broker refused a batch for a record's content; sending it again in two",
			"topic", first.part.topic, "partition", first.part.id, "records", n, "error", codeName(err))
		p.mu.Lock()
		first.part.queued = append([]*batch{first, rest}, first.part.queued...)
		p.mu.Unlock()
		return nil
	}
	recs, stamps, derr := b.records()
	if derr != nil {
		return p.fail(b, derr)
	}
	r := &recs[0]
	way := refusalFix(err, stamps[0], p.clock.Now())
	if r.Refusable {
		p.complete(b, &outboxd.RefusedError{Topic: r.Topic, Key: bytes.Clone(r.Key), Headers: cloneHeaders(r.Headers),
			Size: r.WireSize(), Err: fmt.Errorf("%s: %s: %w", codeName(err), way, err)})
		return nil
	}
	return p.fail(b, &RecordError{Topic: r.Topic, Key: bytes.Clone(r.Key), Err: err,
		Reason: fmt.Sprintf("the broker refused the record (%d bytes) with %s, alone in its batch: %s, or dead-letter such rows (on_error: dead_letter)",
			r.WireSize(), codeName(err), way)})
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
// the broker. An error no replay can fix becomes a RecordError. It returns
// the error b's records got.
func (p *Producer) fail(b *batch, err error) error {
	var re *RecordError
	if ae := authFailure(err); ae != nil {
		err = ae
	} else if reason := permanent(err); reason != "" && !errors.As(err, &re) {
		err = &RecordError{Topic: b.part.topic, Reason: reason, Err: err}
	}
	p.fence(err)
	p.complete(b, err)
	return err
}

// fence stops the producer after a batch failed for good. The failure is
// returned, not logged: the batch's Ackers get it, which ends the stream
// (the runner logs it once).
func (p *Producer) fence(err error) {
	p.mu.Lock()
	if p.fenced == nil {
		p.fenced = fenceError(err)
	}
	p.mu.Unlock()
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

// complete tells every record of b its outcome, after observing it.
func (p *Producer) complete(b *batch, err error) {
	p.observe(b.part.topic, int(b.count), b.kvBytes, b.created, err)
	for _, a := range b.acks {
		a.ack.Ack(err)
	}
	b.release()
}
