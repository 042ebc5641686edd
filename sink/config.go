package sink

import (
	"crypto/tls"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/outboxd/outboxd/clock"
)

// Config is the producer's configuration.
type Config struct {
	Brokers      []string
	Partitioner  string // one of Partitioners
	Compression  string // one of Compressions
	Linger       time.Duration
	BatchSize    int   // records per partition batch
	BatchBytes   int64 // bytes per partition batch, as encoded (before compression)
	MaxAttempts  int
	WriteTimeout time.Duration
	ClientID     string
	// Idempotence makes the producer idempotent (idempotence.go): retries
	// never duplicate a record, and up to five batches of a partition are
	// in flight at once. Brokers of 0.11 and later take it; those before
	// 2.8 want IDEMPOTENT_WRITE on the cluster for the principal.
	Idempotence bool
	// TLS and SASL secure every connection to the brokers; nil: plaintext,
	// no authentication (BuildTLS, BuildSASL).
	TLS  *tls.Config
	SASL sasl.Mechanism
	// OnPartitionChange is what a topic whose partition count changes while
	// records flow does: PartitionsFollow (the Java producer's behaviour:
	// keys are hashed over the new count from the next record on, so some
	// aggregates move to another partition, said by a warning) or
	// PartitionsStop (the producer is fenced with a RecordError before any
	// record takes the new layout: outboxd stops, having confirmed what was
	// acknowledged, and an operator decides).
	OnPartitionChange string
	// Partitions, when set, is told a topic's partition count when the
	// producer first learns it (from 0) and whenever it changes.
	Partitions func(topic string, from, to int)
	// Observe, when set, is told the outcome of every partition batch, and
	// of every record failed before it reached a batch: its topic, records,
	// key and value bytes, the time since its first record was handed over,
	// and the error. Every record is observed once, before its Ack.
	Observe func(topic string, records int, bytes int64, latency time.Duration, err error)
	// TransactionalID, when set with Idempotence, makes the producer
	// transactional (transaction.go): records are acknowledged once their
	// transaction commits, at most TransactionInterval after it began, and
	// an earlier producer with the same id is fenced.
	TransactionalID     string
	TransactionInterval time.Duration
	// Stream, when set with Idempotence, names the replication stream the
	// records come from (dedupe.go): every record with a position carries
	// it in the outboxd.stream header, and after a restart a partition's
	// records at or below the last position of the stream it already
	// holds are not produced again (Skipped is told, then their Ack).
	Stream  string
	Skipped func(topic string)
	// TailTimeout bounds how long a partition's records wait for its tail
	// to be read (counted from its first read's start, 0: unbounded);
	// past it, or after a few failed reads, they go out without restart
	// de-duplication and TailGivenUp is told (dedupe.go, giveUpTail).
	TailTimeout time.Duration
	TailGivenUp func(topic string)
	// StreamKey is the key of the header's MAC (streamkey.go): a record
	// proves a position only when its MAC verifies under it, so only the
	// instances that share it prove positions to each other. Empty: a
	// random key of this producer's own (nothing an earlier process
	// produced verifies: duplicates after a restart, never a loss).
	// Rejected, when set, is told the topic of every record of the stream's
	// identity in a partition's tail that proves nothing: its MAC does not
	// verify, or, transactional, it is not in a transaction of the
	// producer id.
	StreamKey []byte
	Rejected  func(topic string)
	// Timeline is the source's current timeline, Timelines it and its
	// ancestors (where each began and ended), WALEnd the source's WAL
	// position when the session began (dedupe.go, proof).
	Timeline  uint32
	Timelines map[uint32]Timeline
	WALEnd    uint64
	// Clock is what the producer reads and waits on (the linger, the
	// backoff between attempts, a partition's idle spell: pipelineIdle);
	// nil: clock.System.
	Clock clock.Clock
}

// partitioners are the Config.Partitioner values and their balancers.
var partitioners = []option[func() kafka.Balancer]{
	// The Java client's default partitioner for keyed records.
	{"murmur2", func() kafka.Balancer { return &kafka.Murmur2Balancer{Consistent: true} }},
	// librdkafka's "consistent_random" for keyed records.
	{"crc32", func() kafka.Balancer { return &kafka.CRC32Balancer{Consistent: true} }},
}

// Partitioners lists the Config.Partitioner values (kafka.partitioner).
func Partitioners() []string { return names(partitioners) }

// balancer returns the kafka-go balancer for a partitioner name.
func balancer(name string) (kafka.Balancer, error) {
	if b, ok := lookup(partitioners, name); ok {
		return b(), nil
	}
	return nil, fmt.Errorf("unknown partitioner %q (want %s)", name, either(Partitioners()))
}

// What a producer does when a topic's partition count changes
// (Config.OnPartitionChange).
const (
	PartitionsFollow = "follow"
	PartitionsStop   = "stop"
)

// PartitionChanges lists the Config.OnPartitionChange values
// (kafka.on_partition_change).
func PartitionChanges() []string { return []string{PartitionsFollow, PartitionsStop} }
