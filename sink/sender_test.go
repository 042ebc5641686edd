package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/clock/clocktest"
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
	checkPlaces(t, r, b) // a batch sent again is placed where its last answer says
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
// (it reached the broker, which holds it), nothing is reported delivered.
func TestNothingAcknowledgedBeforeTheBroker(t *testing.T) {
	b := &fakeBroker{partitions: 3, block: make(chan struct{})}
	p := testProducer(t, b, Config{Linger: time.Millisecond, MaxAttempts: 1, WriteTimeout: time.Minute})
	r := newAckRecorder(30)
	for i := 0; i < 30; i++ {
		produceOne(t, p, rec(r, fmt.Sprintf("P-%d", i), fmt.Sprintf("v%d", i)))
	}
	b.waitArrived(t, 1)
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

// TestTooLargeBatchIsSplit: a batch the broker refuses as too large is
// split in two valid batches (offset deltas from 0, timestamps kept), sent
// again in order before anything later of its partition, down to the record
// that is too large alone. A Refusable one is refused with a RefusedError
// naming it (key, headers, size) and the records after it are delivered;
// any other stops the producer with a RecordError naming it, and nothing
// after it is delivered.
func TestTooLargeBatchIsSplit(t *testing.T) {
	big := strings.Repeat("x", 2000)
	for _, tc := range []struct {
		name        string
		refusable   bool
		idempotence bool
		delivered   string // the values on the topic, in order
	}{
		{"refusable", true, false, "a c d e f"},
		{"not refusable", false, false, "a"},
		{"refusable, idempotent", true, true, "a c d e f"},
		{"not refusable, idempotent", false, true, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBroker{maxBatchBytes: 1000, block: make(chan struct{})}
			// a, big and c fill a batch, d, e and f the next one, queued
			// behind it while the broker holds the first request.
			p := testProducer(t, b, Config{BatchSize: 3, Linger: time.Hour, MaxAttempts: 1, Idempotence: tc.idempotence})
			r := newAckRecorder(6)
			recs := []*outboxd.Record{rec(r, "P-1", "a"), rec(r, "P-1", big), rec(r, "P-1", "c"),
				rec(r, "P-1", "d"), rec(r, "P-1", "e"), rec(r, "P-1", "f")}
			for _, x := range recs {
				x.Refusable = tc.refusable
			}
			produceOne(t, p, recs...)
			close(b.block)
			closeWithin(t, p, 5*time.Second)
			r.wait(t)

			got := b.onTopic()
			if got != tc.delivered {
				t.Errorf("the topic holds %q, want %q", got, tc.delivered)
			}
			if first := b.values()[0]; len(first) != 3 {
				t.Errorf("the first request carried %d records, want the batch of 3", len(first))
			}
			checkResentBatches(t, b)
			checkPlaces(t, r, b) // the split batches' records at their own offsets

			if err := r.get("a"); err != nil {
				t.Errorf("a: %v", err)
			}
			bigErr := r.get(big)
			if !errors.Is(bigErr, kafka.MessageSizeTooLarge) {
				t.Fatalf("the large record: want MESSAGE_TOO_LARGE, got %v", bigErr)
			}
			if tc.refusable {
				var re *outboxd.RefusedError
				if !errors.As(bigErr, &re) || errors.Is(bigErr, ErrFenced) {
					t.Fatalf("the large record: want a RefusedError, not fenced, got %v", bigErr)
				}
				if re.Topic != "t" || string(re.Key) != "P-1" || re.Size != recs[1].WireSize() ||
					fmt.Sprint(re.Headers) != fmt.Sprint(recs[1].Headers) {
					t.Errorf("RefusedError{%q, %q, %v, %d}, want {t, P-1, %v, %d}", re.Topic, re.Key, re.Headers, re.Size, recs[1].Headers, recs[1].WireSize())
				}
				for _, k := range []string{"c", "d", "e", "f"} {
					if err := r.get(k); err != nil {
						t.Errorf("%s, after the refused record: %v", k, err)
					}
				}
				return
			}
			var re *RecordError
			if !errors.As(bigErr, &re) || re.Topic != "t" || string(re.Key) != "P-1" ||
				!strings.Contains(bigErr.Error(), fmt.Sprintf("(%d bytes)", recs[1].WireSize())) {
				t.Fatalf("the large record: want a RecordError naming topic t, key P-1 and its size, got %v", bigErr)
			}
			for _, k := range []string{"c", "d", "e", "f"} {
				if err := r.get(k); !errors.Is(err, ErrFenced) || !errors.As(err, &re) {
					t.Errorf("%s, after the refused record: want ErrFenced carrying the RecordError, got %v", k, err)
				}
			}
		})
	}
}

// TestBatchGrownByCompressionIsSplit: incompressible records make a batch
// larger once compressed; a broker limit between the raw and the
// compressed size refuses it, and its halves are delivered, in order.
func TestBatchGrownByCompressionIsSplit(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	values := make([]string, 4)
	for i := range values {
		noise := make([]byte, 300)
		for j := range noise {
			noise[j] = byte(rnd.Uint32())
		}
		values[i] = fmt.Sprintf("v%d:%s", i, noise)
	}
	for _, name := range []string{"gzip", "snappy", "lz4", "zstd"} {
		t.Run(name, func(t *testing.T) {
			r := newAckRecorder(len(values))
			var recs []*outboxd.Record
			for _, v := range values {
				// No headers: rec's id header would repeat the value.
				recs = append(recs, &outboxd.Record{Topic: "t", Key: []byte("P-1"), Value: []byte(v), Ack: ack{r, v}})
			}
			// The limit: the batch's raw size, with room for the larger
			// timestamp deltas the producer may encode.
			raw, compressed := batchSizes(t, name, recs)
			limit := raw + len(recs)
			if compressed <= limit {
				t.Fatalf("the batch is %d bytes compressed, %d raw: the payload must not compress", compressed, raw)
			}
			b := &fakeBroker{maxBatchBytes: limit}
			p := testProducer(t, b, Config{Compression: name, BatchSize: len(recs), Linger: time.Hour, MaxAttempts: 1})
			produceOne(t, p, recs...)
			closeWithin(t, p, 5*time.Second)
			r.wait(t)
			for i, v := range values {
				if err := r.get(v); err != nil {
					t.Errorf("record %d: %v", i, err)
				}
			}
			if got := b.onTopic(); got != strings.Join(values, " ") {
				t.Errorf("the topic holds %d records, not the %d in order", len(strings.Fields(got)), len(values))
			}
			if n := len(b.values()); n != 3 {
				t.Errorf("%d produce requests, want 3 (the refused batch and its halves)", n)
			}
			checkResentBatches(t, b)
		})
	}
}

// batchSizes encodes recs as one batch and returns its size raw and
// compressed with codec name, without the record set's size prefix.
func batchSizes(t *testing.T, name string, recs []*outboxd.Record) (raw, compressed int) {
	t.Helper()
	cd, err := codec(name)
	if err != nil {
		t.Fatal(err)
	}
	b := newBatch(&partition{topic: "t"}, time.Now())
	for _, r := range recs {
		b.add(r, time.Now().UnixMilli())
	}
	var out bytes.Buffer
	enc, err := b.encode(cd, &out)
	if err != nil {
		t.Fatal(err)
	}
	return len(b.buf) - sizePrefix, len(enc) - sizePrefix
}

// checkResentBatches: every batch the broker received numbers its records
// from offset delta 0, and a record sent again keeps its timestamp.
func checkResentBatches(t *testing.T, b *fakeBroker) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	stamps := map[string]time.Time{}
	for n, req := range b.requests {
		for _, msgs := range req.parts {
			for i, m := range msgs {
				if m.Offset != int64(i) {
					t.Errorf("request %d: record %d has offset delta %d", n, i, m.Offset)
				}
				if ts, ok := stamps[string(m.Value)]; ok && !ts.Equal(m.Time) {
					t.Errorf("request %d: a record sent again at %s, first sent at %s", n, m.Time, ts)
				}
				stamps[string(m.Value)] = m.Time
			}
		}
	}
}

// closeWithin closes p, which sends what lingers, and requires it to finish
// in time.
func closeWithin(t *testing.T, p *Producer, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFlushSendsAtOnceAndBatchesWhileInFlight: records wait for the linger
// until Flush; then they go out at once when no request is in flight, and
// records flushed while one is in flight wait for the linger and go
// together in one request: a flush never makes the rounds of a busy stream
// smaller. The producer's clock moves only by hand: what goes without it
// did not wait for the linger.
func TestFlushSendsAtOnceAndBatchesWhileInFlight(t *testing.T) {
	b := &fakeBroker{partitions: 1, block: make(chan struct{})}
	c := clocktest.New()
	const linger = 300 * time.Millisecond
	p := testProducer(t, b, Config{Linger: linger, Clock: c})
	r := newAckRecorder(4)
	produceOne(t, p, rec(r, "K", "a"))
	c.AwaitTimer(t, linger) // a lingers
	if n := b.arrived.Load(); n != 0 {
		t.Fatalf("%d requests before the linger and without a flush", n)
	}
	p.Flush()
	b.waitArrived(t, 1) // the first request is in the broker, held there
	for _, v := range []string{"b", "c", "d"} {
		produceOne(t, p, rec(r, "K", v))
		p.Flush()
	}
	drain(c)
	b.block <- struct{}{} // the first request answers
	close(b.block)        // and the next one whenever it comes
	c.AwaitWaiter(t)      // the sender waits for the linger of b, c, d
	if n := b.arrived.Load(); n != 1 {
		t.Fatalf("records flushed while a request was in flight went at once (%d requests): not batched under the linger", n)
	}
	c.Advance(linger)
	b.waitArrived(t, 2)
	r.wait(t)
	got := b.values()
	if len(got) != 2 || strings.Join(got[0], ",") != "a" || strings.Join(got[1], ",") != "b,c,d" {
		t.Fatalf("requests %v, want [a] then [b c d]", got)
	}
	// Idle again: a flush sends at once, the clock unmoved.
	waitIdle(t, p)
	r2 := newAckRecorder(1)
	produceOne(t, p, rec(r2, "K", "e"))
	p.Flush()
	b.waitArrived(t, 3)
	r2.wait(t)
}

// drain forgets the waits on c so far: the next AwaitWaiter is for a new one.
func drain(c *clocktest.Clock) {
	for {
		select {
		case <-c.Waiting:
		default:
			return
		}
	}
}

// TestFlushPacesRoundsByTheirDuration: right after a round, a flush waits
// as long as that round took (here the broker held it 80 ms of the
// producer's clock), not the linger (an hour) and not zero, so that commits
// arriving back to back do not each cost the broker a request; after an
// idle spell it goes at once. The clock moves only by hand.
func TestFlushPacesRoundsByTheirDuration(t *testing.T) {
	b := &fakeBroker{partitions: 1, block: make(chan struct{})}
	c := clocktest.New()
	p := testProducer(t, b, Config{Linger: time.Hour, Clock: c})
	ra, rb, rc := newAckRecorder(1), newAckRecorder(1), newAckRecorder(1)
	produceOne(t, p, rec(ra, "K", "a"))
	p.Flush()
	b.waitArrived(t, 1)
	c.Advance(80 * time.Millisecond)
	b.block <- struct{}{} // the round took 80 ms
	ra.wait(t)
	waitIdle(t, p)
	produceOne(t, p, rec(rb, "K", "b"))
	p.Flush()
	c.AwaitTimer(t, 80*time.Millisecond) // paced, not sent at once
	c.Advance(79 * time.Millisecond)
	if n := b.arrived.Load(); n != 1 {
		t.Fatalf("the flushed round went before the previous one's duration had passed (%d requests)", n)
	}
	c.Advance(time.Millisecond)
	b.waitArrived(t, 2)
	b.block <- struct{}{}
	rb.wait(t)
	waitIdle(t, p)
	// Idle for longer than the last round took: the next flush goes at
	// once.
	c.Advance(200 * time.Millisecond)
	produceOne(t, p, rec(rc, "K", "c"))
	p.Flush()
	b.waitArrived(t, 3)
	close(b.block)
	rc.wait(t)
	if got := b.values(); len(got) != 3 {
		t.Fatalf("requests %v, want [a] [b] [c]", got)
	}
}

// TestRetryBacksOffOnItsClock: a batch the broker failed with a retriable
// error is sent again after the backoff (backoff.Delay: 50-100 ms, then
// 100-200 ms), waited on the producer's clock: nothing is retried until
// the test moves it. Nothing sleeps.
func TestRetryBacksOffOnItsClock(t *testing.T) {
	b := &fakeBroker{fail: func(n int, _ int32) int16 {
		if n < 2 {
			return int16(kafka.NotEnoughReplicas)
		}
		return 0
	}}
	c := clocktest.New()
	p := testProducer(t, b, Config{MaxAttempts: 5, Clock: c})
	r := newAckRecorder(1)
	produceOne(t, p, rec(r, "P-1", "a"))
	for n, delay := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond} {
		b.waitArrived(t, int32(n+1))
		c.AwaitWaiter(t) // the sender waits out the backoff on c
		if got := b.arrived.Load(); got != int32(n+1) {
			t.Fatalf("%d requests before the clock moved, want %d", got, n+1)
		}
		c.Advance(delay)
	}
	r.wait(t)
	if err := r.get("a"); err != nil || b.arrived.Load() != 3 {
		t.Fatalf("a: %v after %d requests; want delivered at the third", err, b.arrived.Load())
	}
}

// TestNewBatchKick: a record that opens a batch wakes the sender only when
// no timer of the sender's wakes it before the batch's linger ends: at the
// rates services run, most records open a batch, and a kick for each woke
// the sender only to set its timer again (issue 36).
func TestNewBatchKick(t *testing.T) {
	now := time.UnixMilli(1789000000000)
	linger := 5 * time.Millisecond
	for _, tc := range []struct {
		name   string
		wakeAt time.Time
		kick   bool
	}{
		{"no timer", time.Time{}, true},
		{"a timer before the linger's end", now.Add(linger / 2), false},
		{"a timer at the linger's end", now.Add(linger), false},
		{"a timer passed (the sender runs)", now.Add(-time.Second), false},
		{"a timer after the linger's end", now.Add(2 * linger), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Producer{cfg: Config{Linger: linger, BatchSize: 1000, BatchBytes: 1 << 20}, kick: make(chan struct{}, 1), wakeAt: tc.wakeAt}
			tp := &topic{name: "t"}
			part := &partition{topic: "t"}
			p.appendRecord(tp, part, &outboxd.Record{Topic: "t", Key: []byte("k"), Value: []byte("v"), Ack: nopAck{}}, now, now.UnixMilli())
			if got := len(p.kick) == 1; got != tc.kick {
				t.Errorf("kicked %t, want %t", got, tc.kick)
			}
			if part.open == nil || part.open.count != 1 {
				t.Fatalf("the record is not in the partition's open batch")
			}
		})
	}
}

// The senders live as long as the producer (issue 36: a goroutine per
// round grew its stack anew each time) and end with it: after Close no
// goroutine of the producer is left, idempotent (five senders) or not
// (one), with every record acknowledged.
func TestSendersEndWithTheProducer(t *testing.T) {
	for _, idempotent := range []bool{false, true} {
		t.Run(fmt.Sprintf("idempotence=%t", idempotent), func(t *testing.T) {
			before := runtime.NumGoroutine()
			b := &fakeBroker{}
			p := testProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond, MaxAttempts: 5, Idempotence: idempotent})
			r := newAckRecorder(20)
			for i := range 20 {
				produceOne(t, p, rec(r, fmt.Sprintf("P-%d", i%4), fmt.Sprintf("v%d", i)))
				p.Flush()
			}
			r.wait(t)
			for _, k := range r.told() {
				if err := r.get(k); err != nil {
					t.Fatalf("%s: %v", k, err)
				}
			}
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if n := runtime.NumGoroutine(); n > before {
				buf := make([]byte, 1<<20)
				t.Fatalf("%d goroutines left after Close (%d before):\n%s", n-before, before, buf[:runtime.Stack(buf, true)])
			}
		})
	}
}
