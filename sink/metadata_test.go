package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd"
)

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
		if err := p.Produce(&outboxd.Record{Topic: "t", Key: key, Value: val, Ack: ack{r, string(val)}}); err != nil {
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
	if err := p.Produce(rec(newAckRecorder(1), "P-3", "c")); !errors.Is(err, ErrFenced) {
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
