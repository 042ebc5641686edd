// Package outboxd holds the domain types shared by the pipeline stages:
// the replication stream turns outbox rows into Records, the sink produces
// them to Kafka and reports each outcome back through the record's Ack.
package outboxd

import (
	"encoding/binary"
	"fmt"
)

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Acker learns the outcome of one produced record: nil once Kafka
// acknowledged it with acks=all, the error otherwise. It is called exactly
// once per record, possibly from another goroutine.
type Acker interface {
	Ack(err error)
}

// Placer is an Acker that also learns where Kafka put its record: the
// producer calls Place, before Ack(nil), when the broker's answer says
// (a record it skips as already in Kafka, or a batch the broker reports
// as a duplicate, has no place to tell).
type Placer interface {
	Place(partition int32, offset int64)
}

// Record is one Kafka record built from one outbox row.
type Record struct {
	Topic   string
	Key     []byte
	Value   []byte
	Headers []Header
	// Time is the record's timestamp in milliseconds since the epoch; 0
	// means the time it is produced (the Java client's CreateTime).
	Time int64
	// Refusable says the caller handles a refusal of this record: when the
	// broker refuses it for its own content (too large for the topic, even
	// alone in its batch), the producer reports a *RefusedError through Ack
	// and goes on with the records after it (the caller dead-letters it).
	// Without it such a refusal stops the producer, so that no later record
	// steps over it.
	Refusable bool
	// RowID is the id of the outbox row the record was built from (its
	// routes[].columns.id), whichever header carries it, if any; nil for a
	// logical message. It is not produced: it names the row to
	// postgres.mark_published.
	RowID []byte
	// Pos is the record's place in the replication stream, zero for a row
	// read from its table (cut-over snapshot, replay) and for a
	// dead-letter record. The producer de-duplicates by it after a restart
	// (sink.Config.Stream): only a streamed record is ever skipped, and
	// only one proves that others are in Kafka.
	Pos Pos
	// Ack is told the outcome of the produce.
	Ack Acker
}

// Pos is a record's place in the replication stream: its transaction's
// commit LSN, its change's index among the transaction's changes, and the
// route among the change's routes (a change may become several records).
// Positions grow in commit order, and no two records share one.
type Pos struct {
	LSN   uint64
	Index uint32
	Route uint32
}

// After says whether p comes after q in the stream.
func (p Pos) After(q Pos) bool {
	if p.LSN != q.LSN {
		return p.LSN > q.LSN
	}
	if p.Index != q.Index {
		return p.Index > q.Index
	}
	return p.Route > q.Route
}

// Header is the value of the record's first header called key, nil when
// it has none.
func (r *Record) Header(key string) []byte {
	for _, h := range r.Headers {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}

// Size approximates the bytes the record holds in memory while in flight.
func (r *Record) Size() int64 {
	n := len(r.Topic) + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// batchOverhead is what a Kafka v2 record batch adds around its records:
// the 61-byte batch header and the 4-byte size that precedes a record set.
const batchOverhead = 65

// WireSize is the number of bytes the record takes as the only record of a
// Kafka v2 record batch, uncompressed: the unit that kafka.batch_bytes and
// the broker's max.message.bytes limit. It is exact for a record whose
// timestamp delta and offset delta are 0 and an upper bound otherwise
// within a few bytes.
func (r *Record) WireSize() int {
	n := 1 + 1 + 1 + // attributes, timestamp delta 0, offset delta 0
		bytesLen(r.Key) + bytesLen(r.Value) + varintLen(len(r.Headers))
	for i := range r.Headers {
		h := &r.Headers[i]
		n += varintLen(len(h.Key)) + len(h.Key) + bytesLen(h.Value)
	}
	return batchOverhead + varintLen(n) + n
}

func varintLen(n int) int {
	var buf [binary.MaxVarintLen64]byte
	return binary.PutVarint(buf[:], int64(n))
}

func bytesLen(b []byte) int {
	if b == nil {
		return 1 // -1: null
	}
	return varintLen(len(b)) + len(b)
}

// RefusedError is the outcome of a Refusable record that the broker refused
// for its own content, alone in its batch: no retry or replay can deliver
// it. It carries copies of what identifies the record, for a dead-letter
// record in its place.
type RefusedError struct {
	Topic   string
	Key     []byte   // a copy, nil for a null key
	Headers []Header // copies
	Size    int      // the record's size on the wire (WireSize)
	Err     error    // the broker's error
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("the broker refused the record for topic %q with key %q (%d bytes): %v", e.Topic, e.Key, e.Size, e.Err)
}

func (e *RefusedError) Unwrap() error { return e.Err }
