package sink

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/protocol/produce"

	"github.com/outboxd/outboxd"
)

// fakeBroker answers kafka-go's requests in memory. It exists for the one
// fault a real broker cannot be made to produce on demand: failing exactly
// one produce request, then watching whether the partition's next batch is
// still sent. The integration tests use a real broker for everything else.
type fakeBroker struct {
	mu       sync.Mutex
	produced []string // value of the first record of each produce request that reached the broker
	fail     func(n int) int16
}

func (b *fakeBroker) RoundTrip(_ context.Context, _ net.Addr, req protocol.Message) (protocol.Message, error) {
	switch r := req.(type) {
	case *metadata.Request:
		return &metadata.Response{Topics: []metadata.ResponseTopic{{Name: r.TopicNames[0],
			Partitions: []metadata.ResponsePartition{{PartitionIndex: 0}}}}}, nil
	case *produce.Request:
		b.mu.Lock()
		n := len(b.produced)
		rec, err := r.Topics[0].Partitions[0].RecordSet.Records.ReadRecord()
		val := ""
		if err == nil && rec.Value != nil {
			buf := make([]byte, 64)
			k, _ := rec.Value.Read(buf)
			val = string(buf[:k])
		}
		b.produced = append(b.produced, val)
		b.mu.Unlock()
		code := b.fail(n)
		return &produce.Response{Topics: []produce.ResponseTopic{{Topic: r.Topics[0].Topic,
			Partitions: []produce.ResponsePartition{{Partition: 0, ErrorCode: code, BaseOffset: int64(n)}}}}}, nil
	}
	return nil, errors.New("fake broker: unexpected request")
}

type ackRecorder struct {
	mu   sync.Mutex
	errs map[string]error
	done chan struct{}
	want int
}

type ack struct {
	r   *ackRecorder
	key string
}

func (a ack) Ack(err error) {
	a.r.mu.Lock()
	defer a.r.mu.Unlock()
	a.r.errs[a.key] = err
	if len(a.r.errs) == a.r.want {
		close(a.r.done)
	}
}

// TestFailedBatchFencesLaterBatches: kafka-go fails a batch after
// MaxAttempts and would then send the partition's next batch, delivering a
// later event of an aggregate before an earlier one. The fence must stop it.
func TestFailedBatchFencesLaterBatches(t *testing.T) {
	b := &fakeBroker{fail: func(n int) int16 {
		if n == 0 {
			return int16(kafka.NotLeaderForPartition) // retriable, but attempts run out
		}
		return 0
	}}
	p, err := newProducer(Config{Brokers: []string{"fake:9092"}, BatchSize: 1, Linger: time.Millisecond, MaxAttempts: 1,
		BatchBytes: 1 << 20, WriteTimeout: time.Second}, hclog.NewNullLogger(), b)
	if err != nil {
		t.Fatal(err)
	}
	rec := &ackRecorder{errs: map[string]error{}, done: make(chan struct{}), want: 3}
	var recs []outboxd.Record
	for _, v := range []string{"first", "second", "third"} {
		recs = append(recs, outboxd.Record{Topic: "t", Key: []byte("P-1"), Value: []byte(v), Ack: ack{rec, v}})
	}
	if err := p.Produce(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rec.done:
	case <-time.After(10 * time.Second):
		t.Fatal("not every record was acknowledged or failed")
	}
	_ = p.Close(context.Background())
	if len(b.produced) != 1 || b.produced[0] != "first" {
		t.Fatalf("after the first batch failed the broker still received %q", b.produced)
	}
	if !errors.Is(rec.errs["first"], kafka.NotLeaderForPartition) {
		t.Errorf("first: %v", rec.errs["first"])
	}
	for _, k := range []string{"second", "third"} {
		if !errors.Is(rec.errs[k], ErrFenced) {
			t.Errorf("%s: want ErrFenced, got %v", k, rec.errs[k])
		}
	}
	if err := p.Produce(context.Background(), recs[:1]); !errors.Is(err, ErrFenced) {
		t.Errorf("a fenced producer accepted a record: %v", err)
	}
}

// TestPermanentBrokerErrorIsARecordError: an error no replay can fix reaches
// the Acker as a RecordError, which stops outboxd instead of looping.
func TestPermanentBrokerErrorIsARecordError(t *testing.T) {
	b := &fakeBroker{fail: func(int) int16 { return int16(kafka.MessageSizeTooLarge) }}
	p, err := newProducer(Config{Brokers: []string{"fake:9092"}, BatchSize: 1, Linger: time.Millisecond, MaxAttempts: 3,
		BatchBytes: 1 << 20, WriteTimeout: time.Second}, hclog.NewNullLogger(), b)
	if err != nil {
		t.Fatal(err)
	}
	rec := &ackRecorder{errs: map[string]error{}, done: make(chan struct{}), want: 1}
	if err := p.Produce(context.Background(), []outboxd.Record{{Topic: "t", Key: []byte("K"), Value: []byte("v"), Ack: ack{rec, "v"}}}); err != nil {
		t.Fatal(err)
	}
	<-rec.done
	var re *RecordError
	if !errors.As(rec.errs["v"], &re) || !errors.Is(re, kafka.MessageSizeTooLarge) {
		t.Fatalf("got %v", rec.errs["v"])
	}
}
