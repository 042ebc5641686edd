package sink

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/rawproduce"

	"github.com/outboxd/outboxd"
)

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
// send again), hands it to one of its senders (send), settles the
// outcomes when it comes back (settle), and completes the batches, in each
// partition's order. It returns once closing and nothing is left, every
// round it started having come back.
func (p *Producer) run() {
	defer close(p.done)
	defer p.reads.stop()
	// The rounds go to senders that live as long as the producer: a
	// goroutine per round started with a small stack and grew it (copied
	// it) on every round, 6 % of outboxd's CPU at 200 events/s (issue 36).
	// There are as many as rounds may be in flight, so sends never wait.
	sends := make(chan *round, p.maxRounds())
	defer close(sends) // after the last round came back (run returns then)
	for range p.maxRounds() {
		go func() {
			for rd := range sends {
				p.send(rd)
			}
		}()
	}
	for {
		for settled := false; !settled; {
			select {
			case rd := <-p.finished:
				p.finish(p.settle(rd))
			case a := <-p.reads.answers:
				p.learnTail(a)
			default:
				settled = true
			}
		}
		now := p.clock.Now()
		retry := p.resolveTopics(now)
		sooner := func(w time.Duration) {
			if w > 0 && (retry == 0 || w < retry) {
				retry = w
			}
		}
		// In this order: a commit before a reset's new epoch; the tails
		// read once the producer id has fenced an earlier holder of its
		// transactional id; partitions added once their batches may go.
		sooner(p.transact(now))
		sooner(p.producerID(now))
		sooner(p.readTails(now))
		sooner(p.joinTransaction(now))
		p.mu.Lock()
		now = p.clock.Now()
		rd, wait, drop, exit := p.takeRound(now)
		if retry > 0 && (wait == 0 || retry < wait) {
			wait = retry
		}
		p.wakeAt = time.Time{}
		if rd == nil && wait > 0 {
			p.wakeAt = now.Add(wait)
		}
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
			sends <- rd
			continue
		}
		var timer <-chan time.Time // nil: until kicked or a round comes back
		if wait > 0 {
			timer = p.clock.After(wait)
		} else {
			p.logIdleWithWork()
		}
		ctxDone := p.ctx.Done()
		if p.ctx.Err() != nil {
			ctxDone = nil // seen: wait for the rounds still out
		}
		select {
		case <-p.kick:
		case <-timer:
		case rd := <-p.finished:
			p.finish(p.settle(rd))
		case a := <-p.reads.answers:
			p.learnTail(a)
		case <-ctxDone:
		}
	}
}

// send sends one round and hands it back to the sender goroutine.
// p.finished has room for every round in flight.
func (p *Producer) send(rd *round) {
	rd.errs = p.sendOnce(rd.batches)
	rd.end = p.clock.Now()
	p.finished <- rd
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
		for leader, idx := range groups {
			p.request(leader, todo, idx, errs)
		}
		return errs
	}
	var wg sync.WaitGroup
	for leader, idx := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.request(leader, todo, idx, errs)
		}()
	}
	wg.Wait()
	return errs
}

var outPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// request sends the batches todo[idx] (one leader) in one produce request
// and writes each one's outcome into errs.
func (p *Producer) request(leader int32, todo []*batch, idx []int, errs []error) {
	var results []partitionOutcome
	var sent []int
	var err error
	if p.wires != nil {
		sent, results, err = p.wireRequest(leader, todo, idx, errs)
	} else {
		sent, results, err = p.transportRequest(todo, idx, errs)
	}
	for _, i := range sent {
		if err != nil {
			errs[i] = err
			continue
		}
		todo[i].offset, errs[i] = partitionResult(results, todo[i].part)
	}
}

// byTopic is idx grouped by the batches' topics, in the order they come.
func byTopic(todo []*batch, idx []int) [][]int {
	var groups [][]int
	for _, i := range idx {
		g := slices.IndexFunc(groups, func(g []int) bool { return todo[g[0]].part.topic == todo[i].part.topic })
		if g < 0 {
			g = len(groups)
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// wireRequest sends the batches todo[idx] in one produce request on the
// producer's own connection to the leader (wire.go), each batch encoded
// (compressed) into the request as it is written, and returns the batches
// sent (an encoding failure is its batch's outcome) and the answer. The
// request holds a copy of the batches: once it returns, their buffers are
// free whatever happened.
func (p *Producer) wireRequest(leader int32, todo []*batch, idx []int, errs []error) ([]int, []partitionOutcome, error) {
	p.mu.Lock()
	addr := p.brokerAddrs[leader]
	p.mu.Unlock()
	if addr == "" {
		return idx, nil, fmt.Errorf("no address known for broker %d, the leader: %w", leader, kafka.LeaderNotAvailable)
	}
	buf := outPool.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 4<<20 {
			outPool.Put(buf)
		}
	}()
	buf.Reset()
	req := startProduceRequest(buf, p.cfg.ClientID, p.cfg.TransactionalID, p.cfg.WriteTimeout)
	sent := idx[:0:0]
	for _, group := range byTopic(todo, idx) {
		req.topic(todo[group[0]].part.topic)
		for _, i := range group {
			b := todo[i]
			mark := req.partition(b.part.id)
			n := buf.Len()
			raw, err := b.encode(p.codec, buf)
			if err != nil {
				req.undo(mark)
				errs[i] = fmt.Errorf("%w: %w", errEncode, err)
				continue
			}
			if buf.Len() == n {
				buf.Write(raw) // not compressed: the batch's own buffer
			}
			sent = append(sent, i)
		}
	}
	if len(sent) == 0 {
		return nil, nil, nil
	}
	req.finish()
	body, err := p.wires.produce(p.ctx, addr, buf)
	if err != nil {
		return sent, nil, err
	}
	results, err := parseProduceAnswer(body)
	return sent, results, err
}

// transportRequest sends the batches todo[idx] in one produce request
// through the RoundTripper the producer was built with (a fake broker in
// tests), and returns the batches sent and the answer.
func (p *Producer) transportRequest(todo []*batch, idx []int, errs []error) ([]int, []partitionOutcome, error) {
	// A transactional batch travels in a request naming its transactional
	// id (the broker authorizes WRITE on it).
	req := &rawproduce.Request{Acks: int16(kafka.RequireAll), Timeout: int32(p.cfg.WriteTimeout / time.Millisecond), TransactionalID: p.cfg.TransactionalID}
	var outs []*bytes.Buffer
	defer func() {
		for _, o := range outs {
			if o.Cap() <= 4<<20 {
				outPool.Put(o)
			}
		}
	}()
	sent := idx[:0:0]
	for _, group := range byTopic(todo, idx) {
		rt := rawproduce.RequestTopic{Topic: todo[group[0]].part.topic}
		for _, i := range group {
			b := todo[i]
			var out *bytes.Buffer
			if p.codec != nil {
				out = outPool.Get().(*bytes.Buffer)
				out.Reset()
				outs = append(outs, out)
			}
			raw, err := b.encode(p.codec, out)
			if err != nil {
				errs[i] = fmt.Errorf("%w: %w", errEncode, err)
				continue
			}
			rt.Partitions = append(rt.Partitions, rawproduce.RequestPartition{Partition: b.part.id, RecordSet: protocol.RawRecordSet{Reader: bytes.NewReader(raw)}})
			sent = append(sent, i)
		}
		if len(rt.Partitions) > 0 {
			req.Topics = append(req.Topics, rt)
		}
	}
	if len(sent) == 0 {
		return nil, nil, nil
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
		return sent, nil, err
	}
	pr, ok := res.(*produce.Response)
	if !ok {
		return sent, nil, fmt.Errorf("unexpected produce response %T", res)
	}
	var results []partitionOutcome
	for _, t := range pr.Topics {
		for _, r := range t.Partitions {
			results = append(results, partitionOutcome{topic: t.Topic, partition: r.Partition, code: r.ErrorCode, baseOffset: r.BaseOffset, message: r.ErrorMessage})
		}
	}
	return sent, results, nil
}

// partitionResult is pt's outcome in results: the offset of the batch's
// first record (-1 when the broker does not say) and the broker's error.
func partitionResult(results []partitionOutcome, pt *partition) (int64, error) {
	for _, r := range results {
		if r.topic != pt.topic || r.partition != pt.id {
			continue
		}
		if r.code == 0 {
			return r.baseOffset, nil
		}
		return -1, codeError(r.code, r.message)
	}
	return -1, fmt.Errorf("the produce response has no result for %s/%d", pt.topic, pt.id)
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

// complete tells every record of b its outcome, after observing it; a
// record whose Acker is a Placer is told its offset first, when the broker
// said where the batch starts.
func (p *Producer) complete(b *batch, err error) {
	p.observe(b.part.topic, int(b.count), b.kvBytes, b.created, err)
	for i, a := range b.acks {
		if err == nil && b.offset >= 0 {
			if pl, ok := a.ack.(outboxd.Placer); ok {
				pl.Place(b.part.id, b.offset+int64(i))
			}
		}
		a.ack.Ack(err)
	}
	b.release()
}

// logIdleWithWork says, once per spell, that the sender waits with no round
// out and no timer while batches wait: only a kick can wake it then, and
// none may come (a bug; the state is what diagnoses it).
func (p *Producer) logIdleWithWork() {
	p.mu.Lock()
	defer p.mu.Unlock()
	held := false
	for _, pt := range p.parts {
		held = held || pt.proof.holding()
	}
	// A kick pending: records came (appendRecord pokes under mu) after the
	// round was taken, and the select wakes at once.
	if p.rounds > 0 || held || !p.hasWork() || len(p.kick) > 0 {
		// Held records wait for their tail (dedupe.go), which has a timer
		// or is read at the next pass (hold pokes the sender).
		p.idleLogged = false
		return
	}
	if p.idleLogged {
		return
	}
	p.idleLogged = true
	p.log.Warn("sender idle with batches waiting and nothing to wake it", "state", p.stateLocked())
}

// stateLocked describes the partitions with batches and the topics with
// records waiting. Called with mu held.
func (p *Producer) stateLocked() string {
	var b strings.Builder
	for _, pt := range p.parts {
		if pt.open == nil && len(pt.queued) == 0 && len(pt.sent) == 0 {
			continue
		}
		fmt.Fprintf(&b, " %s/%d leader=%d open=%t queued=%d inflight=%d pipelined=%t sent=[", pt.topic, pt.id, pt.leader, pt.open != nil, len(pt.queued), pt.inFlight, pt.pipelined)
		for _, x := range pt.sent {
			fmt.Fprintf(&b, "{state=%d resent=%t reseq=%t pid=%d retryAt=%s err=%v}", x.state, x.resent, x.reseq, x.pid, x.retryAt.Format("15:04:05.000"), x.err)
		}
		b.WriteString("]")
	}
	for _, t := range p.topics {
		fmt.Fprintf(&b, " topic %s waiting=%d fetched=%s stale=%t", t.name, len(t.waiting), t.fetched.Format("15:04:05.000"), t.stale)
	}
	return fmt.Sprintf("pid=%d reset=%t fenced=%v rounds=%d inflight=%d closing=%t due=%t%s", p.pid, p.reset, p.fenced, p.rounds, p.inFlight, p.closing, p.due, b.String())
}
