package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/clock/clocktest"
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
// a record larger than batch_bytes is not refused by the producer (the
// envelope stage decided it may be produced, the broker has the last word):
// it goes alone in its own batch, between the batches before and after it.
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
	big := strings.Repeat("x", 400)
	r2 := newAckRecorder(3)
	produceOne(t, p, rec(r2, "P-1", "before"), rec(r2, "P-1", big), rec(r2, "P-1", "after"))
	r2.wait(t)
	for _, k := range []string{"before", big, "after"} {
		if err := r2.get(k); err != nil {
			t.Errorf("%.10s: %v", k, err)
		}
	}
	if got := fmt.Sprint(b.values()[3:]); got != fmt.Sprintf("[[before] [%s] [after]]", big) {
		t.Errorf("the broker received %.60s..., want [before], the large record alone, [after]", got)
	}
}

// TestEveryFailureIsObserved: every record the producer fails reaches
// Config.Observe once with its error (outboxd_produce_errors_total counts
// them), wherever it failed: in a batch, while waiting for its topic's
// metadata, or refused by Produce after the producer stopped.
func TestEveryFailureIsObserved(t *testing.T) {
	unreachable := func(int) (int16, error) { return 0, errors.New("dial tcp: connection refused") }
	closeSoon := func(t *testing.T, p *Producer) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if err := p.Close(ctx); err == nil {
			t.Error("Close reported success with records unacknowledged")
		}
	}
	for _, tc := range []struct {
		name   string
		broker *fakeBroker
		cfg    Config
		then   func(t *testing.T, p *Producer) // after the records were handed over
	}{
		{"closed while waiting for metadata", &fakeBroker{meta: unreachable},
			Config{Linger: time.Millisecond, MaxAttempts: 1}, closeSoon},
		{"closed with the request in flight", &fakeBroker{block: make(chan struct{})},
			Config{Linger: time.Millisecond, MaxAttempts: 1, WriteTimeout: time.Minute}, closeSoon},
		{"missing topic", &fakeBroker{meta: func(int) (int16, error) { return int16(kafka.UnknownTopicOrPartition), nil }},
			Config{Linger: time.Millisecond, MaxAttempts: 1}, nil},
		{"fenced after a failed batch", &fakeBroker{fail: func(int, int32) int16 { return int16(kafka.NotLeaderForPartition) }},
			Config{BatchSize: 1, Linger: time.Millisecond, MaxAttempts: 1}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.broker.block != nil {
				defer close(tc.broker.block)
			}
			var obs observer
			tc.cfg.Observe = obs.observe
			p := testProducer(t, tc.broker, tc.cfg)
			p.topicWait = 100 * time.Millisecond
			r := newAckRecorder(3)
			produceOne(t, p, rec(r, "P-1", "a"), rec(r, "P-1", "b"), rec(r, "P-1", "c"))
			if tc.then != nil {
				tc.then(t, p)
			}
			r.wait(t)
			for _, k := range []string{"a", "b", "c"} {
				if r.get(k) == nil {
					t.Fatalf("%s reported delivered", k)
				}
			}
			late := newAckRecorder(1)
			if err := p.Produce(rec(late, "P-1", "late")); err == nil {
				t.Fatal("a stopped producer accepted a record")
			}
			if ok, failed := obs.counts(); ok != 0 || failed != 4 {
				t.Errorf("observed %d delivered and %d failed records, want 0 and 4", ok, failed)
			}
		})
	}
}

// TestCloseWaitsForTheSender: a Close that gave up returns only once its
// sender goroutine has, even when the request in flight takes its time to
// give up after the cancellation: the goroutine never outlives Close.
// (Close used to wait one more second of its clock and return with the
// goroutine still in the request.) The producer's clock is moved as soon
// as anyone waits on it, so any wait on it ends at once; the test then
// gives Close 300 ms to return early, which only a broken Close does.
func TestCloseWaitsForTheSender(t *testing.T) {
	b := &fakeBroker{block: make(chan struct{}), slowCancel: make(chan struct{}), cancelled: make(chan struct{})}
	c := clocktest.New()
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) }) // after the producer's Close
	go func() {
		for {
			select {
			case <-c.Waiting:
				c.Advance(time.Hour)
			case <-stop:
				return
			}
		}
	}()
	p := testProducer(t, b, Config{MaxAttempts: 1, WriteTimeout: time.Hour, Clock: c})
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(b.slowCancel) }) }) // before it
	r := newAckRecorder(1)
	produceOne(t, p, rec(r, "K", "a"))
	b.waitArrived(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	closed := make(chan error, 1)
	go func() { closed <- p.Close(ctx) }()
	<-b.cancelled
	select {
	case <-closed:
		t.Fatal("Close returned while its sender goroutine was still in a request")
	case <-time.After(300 * time.Millisecond):
	}
	release.Do(func() { close(b.slowCancel) })
	if err := <-closed; err == nil {
		t.Fatal("Close reported success with a record unacknowledged")
	}
	select {
	case <-p.done:
	default:
		t.Fatal("the sender goroutine outlived Close")
	}
	r.wait(t)
}
