package sink

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/rawproduce"

	"github.com/outboxd/outboxd"
)

// fakeBroker answers the producer's requests in memory. It exists for the
// faults a real broker cannot be made to produce on demand: failing exactly
// one partition of one produce request, blocking, several leaders. It
// decodes every record batch with kafka-go's own decoder (which checks the
// CRC), so the encoding is checked independently of the encoder. The
// integration tests use a real broker for everything else.
type fakeBroker struct {
	partitions int
	leaders    func(partition int) int32 // nil: broker 1 leads all
	// fail says which error code the n-th produce request (from 0) gets for
	// a partition; block, when set, makes requests wait for it.
	fail  func(n int, partition int32) int16
	block chan struct{}
	// meta, when set, answers the n-th metadata request (from 0) with a
	// topic error code or a transport error instead of the layout.
	meta func(n int) (int16, error)

	metaN int

	mu       sync.Mutex
	requests []fakeRequest
}

type fakeRequest struct {
	parts map[int32][]kafka.Message // records per partition, decoded
}

// values lists the values the broker received, request by request.
func (b *fakeBroker) values() [][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out [][]string
	for _, r := range b.requests {
		var vs []string
		ids := make([]int, 0, len(r.parts))
		for id := range r.parts {
			ids = append(ids, int(id))
		}
		sort.Ints(ids)
		for _, id := range ids {
			for _, m := range r.parts[int32(id)] {
				vs = append(vs, string(m.Value))
			}
		}
		out = append(out, vs)
	}
	return out
}

func (b *fakeBroker) RoundTrip(ctx context.Context, _ net.Addr, req protocol.Message) (protocol.Message, error) {
	switch r := req.(type) {
	case *metadata.Request:
		if b.meta != nil {
			b.mu.Lock()
			k := b.metaN
			b.metaN++
			b.mu.Unlock()
			if code, err := b.meta(k); err != nil {
				return nil, err
			} else if code != 0 {
				return &metadata.Response{Topics: []metadata.ResponseTopic{{Name: r.TopicNames[0], ErrorCode: code}}}, nil
			}
		}
		n := max(b.partitions, 1)
		ps := make([]metadata.ResponsePartition, n)
		for i := range ps {
			ps[i] = metadata.ResponsePartition{PartitionIndex: int32(i), LeaderID: 1}
			if b.leaders != nil {
				ps[i].LeaderID = b.leaders(i)
			}
		}
		return &metadata.Response{Topics: []metadata.ResponseTopic{{Name: r.TopicNames[0], Partitions: ps}}}, nil
	case *rawproduce.Request:
		if b.block != nil {
			select {
			case <-b.block:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		fr := fakeRequest{parts: map[int32][]kafka.Message{}}
		res := &produce.Response{}
		b.mu.Lock()
		n := len(b.requests)
		for _, t := range r.Topics {
			rt := produce.ResponseTopic{Topic: t.Topic}
			for _, p := range t.Partitions {
				msgs, err := decodeRaw(p.RecordSet)
				if err != nil {
					b.mu.Unlock()
					return nil, fmt.Errorf("fake broker: bad record batch: %w", err)
				}
				fr.parts[p.Partition] = msgs
				code := int16(0)
				if b.fail != nil {
					code = b.fail(n, p.Partition)
				}
				rt.Partitions = append(rt.Partitions, produce.ResponsePartition{Partition: p.Partition, ErrorCode: code})
			}
			res.Topics = append(res.Topics, rt)
		}
		b.requests = append(b.requests, fr)
		b.mu.Unlock()
		return res, nil
	}
	return nil, fmt.Errorf("fake broker: unexpected request %T", req)
}

// decodeRaw reads a raw record set with kafka-go's decoder.
func decodeRaw(rs protocol.RawRecordSet) ([]kafka.Message, error) {
	raw, err := io.ReadAll(rs.Reader)
	if err != nil {
		return nil, err
	}
	if len(raw) < 4 || int(binary.BigEndian.Uint32(raw)) != len(raw)-4 {
		return nil, fmt.Errorf("the record set's size prefix does not match its %d bytes", len(raw))
	}
	var set protocol.RecordSet
	if _, err := set.ReadFrom(bytes.NewReader(raw)); err != nil {
		return nil, err
	}
	var out []kafka.Message
	for {
		rec, err := set.Records.ReadRecord()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		m := kafka.Message{Offset: rec.Offset, Time: rec.Time}
		if rec.Key != nil {
			m.Key, _ = io.ReadAll(rec.Key)
			if m.Key == nil {
				m.Key = []byte{}
			}
		}
		if rec.Value != nil {
			m.Value, _ = io.ReadAll(rec.Value)
		}
		for _, h := range rec.Headers {
			m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
		out = append(out, m)
	}
}

type ackRecorder struct {
	mu    sync.Mutex
	errs  map[string]error
	order []string
	done  chan struct{}
	want  int
}

func newAckRecorder(want int) *ackRecorder {
	return &ackRecorder{errs: map[string]error{}, done: make(chan struct{}), want: want}
}

func (r *ackRecorder) wait(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("only %d of %d records were acknowledged or failed", len(r.errs), r.want)
	}
}

func (r *ackRecorder) get(k string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs[k]
}

type ack struct {
	r   *ackRecorder
	key string
}

func (a ack) Ack(err error) {
	a.r.mu.Lock()
	defer a.r.mu.Unlock()
	if _, dup := a.r.errs[a.key]; dup {
		panic("record " + a.key + " acknowledged twice")
	}
	a.r.errs[a.key] = err
	a.r.order = append(a.r.order, a.key)
	if len(a.r.errs) == a.r.want {
		close(a.r.done)
	}
}

func testProducer(t *testing.T, b *fakeBroker, cfg Config) *Producer {
	t.Helper()
	if cfg.BatchBytes == 0 {
		cfg.BatchBytes = 1 << 20
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = time.Second
	}
	cfg.Brokers = []string{"fake:9092"}
	p, err := newProducer(cfg, hclog.NewNullLogger(), b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = p.Close(ctx)
	})
	return p
}

func rec(r *ackRecorder, key, value string) outboxd.Record {
	return outboxd.Record{Topic: "t", Key: []byte(key), Value: []byte(value), Ack: ack{r, value},
		Headers: []outboxd.Header{{Key: "tipus", Value: []byte("comanda.creada")}, {Key: "id_esdeveniment", Value: []byte("id-" + value)}}}
}

// produceOne hands records one call at a time, as the replication stream does.
func produceOne(t *testing.T, p *Producer, recs ...outboxd.Record) {
	t.Helper()
	for i := range recs {
		if err := p.Produce(context.Background(), recs[i:i+1]); err != nil {
			t.Fatalf("produce %s: %v", recs[i].Value, err)
		}
	}
}

// TestFailedBatchFencesLaterBatches: once a batch failed for good, no later
// batch may be sent, or a later event of an aggregate would reach Kafka
// before an earlier one. kafka-go's Writer sends the partition's next batch
// after a failure; this producer must not.
func TestFailedBatchFencesLaterBatches(t *testing.T) {
	b := &fakeBroker{fail: func(n int, _ int32) int16 {
		if n == 0 {
			return int16(kafka.NotLeaderForPartition) // retriable, but attempts run out
		}
		return 0
	}}
	p := testProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond, MaxAttempts: 1})
	r := newAckRecorder(3)
	produceOne(t, p, rec(r, "P-1", "first"), rec(r, "P-1", "second"), rec(r, "P-1", "third"))
	r.wait(t)
	if got := b.values(); len(got) != 1 || len(got[0]) != 1 || got[0][0] != "first" {
		t.Fatalf("after the first batch failed the broker still received %q", got)
	}
	if !errors.Is(r.get("first"), kafka.NotLeaderForPartition) {
		t.Errorf("first: %v", r.get("first"))
	}
	for _, k := range []string{"second", "third"} {
		if !errors.Is(r.get(k), ErrFenced) {
			t.Errorf("%s: want ErrFenced, got %v", k, r.get(k))
		}
	}
	r2 := newAckRecorder(1)
	if err := p.Produce(context.Background(), []outboxd.Record{rec(r2, "P-1", "fourth")}); !errors.Is(err, ErrFenced) {
		t.Errorf("a fenced producer accepted a record: %v", err)
	}
	if !errors.Is(r2.get("fourth"), ErrFenced) {
		t.Errorf("the refused record was not failed through its Acker: %v", r2.get("fourth"))
	}
}

// TestRetryKeepsOrder: a batch that fails with a retriable error is sent
// again, and nothing of that partition that came after it leaves before it
// succeeded.
func TestRetryKeepsOrder(t *testing.T) {
	b := &fakeBroker{fail: func(n int, _ int32) int16 {
		if n < 2 {
			return int16(kafka.NotEnoughReplicas)
		}
		return 0
	}}
	p := testProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond, MaxAttempts: 5})
	r := newAckRecorder(3)
	produceOne(t, p, rec(r, "P-1", "first"), rec(r, "P-1", "second"), rec(r, "P-1", "third"))
	r.wait(t)
	for _, k := range []string{"first", "second", "third"} {
		if err := r.get(k); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
	got := b.values()
	var flat []string
	for _, vs := range got {
		flat = append(flat, vs...)
	}
	if want := "first first first second third"; strings.Join(flat, " ") != want {
		t.Fatalf("the broker received %q, want %q", flat, want)
	}
}

// TestRoundCarriesEveryPartition: records for six partitions that arrive
// within the linger go out in one produce request, not one per partition.
func TestRoundCarriesEveryPartition(t *testing.T) {
	b := &fakeBroker{partitions: 6}
	p := testProducer(t, b, Config{Linger: 50 * time.Millisecond, MaxAttempts: 1})
	r := newAckRecorder(60)
	var recs []outboxd.Record
	for i := 0; i < 60; i++ {
		recs = append(recs, rec(r, fmt.Sprintf("P-%d", i), fmt.Sprintf("v%02d", i)))
	}
	produceOne(t, p, recs...)
	r.wait(t)
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.requests) != 1 {
		t.Fatalf("%d produce requests, want 1", len(b.requests))
	}
	if n := len(b.requests[0].parts); n != 6 {
		t.Errorf("the request carried %d partitions, want 6", n)
	}
	bal := &kafka.Murmur2Balancer{Consistent: true}
	total := 0
	for part, msgs := range b.requests[0].parts {
		for i, m := range msgs {
			total++
			if want := bal.Balance(kafka.Message{Key: m.Key}, 0, 1, 2, 3, 4, 5); int32(want) != part {
				t.Errorf("key %s in partition %d, murmur2 says %d", m.Key, part, want)
			}
			if m.Offset != int64(i) {
				t.Errorf("partition %d record %d has offset delta %d", part, i, m.Offset)
			}
			if len(m.Headers) != 2 || m.Headers[0].Key != "tipus" || string(m.Headers[1].Value) != "id-"+string(m.Value) {
				t.Errorf("headers of %s: %v", m.Value, m.Headers)
			}
		}
	}
	if total != 60 {
		t.Errorf("%d records decoded, want 60", total)
	}
}

// TestPartialFailure: one partition of a request refused for good fails its
// records as a RecordError, the other partitions' records are acknowledged,
// and nothing later is sent.
func TestPartialFailure(t *testing.T) {
	bal := &kafka.Murmur2Balancer{Consistent: true}
	var badKey, goodKey string
	for i := 0; badKey == "" || goodKey == ""; i++ {
		k := fmt.Sprintf("K-%d", i)
		if bal.Balance(kafka.Message{Key: []byte(k)}, 0, 1) == 1 {
			badKey = k
		} else {
			goodKey = k
		}
	}
	b := &fakeBroker{partitions: 2, fail: func(_ int, part int32) int16 {
		if part == 1 {
			return int16(kafka.MessageSizeTooLarge)
		}
		return 0
	}}
	p := testProducer(t, b, Config{Linger: 20 * time.Millisecond, MaxAttempts: 3})
	r := newAckRecorder(2)
	produceOne(t, p, rec(r, goodKey, "good"), rec(r, badKey, "bad"))
	r.wait(t)
	if err := r.get("good"); err != nil {
		t.Errorf("good: %v", err)
	}
	var re *RecordError
	if err := r.get("bad"); !errors.As(err, &re) || !errors.Is(err, kafka.MessageSizeTooLarge) {
		t.Errorf("bad: want a RecordError wrapping MessageSizeTooLarge, got %v", err)
	}
	r2 := newAckRecorder(1)
	if err := p.Produce(context.Background(), []outboxd.Record{rec(r2, goodKey, "later")}); !errors.Is(err, ErrFenced) {
		t.Errorf("a record after a permanent failure was accepted: %v", err)
	}
	if n := len(b.values()); n != 1 {
		t.Errorf("%d produce requests, want 1", n)
	}
}

// TestOneRequestPerLeader: partitions led by different brokers go out in
// one request per leader, each carrying only its own partitions.
func TestOneRequestPerLeader(t *testing.T) {
	b := &fakeBroker{partitions: 4, leaders: func(p int) int32 { return int32(1 + p%2) }}
	p := testProducer(t, b, Config{Linger: 30 * time.Millisecond, MaxAttempts: 1})
	r := newAckRecorder(40)
	for i := 0; i < 40; i++ {
		produceOne(t, p, rec(r, fmt.Sprintf("P-%d", i), fmt.Sprintf("v%d", i)))
	}
	r.wait(t)
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.requests) != 2 {
		t.Fatalf("%d requests, want 2 (one per leader)", len(b.requests))
	}
	for _, req := range b.requests {
		leader := int32(-1)
		for part := range req.parts {
			l := int32(1 + part%2)
			if leader >= 0 && l != leader {
				t.Errorf("one request mixes partitions of leaders %d and %d", leader, l)
			}
			leader = l
		}
	}
}

// TestCloseGivesUp: Close waits for acknowledgements only until its context
// ends; the records still waiting are failed through their Ackers.
func TestCloseGivesUp(t *testing.T) {
	b := &fakeBroker{block: make(chan struct{})}
	defer close(b.block)
	p := testProducer(t, b, Config{Linger: time.Millisecond, MaxAttempts: 3, WriteTimeout: time.Minute})
	r := newAckRecorder(2)
	produceOne(t, p, rec(r, "P-1", "a"), rec(r, "P-2", "b"))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := p.Close(ctx); err == nil {
		t.Fatal("Close reported success with records unacknowledged")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %s", d)
	}
	r.wait(t)
	for _, k := range []string{"a", "b"} {
		if r.get(k) == nil {
			t.Errorf("%s reported delivered", k)
		}
	}
}

// TestCloseFlushes: a clean Close sends what is still lingering and waits.
func TestCloseFlushes(t *testing.T) {
	b := &fakeBroker{}
	p := testProducer(t, b, Config{Linger: time.Hour, MaxAttempts: 1})
	r := newAckRecorder(2)
	produceOne(t, p, rec(r, "P-1", "a"), rec(r, "P-1", "b"))
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.wait(t)
	if r.get("a") != nil || r.get("b") != nil {
		t.Fatalf("a: %v, b: %v", r.get("a"), r.get("b"))
	}
}

// TestBatchLimits: batches are cut at batch_size records and at batch_bytes;
// a record that cannot fit an empty batch is refused as a RecordError.
func TestBatchLimits(t *testing.T) {
	b := &fakeBroker{}
	p := testProducer(t, b, Config{Linger: 20 * time.Millisecond, BatchSize: 3, BatchBytes: 400, MaxAttempts: 1})
	r := newAckRecorder(7)
	for i := 0; i < 7; i++ {
		produceOne(t, p, rec(r, "P-1", fmt.Sprintf("v%d", i)))
	}
	r.wait(t)
	var sizes []int
	for _, vs := range b.values() {
		sizes = append(sizes, len(vs))
	}
	if fmt.Sprint(sizes) != "[3 3 1]" {
		t.Errorf("batches of %v records, want [3 3 1]", sizes)
	}
	big := newAckRecorder(1)
	err := p.Produce(context.Background(), []outboxd.Record{rec(big, "P-1", strings.Repeat("x", 400))})
	var re *RecordError
	if !errors.As(err, &re) || !errors.Is(err, kafka.MessageSizeTooLarge) {
		t.Fatalf("oversize record: %v", err)
	}
	if big.get(strings.Repeat("x", 400)) == nil {
		t.Error("the oversize record's Acker was not told")
	}
}

// TestNothingAcknowledgedBeforeTheBroker: an Acker hears nil only after the
// broker answered for its record's batch; while the request is outstanding
// (the linger long passed), nothing is reported delivered.
func TestNothingAcknowledgedBeforeTheBroker(t *testing.T) {
	b := &fakeBroker{partitions: 3, block: make(chan struct{})}
	p := testProducer(t, b, Config{Linger: time.Millisecond, MaxAttempts: 1, WriteTimeout: time.Minute})
	r := newAckRecorder(30)
	for i := 0; i < 30; i++ {
		produceOne(t, p, rec(r, fmt.Sprintf("P-%d", i), fmt.Sprintf("v%d", i)))
	}
	time.Sleep(200 * time.Millisecond)
	r.mu.Lock()
	early := len(r.errs)
	r.mu.Unlock()
	if early != 0 {
		t.Fatalf("%d records reported before the broker answered", early)
	}
	close(b.block)
	r.wait(t)
	for i := 0; i < 30; i++ {
		if err := r.get(fmt.Sprintf("v%d", i)); err != nil {
			t.Errorf("v%d: %v", i, err)
		}
	}
}

// TestProduceDoesNotWaitForMetadata: while the cluster cannot say where a
// topic's partitions are, Produce returns at once (the stream keeps
// reading and sending status); the records go out, in order, once it can.
func TestProduceDoesNotWaitForMetadata(t *testing.T) {
	unreachable := errors.New("dial tcp: connection refused")
	b := &fakeBroker{meta: func(n int) (int16, error) {
		if n < 3 {
			return 0, unreachable
		}
		return 0, nil
	}}
	p := testProducer(t, b, Config{Linger: time.Millisecond, MaxAttempts: 1})
	r := newAckRecorder(20)
	start := time.Now()
	for i := 0; i < 20; i++ {
		key := []byte("P-1")
		val := []byte(fmt.Sprintf("v%02d", i))
		recs := []outboxd.Record{{Topic: "t", Key: key, Value: val, Ack: ack{r, string(val)}}}
		if err := p.Produce(context.Background(), recs); err != nil {
			t.Fatal(err)
		}
		// The caller reuses its buffers at once: the producer copied them.
		copy(val, "xx")
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("Produce took %s without metadata", d)
	}
	r.wait(t)
	var got []string
	for _, vs := range b.values() {
		got = append(got, vs...)
	}
	want := make([]string, 20)
	for i := range want {
		want[i] = fmt.Sprintf("v%02d", i)
		if err := r.get(want[i]); err != nil {
			t.Errorf("%s: %v", want[i], err)
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the broker received %q", got)
	}
}

// TestMissingTopicFailsAsRecordError: a topic the cluster keeps calling
// unknown (no auto-creation) fails its records as a RecordError that says
// to create it, and fences the producer.
func TestMissingTopicFailsAsRecordError(t *testing.T) {
	b := &fakeBroker{meta: func(int) (int16, error) { return int16(kafka.UnknownTopicOrPartition), nil }}
	p := testProducer(t, b, Config{Linger: time.Millisecond, MaxAttempts: 1})
	p.topicWait = 300 * time.Millisecond
	r := newAckRecorder(2)
	produceOne(t, p, rec(r, "P-1", "a"), rec(r, "P-2", "b"))
	r.wait(t)
	var re *RecordError
	if err := r.get("a"); !errors.As(err, &re) || !strings.Contains(err.Error(), "create it") {
		t.Fatalf("a: %v", err)
	}
	if r.get("b") == nil {
		t.Error("b reported delivered")
	}
	if err := p.Produce(context.Background(), []outboxd.Record{rec(newAckRecorder(1), "P-3", "c")}); !errors.Is(err, ErrFenced) {
		t.Errorf("after a missing topic: %v", err)
	}
	if n := len(b.values()); n != 0 {
		t.Errorf("%d produce requests for a missing topic", n)
	}
}

// TestCloseFailsRecordsWaitingForMetadata: records still waiting for their
// topic when Close gives up are failed, not forgotten.
func TestCloseFailsRecordsWaitingForMetadata(t *testing.T) {
	b := &fakeBroker{meta: func(int) (int16, error) { return 0, errors.New("unreachable") }}
	p := testProducer(t, b, Config{Linger: time.Millisecond, MaxAttempts: 1})
	r := newAckRecorder(1)
	produceOne(t, p, rec(r, "P-1", "a"))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := p.Close(ctx); err == nil {
		t.Fatal("Close reported success")
	}
	r.wait(t)
	if r.get("a") == nil {
		t.Fatal("a reported delivered")
	}
}

// TestBrokerErrorClasses: errors no replay can fix (a missing authorization,
// and every error the broker does not call retriable, including codes
// kafka-go does not know) fail the record as a RecordError, sent once,
// which stops outboxd with the broker's reason instead of replaying the same
// refusal for ever; retriable ones (REPLICA_NOT_AVAILABLE among them, which
// kafka-go does not list) are retried.
func TestBrokerErrorClasses(t *testing.T) {
	for _, tc := range []struct {
		name      string
		code      int16
		permanent bool
	}{
		{"topic authorization failed", int16(kafka.TopicAuthorizationFailed), true},
		{"invalid timestamp", int16(kafka.InvalidTimestamp), true},
		{"policy violation", int16(kafka.PolicyViolation), true},
		{"unknown code", 9999, true},
		{"replica not available", int16(kafka.ReplicaNotAvailable), false},
		{"not enough replicas", int16(kafka.NotEnoughReplicas), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBroker{fail: func(n int, _ int32) int16 {
				if n == 0 {
					return tc.code
				}
				return 0
			}}
			p := testProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond, MaxAttempts: 3})
			r := newAckRecorder(1)
			produceOne(t, p, rec(r, "K", "v"))
			r.wait(t)
			var re *RecordError
			err := r.get("v")
			if tc.permanent {
				if !errors.As(err, &re) || !errors.Is(err, kafka.Error(tc.code)) {
					t.Fatalf("want a RecordError wrapping code %d, got %v", tc.code, err)
				}
				if n := len(b.values()); n != 1 {
					t.Errorf("a permanent error was retried: %d requests", n)
				}
				return
			}
			if err != nil {
				t.Fatalf("a retriable error was not retried: %v", err)
			}
			if n := len(b.values()); n != 2 {
				t.Errorf("want 2 requests (the failure and the retry), got %d", n)
			}
		})
	}
}

// TestFenceCarriesTheCause: a record refused because an earlier one failed
// for good carries that failure, so the stream, which keeps the first error
// it hears, stops on a permanent refusal whichever record it hears of first
// (a bare ErrFenced would be taken for an outage and replayed for ever).
func TestFenceCarriesTheCause(t *testing.T) {
	b := &fakeBroker{fail: func(int, int32) int16 { return int16(kafka.MessageSizeTooLarge) }}
	p := testProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond, MaxAttempts: 3})
	r := newAckRecorder(1)
	produceOne(t, p, rec(r, "K", "first"))
	r.wait(t)
	r2 := newAckRecorder(1)
	err := p.Produce(context.Background(), []outboxd.Record{rec(r2, "K", "second")})
	var re *RecordError
	if !errors.Is(err, ErrFenced) || !errors.As(err, &re) || !errors.Is(err, kafka.MessageSizeTooLarge) {
		t.Fatalf("Produce after a permanent failure: want ErrFenced carrying the RecordError, got %v", err)
	}
	if got := r2.get("second"); !errors.As(got, &re) {
		t.Errorf("the fenced record's Acker: want the RecordError, got %v", got)
	}
}
