package sink

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/initproducerid"

	"github.com/outboxd/outboxd/backoff"
	"github.com/outboxd/outboxd/clock"
)

// The idempotent producer (Config.Idempotence, KIP-98). The producer asks
// the cluster for a producer id and epoch (InitProducerId, without a
// transactional id), stamps every record batch with them and with the
// sequence of its first record, counted per partition, and the partition's
// leader appends a batch only if its sequence follows the last one it
// appended for that producer: a retried batch it already holds is answered
// as a success, with the offset it got the first time (the broker keeps the
// last five batches of each producer per partition, which is why at most
// maxInFlight batches of a partition are in flight), and a batch after a
// gap is refused with OUT_OF_ORDER_SEQUENCE_NUMBER. Retries then never
// duplicate, and a partition's batches can be in flight together without
// reordering: a later one that overtakes a failed earlier one is refused,
// and sent again after it.
//
// What the broker answers, and what the sender does (outcome.go, outcome):
//
//   - DUPLICATE_SEQUENCE_NUMBER: the batch is already there (brokers since
//     1.0 answer a success instead): acknowledged.
//   - OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID for a batch behind
//     an earlier one of its partition whose fate is open: a consequence of
//     that one's failure; sent again after it.
//   - The same for the partition's first open batch, or
//     INVALID_PRODUCER_EPOCH: the leader's idea of the producer is not ours
//     (its state lost or truncated: an unclean leader election, records
//     deleted). KIP-360: the producer takes a new producer id, once every
//     other open batch is settled under the old one, and numbers the
//     partitions from 0 again; the refused batches, which the broker did
//     not append, are sent again under it.
//   - A record refused for its content (dead-lettered; isolate) leaves a
//     gap in its partition's sequences that no batch fills: a new producer
//     id likewise, the batches after it numbered from 0 under it
//     (resetAfterRefusal), never numbered down into the gap.
//   - PRODUCER_FENCED: another producer took this id over; no retry can
//     fix that, the producer fails as for any error the broker does not
//     call retriable.
//
// Brokers since Kafka 3.0 need nothing to accept it (KIP-679 made it the
// Java client's default); the principal needs IDEMPOTENT_WRITE on the
// cluster on brokers before 2.8, where WRITE on a topic does not imply it
// (idempotenceRefused).

// maxInFlight is how many batches of one partition may be in flight at once
// with idempotence: the leader recognises a retry among the last five
// batches of a producer only (ProducerStateEntry.NUM_BATCHES_TO_RETAIN).
const maxInFlight = 5

// pipelineIdle is how long a partition may go without an acknowledgement
// before its next batch goes alone again (partition.pipelined). A leader
// forgets a producer that appended nothing for producer.id.expiration.ms
// (1 day by default) and then appends a batch at any sequence: one sent
// behind a batch refused before its append (NOT_ENOUGH_REPLICAS) would be
// appended before it, which is sent again under a new producer id after
// it, two events of one key out of commit order. Well under the broker's
// default, which a cluster may lower.
const pipelineIdle = 10 * time.Minute

// initProducerIDRequest is InitProducerId without a transactional id, sent
// to any broker. kafka-go's own request type says it is transactional, so
// its Transport sends it to the coordinator of the transactional id "" it
// looks up first, which an ACL on transactional ids refuses; this type,
// registered as an override of the same API, is sent to the bootstrap
// brokers, as the Java client sends it to the least loaded one. Its fields
// are the protocol's (versions 0 to 4; 2 and later are flexible).
type initProducerIDRequest struct {
	_                    struct{} `kafka:"min=v2,max=v4,tag"`
	TransactionalID      string   `kafka:"min=v0,max=v4,nullable"`
	TransactionTimeoutMs int32    `kafka:"min=v0,max=v4"`
	ProducerID           int64    `kafka:"min=v3,max=v4"`
	ProducerEpoch        int16    `kafka:"min=v3,max=v4"`
}

// overrideInitProducerID is its key among kafka-go's type overrides of the
// InitProducerId API (rawproduce holds key 0 of Produce).
const overrideInitProducerID protocol.OverrideTypeKey = 1

func init() {
	protocol.RegisterOverride(&initProducerIDRequest{}, &initproducerid.Response{}, overrideInitProducerID)
}

func (r *initProducerIDRequest) ApiKey() protocol.ApiKey { return protocol.InitProducerId }

func (r *initProducerIDRequest) TypeKey() protocol.OverrideTypeKey { return overrideInitProducerID }

// newProducerID asks the cluster for a producer id and epoch. KIP-360's
// fields (the current id and epoch, to bump it) do not apply to a producer
// without a transactional id: the broker gives a new id each time.
func newProducerID(ctx context.Context, rt kafka.RoundTripper, addr net.Addr, timeout time.Duration) (int64, int16, error) {
	return initProducerID(ctx, rt, addr, timeout, &initProducerIDRequest{ProducerID: -1, ProducerEpoch: -1})
}

// initProducerID sends an InitProducerId request (without a transactional
// id, or with one: transactionalProducerID) and reads its answer.
func initProducerID(ctx context.Context, rt kafka.RoundTripper, addr net.Addr, timeout time.Duration, req protocol.Message) (int64, int16, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := rt.RoundTrip(ctx, addr, req)
	if err != nil {
		return 0, 0, err
	}
	r, ok := res.(*initproducerid.Response)
	if !ok {
		return 0, 0, fmt.Errorf("unexpected InitProducerId response %T", res)
	}
	if r.ErrorCode != 0 {
		return 0, 0, kafka.Error(r.ErrorCode)
	}
	return r.ProducerID, r.ProducerEpoch, nil
}

// producerID gets the producer an id when it is idempotent, has batches to
// send and has none (at the first batch, and after a reset): once every
// batch stamped with the old one is settled. It returns how long to wait
// before trying again (0: nothing to wait for). A refusal no retry can fix
// fences the producer with an IdempotenceError. Called by the sender
// goroutine, without mu.
func (p *Producer) producerID(now time.Time) time.Duration {
	if !p.cfg.Idempotence {
		return 0
	}
	p.mu.Lock()
	p.resetProducerID()
	need := p.pid < 0 && p.fenced == nil && p.inFlight == 0 && p.hasWork()
	wait := p.pidRetryAt.Sub(now)
	p.mu.Unlock()
	if !need {
		return 0
	}
	if wait > 0 {
		return wait
	}
	var pid int64
	var epoch int16
	var err error
	if p.transactional() {
		pid, epoch, err = p.transactionalProducerID(p.ctx, p.lastPid, p.lastEpoch)
	} else {
		pid, epoch, err = newProducerID(p.ctx, p.rt, p.bootstrap(), p.cfg.WriteTimeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		p.pid, p.epoch, p.pidAttempts, p.pidRetryAt = pid, epoch, 0, time.Time{}
		p.lastPid, p.lastEpoch = pid, epoch
		for _, pt := range p.parts {
			pt.nextSeq, pt.pipelined = 0, false
		}
		p.log.Debug("producer id", "producer_id", pid, "epoch", epoch)
		return 0
	}
	if p.transactional() && !retriable(err) && authFailure(err) == nil {
		p.fence(txnFailure("get a producer id", p.cfg.TransactionalID, err))
		return 0
	}
	if ie := idempotenceRefused(err); ie != nil {
		if p.fenced == nil {
			// Not logged: every waiting record fails with it, and the
			// caller ends its session with it (log or return).
			p.fenced = fenceError(ie)
		}
		return 0
	}
	p.pidAttempts++
	p.pidRetryAt = now.Add(backoff.Delay(p.pidAttempts-1, retryMin, retryMax))
	p.log.Debug("no producer id yet; retrying", "attempt", p.pidAttempts, "error", err)
	return p.pidRetryAt.Sub(now)
}

// hasWork says whether any batch waits to be sent. Called with mu held.
func (p *Producer) hasWork() bool {
	for _, pt := range p.parts {
		if pt.open != nil || len(pt.queued) > 0 || len(pt.sent) > 0 || pt.proof.holding() {
			return true
		}
	}
	return false
}

// stamp gives b the producer's id and epoch and the next sequences of its
// partition, unless it has them already. Called with mu held.
func (p *Producer) stamp(b *batch) {
	if !p.cfg.Idempotence || b.pid == p.pid && b.epoch == p.epoch && b.pid >= 0 {
		return
	}
	pt := b.part
	b.pid, b.epoch, b.seq, b.txn = p.pid, p.epoch, pt.nextSeq, p.transactional()
	pt.nextSeq = addSeq(pt.nextSeq, b.count)
}

// addSeq is seq + n as the protocol counts sequences, modulo 2^31: after
// MaxInt32 comes 0 (the Java client's DefaultRecordBatch.incrementSequence);
// n may be negative.
func addSeq(seq, n int32) int32 {
	return int32((int64(seq) + int64(n)) & math.MaxInt32)
}

// sequenceError says whether err is the broker refusing a batch for its
// producer id, epoch or sequence: the batch was not appended.
func sequenceError(err error) bool {
	return errors.Is(err, kafka.OutOfOrderSequenceNumber) || errors.Is(err, kafka.UnknownProducerId) ||
		errors.Is(err, kafka.InvalidProducerEpoch) || errors.Is(err, kafka.InvalidProducerIDMapping)
}

// IdempotenceError is a cluster or a principal that cannot produce
// idempotently (kafka.idempotence: true): no retry can fix it.
type IdempotenceError struct {
	Why string // what the brokers refused
	Fix string // the way out
	Err error  // their answer
}

func (e *IdempotenceError) Error() string {
	return e.Why + " (" + codeName(e.Err) + "): " + e.Fix
}

func (e *IdempotenceError) Unwrap() error { return e.Err }

// Permanent: see RecordError.
func (e *IdempotenceError) Permanent() string { return e.Error() }

// idempotenceRefused is the IdempotenceError of an InitProducerId answer
// no retry can change, nil for any other (an outage).
func idempotenceRefused(err error) *IdempotenceError {
	if ae := authFailure(err); ae != nil {
		return nil // a TLS or SASL refusal: the produce path names it
	}
	var kerr kafka.Error
	if !errors.As(err, &kerr) || retriable(err) {
		return nil
	}
	const off = "or set kafka.idempotence: false (a retry after a lost acknowledgement may then duplicate records)"
	ie := &IdempotenceError{Err: err, Why: "the brokers refused outboxd a producer id for idempotent produce",
		Fix: "see the broker's log, " + off}
	switch kerr {
	case kafka.ClusterAuthorizationFailed:
		ie.Why = "the brokers refused outboxd's principal a producer id for idempotent produce"
		ie.Fix = "grant it WRITE on the routed topics (enough since Kafka 2.8), or IDEMPOTENT_WRITE on the cluster, which brokers before 2.8 require " +
			"(kafka-acls.sh --add --allow-principal User:NAME --operation IdempotentWrite --cluster), " + off
	case kafka.UnsupportedVersion:
		ie.Why = "the brokers do not support idempotent produce (InitProducerId)"
		ie.Fix = "upgrade them, " + off
	}
	return ie
}

// probeBudget bounds ProbeIdempotence's retries: a KRaft broker answers
// the first InitProducerId after its start COORDINATOR_LOAD_IN_PROGRESS
// while it fetches a block of producer ids from the controller.
const probeBudget = 10 * time.Second

// ProbeIdempotence asks the brokers for a producer id as the producer does
// at its first batch, with cfg's connection settings, retrying an answer
// the producer would retry for up to probeBudget: nil when they give one,
// an *IdempotenceError when they refuse in a way no retry can change (with
// the way out), another error when no broker gave one in time. The id is
// never used: asking for one changes nothing but the cluster's producer id
// counter.
func ProbeIdempotence(ctx context.Context, cfg Config) error {
	t := newTransport(cfg)
	defer t.CloseIdleConnections()
	return probeIdempotence(ctx, t, kafka.TCP(cfg.Brokers...), probeBudget, clock.Or(cfg.Clock))
}

func probeIdempotence(ctx context.Context, rt kafka.RoundTripper, addr net.Addr, budget time.Duration, c clock.Clock) error {
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	for attempt := 1; ; attempt++ {
		_, _, err := newProducerID(ctx, rt, addr, dialTimeout)
		if err == nil {
			return nil
		}
		if ie := idempotenceRefused(err); ie != nil {
			return ie
		}
		if !retriable(err) {
			return err
		}
		if !clock.Sleep(ctx, c, backoff.Delay(attempt-1, retryMin, retryMax)) {
			return err
		}
	}
}
