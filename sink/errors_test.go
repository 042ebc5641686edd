package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd"
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

// TestRecordRefusalsFollowOnError (issue 19 item 8): a record the broker
// refuses for its content whatever the retries (INVALID_TIMESTAMP: a
// replayed old row whose routes[].timestamp is older than the topic takes;
// INVALID_RECORD), or refuses as corrupt on every attempt (CORRUPT_MESSAGE,
// retried first: it may be the network's), is isolated as a record too
// large is: its batch is split down to it, the records before and after it
// keep their order, and its route's on_error decides. A Refusable record
// (on_error: dead_letter) is refused with a RefusedError naming the way out
// and the records after it are delivered; any other stops the producer
// with a RecordError that names the way out. Before, CORRUPT_MESSAGE was
// retried for ever (replayed from the slot after each session), and a
// timestamp refusal stopped outboxd whatever on_error said, so a snapshot
// with such a row could never finish. The fake broker injects the
// refusals: a real broker cannot be made to refuse one chosen record as
// corrupt (TestInvalidTimestampFollowsOnError has a real one refuse a
// timestamp).
func TestRecordRefusalsFollowOnError(t *testing.T) {
	for _, tc := range []struct {
		name     string
		code     kafka.Error
		way      string
		requests int // the requests that carried the refused record
	}{
		{"invalid timestamp", kafka.InvalidTimestamp, "message.timestamp.type=LogAppendTime", 3},
		{"invalid record", kafka.InvalidRecord, "a compacted topic refuses a record without a key", 3},
		{"corrupt message", kafka.InvalidMessage, "CORRUPT_MESSAGE", 5}, // the batch 3 times (max_attempts), then halved
	} {
		for _, refusable := range []bool{true, false} {
			for _, idem := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/refusable=%v/idempotence=%v", tc.name, refusable, idem), func(t *testing.T) {
					b := &fakeBroker{refuse: map[string]int16{"c": int16(tc.code)}, refusal: "the broker's own words", block: make(chan struct{})}
					// a, b, c and d fill a batch, e and f the next one, queued
					// behind it while the broker holds the first request.
					p := testProducer(t, b, Config{BatchSize: 4, Linger: time.Hour, MaxAttempts: 3, Idempotence: idem})
					r := newAckRecorder(6)
					recs := []*outboxd.Record{rec(r, "P-1", "a"), rec(r, "P-1", "b"), rec(r, "P-1", "c"),
						rec(r, "P-1", "d"), rec(r, "P-1", "e"), rec(r, "P-1", "f")}
					for _, x := range recs {
						x.Refusable = refusable
					}
					produceOne(t, p, recs...)
					close(b.block)
					closeWithin(t, p, 10*time.Second)
					r.wait(t)

					got := b.onTopic()
					want := "a b"
					if refusable {
						want = "a b d e f"
					}
					if got != want {
						t.Errorf("the topic holds %q, want %q", got, want)
					}
					carried := 0
					for _, vs := range b.values() {
						if slices.Contains(vs, "c") {
							carried++
						}
					}
					if carried != tc.requests {
						t.Errorf("%d requests carried c, want %d", carried, tc.requests)
					}
					checkResentBatches(t, b)
					err := r.get("c")
					if !errors.Is(err, tc.code) || !strings.Contains(err.Error(), tc.way) || !strings.Contains(err.Error(), "the broker's own words") {
						t.Fatalf("c: want the broker's code %d, its message and the way out %q; got %v", tc.code, tc.way, err)
					}
					var refused *outboxd.RefusedError
					var re *RecordError
					switch {
					case refusable && (!errors.As(err, &refused) || errors.Is(err, ErrFenced)):
						t.Fatalf("c: want a RefusedError, not fenced; got %v", err)
					case !refusable && (!errors.As(err, &re) || !strings.Contains(err.Error(), "on_error: dead_letter")):
						t.Fatalf("c: want a RecordError that names on_error: dead_letter; got %v", err)
					}
					for _, k := range []string{"d", "e", "f"} {
						if err := r.get(k); refusable && err != nil || !refusable && !errors.Is(err, ErrFenced) {
							t.Errorf("%s, after the refused record: %v", k, err)
						}
					}
				})
			}
		}
	}
}

// TestFailureIsReturnedNotLogged: a batch that fails for good (a record
// too large even alone, an outage that outlived the attempts) reaches its
// Ackers, and through them the stream, whose runner logs it; the producer
// does not log it too (log or return, never both).
func TestFailureIsReturnedNotLogged(t *testing.T) {
	for name, code := range map[string]kafka.Error{"refused": kafka.MessageSizeTooLarge, "outage": kafka.NotEnoughReplicas} {
		t.Run(name, func(t *testing.T) {
			var logged bytes.Buffer
			log := hclog.New(&hclog.LoggerOptions{Output: &logged, Level: hclog.Warn})
			b := &fakeBroker{partitions: 1, fail: func(int, int32) int16 { return int16(code) }}
			p, err := NewWithTransport(Config{Brokers: []string{"fake:9092"}, Partitioner: "murmur2", Compression: "none",
				OnPartitionChange: PartitionsFollow, BatchSize: 1, BatchBytes: 1 << 20, MaxAttempts: 1, WriteTimeout: time.Second}, log, b)
			if err != nil {
				t.Fatal(err)
			}
			r := newAckRecorder(1)
			produceOne(t, p, rec(r, "K", "a"))
			r.wait(t)
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := r.get("a"); !errors.Is(got, code) {
				t.Fatalf("the Acker got %v, want %v", got, code)
			}
			if logged.Len() > 0 {
				t.Fatalf("the producer logged the failure it returned:\n%s", logged.String())
			}
		})
	}
}
