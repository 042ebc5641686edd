package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

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
	err := p.Produce(rec(big, "P-1", strings.Repeat("x", 400)))
	var re *RecordError
	if !errors.As(err, &re) || !errors.Is(err, kafka.MessageSizeTooLarge) {
		t.Fatalf("oversize record: %v", err)
	}
	if big.get(strings.Repeat("x", 400)) == nil {
		t.Error("the oversize record's Acker was not told")
	}
}
