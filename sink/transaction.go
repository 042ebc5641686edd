package sink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/addpartitionstotxn"
	"github.com/segmentio/kafka-go/protocol/endtxn"
	"github.com/segmentio/kafka-go/protocol/findcoordinator"
	"github.com/segmentio/kafka-go/protocol/initproducerid"

	"github.com/outboxd/outboxd/backoff"
	"github.com/outboxd/outboxd/clock"
)

// The transactional producer (Config.TransactionalID, kafka.transactions;
// KIP-98). It is the idempotent producer, whose producer id comes from the
// transaction coordinator of its transactional id, and whose batches go
// out in transactions: a read_committed consumer sees a transaction's
// records once it is committed, never those of one that is aborted.
//
// What it adds to the idempotent producer:
//
//   - InitProducerId with the transactional id (sent to its coordinator)
//     gives the producer its id and a new epoch, and aborts the
//     transaction an earlier holder of the id left open. Every later
//     request of that earlier holder is refused (PRODUCER_FENCED,
//     INVALID_PRODUCER_EPOCH): an outboxd frozen while another took the
//     slot over is fenced at its first request (fencedByAnother), its
//     records never reach a read_committed consumer, and it stops.
//   - Before a partition's first batch of a transaction goes out, the
//     partition joins the transaction (AddPartitionsToTxn; joinTransaction).
//   - Batches the leaders acknowledged are not completed (their records'
//     Ackers are not told, so the slot is not confirmed past them) until
//     the transaction commits (EndTxn; commit): Config.TransactionInterval
//     after it began, as soon as nothing is left to send, before the
//     producer takes a new epoch (a reset: it would abort the
//     transaction), and when the producer closes. No round is sent while a
//     commit is due; the next transaction begins after it.
//   - A commit refused for good, or a batch refused by the fence, fences
//     the producer: every batch of the open transaction fails (dropAll),
//     acknowledged or not, and the next session's InitProducerId aborts
//     the transaction.
//
// Restart de-duplication reads committed records only (tail.go), once the
// session has its producer id: the coordinator has then completed every
// transaction of an earlier holder, so what they committed is below the
// partitions' last stable offsets, and what they left open is aborted.

// transactionTimeout is the transaction.timeout.ms outboxd asks for: the
// coordinator aborts a transaction left open longer (an instance frozen
// with no successor). The brokers' transaction.max.timeout.ms (15 min by
// default) must allow it.
const transactionTimeout = time.Minute

// txnState is the open transaction. Changed by the sender goroutine, under
// mu.
type txnState struct {
	// parts: the partitions added to it; started: when the first was
	// (zero: no transaction is open).
	parts   map[*partition]bool
	started time.Time
	// done: batches settled (acknowledged, or refused for their content)
	// in it, in the order they are to be completed once it commits.
	done []*batch
	// committing: a commit is due; no round is sent until it is made.
	committing bool
	// attempts, retryAt: commits or joins that failed in a row, and when
	// to try again.
	attempts int
	retryAt  time.Time
}

// open says whether a transaction is open (a partition joined it).
func (t *txnState) open() bool { return !t.started.IsZero() }

// in says whether pt joined the open transaction.
func (t *txnState) in(pt *partition) bool { return t.parts[pt] }

// keep holds settled batches until the transaction commits.
func (t *txnState) keep(bs []*batch) { t.done = append(t.done, bs...) }

// joined adds parts to the transaction, which begins at now with the
// first, and forgets the failures before.
func (t *txnState) joined(parts []*partition, now time.Time) {
	if t.parts == nil {
		t.parts = map[*partition]bool{}
		t.started = now
	}
	for _, pt := range parts {
		t.parts[pt] = true
	}
	t.attempts, t.retryAt = 0, time.Time{}
}

// committed ends the transaction, committed: its batches, to be completed
// in order.
func (t *txnState) committed() []*batch {
	done := t.done
	*t = txnState{}
	return done
}

// aborted ends the transaction, aborted: its batches, failed with err
// (acknowledged by their leaders, they are aborted all the same).
func (t *txnState) aborted(err error) []*batch {
	done := t.done
	for _, b := range done {
		if b.state == acked {
			b.state, b.err = failed, err
		}
	}
	*t = txnState{}
	return done
}

// failedAt counts a join or a commit that failed with err at now and says
// when to try again: soon after CONCURRENT_TRANSACTIONS (the coordinator
// writing the last commit's markers), else after the usual backoff.
func (t *txnState) failedAt(err error, now time.Time) time.Time {
	t.attempts++
	lo, hi := retryMin, retryMax
	if errors.Is(err, kafka.ConcurrentTransactions) {
		lo, hi = concurrentMin, concurrentMax
	}
	t.retryAt = now.Add(backoff.Delay(t.attempts-1, lo, hi))
	return t.retryAt
}

func (p *Producer) transactional() bool { return p.cfg.TransactionalID != "" }

// finish completes settled batches, or, in a transaction, keeps them until
// it commits.
func (p *Producer) finish(bs []*batch) {
	if !p.transactional() || len(bs) == 0 {
		p.completeAll(bs)
		return
	}
	p.mu.Lock()
	p.txn.keep(bs)
	p.mu.Unlock()
}

// transact commits the open transaction when a commit is due and no round
// is in flight, and decides whether one is due. It returns how long to
// wait before trying again (0: nothing to wait for). Called by the sender
// goroutine, without mu.
func (p *Producer) transact(now time.Time) time.Duration {
	if !p.transactional() {
		return 0
	}
	p.mu.Lock()
	if p.fenced != nil || !p.txn.open() {
		p.mu.Unlock()
		return 0
	}
	if !p.txn.committing {
		age := now.Sub(p.txn.started)
		p.txn.committing = p.closing || p.resetReady() || age >= p.cfg.TransactionInterval || !p.sendable()
		if !p.txn.committing {
			p.mu.Unlock()
			return p.cfg.TransactionInterval - age
		}
	}
	if p.rounds > 0 {
		p.mu.Unlock()
		return 0 // a round coming back wakes the sender
	}
	if wait := p.txn.retryAt.Sub(now); wait > 0 {
		p.mu.Unlock()
		return wait
	}
	pid, epoch := p.pid, p.epoch
	p.mu.Unlock()

	err := p.endTxn(pid, epoch)
	p.mu.Lock()
	if err != nil {
		defer p.mu.Unlock()
		return p.txnFailed("commit the transaction", err, now)
	}
	done := p.txn.committed()
	p.mu.Unlock()
	p.completeAll(done)
	return 0
}

// concurrentMin and concurrentMax bound the backoff after
// CONCURRENT_TRANSACTIONS, which the coordinator answers for the few
// milliseconds it writes the last commit's markers: the next transaction's
// first AddPartitionsToTxn meets it at every commit under load (the Java
// client retries it after 20 ms, not its usual 100).
const concurrentMin, concurrentMax = 2 * time.Millisecond, 10 * time.Millisecond

// operationNotAttempted is OPERATION_NOT_ATTEMPTED (55), which kafka-go
// does not name.
const operationNotAttempted = kafka.Error(55)

// txnFailed handles a join or a commit that failed with err: it fences
// the producer when no retry can fix it, else it says how long to wait
// before trying again. Called with mu held.
func (p *Producer) txnFailed(step string, err error, now time.Time) time.Duration {
	switch {
	case errors.Is(err, kafka.TopicAuthorizationFailed):
		// As the produce path: outboxd stops with the ACL to grant.
		p.fence(&RecordError{Reason: permanent(err), Err: err})
		return 0
	case !retriable(err):
		p.fence(txnFailure(step, p.cfg.TransactionalID, err))
		return 0
	}
	retryAt := p.txn.failedAt(err, now)
	p.log.Debug(step+" failed; retrying", "attempt", p.txn.attempts, "error", err)
	return retryAt.Sub(now)
}

// sendable says whether a batch of a partition is open, queued, in flight
// or to be sent again, or records wait for their topic or tail. Called
// with mu held.
func (p *Producer) sendable() bool {
	if p.hasWork() {
		return true
	}
	for _, t := range p.topics {
		if len(t.waiting) > 0 {
			return true
		}
	}
	return false
}

// joinTransaction adds to the transaction (beginning one) the partitions
// with a batch to send that are not in it. It returns how long to wait
// before trying again after a failure. Called by the sender goroutine,
// without mu.
func (p *Producer) joinTransaction(now time.Time) time.Duration {
	if !p.transactional() {
		return 0
	}
	p.mu.Lock()
	if p.fenced != nil || p.pid < 0 || p.txn.committing {
		p.mu.Unlock()
		return 0
	}
	if wait := p.txn.retryAt.Sub(now); wait > 0 {
		p.mu.Unlock()
		return wait
	}
	// Every partition with a batch joins, one to be sent again later too
	// (its backoff's timer is nextBatch's once it is in): a partition in a
	// transaction that sends nothing in it costs a marker.
	var join []*partition
	for _, pt := range p.parts {
		if !p.txn.in(pt) && (pt.open != nil || len(pt.queued) > 0 || len(pt.sent) > 0) {
			join = append(join, pt)
		}
	}
	pid, epoch := p.pid, p.epoch
	p.mu.Unlock()
	if len(join) == 0 {
		return 0
	}
	err := p.addPartitions(pid, epoch, join)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		return p.txnFailed("add partitions to the transaction", err, now)
	}
	p.txn.joined(join, now)
	return 0
}

// addPartitions is AddPartitionsToTxn (kafka-go sends it to the
// transactional id's coordinator): nil once every partition is in the
// transaction, else the first partition's error.
func (p *Producer) addPartitions(pid int64, epoch int16, parts []*partition) error {
	req := &addpartitionstotxn.Request{TransactionalID: p.cfg.TransactionalID, ProducerID: pid, ProducerEpoch: epoch}
	byTopic := map[string]int{}
	for _, pt := range parts {
		i, ok := byTopic[pt.topic]
		if !ok {
			i = len(req.Topics)
			byTopic[pt.topic] = i
			req.Topics = append(req.Topics, addpartitionstotxn.RequestTopic{Name: pt.topic})
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, pt.id)
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.WriteTimeout)
	defer cancel()
	res, err := p.rt.RoundTrip(ctx, p.bootstrap(), req)
	if err != nil {
		return err
	}
	r, ok := res.(*addpartitionstotxn.Response)
	if !ok {
		return fmt.Errorf("unexpected AddPartitionsToTxn response %T", res)
	}
	var notAttempted error
	for _, t := range r.Results {
		for _, pa := range t.Results {
			switch code := kafka.Error(pa.ErrorCode); {
			case code == 0:
			case code == operationNotAttempted:
				// The others, when one partition failed: that one's
				// error is the answer.
				notAttempted = fmt.Errorf("%s/%d: %w", t.Name, pa.PartitionIndex, code)
			default:
				return fmt.Errorf("%s/%d: %w", t.Name, pa.PartitionIndex, code)
			}
		}
	}
	return notAttempted
}

// endTxn commits the transaction (EndTxn, to the coordinator).
func (p *Producer) endTxn(pid int64, epoch int16) error {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.WriteTimeout)
	defer cancel()
	res, err := p.rt.RoundTrip(ctx, p.bootstrap(), &endtxn.Request{TransactionalID: p.cfg.TransactionalID,
		ProducerID: pid, ProducerEpoch: epoch, Committed: true})
	if err != nil {
		return err
	}
	r, ok := res.(*endtxn.Response)
	if !ok {
		return fmt.Errorf("unexpected EndTxn response %T", res)
	}
	if r.ErrorCode != 0 {
		return kafka.Error(r.ErrorCode)
	}
	return nil
}

// transactionalProducerID asks the transactional id's coordinator for the
// producer id and a new epoch: the first time (pid -1), it fences any
// earlier holder of the id and aborts what it left open; after a reset it
// names the id and epoch it had (KIP-360), so a coordinator that gave
// them to another holder meanwhile refuses (PRODUCER_FENCED).
func (p *Producer) transactionalProducerID(ctx context.Context, pid int64, epoch int16) (int64, int16, error) {
	return initProducerID(ctx, p.rt, p.bootstrap(), p.cfg.WriteTimeout, &initproducerid.Request{TransactionalID: p.cfg.TransactionalID,
		TransactionTimeoutMs: int32(transactionTimeout / time.Millisecond), ProducerID: pid, ProducerEpoch: epoch})
}

// fencedByAnother says whether err is the coordinator or a leader refusing
// this producer because another took its transactional id over (or the
// coordinator aborted its transaction, open past transactionTimeout, which
// bumps the epoch the same way).
func fencedByAnother(err error) bool {
	return errors.Is(err, kafka.ProducerFenced) || errors.Is(err, kafka.InvalidProducerEpoch) ||
		errors.Is(err, kafka.TransactionCoordinatorFenced)
}

// transactionAborted is TRANSACTION_ABORTABLE (120), which kafka-go does
// not name.
const transactionAborted = kafka.Error(120)

// txnStateError says whether err is a leader refusing a transactional
// batch for its transaction's state: the transaction cannot commit, and
// the next session sends its records again.
func txnStateError(err error) bool {
	return errors.Is(err, kafka.InvalidTransactionState) || errors.Is(err, kafka.InvalidProducerIDMapping) ||
		errors.Is(err, transactionAborted)
}

// TransactionError is a transaction that failed for good: outboxd was
// fenced by another instance holding the same transactional id, or the
// principal may not use it. Nothing of the open transaction was committed.
type TransactionError struct {
	Step string // what failed
	ID   string // the transactional id
	Fix  string
	Err  error
}

func (e *TransactionError) Error() string {
	return fmt.Sprintf("%s (transactional id %q): %s: %s", e.Step, e.ID, codeName(e.Err), e.Fix)
}

func (e *TransactionError) Unwrap() error { return e.Err }

// txnFailure names what failed and the way out: an *IdempotenceError
// (outboxd stops) when the principal may not use the transactional id or
// the brokers refuse its timeout, else a *TransactionError (the session
// ends; the next one waits for the slot).
func txnFailure(step, id string, err error) error {
	if errors.Is(err, kafka.ClusterAuthorizationFailed) || errors.Is(err, kafka.UnsupportedVersion) {
		if ie := idempotenceRefused(err); ie != nil {
			return ie
		}
	}
	switch {
	case errors.Is(err, kafka.TransactionalIDAuthorizationFailed):
		return &IdempotenceError{Err: err, Why: fmt.Sprintf("the brokers refused outboxd's principal the transactional id %q (%s)", id, step),
			Fix: fmt.Sprintf("grant it WRITE and DESCRIBE on the transactional id "+
				"(kafka-acls.sh --add --allow-principal User:NAME --operation Write --operation Describe --transactional-id %s), "+
				"or set kafka.transactions: false", id)}
	case errors.Is(err, kafka.InvalidTransactionTimeout):
		return &IdempotenceError{Err: err, Why: "the brokers refused outboxd's transaction timeout",
			Fix: fmt.Sprintf("raise their transaction.max.timeout.ms to at least %d, or set kafka.transactions: false", transactionTimeout/time.Millisecond)}
	}
	te := &TransactionError{Step: step, ID: id, Err: err,
		Fix: "nothing of the open transaction was committed; the next session sends it again"}
	if fencedByAnother(err) {
		te.Fix = "another outboxd took this transactional id (this slot) over, or the coordinator aborted the transaction after " +
			transactionTimeout.String() + " open; it is aborted and this session ends"
	}
	return te
}

// ProbeTransactions asks the brokers for the coordinator of the
// transactional id, as kafka-go does before each transactional request,
// retrying what the producer retries for up to probeBudget: the broker's
// id, or why not (TRANSACTIONAL_ID_AUTHORIZATION_FAILED: the principal may
// not DESCRIBE the id, an *IdempotenceError with the way out). It does not
// ask for a producer id: that would fence an outboxd running with the id.
func ProbeTransactions(ctx context.Context, cfg Config, id string) (int32, error) {
	t := newTransport(cfg)
	defer t.CloseIdleConnections()
	c := clock.Or(cfg.Clock)
	ctx, cancel := context.WithTimeout(ctx, probeBudget)
	defer cancel()
	for attempt := 1; ; attempt++ {
		node, err := findCoordinator(ctx, t, kafka.TCP(cfg.Brokers...), id)
		if err == nil {
			return node, nil
		}
		if !retriable(err) {
			return -1, txnFailure("find the transaction coordinator", id, err)
		}
		if !clock.Sleep(ctx, c, backoff.Delay(attempt-1, retryMin, retryMax)) {
			return -1, err
		}
	}
}

func findCoordinator(ctx context.Context, rt kafka.RoundTripper, addr net.Addr, id string) (int32, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	res, err := rt.RoundTrip(ctx, addr, &findcoordinator.Request{Key: id, KeyType: int8(kafka.CoordinatorKeyTypeTransaction)})
	if err != nil {
		return -1, err
	}
	r, ok := res.(*findcoordinator.Response)
	if !ok {
		return -1, fmt.Errorf("unexpected FindCoordinator response %T", res)
	}
	if r.ErrorCode != 0 {
		return -1, kafka.Error(r.ErrorCode)
	}
	return r.NodeID, nil
}
