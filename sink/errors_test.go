package sink

import (
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

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
	err := p.Produce(rec(r2, "K", "second"))
	var re *RecordError
	if !errors.Is(err, ErrFenced) || !errors.As(err, &re) || !errors.Is(err, kafka.MessageSizeTooLarge) {
		t.Fatalf("Produce after a permanent failure: want ErrFenced carrying the RecordError, got %v", err)
	}
	if got := r2.get("second"); !errors.As(got, &re) {
		t.Errorf("the fenced record's Acker: want the RecordError, got %v", got)
	}
}
