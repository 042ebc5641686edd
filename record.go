// Package outboxd holds the domain types shared by the pipeline stages:
// the replication stream turns outbox rows into Records, the sink produces
// them to Kafka and reports each outcome back through the record's Ack.
package outboxd

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

// Record is one Kafka record built from one outbox row.
type Record struct {
	Topic   string
	Key     []byte
	Value   []byte
	Headers []Header
	// Ack is told the outcome of the produce.
	Ack Acker
}

// Size approximates the bytes the record holds in memory while in flight.
func (r *Record) Size() int64 {
	n := len(r.Topic) + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}
