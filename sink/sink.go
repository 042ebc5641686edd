// Package sink produces records to Kafka with kafka-go: acks=all, a key
// balancer compatible with the Java client (murmur2) or with librdkafka
// (crc32), batching with a short linger, and one completion per record.
package sink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/compress"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/produce"

	"github.com/outboxd/outboxd"
)

// Config is the producer's configuration.
type Config struct {
	Brokers      []string
	Partitioner  string // murmur2 | crc32
	Compression  string // none | gzip | snappy | lz4 | zstd
	Linger       time.Duration
	BatchSize    int
	BatchBytes   int64
	MaxAttempts  int
	WriteTimeout time.Duration
	ClientID     string
	// Observe, when set, is told the outcome of every batch: its topic,
	// records, bytes, the time since it was handed over, and the error.
	Observe func(topic string, records int, bytes int64, latency time.Duration, err error)
}

// ErrFenced is the error of every record produced after an earlier record of
// the same producer failed: once one batch failed, no later batch may reach
// the broker, or a later event could be delivered before an earlier one of
// the same aggregate.
var ErrFenced = errors.New("produce fenced after an earlier delivery failure")

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

// How long Produce waits for a topic being auto-created to appear.
const (
	topicWaitStep     = 250 * time.Millisecond
	topicWaitAttempts = 40
)

// Producer sends records asynchronously; each record's Acker learns its
// outcome. A Producer is used for one replication session: after a failure
// it is fenced and must be closed and replaced.
type Producer struct {
	w       *kafka.Writer
	fenced  atomic.Bool
	log     hclog.Logger
	observe func(topic string, records int, bytes int64, latency time.Duration, err error)
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

func codec(name string) (kafka.Compression, error) {
	switch name {
	case "", "none":
		return 0, nil
	case "gzip":
		return kafka.Compression(compress.Gzip), nil
	case "snappy":
		return kafka.Compression(compress.Snappy), nil
	case "lz4":
		return kafka.Compression(compress.Lz4), nil
	case "zstd":
		return kafka.Compression(compress.Zstd), nil
	}
	return 0, fmt.Errorf("unknown compression %q", name)
}

// New builds a producer. It does not connect until the first record.
func New(cfg Config, log hclog.Logger) (*Producer, error) {
	return newProducer(cfg, log, nil)
}

// newProducer builds a producer over transport, or over a kafka-go
// Transport for the configured brokers when it is nil.
func newProducer(cfg Config, log hclog.Logger, transport kafka.RoundTripper) (*Producer, error) {
	bal, err := Balancer(cfg.Partitioner)
	if err != nil {
		return nil, err
	}
	comp, err := codec(cfg.Compression)
	if err != nil {
		return nil, err
	}
	p := &Producer{log: log, observe: cfg.Observe}
	if transport == nil {
		transport = &kafka.Transport{
			ClientID:    cfg.ClientID,
			Dial:        (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 10 * time.Second}).DialContext,
			IdleTimeout: 30 * time.Second,
			MetadataTTL: 10 * time.Second,
		}
	}
	p.w = &kafka.Writer{
		Addr:            kafka.TCP(cfg.Brokers...),
		Balancer:        bal,
		RequiredAcks:    kafka.RequireAll, // the zero value is "none"
		Async:           true,
		Completion:      p.complete,
		BatchSize:       cfg.BatchSize,
		BatchBytes:      cfg.BatchBytes,
		BatchTimeout:    cfg.Linger, // kafka-go's default is 1 s
		MaxAttempts:     cfg.MaxAttempts,
		WriteBackoffMin: 100 * time.Millisecond,
		WriteBackoffMax: 1 * time.Second,
		WriteTimeout:    cfg.WriteTimeout,
		ReadTimeout:     cfg.WriteTimeout,
		Compression:     comp,
		Transport:       &fence{next: transport, fenced: &p.fenced},
		// As the Java producer does: ask for a missing topic to be created and
		// let the broker's auto.create.topics.enable decide.
		AllowAutoTopicCreation: true,
		ErrorLogger:            kafka.LoggerFunc(func(f string, a ...any) { log.Debug(fmt.Sprintf(f, a...)) }),
	}
	return p, nil
}

// Produce hands records to the writer. kafka-go accepts all of a call's
// records or none: on an error every record of the call is failed through
// its Acker, and the caller must stop and replace the producer.
func (p *Producer) Produce(ctx context.Context, recs []outboxd.Record) error {
	if p.fenced.Load() {
		return ErrFenced
	}
	msgs := make([]kafka.Message, len(recs))
	// The record's CreateTime, as the Java client and librdkafka set it;
	// kafka-go would otherwise stamp it when encoding the batch.
	now := time.Now()
	for i := range recs {
		r := &recs[i]
		m := &msgs[i]
		m.Topic = r.Topic
		m.Key = r.Key
		m.Value = r.Value
		if len(r.Headers) > 0 {
			m.Headers = make([]kafka.Header, len(r.Headers))
			for j, h := range r.Headers {
				m.Headers[j] = kafka.Header{Key: h.Key, Value: h.Value}
			}
		}
		m.WriterData = r.Ack
		m.Time = now
	}
	err := p.w.WriteMessages(ctx, msgs...)
	// A topic the broker is auto-creating (the metadata request asked it
	// to) is unknown or leaderless for a moment: wait for it, as the Java
	// producer does, before calling it missing. kafka-go queues nothing when
	// WriteMessages fails, so the call can be repeated as is.
	for wait := 0; err != nil && wait < topicWaitAttempts && (errors.Is(err, kafka.UnknownTopicOrPartition) || errors.Is(err, kafka.LeaderNotAvailable)); wait++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(topicWaitStep):
		}
		err = p.w.WriteMessages(ctx, msgs...)
	}
	if err == nil {
		return nil
	}
	p.fenced.Store(true)
	err = p.refused(recs, err)
	for i := range recs {
		recs[i].Ack.Ack(err)
	}
	return err
}

// refused explains an error of WriteMessages.
func (p *Producer) refused(recs []outboxd.Record, err error) error {
	var tooLarge kafka.MessageTooLargeError
	switch {
	case errors.As(err, &tooLarge):
		return &RecordError{Topic: tooLarge.Message.Topic, Key: tooLarge.Message.Key, Err: err,
			Reason: fmt.Sprintf("%d bytes is larger than kafka.batch_bytes (%d); raise it together with the broker's and the topic's max.message.bytes", len(tooLarge.Message.Key)+len(tooLarge.Message.Value), p.w.BatchBytes)}
	case errors.Is(err, kafka.UnknownTopicOrPartition):
		return &RecordError{Topic: recs[0].Topic, Key: recs[0].Key, Err: err, Reason: "the topic does not exist and the broker does not create topics (auto.create.topics.enable=false): create it"}
	}
	return fmt.Errorf("produce: %w", err)
}

// complete runs on kafka-go's partition goroutine after each batch. A failed
// batch fences the producer before the partition's next batch is sent.
func (p *Producer) complete(msgs []kafka.Message, err error) {
	if err != nil && !p.fenced.Swap(true) {
		p.log.Error("delivery failed; no further records will be sent by this producer", "topic", msgs[0].Topic, "partition", msgs[0].Partition, "records", len(msgs), "error", err)
	}
	if reason := permanent(err); reason != "" {
		err = &RecordError{Topic: msgs[0].Topic, Key: msgs[0].Key, Reason: reason, Err: err}
	}
	if p.observe != nil && len(msgs) > 0 {
		var n int64
		for i := range msgs {
			n += int64(len(msgs[i].Key) + len(msgs[i].Value))
		}
		p.observe(msgs[0].Topic, len(msgs), n, time.Since(msgs[0].Time), err)
	}
	for i := range msgs {
		if a, ok := msgs[i].WriterData.(outboxd.Acker); ok {
			a.Ack(err)
		}
	}
}

// permanent names the broker errors that no retry or replay can fix: the
// same records would fail the same way for ever.
func permanent(err error) string {
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
	return ""
}

// Close flushes what is batched and waits for the writer, at most until ctx
// ends.
func (p *Producer) Close(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- p.w.Close() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		p.fenced.Store(true)
		return fmt.Errorf("close producer: %w", ctx.Err())
	}
}

// fence refuses produce requests once the producer is fenced. Everything else
// (metadata) passes.
type fence struct {
	next   kafka.RoundTripper
	fenced *atomic.Bool
}

func (f *fence) RoundTrip(ctx context.Context, addr net.Addr, req protocol.Message) (protocol.Message, error) {
	if _, ok := req.(*produce.Request); ok && f.fenced.Load() {
		return nil, ErrFenced
	}
	return f.next.RoundTrip(ctx, addr, req)
}
