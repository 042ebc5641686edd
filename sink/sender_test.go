package sink

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd"
)

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
	if err := p.Produce(rec(r2, "P-1", "fourth")); !errors.Is(err, ErrFenced) {
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
	var recs []*outboxd.Record
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
	if err := p.Produce(rec(r2, goodKey, "later")); !errors.Is(err, ErrFenced) {
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
