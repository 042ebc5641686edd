// Package sink produces records to Kafka: acks=all, a key partitioner
// compatible with the Java client (murmur2) or with librdkafka (crc32), and
// one completion per record.
//
// It encodes record batches itself and sends them through kafka-go's
// Transport (connections, metadata, API versions). kafka-go's Writer sends
// one produce request per partition batch, so small transactions spread
// over many partitions cost a request each; this producer sends, in rounds,
// one request per leader broker that carries a batch for every partition
// with records waiting, like the Java producer. Only one round is in flight
// at a time, so a partition's batches reach the broker strictly in order,
// and a failed batch is retried before anything later is sent; once it
// fails for good the producer is fenced and sends nothing more.
package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/compress"
	"github.com/segmentio/kafka-go/protocol"
	meta "github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/rawproduce"

	"github.com/outboxd/outboxd"
)

// Config is the producer's configuration.
type Config struct {
	Brokers      []string
	Partitioner  string // murmur2 | crc32
	Compression  string // none | gzip | snappy | lz4 | zstd
	Linger       time.Duration
	BatchSize    int   // records per partition batch
	BatchBytes   int64 // bytes per partition batch, as encoded (before compression)
	MaxAttempts  int
	WriteTimeout time.Duration
	ClientID     string
	// Observe, when set, is told the outcome of every partition batch: its
	// topic, records, key and value bytes, the time since its first record
	// was handed over, and the error.
	Observe func(topic string, records int, bytes int64, latency time.Duration, err error)
}

// ErrFenced is the error of every record produced after an earlier record of
// the same producer failed: once one batch failed, no later batch may reach
// the broker, or a later event could be delivered before an earlier one of
// the same aggregate.
var ErrFenced = errors.New("produce fenced after an earlier delivery failure")

// fenceError is the error of the records after the one that failed with
// cause: ErrFenced, still carrying the cause, so that a record the broker
// can never take (a RecordError) stops the stream whichever record's
// outcome it hears first, instead of being taken for an outage and replayed.
func fenceError(cause error) error {
	if errors.Is(cause, ErrFenced) || errors.Is(cause, errClosed) {
		return cause
	}
	return fmt.Errorf("%w: %w", ErrFenced, cause)
}

// errClosed is the error of records still waiting when Close gave up.
var errClosed = errors.New("producer closed before the records were acknowledged")

// RecordError is a record the broker cannot take whatever the retries
// (larger than the batch limit, a topic that does not exist). It is bad
// input, not an outage.
type RecordError struct {
	Topic  string
	Key    []byte
	Reason string
	Err    error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("record for topic %q with key %q: %s", e.Topic, e.Key, e.Reason)
}

func (e *RecordError) Unwrap() error { return e.Err }

// RecordProblem marks the error as bad input for the replication stream.
func (e *RecordError) RecordProblem() string { return e.Reason }

// How long records wait for a topic being auto-created to appear, and how
// often its metadata is asked for meanwhile.
const (
	topicWait     = 10 * time.Second
	topicWaitStep = 250 * time.Millisecond
)

// metadataTTL is how often a topic's partitions and leaders are read again
// (from the Transport's cache, which refreshes on the same period). Nothing
// refreshes that cache after a produce error, so it must be well under the
// retry budget (kafka.max_attempts with backoff up to 1 s: about 6.5 s by
// default), or a leader change would exhaust the retries and cost a replay.
const metadataTTL = 2 * time.Second

// maxRoundBytes bounds one round's batches (the broker's
// socket.request.max.bytes defaults to 100 MiB).
const maxRoundBytes = 32 << 20

// Producer sends records asynchronously; each record's Acker learns its
// outcome. A Producer is used for one replication session: after a failure
// it is fenced and must be closed and replaced.
type Producer struct {
	cfg       Config
	rt        kafka.RoundTripper
	transport *kafka.Transport // nil when rt was given (tests)
	addr      net.Addr
	bal       kafka.Balancer
	codec     compress.Codec // nil: no compression
	log       hclog.Logger
	topicWait time.Duration

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
}

type topic struct {
	name    string
	ids     []int // partition ids, for the balancer
	parts   map[int]*partition
	fetched time.Time       // when its layout was last read; zero: not known yet
	since   time.Time       // first attempt to read it, while not known
	waiting []waitingRecord // records that came before its layout was known
}

type partition struct {
	topic  string
	id     int32
	leader int32 // broker id, -1 when unknown
	open   *batch
	queued []*batch // full batches, oldest first
}

// Balancer returns the kafka-go balancer for a partitioner name.
func Balancer(name string) (kafka.Balancer, error) {
	switch name {
	case "", "murmur2":
		// The Java client's default partitioner for keyed records.
		return &kafka.Murmur2Balancer{Consistent: true}, nil
	case "crc32":
		// librdkafka's "consistent_random" for keyed records.
		return &kafka.CRC32Balancer{Consistent: true}, nil
	}
	return nil, fmt.Errorf("unknown partitioner %q (want murmur2 or crc32)", name)
}

func codec(name string) (compress.Codec, error) {
	switch name {
	case "", "none":
		return nil, nil
	case "gzip":
		return compress.Gzip.Codec(), nil
	case "snappy":
		return compress.Snappy.Codec(), nil
	case "lz4":
		return lz4Codec{}, nil
	case "zstd":
		return compress.Zstd.Codec(), nil
	}
	return nil, fmt.Errorf("unknown compression %q", name)
}

// New builds a producer. It does not connect until the first record.
func New(cfg Config, log hclog.Logger) (*Producer, error) {
	return newProducer(cfg, log, nil)
}

// NewWithTransport builds a producer that sends through rt (a
// *kafka.Transport, or a fake broker in tests and benchmarks).
func NewWithTransport(cfg Config, log hclog.Logger, rt kafka.RoundTripper) (*Producer, error) {
	return newProducer(cfg, log, rt)
}

// newProducer builds a producer over rt, or over a kafka-go Transport for
// the configured brokers when it is nil.
func newProducer(cfg Config, log hclog.Logger, rt kafka.RoundTripper) (*Producer, error) {
	bal, err := Balancer(cfg.Partitioner)
	if err != nil {
		return nil, err
	}
	cd, err := codec(cfg.Compression)
	if err != nil {
		return nil, err
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 1000
	}
	if cfg.BatchBytes <= 0 {
		cfg.BatchBytes = 1 << 20
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 10
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	p := &Producer{cfg: cfg, rt: rt, addr: kafka.TCP(cfg.Brokers...), bal: bal, codec: cd, log: log,
		kick: make(chan struct{}, 1), done: make(chan struct{}), topics: map[string]*topic{}, topicWait: topicWait}
	if rt == nil {
		p.transport = &kafka.Transport{
			ClientID:    cfg.ClientID,
			Dial:        (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 10 * time.Second}).DialContext,
			IdleTimeout: 30 * time.Second,
			MetadataTTL: metadataTTL,
		}
		p.rt = p.transport
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	go p.run()
	return p, nil
}

// Produce encodes the records into their partitions' batches and returns
// without waiting for the network; each record's Acker learns its outcome
// later. The records' bytes are copied: the caller may reuse them as soon
// as Produce returns. On an error the records not taken are failed through
// their Ackers and the caller must stop and replace the producer.
func (p *Producer) Produce(_ context.Context, recs []outboxd.Record) error {
	now := time.Now()
	ts := now.UnixMilli() // the record's CreateTime, as the Java client sets it
	for i := range recs {
		if err := p.add(&recs[i], now, ts); err != nil {
			for j := i; j < len(recs); j++ {
				recs[j].Ack.Ack(err)
			}
			return err
		}
	}
	return nil
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
	return p.encode(t, r, now, ts)
}

// encode adds r to its partition's batch. Called with mu held.
func (p *Producer) encode(t *topic, r *outboxd.Record, now time.Time, ts int64) error {
	part := t.parts[p.bal.Balance(kafka.Message{Key: r.Key}, t.ids...)]
	b := part.open
	kick := false
	if b != nil && int64(len(b.buf)+b.encodedLen(r, ts)) > p.cfg.BatchBytes {
		part.seal()
		b, kick = nil, true
	}
	if b == nil {
		if n := int64(batchHeaderLen + emptyBatchLen(r)); n > p.cfg.BatchBytes {
			return &RecordError{Topic: r.Topic, Key: bytes.Clone(r.Key), Err: kafka.MessageSizeTooLarge,
				Reason: fmt.Sprintf("%d bytes is larger than kafka.batch_bytes (%d); raise it together with the broker's and the topic's max.message.bytes", n, p.cfg.BatchBytes)}
		}
		b, kick = newBatch(part, now), true
		part.open = b
	}
	b.add(r, ts)
	if int(b.count) >= p.cfg.BatchSize || int64(len(b.buf)) >= p.cfg.BatchBytes {
		part.seal()
		kick = true
	}
	if kick {
		p.poke()
	}
	return nil
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
	c := outboxd.Record{Topic: r.Topic, Key: take(r.Key), Value: take(r.Value), Ack: r.Ack}
	if len(r.Headers) > 0 {
		c.Headers = make([]outboxd.Header, len(r.Headers))
		for i, h := range r.Headers {
			c.Headers[i] = outboxd.Header{Key: h.Key, Value: take(h.Value)}
		}
	}
	return c
}

// resolveTopics asks the cluster for the partitions and leaders of the
// topics not known yet, and of the known ones every metadataTTL (served
// from the Transport's cache). A topic being auto-created (the request asks
// for it, as the Java producer does) is waited for up to
// topicWait before its records fail as a RecordError;
// an unreachable cluster is retried until the stream's delivery timeout
// gives up on the session. It returns how soon to try again (0: nothing
// pending).
func (p *Producer) resolveTopics(now time.Time) time.Duration {
	p.mu.Lock()
	var names []string
	for name, t := range p.topics {
		if t.fetched.IsZero() || now.Sub(t.fetched) > metadataTTL {
			names = append(names, name)
		}
	}
	p.mu.Unlock()
	retry := time.Duration(0)
	for _, name := range names {
		mt, err := p.metadata(p.ctx, name)
		var failed []outboxd.Record
		var failure error
		p.mu.Lock()
		t := p.topics[name]
		switch {
		case err == nil:
			p.applyTopic(mt, time.Now())
			for _, w := range t.waiting {
				if p.fenced != nil {
					failed, failure = append(failed, w.rec), p.fenced
					continue
				}
				if err := p.encode(t, &w.rec, w.now, w.ts); err != nil {
					failed, failure = append(failed, w.rec), err
					p.fenced = fenceError(err)
				}
			}
			t.waiting = nil
		case !t.fetched.IsZero():
			// A refresh failed: keep the known layout, try again later.
			p.log.Debug("metadata refresh failed; keeping the known partitions", "topic", name, "error", err)
			t.fetched = time.Now()
		default:
			if t.since.IsZero() {
				t.since = now
			}
			creating := errors.Is(err, kafka.UnknownTopicOrPartition) || errors.Is(err, kafka.LeaderNotAvailable)
			if creating && time.Since(t.since) > p.topicWait {
				failure = fmt.Errorf("kafka metadata for topic %q: %w", name, err)
				if errors.Is(err, kafka.UnknownTopicOrPartition) {
					failure = &RecordError{Topic: name, Err: err, Reason: "the topic does not exist and the broker does not create topics (auto.create.topics.enable=false): create it"}
				}
				for _, w := range t.waiting {
					failed = append(failed, w.rec)
				}
				t.waiting = nil
				if p.fenced == nil {
					p.fenced = fenceError(failure)
				}
			} else {
				if !creating {
					p.log.Debug("kafka metadata unavailable; retrying", "topic", name, "error", err)
				}
				retry = topicWaitStep
			}
		}
		p.mu.Unlock()
		if failure != nil && len(failed) > 0 {
			p.log.Error("records refused before delivery; no further records will be sent by this producer", "topic", name, "records", len(failed), "error", failure)
		}
		for i := range failed {
			failed[i].Ack.Ack(failure)
		}
	}
	return retry
}

// metadata asks for one topic (auto-creating it when the broker allows).
func (p *Producer) metadata(ctx context.Context, name string) (*meta.ResponseTopic, error) {
	mctx, cancel := context.WithTimeout(ctx, p.cfg.WriteTimeout)
	defer cancel()
	res, err := p.rt.RoundTrip(mctx, p.addr, &meta.Request{TopicNames: []string{name}, AllowAutoTopicCreation: true})
	if err != nil {
		return nil, err
	}
	m, ok := res.(*meta.Response)
	if !ok {
		return nil, fmt.Errorf("unexpected metadata response %T", res)
	}
	for i := range m.Topics {
		t := &m.Topics[i]
		if t.Name != name {
			continue
		}
		if t.ErrorCode != 0 {
			return nil, kafka.Error(t.ErrorCode)
		}
		if len(t.Partitions) == 0 {
			return nil, kafka.UnknownTopicOrPartition
		}
		for _, pm := range t.Partitions {
			if pm.LeaderID < 0 {
				return nil, kafka.LeaderNotAvailable
			}
		}
		return t, nil
	}
	return nil, kafka.UnknownTopicOrPartition
}

// applyTopic records a topic's layout. Called with mu held.
func (p *Producer) applyTopic(mt *meta.ResponseTopic, now time.Time) {
	t := p.topics[mt.Name]
	if t == nil {
		t = &topic{name: mt.Name, parts: map[int]*partition{}}
		p.topics[mt.Name] = t
	}
	t.fetched = now
	for _, pm := range mt.Partitions {
		id := int(pm.PartitionIndex)
		pt := t.parts[id]
		if pt == nil {
			pt = &partition{topic: mt.Name, id: pm.PartitionIndex}
			t.parts[id] = pt
			t.ids = append(t.ids, id)
			p.parts = append(p.parts, pt)
		}
		pt.leader = pm.LeaderID
	}
	sortInts(t.ids)
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

// run is the sender: it takes a round (the oldest batch of every partition
// with records waiting, once one is full or has waited the linger), sends
// it, retries what failed, and only then takes the next.
func (p *Producer) run() {
	defer close(p.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		retry := p.resolveTopics(time.Now())
		p.mu.Lock()
		round, wait, drop, exit := p.takeRound(time.Now())
		p.mu.Unlock()
		if drop != nil {
			for _, b := range drop.batches {
				p.complete(b, drop.err)
			}
			for i := range drop.records {
				drop.records[i].Ack.Ack(drop.err)
			}
		}
		if exit {
			return
		}
		if len(round) > 0 {
			p.send(round)
			continue
		}
		if retry > 0 && (wait == 0 || retry < wait) {
			wait = retry
		}
		if wait > 0 {
			timer.Reset(wait)
		}
		select {
		case <-p.kick:
		case <-timer.C:
		case <-p.ctx.Done():
		}
		timer.Stop()
	}
}

// dropped is what a fenced producer fails without sending.
type dropped struct {
	batches []*batch
	records []outboxd.Record
	err     error
}

// takeRound picks the next round, or says how long to wait for one (0: until
// kicked). After a fence it hands back every waiting batch to be failed.
// Called with mu held.
func (p *Producer) takeRound(now time.Time) (round []*batch, wait time.Duration, drop *dropped, exit bool) {
	if p.fenced != nil {
		drop = &dropped{err: p.fenced}
		for _, pt := range p.parts {
			drop.batches = append(drop.batches, pt.queued...)
			pt.queued = nil
			if pt.open != nil {
				drop.batches = append(drop.batches, pt.open)
				pt.open = nil
			}
		}
		for _, t := range p.topics {
			for _, w := range t.waiting {
				drop.records = append(drop.records, w.rec)
			}
			t.waiting = nil
		}
		return nil, 0, drop, p.closing
	}
	waiting := false
	for _, t := range p.topics {
		waiting = waiting || len(t.waiting) > 0
	}
	ready, any := false, false
	var oldest time.Time
	for _, pt := range p.parts {
		if len(pt.queued) > 0 {
			ready = true
			break
		}
		if pt.open != nil {
			any = true
			if p.closing || now.Sub(pt.open.created) >= p.cfg.Linger {
				ready = true
				break
			}
			if oldest.IsZero() || pt.open.created.Before(oldest) {
				oldest = pt.open.created
			}
		}
	}
	if !ready {
		if !any && !waiting && p.closing {
			return nil, 0, nil, true
		}
		if any {
			wait = p.cfg.Linger - now.Sub(oldest)
		}
		return nil, wait, nil, false
	}
	// Like the Java producer, a ready round takes every partition's oldest
	// batch, lingering or not: one request instead of several.
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
			p.next = (p.next + i) % n
			return round, 0, nil, false
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
	return round, 0, nil, false
}

// send delivers one round: every batch is acknowledged, or retried (alone,
// before anything later) until MaxAttempts, or failed, which fences the
// producer.
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
			case retriable(err):
				retry, retryErr = append(retry, b), append(retryErr, err)
			default:
				if reason := permanent(err); reason != "" {
					err = &RecordError{Topic: b.part.topic, Reason: reason, Err: err}
				}
				fatal = err
				p.fence(b, err)
				p.complete(b, err)
			}
		}
		if len(retry) == 0 {
			return
		}
		if fatal == nil && attempt < p.cfg.MaxAttempts {
			p.log.Debug("produce failed; retrying", "batches", len(retry), "attempt", attempt, "error", retryErr[0])
			select {
			case <-time.After(backoff(attempt, 100*time.Millisecond, time.Second)):
			case <-p.ctx.Done():
			}
			if p.ctx.Err() == nil {
				p.refreshLeaders(retry)
				todo = retry
				continue
			}
		}
		for i, b := range retry {
			p.fence(b, retryErr[i])
			p.complete(b, retryErr[i])
		}
		return
	}
}

// fence stops the producer after b failed for good.
func (p *Producer) fence(b *batch, err error) {
	p.mu.Lock()
	first := p.fenced == nil
	if first {
		p.fenced = fenceError(err)
	}
	p.mu.Unlock()
	if first && !errors.Is(err, errClosed) {
		p.log.Error("delivery failed; no further records will be sent by this producer",
			"topic", b.part.topic, "partition", b.part.id, "records", b.count, "error", err)
	}
}

// retriable reports whether a produce error may go away on its own.
func retriable(err error) bool {
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		// REPLICA_NOT_AVAILABLE is stale metadata, retriable for the Java
		// client, though kafka-go does not list it.
		return kerr.Temporary() || kerr == kafka.ReplicaNotAvailable
	}
	// Transport errors (a refused or reset connection, a timeout): the
	// outcome is unknown, a retry may duplicate but never reorders.
	return !errors.Is(err, errEncode)
}

var errEncode = errors.New("encode record batch")

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
	res, err := p.rt.RoundTrip(ctx, p.addr, req)
	cancel()
	if err != nil && p.ctx.Err() != nil {
		// kafka-go returns on cancellation while its connection may still
		// be writing the request: its buffers must not be reused.
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
				return fmt.Errorf("%w: %s", kafka.Error(r.ErrorCode), r.ErrorMessage)
			}
			return kafka.Error(r.ErrorCode)
		}
	}
	return fmt.Errorf("the produce response has no result for %s/%d", pt.topic, pt.id)
}

// refreshLeaders rereads the leaders of the batches' topics (from the
// Transport's metadata cache) before a retry.
func (p *Producer) refreshLeaders(bs []*batch) {
	seen := map[string]bool{}
	for _, b := range bs {
		if seen[b.part.topic] {
			continue
		}
		seen[b.part.topic] = true
		mt, err := p.metadata(p.ctx, b.part.topic)
		if err != nil {
			continue
		}
		p.mu.Lock()
		p.applyTopic(mt, time.Now())
		p.mu.Unlock()
	}
}

// complete tells every record of b its outcome.
func (p *Producer) complete(b *batch, err error) {
	if p.cfg.Observe != nil {
		p.cfg.Observe(b.part.topic, int(b.count), b.kvBytes, time.Since(b.created), err)
	}
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

// permanent names the broker errors that no retry or replay can fix: the
// same records would fail the same way for ever.
func permanent(err error) string {
	if errors.Is(err, errEncode) {
		return "the record batch could not be encoded"
	}
	var kerr kafka.Error
	if !errors.As(err, &kerr) {
		return ""
	}
	switch kerr {
	case kafka.MessageSizeTooLarge, kafka.RecordListTooLarge:
		return "the broker refused the batch as too large: lower kafka.batch_bytes below the topic's max.message.bytes, or raise that"
	case kafka.InvalidRecord, kafka.InvalidMessage:
		return "the broker refused the record as invalid"
	case kafka.TopicAuthorizationFailed, kafka.ClusterAuthorizationFailed:
		return "not authorized to write to the topic: grant outboxd's principal WRITE on it"
	case kafka.InvalidTopic:
		return "the topic name is invalid"
	}
	if !retriable(err) {
		// As the Java producer: an error the broker does not call retriable
		// fails the send (INVALID_TIMESTAMP, POLICY_VIOLATION, codes kafka-go
		// does not know, ...). Replaying would fail the same way for ever.
		return fmt.Sprintf("the broker refused the batch with a non-retriable error (%v)", err)
	}
	return ""
}

// Close sends what is batched and waits for the acknowledgements, at most
// until ctx ends; then it abandons the rest (their Ackers get an error).
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
		select {
		case <-p.done:
		case <-time.After(time.Second):
		}
		err = fmt.Errorf("close producer: %w", ctx.Err())
	}
	p.cancel()
	if p.transport != nil {
		p.transport.CloseIdleConnections()
	}
	return err
}
