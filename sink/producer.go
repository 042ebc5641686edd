// Package sink produces records to Kafka: acks=all, a key partitioner
// compatible with the Java client (murmur2) or with librdkafka (crc32), and
// one completion per record.
//
// It encodes record batches and produce requests itself and sends them on
// its own connections, one per broker (wire.go); everything else
// (metadata, API versions, tails, transactions) goes through kafka-go's
// Transport. kafka-go's Writer sends
// one produce request per partition batch, so small transactions spread
// over many partitions cost a request each; this producer sends, in rounds,
// one request per leader broker that carries a batch for every partition
// with records waiting, like the Java producer.
//
// Idempotent (Config.Idempotence, the default; idempotence.go), it stamps
// each batch with a producer id and per-partition sequence numbers, so the
// leader drops a retried batch it already holds and refuses one that
// overtook an earlier one: up to five rounds, and five batches of a
// partition, are in flight at once, and a retry never duplicates. Without
// it, one round is in flight at a time, so a partition's batches reach the
// broker strictly in order. Either way a failed batch is sent again (or,
// refused as too large, split and sent again) before anything later of its
// partition, records are acknowledged in their partition's order, and once
// a batch fails for good the producer is fenced and sends nothing more.
//
// The files follow the path of a record: config.go (Config), producer.go
// (Produce, batching), metadata.go (topic layout), dedupe.go and tail.go
// (restart de-duplication), round.go (what the next round takes),
// sender.go (sending rounds), wire.go (produce requests on the wire),
// outcome.go (what an answer does to a batch),
// idempotence.go (producer id, sequences), transaction.go (Kafka
// transactions), batch.go (the v2 record batch), codec.go, errors.go (what
// fails for good), dial.go (every connection to Kafka).
package sink

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/compress"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/clock"
)

// Producer sends records asynchronously; each record's Acker learns its
// outcome. A Producer is used for one replication session: after a failure
// it is fenced and must be closed and replaced.
type Producer struct {
	cfg       Config
	rt        kafka.RoundTripper
	transport *kafka.Transport // nil when rt was given (tests)
	// wires: the produce requests' own connections (wire.go); nil when rt
	// was given, and produce requests go through rt.
	wires *wires
	addr  net.Addr // the bootstrap brokers (mu: learnBrokers adds to them)
	// The brokers' addresses by id (learnBrokers), the ones not to ask for
	// metadata until a time (avoidBroker), and the addresses asked now
	// (bootstrap). Under mu.
	brokerAddrs map[int32]string
	avoid       map[int32]time.Time
	boot        net.Addr
	bal         kafka.Balancer
	codec       compress.Codec // nil: no compression
	log         hclog.Logger
	clock       clock.Clock
	topicWait   time.Duration
	// metadataTTL is metadataTTL (metadata.go); tests shorten it.
	metadataTTL time.Duration
	// autoCreate is the brokers' auto.create.topics.enable, read once a
	// topic is first called missing; nil: not read yet. Only the sender
	// goroutine uses it.
	autoCreate *autoCreation

	ctx    context.Context // cancelled when Close gives up
	cancel context.CancelFunc
	kick   chan struct{}
	done   chan struct{} // closed when the sender goroutine has returned

	mu      sync.Mutex
	topics  map[string]*topic
	parts   []*partition // every known partition, in a stable order
	next    int          // where the next round starts in parts
	fenced  error        // the error every later record gets
	closing bool
	// due: Flush asked, while no request was in flight, for what is
	// batched to go out without lingering: the next round takes every
	// open batch.
	due bool
	// rounds: the rounds in flight (at most maxRounds); inFlight: their
	// batches.
	rounds, inFlight int
	// paceUntil: a flushed round waits until then: the last round's end
	// plus its duration (see takeRound).
	paceUntil time.Time
	// finished hands a round back to the sender goroutine when its
	// requests have been answered.
	finished chan *round

	// The producer id and epoch every batch is stamped with (idempotence);
	// pid -1: none yet, or given up after a sequence error (reset).
	pid   int64
	epoch int16
	// lastPid, lastEpoch: the last the producer had (-1: none yet), which
	// a transactional producer names when it asks again after a reset.
	lastPid   int64
	lastEpoch int16
	// txn: the open transaction (transaction.go).
	txn txnState
	// reset: a partition's leader refused a batch for its sequence or
	// epoch (batch.reseq), or a record for its content (a gap in its
	// sequences: resetAfterRefusal); the producer takes a new id once the
	// batches stamped with the old one before it are settled, and sends no
	// new batch meanwhile.
	reset bool
	// pidAttempts, pidRetryAt: InitProducerId failures in a row, and when
	// to ask again.
	pidAttempts int
	pidRetryAt  time.Time
	idleLogged  bool // logIdleWithWork said it for this spell
	// wakeAt: when the sender's timer wakes it, zero while it waits for a
	// kick or a round only; set with every round it takes or passes up.
	// A new batch whose linger ends no sooner needs no kick (appendRecord):
	// at the rates services run, most records open a batch, and a kick per
	// record woke the sender only to set that timer again (issue 36).
	wakeAt time.Time
	// Scratch for the outboxd.stream header (withStream), under mu.
	streamHeaders []outboxd.Header
	streamValue   []byte
	mac           *streamMAC // its MAC (streamkey.go)
	// tailOf reads a partition's tail (readKafkaTail; tests replace it),
	// reads runs it off the sender's path (tailreads.go); tailDenied: a
	// read was refused for want of READ (said once).
	tailOf     tailReader
	reads      *tailReads
	tailDenied bool
}

type topic struct {
	name    string
	ids     []int // partition ids, for the balancer
	parts   map[int]*partition
	fetched time.Time // when its layout was last read; zero: not known yet
	stale   bool      // a batch failed: read its leaders again now
	// resized: its partition count changed during this producer's life
	// (dedupe.go: its records prove nothing from then on).
	resized bool
	waiting []waitingRecord // records that came before its layout was known
	// While its layout is not known: the first answer that called it
	// missing since the cluster last failed to answer, and how many did
	// (topicFailure).
	missingSince   time.Time
	missingAnswers int
}

// New builds a producer for cfg.Brokers. It does not connect until the
// first record.
func New(cfg Config, log hclog.Logger) (*Producer, error) {
	return NewWithTransport(cfg, log, nil)
}

// NewWithTransport builds a producer that sends through rt: a fake broker
// in tests and benchmarks, or, when nil, a kafka-go Transport for
// cfg.Brokers. cfg is taken as given: config.Default fills every field.
func NewWithTransport(cfg Config, log hclog.Logger, rt kafka.RoundTripper) (*Producer, error) {
	var ws *wires
	if rt == nil {
		ws = newWires(cfg)
	}
	return newProducer(cfg, log, rt, ws)
}

// newProducer builds a producer that sends produce requests on ws, or
// through rt when ws is nil, and everything else through rt (a Transport
// for cfg.Brokers when nil).
func newProducer(cfg Config, log hclog.Logger, rt kafka.RoundTripper, ws *wires) (*Producer, error) {
	bal, err := balancer(cfg.Partitioner)
	if err != nil {
		return nil, err
	}
	if cfg.TransactionalID != "" && (!cfg.Idempotence || cfg.TransactionInterval <= 0) {
		return nil, fmt.Errorf("a transactional producer needs idempotence and a transaction interval")
	}
	if !slices.Contains(PartitionChanges(), cfg.OnPartitionChange) {
		return nil, fmt.Errorf("unknown partition change policy %q (want %s)", cfg.OnPartitionChange, either(PartitionChanges()))
	}
	cd, err := codec(cfg.Compression)
	if err != nil {
		return nil, err
	}
	p := &Producer{cfg: cfg, rt: rt, addr: kafka.TCP(cfg.Brokers...), bal: bal, codec: cd, log: log, clock: clock.Or(cfg.Clock),
		kick: make(chan struct{}, 1), done: make(chan struct{}), topics: map[string]*topic{}, topicWait: topicWait, metadataTTL: metadataTTL,
		finished: make(chan *round, maxRounds), pid: -1, epoch: -1, lastPid: -1, lastEpoch: -1}
	p.tailOf, p.reads = p.readKafkaTail, newTailReads()
	p.mac = newStreamMAC(cfg.StreamKey, cfg.TransactionalID != "")
	if rt == nil {
		p.transport = newTransport(cfg)
		p.rt = p.transport
	}
	p.wires = ws
	p.ctx, p.cancel = context.WithCancel(context.Background())
	if p.wires != nil {
		context.AfterFunc(p.ctx, p.wires.close) // a request in flight fails at once
	}
	go p.run()
	return p, nil
}

// Produce encodes r into its partition's batch and returns without waiting
// for the network; r's Acker learns its outcome later. r's bytes are
// copied: the caller may reuse them as soon as Produce returns. On an error
// r is failed through its Acker too, and the caller must stop and replace
// the producer.
func (p *Producer) Produce(r *outboxd.Record) error {
	now := p.clock.Now()
	// The record's CreateTime, as the Java client sets it, unless the
	// record carries its own.
	ts := r.Time
	if ts == 0 {
		ts = now.UnixMilli()
	}
	if err := p.add(r, now, ts); err != nil {
		p.failRecord(r, now, err)
		return err
	}
	return nil
}

// failRecord tells a record that never reached a batch its failure, after
// observing it, as complete does for a batch: the produce error counts
// cover every failed record, wherever it failed.
func (p *Producer) failRecord(r *outboxd.Record, since time.Time, err error) {
	p.observe(r.Topic, 1, int64(len(r.Key)+len(r.Value)), since, err)
	r.Ack.Ack(err)
}

func (p *Producer) observe(topic string, records int, kvBytes int64, since time.Time, err error) {
	if p.cfg.Observe != nil {
		p.cfg.Observe(topic, records, kvBytes, clock.Since(p.clock, since), err)
	}
}

func (p *Producer) add(r *outboxd.Record, now time.Time, ts int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fenced != nil {
		return p.fenced
	}
	if p.closing {
		return errClosed
	}
	t := p.topics[r.Topic]
	if t == nil {
		t = &topic{name: r.Topic, parts: map[int]*partition{}}
		p.topics[r.Topic] = t
	}
	if t.fetched.IsZero() {
		// Its partitions are not known yet: the sender asks the cluster.
		// The record waits as a copy, in order, so Produce never blocks on
		// the network (the stream goes on sending standby status).
		t.waiting = append(t.waiting, waitingRecord{rec: cloneRecord(r), now: now, ts: ts})
		p.poke()
		return nil
	}
	p.encode(t, r, now, ts)
	return nil
}

// encode adds r to its partition's batch. A record larger than BatchBytes
// goes alone in its own batch: whether a record may be produced was decided
// before, and the broker has the last word (outcome.go, isolate). Called
// with mu held.
func (p *Producer) encode(t *topic, r *outboxd.Record, now time.Time, ts int64) {
	part := t.parts[p.bal.Balance(kafka.Message{Key: r.Key}, t.ids...)]
	if p.hold(t, part, r, now, ts) {
		return
	}
	p.appendRecord(t, part, r, now, ts)
}

// appendRecord adds r to part's open batch. Called with mu held.
func (p *Producer) appendRecord(t *topic, part *partition, r *outboxd.Record, now time.Time, ts int64) {
	rs := p.withStream(t, part, r)
	b := part.open
	kick := false
	if b != nil && int64(len(b.buf)+b.encodedLen(rs, ts)) > p.cfg.BatchBytes {
		part.seal()
		b, kick = nil, true
	}
	if b == nil {
		b = newBatch(part, now)
		part.open = b
		// A timer already set to wake the sender before the batch's linger
		// ends (the sender then takes a round or sets it again) serves the
		// new batch too.
		kick = kick || p.wakeAt.IsZero() || p.wakeAt.After(now.Add(p.cfg.Linger))
	}
	b.add(rs, ts)
	b.stream = b.stream || rs != r
	if int(b.count) >= p.cfg.BatchSize || int64(len(b.buf)) >= p.cfg.BatchBytes {
		part.seal()
		kick = true
	}
	if kick {
		p.poke()
	}
}

// poke wakes the sender.
func (p *Producer) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (pt *partition) seal() {
	pt.queued = append(pt.queued, pt.open)
	pt.open = nil
}

// waitingRecord is a record held until its topic's partitions are known.
type waitingRecord struct {
	rec outboxd.Record
	now time.Time
	ts  int64
}

// cloneRecord copies r's bytes into one allocation.
func cloneRecord(r *outboxd.Record) outboxd.Record {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Value)
	}
	buf := make([]byte, 0, n)
	take := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		buf = append(buf, b...)
		return buf[len(buf)-len(b) : len(buf) : len(buf)]
	}
	c := *r
	c.Key, c.Value, c.Headers = take(r.Key), take(r.Value), nil
	if len(r.Headers) > 0 {
		c.Headers = make([]outboxd.Header, len(r.Headers))
		for i, h := range r.Headers {
			c.Headers[i] = outboxd.Header{Key: h.Key, Value: take(h.Value)}
		}
	}
	return c
}

// Flush sends the records produced so far at once when no request is in
// flight, without waiting for the linger; while one is in flight it does
// nothing, and they batch up under the linger with whatever follows (with
// idempotence they then go after the linger even while earlier rounds are
// in flight). It does not wait. The stream calls it at each commit: an
// isolated commit goes out at once, a busy stream still sends full rounds.
// (A flush that only waited for the request in flight cost the drain ~30 %
// more CPU, outboxd's and the broker's, in smaller requests:
// docs/reports/PERFORMANCE.md.)
func (p *Producer) Flush() {
	p.mu.Lock()
	idle := p.rounds == 0
	p.due = p.due || idle
	p.mu.Unlock()
	if idle {
		p.poke()
	}
}

// Close sends what is batched and waits for the acknowledgements, at most
// until ctx ends; then it abandons the rest (their Ackers get an error).
// Either way it returns only once the sender goroutine has: after ctx ends
// that is as soon as the request in flight gives up (every request is
// made under the producer's context, which Close cancels).
func (p *Producer) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
	var err error
	select {
	case <-p.done:
	case <-ctx.Done():
		p.mu.Lock()
		if p.fenced == nil {
			p.fenced = errClosed
		}
		p.mu.Unlock()
		p.cancel()
		<-p.done
		err = fmt.Errorf("close producer: %w", ctx.Err())
	}
	p.cancel()
	if p.transport != nil {
		p.transport.CloseIdleConnections()
	}
	return err
}
