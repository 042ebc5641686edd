package sink

import "time"

// maxRoundBytes bounds one round's batches (the broker's
// socket.request.max.bytes defaults to 100 MiB).
const maxRoundBytes = 32 << 20

// dropped is what a fenced producer fails without sending.
type dropped struct {
	batches []*batch
	records []waitingRecord
	err     error
}

// takeRound picks the next round, or says how long to wait for one (0: until
// kicked). After a fence it hands back every waiting batch to be failed.
// Called with mu held.
func (p *Producer) takeRound(now time.Time) (round []*batch, wait time.Duration, drop *dropped, exit bool) {
	if p.fenced != nil {
		return nil, 0, p.dropAll(), p.closing
	}
	ready, wait, exit := p.roundReady(now)
	if !ready {
		return nil, wait, nil, exit
	}
	return p.collectRound(), 0, nil, false
}

// dropAll takes every batch and every record waiting for its topic out of
// a fenced producer, to be failed with the fence's error. Called with mu
// held.
func (p *Producer) dropAll() *dropped {
	drop := &dropped{err: p.fenced}
	for _, pt := range p.parts {
		drop.batches = append(drop.batches, pt.queued...)
		pt.queued = nil
		if pt.open != nil {
			drop.batches = append(drop.batches, pt.open)
			pt.open = nil
		}
	}
	for _, t := range p.topics {
		drop.records = append(drop.records, t.waiting...)
		t.waiting = nil
	}
	return drop
}

// roundReady says whether a round is to go now; if not, how long to wait
// for one (0: until kicked), or that a closing producer has nothing left
// (exit). Called with mu held.
func (p *Producer) roundReady(now time.Time) (ready bool, wait time.Duration, exit bool) {
	waiting := false
	for _, t := range p.topics {
		waiting = waiting || len(t.waiting) > 0
	}
	// A flush (asked while no round was in flight) sends at once after an
	// idle spell; right after a round it waits as long as that round took
	// (at most the linger): commits arriving back to back then share a
	// request instead of costing the broker (and the consumers it wakes)
	// one each, and the broker is busy with our requests at most half the
	// time (docs/reports/PERFORMANCE.md, issue 15).
	pace := p.paceUntil.Sub(now)
	any := false
	var oldest time.Time
	for _, pt := range p.parts {
		if len(pt.queued) > 0 {
			return true, 0, false
		}
		if pt.open != nil {
			any = true
			if p.closing || p.due && pace <= 0 || now.Sub(pt.open.created) >= p.cfg.Linger {
				return true, 0, false
			}
			if oldest.IsZero() || pt.open.created.Before(oldest) {
				oldest = pt.open.created
			}
		}
	}
	if !any {
		return false, 0, !waiting && p.closing
	}
	wait = p.cfg.Linger - now.Sub(oldest)
	if p.due && pace < wait {
		wait = pace
	}
	return false, wait, false
}

// collectRound takes a ready round. Like the Java producer, it takes every
// partition's oldest batch, lingering or not: one request instead of
// several. Called with mu held.
func (p *Producer) collectRound() (round []*batch) {
	size := 0
	n := len(p.parts)
	for i := 0; i < n; i++ {
		pt := p.parts[(p.next+i)%n]
		var b *batch
		switch {
		case len(pt.queued) > 0:
			b = pt.queued[0]
		case pt.open != nil:
			b = pt.open
		default:
			continue
		}
		if size > 0 && size+len(b.buf) > maxRoundBytes {
			// The rest goes in the next round; a Flush still holds for it.
			p.next = (p.next + i) % n
			return round
		}
		if len(pt.queued) > 0 {
			pt.queued[0] = nil
			pt.queued = pt.queued[1:]
		} else {
			pt.open = nil
		}
		size += len(b.buf)
		round = append(round, b)
	}
	p.next = (p.next + 1) % n
	p.due = false
	for _, pt := range p.parts {
		// A partition with several batches queued keeps the flush for
		// its open one.
		p.due = p.due || pt.open != nil && len(pt.queued) > 0
	}
	return round
}
