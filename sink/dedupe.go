package sink

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/backoff"
)

// Restart de-duplication. A session that starts after a crash, a broker
// outage or a failover replays from the slot's confirmed position, which
// lags what Kafka already holds: those records would be produced twice.
// With Config.Stream set (and the idempotent producer), every record with
// a stream position carries it in the HeaderStream header, with the
// stream's identity and the topic's partition count. Before a partition
// gets the session's first record with a position, the producer reads the
// partition's tail (tail.go) for the last record of the same stream under
// the same partition count; the session's records at or below its
// position are acknowledged without being produced (Config.Skipped). Only
// a record outboxd produced proves anything: the header ends with a MAC
// under the stream key the instances of a slot share (streamkey.go), and a
// header whose MAC does not verify proves nothing (Config.Rejected).
//
// Why that loses nothing: the stream produces in commit order, and the
// idempotent producer appends a partition's records in the order they were
// handed over, without gaps (a batch refused or lost stops the ones behind
// it). So when a record of the stream at position P is in a partition,
// every record of that stream routed to that partition at or below P is in
// it too, from the session that wrote P or (skipped by that one) from an
// earlier one. The identity (the database system, the slot, the routing)
// and the partition count make "routed to that partition" mean the same in
// both sessions: after a change of any of them nothing is skipped until
// the partition holds a record of the new identity. Positions go on across
// a promotion (PostgreSQL 17's failover slots), but WAL the old primary
// wrote after the new one's branch point was never the new one's: a record
// from an earlier timeline proves its position only at or before that
// timeline's end in the current timeline's history (proof). A topic whose
// partition count changes during the session (kafka.on_partition_change:
// follow) had records routed under both counts: its records carry no
// header from then on, and its held records are not skipped (topic.resized).
// Records of the cut-over snapshot, of
// replay and dead-letter records carry no position: they are never
// skipped and prove nothing. Nor do a partition's records after the broker
// refused one of the stream there (partition.unproven): the refused
// record's dead-letter record, on another topic, may not be in Kafka when
// they are.

// HeaderStream is the header that carries a record's stream identity and
// position, and their MAC (streamkey.go): "<identity>;<partitions>;<timeline>;<its start>;<commit LSN>;<index>;<route>;<MAC>".
const HeaderStream = "outboxd.stream"

// tailState is what a partition knows of the stream's records in it.
type tailState uint8

const (
	tailUnknown tailState = iota // not read yet: records with a position wait (held)
	tailKnown                    // read: records at or below partProof.pos are skipped
	tailPassed                   // a record above it went out, or none was found: nothing more to skip
)

// partProof is what restart de-duplication knows of one partition: what
// its tail proves, the records held until that is known, and the reads of
// the tail. Under the producer's mu.
type partProof struct {
	tail     tailState
	pos      outboxd.Pos // tailKnown: the stream's last position in the partition
	held     []waitingRecord
	attempts int       // failed reads of the tail in a row
	retryAt  time.Time // when to read it again
	since    time.Time // when its first read began
	reading  bool      // a read is running (tailReads)
	// unproven: the broker refused a record of the stream here; the later
	// ones go without the outboxd.stream header this session.
	unproven bool
}

// holding says whether records wait for the partition's tail.
func (pp *partProof) holding() bool { return len(pp.held) > 0 }

// drop takes the held records away (a fence fails them).
func (pp *partProof) drop() []waitingRecord {
	held := pp.held
	pp.held = nil
	return held
}

func (p *Producer) dedupe() bool { return p.cfg.Stream != "" && p.cfg.Idempotence }

// hold keeps r back, as a copy, while its partition's tail decides whether
// it goes out: a record with a position before the tail is passed, and
// any record behind a held one (order). It pokes the sender, which reads
// the tail (readTails, tailReads). Called with mu held.
func (p *Producer) hold(t *topic, part *partition, r *outboxd.Record, now time.Time, ts int64) bool {
	if !p.dedupe() {
		return false
	}
	// Behind a held record every record waits (order). Otherwise only a
	// record with a position waits, while its partition's tail may still
	// skip it.
	undecided := part.proof.tail != tailPassed && r.Pos.LSN != 0 && !t.resized
	if len(part.proof.held) == 0 && !undecided {
		return false
	}
	part.proof.held = append(part.proof.held, waitingRecord{rec: cloneRecord(r), now: now, ts: ts})
	p.poke()
	return true
}

// withStream is r with the HeaderStream header added, for a record with a
// position when de-duplicating; r itself otherwise. The copy lives in the
// producer's scratch until the next call: the batch copies its bytes.
// Called with mu held.
func (p *Producer) withStream(t *topic, part *partition, r *outboxd.Record) *outboxd.Record {
	if !p.dedupe() || r.Pos.LSN == 0 || part.proof.unproven || t.resized {
		return r
	}
	p.streamValue = appendStream(p.streamValue[:0], p.cfg.Stream, len(t.ids), p.cfg.Timeline, p.cfg.Timelines[p.cfg.Timeline].Start, r.Pos)
	p.streamValue = p.mac.appendMAC(p.streamValue, part.topic, part.id)
	p.streamHeaders = append(append(p.streamHeaders[:0], r.Headers...), outboxd.Header{Key: HeaderStream, Value: p.streamValue})
	c := *r
	c.Headers = p.streamHeaders
	return &c
}

func appendStream(b []byte, identity string, partitions int, timeline uint32, start uint64, pos outboxd.Pos) []byte {
	b = append(b, identity...)
	for _, n := range []uint64{uint64(partitions), uint64(timeline), start, pos.LSN, uint64(pos.Index), uint64(pos.Route)} {
		b = append(b, ';')
		b = strconv.AppendUint(b, n, 10)
	}
	return b
}

// Timeline is one timeline of the source's history (Config.Timelines).
type Timeline struct {
	Start, End uint64 // where it began (its parent's switch point) and ended (0: the current one)
}

// proof is the position a HeaderStream value v, its MAC verified and cut
// off (macVerifier.verify), proves for this session: a
// record of the same identity, under the same partition count, of this
// timeline or of an ancestor, the same branch (the same start: timeline
// numbers repeat across branches made without a shared archive), before
// the ancestor's end (a record at or past it was on a branch a promotion
// left: the new primary never had its transaction, and reuses its
// positions), and before the source's WAL position (nothing this server
// wrote is past it). ok false for any other.
func (p *Producer) proof(v []byte, partitions int) (pos outboxd.Pos, ok bool) {
	tli, start, pos, ok := parseStream(v, p.cfg.Stream, partitions)
	if !ok || pos.LSN >= p.cfg.WALEnd {
		return pos, false
	}
	tl, known := p.cfg.Timelines[tli]
	if !known || tl.Start != start {
		return pos, false
	}
	return pos, tli == p.cfg.Timeline || pos.LSN < tl.End
}

// ofStream says whether v, a HeaderStream value, names this session's
// stream identity: only those are judged by their MAC (a record of another
// outboxd, under its own key, is no forgery).
func (p *Producer) ofStream(v []byte) bool {
	n := len(p.cfg.Stream)
	return p.mac != nil && n > 0 && len(v) > n && v[n] == ';' && string(v[:n]) == p.cfg.Stream
}

// rejections are the records of one tail read whose header names the
// stream but proves nothing (its MAC does not verify, or, transactional,
// it is not in a transaction of the producer id): each is counted, the
// last logged.
type rejections struct {
	n      int
	offset int64
	why    string
}

func (r *rejections) add(topic string, offset int64, why string, count func(topic string)) {
	r.n++
	r.offset, r.why = offset, why
	if count != nil {
		count(topic)
	}
}

func (r *rejections) log(log hclog.Logger, topic string, partition int32) {
	if r.n > 0 && log != nil {
		log.Warn("a record in the partition's tail carries an outboxd.stream header outboxd did not write: it proves nothing, so no record is skipped on its word",
			"topic", topic, "partition", partition, "offset", r.offset, "why", r.why, "records", r.n)
	}
}

// parseStream is the timeline, its start and the position in a
// HeaderStream value written by the stream identity under partitions
// partitions; ok false for any other.
func parseStream(v []byte, identity string, partitions int) (tli uint32, start uint64, pos outboxd.Pos, ok bool) {
	rest, found := bytes.CutPrefix(v, []byte(identity))
	if !found || len(rest) == 0 || rest[0] != ';' {
		return 0, 0, pos, false
	}
	// The fields after the identity, in appendStream's order, each with
	// its width.
	var parts, timeline, lsn, index, route uint64
	fields := [...]struct {
		n    *uint64
		bits int
	}{{&parts, 32}, {&timeline, 32}, {&start, 64}, {&lsn, 64}, {&index, 32}, {&route, 32}}
	texts := bytes.Split(rest[1:], []byte{';'})
	if len(texts) != len(fields) {
		return 0, 0, pos, false
	}
	for i, f := range fields {
		var err error
		if *f.n, err = strconv.ParseUint(string(texts[i]), 10, f.bits); err != nil {
			return 0, 0, pos, false
		}
	}
	if parts != uint64(partitions) || lsn == 0 {
		return 0, 0, pos, false
	}
	return uint32(timeline), start, outboxd.Pos{LSN: lsn, Index: uint32(index), Route: uint32(route)}, true
}

// readTails starts reading the tail of every partition with records held
// whose tail is not known (at most once per backoff step after a failure,
// as many at once as tailReads allows), and lets go the held records of
// the partitions whose tail is: skipped when at or below it, added to
// batches otherwise. A partition whose tail could not be read within its
// budget gives up (giveUpTail). It returns how soon to look again (0:
// only when an answer or a record comes). The sender's.
func (p *Producer) readTails(now time.Time) time.Duration {
	if !p.dedupe() {
		return 0
	}
	p.mu.Lock()
	if p.transactional() && p.pid < 0 {
		p.mu.Unlock()
		return 0 // producerID fences an earlier holder first (transaction.go)
	}
	var skipped []waitingRecord
	retry := time.Duration(0)
	sooner := func(at time.Time) {
		if w := max(at.Sub(now), time.Millisecond); retry == 0 || w < retry {
			retry = w
		}
	}
	for _, pt := range p.parts {
		switch {
		case len(pt.proof.held) == 0 || pt.proof.reading:
		case pt.proof.tail != tailUnknown:
			skipped = p.release(pt, skipped)
		case now.Before(pt.proof.retryAt):
			sooner(pt.proof.retryAt)
		case !pt.proof.since.IsZero() && !now.Before(p.tailDeadline(pt)):
			p.giveUpTail(pt, errTailLate)
			skipped = p.release(pt, skipped)
		case p.reads.free():
			if pt.proof.since.IsZero() {
				pt.proof.since = now
			}
			pt.proof.reading = true
			p.reads.start(p.tailOf, pt, len(p.topics[pt.topic].ids), p.tailDeadline(pt).Sub(now))
		}
	}
	p.mu.Unlock()
	p.ackSkipped(skipped)
	return retry
}

// learnTail takes a read's answer: what pt's tail proves, or why it could
// not be read (read again after a backoff step, or given up: giveUpTail);
// then lets go its held records if the tail is known now. The sender's.
func (p *Producer) learnTail(a tailAnswer) {
	p.reads.took()
	p.mu.Lock()
	pt := a.pt
	pt.proof.reading = false
	switch now := p.clock.Now(); {
	case len(pt.proof.held) == 0:
		// Dropped meanwhile (a fence): nothing waits for the answer.
	case errors.Is(a.err, kafka.TopicAuthorizationFailed):
		// The principal may write the topic but not read it: no
		// de-duplication there (duplicates, never a loss), said once.
		pt.proof.tail = tailPassed
		if !p.tailDenied {
			p.tailDenied = true
			p.log.Warn("cannot read the partition's tail to skip what a restart would produce again: grant the principal READ on the topic (docs/security.md); until then its records are produced again after a restart", "topic", pt.topic, "partition", pt.id, "error", a.err)
		}
	case a.err != nil:
		pt.proof.attempts++
		if pt.proof.attempts >= tailAttempts || !now.Before(p.tailDeadline(pt)) {
			p.giveUpTail(pt, a.err)
			break
		}
		pt.proof.retryAt = now.Add(backoff.Delay(pt.proof.attempts-1, retryMin, retryMax))
		p.log.Debug("could not read the partition's tail; its records wait", "topic", pt.topic, "partition", pt.id, "attempt", pt.proof.attempts, "error", a.err)
	case a.found:
		pt.proof.tail, pt.proof.pos = tailKnown, a.pos
		p.log.Debug("the partition holds the stream's records up to a position: the session's records at or below it are not produced again", "topic", pt.topic, "partition", pt.id, "lsn", a.pos.LSN, "index", a.pos.Index)
	default:
		pt.proof.tail = tailPassed
	}
	// Released under the same lock as the tail is learnt: a record handed
	// over meanwhile queues behind the held ones (hold).
	skipped := p.release(pt, nil)
	p.mu.Unlock()
	p.ackSkipped(skipped)
}

// ackSkipped acknowledges the records a partition already holds, without
// producing them, and counts them (Config.Skipped). Without mu.
func (p *Producer) ackSkipped(skipped []waitingRecord) {
	for i := range skipped {
		if p.cfg.Skipped != nil {
			p.cfg.Skipped(skipped[i].rec.Topic)
		}
		skipped[i].rec.Ack.Ack(nil)
	}
}

// tailAttempts is how many times a partition's tail is read before its
// records go out without it.
const tailAttempts = 3

// errTailLate is why a tail not read within Config.TailTimeout proves
// nothing.
var errTailLate = errors.New("not read within the time its records may wait (half of kafka.delivery_timeout)")

// tailDeadline is when pt's held records stop waiting for its tail:
// Config.TailTimeout after its first read began (a day, when it is 0:
// WriteTimeout bounds each read, tailAttempts their number). Called with
// mu held.
func (p *Producer) tailDeadline(pt *partition) time.Time {
	if p.cfg.TailTimeout <= 0 {
		return pt.proof.since.Add(24 * time.Hour)
	}
	return pt.proof.since.Add(p.cfg.TailTimeout)
}

// giveUpTail lets pt's held records go without the proof of its tail,
// which could not be read (err): a record the partition already holds may
// go out again, a duplicate, never a loss, and never a wedge. Said at WARN
// and counted (Config.TailGivenUp). Called with mu held.
func (p *Producer) giveUpTail(pt *partition, err error) {
	pt.proof.tail = tailPassed
	p.log.Warn("could not read the partition's tail to skip what an earlier session produced: its records go out without restart de-duplication (one the partition already holds may be produced again)",
		"topic", pt.topic, "partition", pt.id, "attempts", pt.proof.attempts, "error", err)
	if p.cfg.TailGivenUp != nil {
		p.cfg.TailGivenUp(pt.topic)
	}
}

// release adds pt's held records to batches, in order, once its tail is
// known, but those at or below the tail, which it appends to skipped.
// Called with mu held.
func (p *Producer) release(pt *partition, skipped []waitingRecord) []waitingRecord {
	if len(pt.proof.held) == 0 || pt.proof.tail == tailUnknown {
		return skipped
	}
	t := p.topics[pt.topic]
	if t.resized {
		pt.proof.tail = tailPassed // routed under another count than the tail's: nothing proven
	}
	for i := range pt.proof.held {
		w := &pt.proof.held[i]
		if w.rec.Pos.LSN != 0 && pt.proof.tail == tailKnown {
			if !w.rec.Pos.After(pt.proof.pos) {
				skipped = append(skipped, *w)
				continue
			}
			pt.proof.tail = tailPassed
		}
		p.appendRecord(t, pt, &w.rec, w.now, w.ts)
	}
	pt.proof.held = nil
	return skipped
}

// withoutStream re-encodes b, in place, without the outboxd.stream header,
// before it is sent (again) in a partition where the broker refused a
// record of the stream (partition.unproven). The batches after the refused
// one were not appended (its sequence is missing), so none of them went out
// with the header. Called with mu held.
func (p *Producer) withoutStream(b *batch) {
	recs, stamps, err := b.records()
	if err != nil {
		// Our own encoding does not decode: a bug, said loudly; the batch
		// goes as it is.
		p.log.Error("could not take the stream header out of a batch", "topic", b.part.topic, "partition", b.part.id, "error", err)
		return
	}
	nb := newBatch(b.part, b.created)
	for i := range recs {
		recs[i].Headers = slices.DeleteFunc(recs[i].Headers, func(h outboxd.Header) bool { return h.Key == HeaderStream })
		nb.add(&recs[i], stamps[i])
	}
	old := *b
	b.buf, b.count, b.baseTime, b.maxTime, b.acks, b.kvBytes = nb.buf, nb.count, nb.baseTime, nb.maxTime, nb.acks, nb.kvBytes
	b.stream, b.abandoned = false, false
	old.release() // its buffer only; nb was never anyone's
}
