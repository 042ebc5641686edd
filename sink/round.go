package sink

import (
	"slices"
	"time"
)

// maxRoundBytes bounds one round's batches (the broker's
// socket.request.max.bytes defaults to 100 MiB).
const maxRoundBytes = 32 << 20

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
		return nil, 0, p.dropAll(), p.closing && p.rounds == 0
	}
	if p.txn.committing {
		return nil, 0, nil, false // transact commits first
	}
	ready, wait, exit := p.roundReady(now)
	if !ready {
		return nil, wait, nil, exit
	}
	return p.collectRound(now), 0, nil, false
}

// dropAll fails, with the fence's error, every batch of a fenced producer
// that is not in flight (to be sent again, queued, open) and takes the
// records waiting for their topic's layout; it hands back the batches
// settled at the head of each partition, to be completed in that order.
// Called with mu held.
func (p *Producer) dropAll() *dropped {
	drop := &dropped{err: p.fenced, batches: p.txn.aborted(p.fenced)}
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
		drop.records = append(drop.records, pt.proof.drop()...)
	}
	for _, t := range p.topics {
		drop.records = append(drop.records, t.waiting...)
		t.waiting = nil
	}
	if p.transactional() {
		// Acknowledged by their leaders behind a batch still open when
		// the fence came: in a transaction that will never commit.
		for _, b := range drop.batches {
			if b.state == acked {
				b.state, b.err = failed, p.fenced
			}
		}
	}
	return drop
}

// roundReady says whether a round is to go now; if not, how long to wait
// for one (0: until kicked or a round comes back), or that a closing
// producer has nothing left and no round out (exit). Called with mu held.
func (p *Producer) roundReady(now time.Time) (ready bool, wait time.Duration, exit bool) {
	waiting := false
	for _, t := range p.topics {
		waiting = waiting || len(t.waiting) > 0
	}
	if p.closing && !waiting && p.rounds == 0 && !p.hasWork() && !p.txn.open() {
		return false, 0, true
	}
	if p.rounds >= p.maxRounds() {
		return false, 0, false // until a round comes back
	}
	// A flush (asked while no round was in flight) sends at once after an
	// idle spell; right after a round it waits as long as that round took
	// (at most the linger): commits arriving back to back then share a
	// request instead of costing the broker (and the consumers it wakes)
	// one each, and the broker is busy with our requests at most half the
	// time (docs/reports/PERFORMANCE.md, issue 15).
	pace := p.paceUntil.Sub(now)
	lingering := false
	var oldest, retryAt time.Time
	for _, pt := range p.parts {
		b, fresh, at := p.nextBatch(pt, now)
		switch {
		case b == nil:
			if !at.IsZero() && (retryAt.IsZero() || at.Before(retryAt)) {
				retryAt = at
			}
		case !fresh || b != pt.open:
			return true, 0, false // a batch to send again, or a full one
		case p.closing || p.due && pace <= 0 || now.Sub(b.created) >= p.cfg.Linger:
			return true, 0, false
		default:
			lingering = true
			if oldest.IsZero() || b.created.Before(oldest) {
				oldest = b.created
			}
		}
	}
	if lingering {
		wait = p.cfg.Linger - now.Sub(oldest)
		if p.due && pace < wait {
			wait = pace
		}
	}
	if !retryAt.IsZero() && (wait <= 0 || retryAt.Sub(now) < wait) {
		wait = max(retryAt.Sub(now), time.Millisecond)
	}
	return false, wait, false
}

// collectRound takes a ready round (nil: nothing could go after all). Like
// the Java producer, it takes every partition's next batch, lingering or
// not: one request instead of several. Called with mu held.
func (p *Producer) collectRound(now time.Time) *round {
	rd := &round{start: now}
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
		if pt.proof.unproven && b.stream {
			p.withoutStream(b)
		}
		p.stamp(b)
		b.behind = pt.openBefore(b)
		b.state, b.resent, b.sentTo = inFlight, !fresh, pt.leader
		pt.inFlight++
		p.inFlight++
		size += len(b.buf)
		rd.batches = append(rd.batches, b)
	}
	if len(rd.batches) == 0 {
		return nil
	}
	if !cut {
		p.next = (p.next + 1) % n
	}
	p.rounds++
	if cut {
		return rd
	}
	p.due = false
	for _, pt := range p.parts {
		// A partition with several batches queued keeps the flush for
		// its open one.
		p.due = p.due || pt.open != nil && len(pt.queued) > 0
	}
	return rd
}

// nextBatch is the batch pt sends next, if it may send one now: its oldest
// batch to send again, alone once nothing of the partition is in flight
// (at its backoff's end: at), or else, while no batch sent again is in
// flight, its next unsent one (fresh), while fewer than the partition's
// limit are in flight. A partition recovering from a failure thus has one
// batch in flight at a time. Called with mu held.
func (p *Producer) nextBatch(pt *partition, now time.Time) (b *batch, fresh bool, at time.Time) {
	if p.transactional() && !p.txn.in(pt) {
		return nil, false, time.Time{} // joinTransaction adds it first
	}
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
	if pt.pipelined && now.Sub(pt.acked) >= pipelineIdle {
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
