package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/metadata"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/clock/clocktest"
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

// TestMissingTopicWaitStartsWhenTheBrokerAnswers (issue 24): the cluster is
// unreachable for longer than the wait, then answers UNKNOWN_TOPIC_OR_PARTITION
// twice (a broker that has just restarted and is creating the topic),
// then the topic: the records are delivered. The wait runs from the first
// answer, not from the first request.
func TestMissingTopicWaitStartsWhenTheBrokerAnswers(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	var missing atomic.Int32
	b := &fakeBroker{meta: func(int) (int16, error) {
		if down.Load() {
			return 0, errors.New("dial tcp: connection refused")
		}
		if missing.Add(1) <= 2 { // over less than the wait
			return int16(kafka.UnknownTopicOrPartition), nil
		}
		return 0, nil
	}}
	c := clocktest.New()
	p := testProducer(t, b, Config{Linger: time.Millisecond, MaxAttempts: 1, Clock: c})
	p.topicWait = 300 * time.Millisecond
	r := newAckRecorder(2)
	produceOne(t, p, rec(r, "P-1", "a"), rec(r, "P-2", "b"))
	advanceFor(t, c, 2*p.topicWait) // the broker down for longer than the wait
	down.Store(false)
	advanceUntil(c, r.done)
	r.wait(t)
	if r.get("a") != nil || r.get("b") != nil {
		t.Fatalf("after the broker came back: a: %v, b: %v", r.get("a"), r.get("b"))
	}
}

// TestMissingTopicEvidence: a topic the brokers keep calling unknown, past
// the wait, is judged by what the brokers' configuration says (read once
// through DescribeConfigs): auto-creation off stops outboxd (a RecordError
// naming the setting and where it was read); on is an outage (a retriable
// error that says so: the session is retried); unreadable stops it, saying
// what was observed and that the setting is unknown.
func TestMissingTopicEvidence(t *testing.T) {
	for _, tc := range []struct {
		autoCreate string
		permanent  bool
		says       string
	}{
		{"false", true, "auto.create.topics.enable=false in the configuration of broker 1): create it"},
		{"true", false, "auto.create.topics.enable=true in the configuration of broker 1) but have not created it"},
		{"", true, "whether the brokers create topics is unknown: their configuration could not be read from broker 1"},
	} {
		t.Run("auto.create.topics.enable="+tc.autoCreate, func(t *testing.T) {
			b := &fakeBroker{autoCreate: tc.autoCreate, meta: func(int) (int16, error) { return int16(kafka.UnknownTopicOrPartition), nil }}
			p := testProducer(t, b, Config{Linger: time.Millisecond, MaxAttempts: 1})
			p.topicWait = 300 * time.Millisecond
			r := newAckRecorder(1)
			produceOne(t, p, rec(r, "P-1", "a"))
			r.wait(t)
			err := r.get("a")
			var re *RecordError
			if errors.As(err, &re) != tc.permanent || !strings.Contains(err.Error(), tc.says) ||
				!strings.Contains(err.Error(), "answered UNKNOWN_TOPIC_OR_PARTITION to") {
				t.Fatalf("want permanent %v, saying %q and what was observed; got %v", tc.permanent, tc.says, err)
			}
			b.mu.Lock()
			describes := b.describes
			b.mu.Unlock()
			if describes != 1 {
				t.Errorf("%d DescribeConfigs requests, want 1", describes)
			}
		})
	}
}

// TestAnswerWithoutClusterViewIsNoAnswer (issue 19 item 8): a broker that
// does not know the cluster yet (no broker, controller -1: a ZooKeeper-mode
// broker after a controller restart, before the new controller sent it the
// cluster's state) calls an existing topic unknown for longer than the
// wait; that says nothing about the topic, and the records are delivered
// once it knows. A fake broker: Kafka 4.1 (KRaft), the tests' broker, does
// not serve requests before it caught up with the cluster's metadata.
func TestAnswerWithoutClusterViewIsNoAnswer(t *testing.T) {
	var blind atomic.Bool
	blind.Store(true)
	b := &fakeBroker{
		noClusterView: func(int) bool { return blind.Load() },
		meta: func(int) (int16, error) {
			if blind.Load() {
				return int16(kafka.UnknownTopicOrPartition), nil
			}
			return 0, nil
		}}
	c := clocktest.New()
	p := testProducer(t, b, Config{Linger: time.Millisecond, MaxAttempts: 1, Clock: c})
	p.topicWait = 300 * time.Millisecond
	r := newAckRecorder(1)
	produceOne(t, p, rec(r, "P-1", "a"))
	advanceFor(t, c, 4*p.topicWait)
	blind.Store(false)
	advanceUntil(c, r.done)
	r.wait(t)
	if err := r.get("a"); err != nil {
		t.Fatalf("a: %v", err)
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

// TestMetadataRefusalStops: a metadata answer no retry can change (an
// authorization refused, an invalid topic name, any error the broker does
// not call retriable) fails the topic's records at once as a RecordError
// naming the topic, the first record's key and the broker's reason, after
// one request: outboxd stops with the reason instead of asking every 250 ms
// until the delivery timeout and replaying for ever. A retriable answer is
// asked again and the records go out.
func TestMetadataRefusalStops(t *testing.T) {
	for _, tc := range []struct {
		name   string
		code   int16
		reason string // "": retriable, the records are delivered
	}{
		{"topic authorization failed", int16(kafka.TopicAuthorizationFailed), "grant outboxd's principal DESCRIBE and WRITE"},
		{"invalid topic", int16(kafka.InvalidTopic), "the topic name is invalid"},
		{"unknown code", 9999, "non-retriable"},
		{"request timed out", int16(kafka.RequestTimedOut), ""},
		// Kafka 2.8.2 with its ZooKeeper down, asked to create the topic.
		{"unknown server error", int16(kafka.Unknown), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The first answer waits until both records were handed over:
			// given earlier, it fences the producer before b's Produce,
			// which then returns the fence instead of b waiting with a.
			handed := make(chan struct{})
			b := &fakeBroker{meta: func(n int) (int16, error) {
				if n == 0 {
					<-handed
					return tc.code, nil
				}
				return 0, nil
			}}
			p := testProducer(t, b, Config{Linger: time.Millisecond, MaxAttempts: 1})
			// A refusal taken for a topic being created would only fail
			// after this, beyond the recorder's patience.
			p.topicWait = time.Hour
			r := newAckRecorder(2)
			produceOne(t, p, rec(r, "P-1", "a"), rec(r, "P-2", "b"))
			close(handed)
			r.wait(t)
			b.mu.Lock()
			metaRequests := b.metaN
			b.mu.Unlock()
			if tc.reason == "" {
				if r.get("a") != nil || r.get("b") != nil {
					t.Fatalf("after a retriable metadata error: a: %v, b: %v", r.get("a"), r.get("b"))
				}
				if metaRequests != 2 {
					t.Errorf("%d metadata requests, want 2 (the error and the retry)", metaRequests)
				}
				return
			}
			var re *RecordError
			err := r.get("a")
			if !errors.As(err, &re) || !errors.Is(err, kafka.Error(tc.code)) || re.Topic != "t" || string(re.Key) != "P-1" ||
				!strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("a: want a RecordError for topic t, key P-1, wrapping code %d, saying %q; got %v", tc.code, tc.reason, err)
			}
			if err := r.get("b"); !errors.Is(err, ErrFenced) || !errors.As(err, &re) {
				t.Errorf("b: want ErrFenced carrying the RecordError, got %v", err)
			}
			if metaRequests != 1 {
				t.Errorf("%d metadata requests, want 1", metaRequests)
			}
			if n := len(b.values()); n != 0 {
				t.Errorf("%d produce requests for a refused topic", n)
			}
		})
	}
}

// TestPartitionsAdded: partitions added to a topic while records flow.
// follow: the records after the change are hashed over the new count (an
// aggregate may move), said by Partitions (the metric) and a warning; the
// records before it stay where they were. stop: no record is sent with the
// new layout; the producer is fenced with a RecordError that names the
// change, so outboxd stops instead of replaying.
func TestPartitionsAdded(t *testing.T) {
	// Keys that murmur2 puts in another partition out of 8 than out of 4.
	var keys []string
	for i := 0; len(keys) < 5; i++ {
		k := fmt.Sprintf("P-%d", i)
		bal := &kafka.Murmur2Balancer{Consistent: true}
		if bal.Balance(kafka.Message{Key: []byte(k)}, 0, 1, 2, 3) != bal.Balance(kafka.Message{Key: []byte(k)}, 0, 1, 2, 3, 4, 5, 6, 7) {
			keys = append(keys, k)
		}
	}
	for _, policy := range []string{PartitionsFollow, PartitionsStop} {
		t.Run(policy, func(t *testing.T) {
			b := &fakeBroker{partitions: 4}
			type change struct{ from, to int }
			var mu sync.Mutex
			var changes []change
			told := make(chan struct{}, 10)
			c := clocktest.New()
			p := testProducer(t, b, Config{MaxAttempts: 1, OnPartitionChange: policy, Clock: c,
				Partitions: func(_ string, from, to int) {
					mu.Lock()
					changes = append(changes, change{from, to})
					mu.Unlock()
					told <- struct{}{}
				}})
			before := newAckRecorder(len(keys))
			for _, k := range keys {
				produceOne(t, p, rec(before, k, "before-"+k))
			}
			before.wait(t)
			<-told // 0 -> 4
			b.setPartitions(8)
			c.Advance(p.metadataTTL + time.Millisecond)
			p.poke() // the sender reads metadata on its rounds
			select {
			case <-told:
			case <-time.After(time.Minute):
			}
			mu.Lock()
			got := fmt.Sprint(changes)
			mu.Unlock()
			if got != "[{0 4} {4 8}]" {
				t.Fatalf("partition counts told: %s", got)
			}
			after := newAckRecorder(len(keys))
			var errs []error
			for _, k := range keys {
				errs = append(errs, p.Produce(rec(after, k, "after-"+k)))
			}
			after.wait(t)
			at := b.partitionOf()
			bal := &kafka.Murmur2Balancer{Consistent: true}
			for i, k := range keys {
				if want := int32(bal.Balance(kafka.Message{Key: []byte(k)}, 0, 1, 2, 3)); at["before-"+k] != want {
					t.Errorf("%s before the change in partition %d, want %d", k, at["before-"+k], want)
				}
				moved := int32(bal.Balance(kafka.Message{Key: []byte(k)}, 0, 1, 2, 3, 4, 5, 6, 7))
				if policy == PartitionsFollow {
					if errs[i] != nil || after.get("after-"+k) != nil || at["after-"+k] != moved {
						t.Errorf("%s after the change: produce %v, ack %v, partition %d, want %d", k, errs[i], after.get("after-"+k), at["after-"+k], moved)
					}
					continue
				}
				var re *RecordError
				if err := after.get("after-" + k); !errors.As(err, &re) || !strings.Contains(err.Error(), "went from 4 to 8 partitions") {
					t.Errorf("%s after the change: %v, want a RecordError naming the change", k, err)
				}
				if _, sent := at["after-"+k]; sent {
					t.Errorf("%s was sent with the new layout", k)
				}
			}
		})
	}
}

// TestBootstrapFromEveryBroker: after the first metadata answer, requests
// go to the configured brokers and every broker the cluster lists, so that
// kafka-go's Transport can still read metadata when the one broker in
// kafka.brokers is down.
func TestBootstrapFromEveryBroker(t *testing.T) {
	b := &fakeBroker{brokers: []metadata.ResponseBroker{{NodeID: 1, Host: "fake", Port: 9092}, {NodeID: 2, Host: "kafka-2", Port: 9093}}}
	p := testProducer(t, b, Config{Linger: time.Millisecond, MaxAttempts: 1})
	r := newAckRecorder(1)
	produceOne(t, p, rec(r, "P-1", "a"))
	r.wait(t)
	b.mu.Lock()
	addrs := append([]string(nil), b.addrs...)
	b.mu.Unlock()
	if len(addrs) < 2 || addrs[0] != "fake:9092" || addrs[len(addrs)-1] != "fake:9092,kafka-2:9093" {
		t.Errorf("request addresses %q: want fake:9092 first, then fake:9092,kafka-2:9093", addrs)
	}
}

// TestUnansweredLeaderIsNotAskedForMetadata (chaos 8d): a produce request
// to broker 2, the partition's leader, gets no answer; until avoidFor has
// passed, requests go to the Transport with the other brokers' addresses
// only, so that its layout comes from a broker that knows the new leader,
// not from one cut off from the cluster that still calls itself the
// leader. Then every broker is asked again.
func TestUnansweredLeaderIsNotAskedForMetadata(t *testing.T) {
	c := clocktest.New()
	drive(t, c, time.Second)
	b := &fakeBroker{
		brokers: []metadata.ResponseBroker{{NodeID: 1, Host: "fake", Port: 9092}, {NodeID: 2, Host: "kafka-2", Port: 9093}},
		leaders: func(int) int32 { return 2 },
		cut:     func(n int) (bool, bool) { return n == 0, false },
	}
	p := testProducer(t, b, Config{Linger: time.Millisecond, MaxAttempts: 3, Clock: c})
	addrs := func() []string {
		b.mu.Lock()
		defer b.mu.Unlock()
		return append([]string(nil), b.addrs...)
	}
	r := newAckRecorder(1)
	produceOne(t, p, rec(r, "P-1", "a"))
	r.wait(t)
	if err := r.get("a"); err != nil {
		t.Fatalf("a: %v", err)
	}
	got := addrs()
	if last := got[len(got)-1]; last != "fake:9092" {
		t.Errorf("after broker 2 did not answer, requests went to %q, want fake:9092 (broker 2 left out); all: %q", last, got)
	}
	c.Advance(avoidFor)
	r = newAckRecorder(1)
	produceOne(t, p, rec(r, "P-1", "b"))
	r.wait(t)
	got = addrs()
	if last := got[len(got)-1]; last != "fake:9092,kafka-2:9093" {
		t.Errorf("%s after, requests went to %q, want every broker again", avoidFor, last)
	}
}
