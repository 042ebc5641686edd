package sink

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/fetch"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/clock/clocktest"
)

// tails is a tailReader for the unit tests: the partition's tail as
// pos/found, after fails failures; reads counts the calls.
type tails struct {
	mu    sync.Mutex
	pos   outboxd.Pos
	found bool
	fails int
	err   error // the failures' error (nil: a leader not available)
	reads int
	parts []int // the partition counts asked for
}

func (x *tails) read(_ context.Context, _ string, _ int32, partitions int) (outboxd.Pos, bool, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.reads++
	x.parts = append(x.parts, partitions)
	if x.fails > 0 {
		x.fails--
		if x.err != nil {
			return outboxd.Pos{}, false, x.err
		}
		return outboxd.Pos{}, false, errors.New("leader not available")
	}
	return x.pos, x.found, nil
}

func dedupeProducer(t *testing.T, b *fakeBroker, x *tails, skipped *[]string, c *clocktest.Clock) *Producer {
	t.Helper()
	var mu sync.Mutex
	cfg := Config{BatchSize: 1, Linger: time.Millisecond, Stream: "7000000000000000001/outboxd/abc", Timeline: 1,
		Timelines: map[uint32]Timeline{1: {}}, WALEnd: 1 << 40, Clock: c, StreamKey: testKey,
		Skipped: func(topic string) {
			mu.Lock()
			defer mu.Unlock()
			*skipped = append(*skipped, topic)
		}}
	p := idemProducer(t, b, cfg)
	p.tailOf = x.read
	return p
}

func posRec(r *ackRecorder, value string, lsn uint64, idx uint32) *outboxd.Record {
	x := rec(r, "P-1", value)
	x.Pos = outboxd.Pos{LSN: lsn, Index: idx}
	return x
}

// TestRestartSkipsWhatThePartitionHolds: the partition's tail holds the
// stream's record at 100/1. The session's records at or below it are
// acknowledged without being produced, and counted; the first above it
// (100/2) and every later one are produced, with the stream header; a
// record without a position (a snapshot row) goes out as it is. Were the
// comparison off by one, or a record above the tail skipped, the slot would
// be confirmed past a record Kafka never got: the partition's content
// says so.
func TestRestartSkipsWhatThePartitionHolds(t *testing.T) {
	c := clocktest.New()
	drive(t, c, time.Second)
	b := &fakeBroker{}
	x := &tails{pos: outboxd.Pos{LSN: 100, Index: 1}, found: true}
	var skipped []string
	p := dedupeProducer(t, b, x, &skipped, c)
	r := newAckRecorder(6)
	snap := rec(r, "P-1", "snap")
	produceOne(t, p, snap, posRec(r, "a", 99, 7), posRec(r, "b", 100, 0), posRec(r, "c", 100, 1), posRec(r, "d", 100, 2), posRec(r, "e", 101, 0))
	wantTopic(t, b, r, "snap d e")
	for _, v := range []string{"a", "b", "c"} {
		if err := r.get(v); err != nil {
			t.Errorf("%s (at or below the tail) was told %v, want acknowledged", v, err)
		}
	}
	if len(skipped) != 3 {
		t.Errorf("%d records counted as skipped, want 3", len(skipped))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if got, want := b.streams["d"], signed(testKey, "t", 0, "7000000000000000001/outboxd/abc;1;1;0;100;2;0"); got != want {
		t.Errorf("d's %s header is %q, want %q", HeaderStream, got, want)
	}
	if _, has := b.streams["snap"]; has {
		t.Errorf("the snapshot row carries a stream header")
	}
	if x.reads != 1 || x.parts[0] != 1 {
		t.Errorf("the tail was read %d times (partition counts %v), want once, for 1 partition", x.reads, x.parts)
	}
}

// TestNoEvidenceNoSkip: a partition without a record of the stream (a new
// topic, or records of another identity: readKafkaTail finds none) skips
// nothing; a tail that cannot be read at once holds the records, unsent,
// while it is read again: none is skipped or produced on a guess.
func TestNoEvidenceNoSkip(t *testing.T) {
	c := clocktest.New()
	drive(t, c, time.Second)
	b := &fakeBroker{}
	x := &tails{fails: tailAttempts - 1}
	var skipped []string
	p := dedupeProducer(t, b, x, &skipped, c)
	r := newAckRecorder(2)
	produceOne(t, p, posRec(r, "a", 50, 0), posRec(r, "b", 51, 0))
	wantTopic(t, b, r, "a b")
	if len(skipped) != 0 || x.reads != tailAttempts {
		t.Errorf("%d skipped, tail read %d times; want none skipped, read %d times (%d failures)", len(skipped), x.reads, tailAttempts, tailAttempts-1)
	}
}

// TestUnreadableTailGivesUp (issue 32, item 1): a tail that fails every
// read (a partition whose oldest records retention deleted, read where
// they were) does not hold its records for ever, session after session,
// until the delivery timeout calls the broker unreachable: after
// tailAttempts reads they go out without de-duplication (a duplicate at
// worst), nothing skipped, and the partition is counted.
func TestUnreadableTailGivesUp(t *testing.T) {
	c := clocktest.New()
	drive(t, c, time.Second)
	b := &fakeBroker{}
	x := &tails{fails: 1 << 30, err: fmt.Errorf("fetch: %w", kafka.OffsetOutOfRange)}
	var skipped []string
	p := dedupeProducer(t, b, x, &skipped, c)
	var givenUp []string
	p.cfg.TailGivenUp = func(topic string) { givenUp = append(givenUp, topic) }
	r := newAckRecorder(2)
	produceOne(t, p, posRec(r, "a", 50, 0), posRec(r, "b", 51, 0))
	wantTopic(t, b, r, "a b")
	if x.reads != tailAttempts || len(skipped) != 0 {
		t.Errorf("tail read %d times, %d skipped; want %d failed reads, nothing skipped", x.reads, len(skipped), tailAttempts)
	}
	if len(givenUp) != 1 {
		t.Errorf("TailGivenUp told %v, want the topic once", givenUp)
	}
}

// TestSlowTailBoundedByTailTimeout (issue 32, item 1): a tail read that
// hangs (a leader that never answers the fetch) is cut at TailTimeout
// after the partition's first read began, and its records go out:
// the de-duplication never holds records up to the delivery timeout. On
// the system clock: the read's context is a real one.
func TestSlowTailBoundedByTailTimeout(t *testing.T) {
	b := &fakeBroker{}
	var givenUp atomic.Int32
	cfg := Config{BatchSize: 1, Linger: time.Millisecond, Stream: "7000000000000000001/outboxd/abc", Timeline: 1,
		Timelines: map[uint32]Timeline{1: {}}, WALEnd: 1 << 40, TailTimeout: 300 * time.Millisecond,
		TailGivenUp: func(string) { givenUp.Add(1) }}
	p := idemProducer(t, b, cfg)
	var left atomic.Int64 // the first read's time left, in ns
	p.tailOf = func(ctx context.Context, _ string, _ int32, _ int) (outboxd.Pos, bool, error) {
		if d, ok := ctx.Deadline(); ok {
			left.CompareAndSwap(0, int64(time.Until(d)))
		}
		<-ctx.Done()
		return outboxd.Pos{}, false, fmt.Errorf("fetch: %w", ctx.Err())
	}
	r := newAckRecorder(2)
	start := time.Now()
	produceOne(t, p, posRec(r, "a", 50, 0), posRec(r, "b", 51, 0))
	wantTopic(t, b, r, "a b")
	if d := time.Duration(left.Load()); d <= 0 || d > 300*time.Millisecond {
		t.Errorf("the tail read had %s left, want a deadline within TailTimeout (300ms)", d)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the records went out %s after their handover, want about TailTimeout", took)
	}
	if givenUp.Load() != 1 {
		t.Errorf("TailGivenUp told %d times, want once", givenUp.Load())
	}
}

// TestTailNotReadableForWantOfRead (review): the principal may write the
// topic but not read it (docs/security.md granted DESCRIBE and WRITE only):
// the refusal is not retried for ever, which would hold the records until
// the delivery timeout, session after session; the partition skips
// nothing, its records go out.
func TestTailNotReadableForWantOfRead(t *testing.T) {
	c := clocktest.New()
	drive(t, c, time.Second)
	b := &fakeBroker{}
	x := &tails{fails: 1 << 30, err: fmt.Errorf("fetch: %w", kafka.TopicAuthorizationFailed)}
	var skipped []string
	p := dedupeProducer(t, b, x, &skipped, c)
	r := newAckRecorder(2)
	produceOne(t, p, posRec(r, "a", 50, 0), posRec(r, "b", 51, 0))
	wantTopic(t, b, r, "a b")
	if x.reads != 1 || len(skipped) != 0 {
		t.Errorf("tail read %d times, %d skipped; want one refused read, nothing skipped", x.reads, len(skipped))
	}
}

// TestDedupeNeedsIdempotence: without the idempotent producer a partition
// may hold a later record without an earlier one (a retry reorders
// nothing, but a failed batch leaves a gap): nothing is skipped, the tail
// is not read, no header is added.
func TestDedupeNeedsIdempotence(t *testing.T) {
	b := &fakeBroker{}
	x := &tails{pos: outboxd.Pos{LSN: 100}, found: true}
	p := testProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond, MaxAttempts: 3, Stream: "s"})
	p.tailOf = x.read
	r := newAckRecorder(1)
	produceOne(t, p, posRec(r, "a", 90, 0))
	wantTopic(t, b, r, "a")
	if x.reads != 0 || len(b.streams) != 0 {
		t.Errorf("tail read %d times, stream headers %v; want neither", x.reads, b.streams)
	}
}

// TestProof: only the same identity under the same partition count is
// evidence: from this timeline, or from an ancestor of the same branch (the
// same start) before its end, and never past the server's WAL position.
func TestProof(t *testing.T) {
	p := &Producer{cfg: Config{Stream: "7/outboxd/abc", Timeline: 3, WALEnd: 20000,
		Timelines: map[uint32]Timeline{1: {0, 5000}, 2: {5000, 9000}, 3: {9000, 0}}}}
	at := func(tli uint32, start, lsn uint64) []byte {
		return appendStream(nil, "7/outboxd/abc", 6, tli, start, outboxd.Pos{LSN: lsn, Index: 2})
	}
	for _, tc := range []struct {
		name  string
		v     []byte
		parts int
		want  bool
	}{
		{"this timeline", at(3, 9000, 12345), 6, true},
		{"this timeline, past the server's WAL position", at(3, 9000, 20000), 6, false},
		{"timeline 2 before its end", at(2, 5000, 8999), 6, true},
		{"timeline 2 at its end (the first record of the next one)", at(2, 5000, 9000), 6, false},
		{"timeline 2 past its end (the branch a promotion left)", at(2, 5000, 9001), 6, false},
		{"another timeline 2 (another branch, another start)", at(2, 6000, 8000), 6, false},
		{"timeline 1 before its end", at(1, 0, 4999), 6, true},
		{"timeline 1 past its end", at(1, 0, 5001), 6, false},
		{"a timeline not in the history", at(4, 9000, 100), 6, false},
		{"partitions added since", at(3, 9000, 12345), 12, false},
		{"another routing", []byte("7/outboxd/abd;6;3;9000;12345;2;0"), 6, false},
		{"a prefix of the identity", []byte("7/outboxd/ab;6;3;9000;12345;2;0"), 6, false},
		{"another system", []byte("8/outboxd/abc;6;3;9000;12345;2;0"), 6, false},
		{"no route", []byte("7/outboxd/abc;6;3;9000;12345;2"), 6, false},
		{"a bad LSN", []byte("7/outboxd/abc;6;3;9000;x;2;0"), 6, false},
		{"LSN 0", []byte("7/outboxd/abc;6;3;9000;0;0;0"), 6, false},
	} {
		pos, ok := p.proof(tc.v, tc.parts)
		if ok != tc.want || ok && pos.Index != 2 {
			t.Errorf("%s: %q under %d partitions: %v %v, want %v", tc.name, tc.v, tc.parts, pos, ok, tc.want)
		}
	}
}

// TestRefusalLeavesLaterRecordsUnproven: the broker refuses a record of the
// stream for its content (its dead-letter record goes to another topic,
// unordered with this partition); the partition's later records go without
// the outboxd.stream header, so that none of them can make a later session
// skip the refused one before its dead-letter record is in Kafka. The
// refusal handed back carries no stream header either.
func TestRefusalLeavesLaterRecordsUnproven(t *testing.T) {
	c := clocktest.New()
	drive(t, c, time.Second)
	b := &fakeBroker{refuse: map[string]int16{"b": int16(kafka.InvalidRecord)}, refusal: "refused"}
	x := &tails{}
	var skipped []string
	p := dedupeProducer(t, b, x, &skipped, c)
	r := newAckRecorder(3)
	refused := posRec(r, "b", 11, 0)
	refused.Refusable = true
	produceOne(t, p, posRec(r, "a", 10, 0), refused, posRec(r, "c", 12, 0))
	r.wait(t)
	var re *outboxd.RefusedError
	if err := r.get("b"); !errors.As(err, &re) {
		t.Fatalf("b: %v, want a RefusedError", err)
	}
	for _, h := range re.Headers {
		if h.Key == HeaderStream {
			t.Errorf("the refusal carries the %s header", HeaderStream)
		}
	}
	if got := strings.Join(b.topic(0), " "); got != "a c" {
		t.Fatalf("the partition holds %q, want \"a c\"", got)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, has := b.streams["a"]; !has {
		t.Errorf("a, before the refusal, has no stream header")
	}
	if v, has := b.streams["c"]; has {
		t.Errorf("c, after the refusal, carries %q", v)
	}
}

// TestSplitHalvesGoWithoutTheHeader (review): the refused record was in a
// batch of four; the broker's refusal splits it down to the record, and
// the halves after it, sent again after the refusal, go without the
// header like any later batch of the partition.
func TestSplitHalvesGoWithoutTheHeader(t *testing.T) {
	c := clocktest.New()
	drive(t, c, time.Millisecond)
	b := &fakeBroker{refuse: map[string]int16{"b": int16(kafka.InvalidRecord)}, refusal: "refused"}
	var skipped []string
	p := dedupeProducer(t, b, &tails{}, &skipped, c)
	p.cfg.BatchSize, p.cfg.Linger = 4, time.Hour
	r := newAckRecorder(4)
	refused := posRec(r, "b", 11, 0)
	refused.Refusable = true
	produceOne(t, p, posRec(r, "a", 10, 0), refused, posRec(r, "c", 12, 0), posRec(r, "d", 13, 0))
	r.wait(t)
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, v := range []string{"c", "d"} {
		if h, has := b.streams[v]; has {
			t.Errorf("%s, after the refused b, carries %q", v, h)
		}
	}
}

// TestResizedTopicProvesNothing (review): with kafka.on_partition_change:
// follow, q is routed under 1 partition to a partition whose leader
// refuses it (it never reaches Kafka); the topic grows to 2; p, later in
// the stream, is appended to partition 1. Were p to carry the header, a
// session under 2 partitions would route q to partition 1, find p there
// and skip q: lost. From the change on the topic's records carry none.
func TestResizedTopicProvesNothing(t *testing.T) {
	bal := &kafka.Murmur2Balancer{Consistent: true}
	var keys []string
	for i := 0; len(keys) < 2; i++ {
		if k := fmt.Sprintf("K-%d", i); bal.Balance(kafka.Message{Key: []byte(k)}, 0, 1) == 1 {
			keys = append(keys, k)
		}
	}
	c := clocktest.New()
	drive(t, c, time.Second)
	b := &fakeBroker{partitions: 1, fail: func(_ int, part int32) int16 {
		if part == 0 {
			return int16(kafka.NotEnoughReplicas)
		}
		return 0
	}}
	var skipped []string
	p := dedupeProducer(t, b, &tails{}, &skipped, c)
	p.cfg.MaxAttempts = 1 << 30
	r := newAckRecorder(2)
	q := rec(r, keys[0], "q")
	q.Pos = outboxd.Pos{LSN: 10}
	produceOne(t, p, q)
	for { // q reached its leader (and was refused) under 1 partition
		if _, ok := b.partitionOf()["q"]; ok {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b.setPartitions(2)
	for {
		p.mu.Lock()
		n := len(p.topics["t"].ids)
		p.mu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	pr := rec(r, keys[1], "p")
	pr.Pos = outboxd.Pos{LSN: 20}
	produceOne(t, p, pr)
	for !r.has("p") {
		time.Sleep(time.Millisecond)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if h, has := b.streams["p"]; has {
		t.Errorf("p, produced after the topic grew, carries %q", h)
	}
}

// TestOneChangeTwoRoutes (review): one change becomes two records of one
// key on one topic (two routes); they differ by their route, so the
// second is not taken for the first: the partition holding route 0's
// record does not prove route 1's.
func TestOneChangeTwoRoutes(t *testing.T) {
	c := clocktest.New()
	drive(t, c, time.Second)
	b := &fakeBroker{}
	x := &tails{pos: outboxd.Pos{LSN: 10, Index: 0, Route: 0}, found: true}
	var skipped []string
	p := dedupeProducer(t, b, x, &skipped, c)
	r := newAckRecorder(2)
	second := posRec(r, "route1", 10, 0)
	second.Pos.Route = 1
	produceOne(t, p, posRec(r, "route0", 10, 0), second)
	wantTopic(t, b, r, "route1")
	if len(skipped) != 1 {
		t.Errorf("%d skipped, want 1 (route 0's record)", len(skipped))
	}
}

func (r *ackRecorder) has(k string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.errs[k]
	return ok
}

// TestTailReadsOffTheSender (issue 32, item 4): a tail read that waits on
// the network (partition 0's: a distant leader) stops neither the sender
// nor the other partitions: partition 1's tail is answered at once and its
// records are produced and acknowledged while partition 0's read still
// waits, which counts as the producer's progress; partition 0's records
// go once its own tail is known. Before, every tail read of a pass had to
// end before any held record went, and no acknowledgement was settled
// meanwhile.
func TestTailReadsOffTheSender(t *testing.T) {
	b := &fakeBroker{partitions: 2}
	cfg := Config{BatchSize: 1, Linger: time.Millisecond, Stream: "7000000000000000001/outboxd/abc", Timeline: 1,
		Timelines: map[uint32]Timeline{1: {}}, WALEnd: 1 << 40}
	p := idemProducer(t, b, cfg)
	slow := make(chan struct{})
	p.tailOf = func(ctx context.Context, _ string, partition int32, _ int) (outboxd.Pos, bool, error) {
		if partition == 0 {
			select {
			case <-slow:
			case <-ctx.Done():
				return outboxd.Pos{}, false, ctx.Err()
			}
		}
		return outboxd.Pos{}, false, nil
	}
	keyOf := func(partition int) string {
		for i := 0; ; i++ {
			k := fmt.Sprintf("K-%d", i)
			if p.bal.Balance(kafka.Message{Key: []byte(k)}, 0, 1) == partition {
				return k
			}
		}
	}
	r := newAckRecorder(4)
	record := func(key, value string, lsn uint64) *outboxd.Record {
		x := rec(r, key, value)
		x.Pos = outboxd.Pos{LSN: lsn}
		return x
	}
	produceOne(t, p, record(keyOf(0), "a0", 10), record(keyOf(1), "b0", 11), record(keyOf(0), "a1", 12), record(keyOf(1), "b1", 13))
	deadline := time.Now().Add(10 * time.Second)
	for len(b.topic(1)) < 2 || r.get("b0") != nil || r.get("b1") != nil || !slices.Contains(r.told(), "b1") {
		if time.Now().After(deadline) {
			t.Fatalf("partition 1's records were not acknowledged while partition 0's tail read waits: partition 1 holds %v, told %v", b.topic(1), r.told())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := b.topic(0); len(got) != 0 {
		t.Fatalf("partition 0 holds %v before its tail is known", got)
	}
	if p.Progress() != 1 {
		t.Errorf("the producer's progress is %d after one tail read answered, want 1", p.Progress())
	}
	close(slow)
	r.wait(t)
	if got := strings.Join(b.topic(0), " "); got != "a0 a1" {
		t.Errorf("partition 0 holds %q, want \"a0 a1\"", got)
	}
}

// testKey is the stream key of the unit tests.
var testKey = []byte("0123456789abcdef0123456789abcdef")

// signed is v with the MAC an idempotent (not transactional) outboxd
// appends for topic's partition under key, computed here from the
// definition: HMAC-SHA256 over the topic, a NUL, the partition (4 bytes,
// big endian), the mode ('i'; 't' when transactional) and v, its first 16
// bytes in hex.
func signed(key []byte, topic string, partition int32, v string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(topic))
	h.Write([]byte{0})
	_ = binary.Write(h, binary.BigEndian, partition)
	h.Write([]byte{'i'})
	h.Write([]byte(v))
	return v + ";" + hex.EncodeToString(h.Sum(nil)[:16])
}

// tailAnswers is a RoundTripper that answers a tail read's fetch of
// partition 0 with its batches.
type tailAnswers struct{ batches []protocol.RecordReader }

func (a tailAnswers) RoundTrip(_ context.Context, _ net.Addr, req protocol.Message) (protocol.Message, error) {
	if _, ok := req.(*fetch.Request); !ok {
		return nil, fmt.Errorf("unexpected request %T", req)
	}
	return &fetch.Response{Topics: []fetch.ResponseTopic{{Topic: "t", Partitions: []fetch.ResponsePartition{{
		RecordSet: protocol.RecordSet{Records: &protocol.RecordStream{Records: a.batches}},
	}}}}}, nil
}

// headerBatch is a record batch of producer pid from offset from, a
// record per header value.
func headerBatch(from int64, pid int64, transactional bool, values ...string) *protocol.RecordBatch {
	var rs []protocol.Record
	for i, v := range values {
		rs = append(rs, protocol.Record{Offset: from + int64(i), Headers: []protocol.Header{{Key: HeaderStream, Value: []byte(v)}}})
	}
	b := &protocol.RecordBatch{BaseOffset: from, ProducerID: pid, Records: protocol.NewRecordReader(rs...)}
	if transactional {
		b.Attributes = protocol.Transactional
	}
	return b
}

// tailProducer reads the tail batches make, as the stream id of
// identity and with testKey; rejected collects the counted forgeries, and
// the log what it says.
func tailProducer(id string, txnPID int64, batches []protocol.RecordReader, rejected *[]string, log *strings.Builder) *Producer {
	cfg := Config{Stream: id, Timeline: 1, Timelines: map[uint32]Timeline{1: {}}, WALEnd: 1 << 40,
		Rejected: func(topic string) { *rejected = append(*rejected, topic) }}
	if txnPID >= 0 {
		cfg.TransactionalID = "outboxd-7-s"
	}
	return &Producer{cfg: cfg, rt: tailAnswers{batches}, addr: kafka.TCP("127.0.0.1:1"), clock: clocktest.New(),
		mac: newStreamMAC(testKey, txnPID >= 0), pid: txnPID, log: hclog.New(&hclog.LoggerOptions{Output: log})}
}

// TestTailTrustsOnlySignedHeaders (issue 32): a record proves a position
// only when its outboxd.stream header's MAC verifies under the stream key
// for its topic and partition. The tail ends with what another producer
// could write: copies of a genuine header with a larger LSN (signed with
// the old MAC, with another key, for another partition, without a MAC),
// and the header of another outboxd (another identity, its own key). The
// proof is the last genuine record's; each forgery of this identity is
// counted and one WARN names the last one, never a record of another
// identity. Were the MAC not checked, the proof would be 999 and the
// records between 120 and 999 skipped: lost.
func TestTailTrustsOnlySignedHeaders(t *testing.T) {
	const id = "7/outboxd/abc"
	genuine := signed(testKey, "t", 0, at(id, 120))
	values := []string{
		signed(testKey, "t", 0, at(id, 100)),
		genuine,
		strings.Replace(genuine, ";120;", ";999;", 1),                            // the LSN changed, the MAC kept
		signed(testKey, "t", 1, at(id, 999)),                                     // signed for another partition
		signed([]byte("another key, another key, another"), "t", 0, at(id, 999)), // another key
		signed(testKey, "u", 0, at(id, 999)),                                     // another topic
		at(id, 999),                                                              // no MAC (the format before issue 32)
		at(id, 999) + ";" + strings.Repeat("zz", 16),                             // not hex
		at(id, 999) + ";00",                                                      // a short MAC
		signed([]byte("the other outboxd's key, 32 bytes"), "t", 0, "8/outboxd/abc;1;1;0;999;0;0"), // another identity
	}
	var rejected []string
	var logged strings.Builder
	p := tailProducer(id, -1, []protocol.RecordReader{headerBatch(0, 9, false, values...)}, &rejected, &logged)
	pos, found, err := p.lastOfStream(context.Background(), "t", 0, 0, int64(len(values)), 1)
	if err != nil {
		t.Fatal(err)
	}
	if !found || pos.LSN != 120 {
		t.Errorf("the tail proves %v (found %v), want 120: only a header outboxd signed for this partition proves", pos, found)
	}
	if len(rejected) != 7 {
		t.Errorf("%d records counted as rejected (%v), want 7: each forgery of this identity, not the other outboxd's", len(rejected), rejected)
	}
	out := logged.String()
	if strings.Count(out, "[WARN]") != 1 || !strings.Contains(out, "offset=8") || !strings.Contains(out, "records=7") || !strings.Contains(out, "partition=0") {
		t.Errorf("want one WARN naming the partition, the last forgery's offset (8) and the count (7); logged:\n%s", out)
	}
}

// TestTransactionalTailTrustsItsOwnTransactions (issue 32): with
// kafka.transactions a record proves a position only in a committed
// transaction of the producer id the transactional id keeps across
// sessions: a copy of a signed header (say, of an aborted transaction's
// record, readable in the log) in another producer's batch, transactional
// or not, proves nothing; nor does an idempotent producer's signed header.
func TestTransactionalTailTrustsItsOwnTransactions(t *testing.T) {
	const id = "7/outboxd/abc"
	sign := func(lsn uint64) string {
		return string(newStreamMAC(testKey, true).appendMAC(appendStream(nil, id, 1, 1, 0, outboxd.Pos{LSN: lsn}), "t", 0))
	}
	batches := []protocol.RecordReader{
		headerBatch(0, 7, true, sign(100), sign(120)),
		headerBatch(2, 7, false, sign(999)),                           // our producer id, outside a transaction
		headerBatch(3, 9, true, sign(999)),                            // another transactional producer
		headerBatch(4, -1, false, sign(999)),                          // a plain producer
		headerBatch(5, 7, true, signed(testKey, "t", 0, at(id, 999))), // an idempotent outboxd's header
	}
	var rejected []string
	var logged strings.Builder
	p := tailProducer(id, 7, batches, &rejected, &logged)
	pos, found, err := p.lastOfStream(context.Background(), "t", 0, 0, 6, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !found || pos.LSN != 120 {
		t.Errorf("the tail proves %v (found %v), want 120: only this producer id's committed transactions prove", pos, found)
	}
	if len(rejected) != 4 || !strings.Contains(logged.String(), "offset=5") {
		t.Errorf("%d records rejected, want 4, the last (offset 5) logged:\n%s", len(rejected), logged.String())
	}
}

// at is the header value of the stream id at lsn, under one partition.
func at(id string, lsn uint64) string {
	return string(appendStream(nil, id, 1, 1, 0, outboxd.Pos{LSN: lsn}))
}

// TestStreamMACVerifies: what withStream appends, verify accepts for the
// same topic and partition and key, and for nothing else; verify hands
// back the value without its MAC, the one proof parses.
func TestStreamMACVerifies(t *testing.T) {
	v := appendStream(nil, "7/outboxd/abc", 3, 1, 0, outboxd.Pos{LSN: 42, Index: 1, Route: 2})
	tagged := newStreamMAC(testKey, false).appendMAC(slices.Clone(v), "t", 2)
	if string(tagged) != signed(testKey, "t", 2, string(v)) {
		t.Fatalf("appendMAC made %q, want %q", tagged, signed(testKey, "t", 2, string(v)))
	}
	mv := newStreamMAC(testKey, false).verifier()
	if payload, why := mv.verify("t", 2, tagged); why != "" || string(payload) != string(v) {
		t.Errorf("verify(its own) = %q, %q; want %q, no reason", payload, why, v)
	}
	for _, tc := range []struct {
		name      string
		topic     string
		partition int32
		mac       *streamMAC
	}{
		{"another partition", "t", 1, newStreamMAC(testKey, false)},
		{"another topic", "t2", 2, newStreamMAC(testKey, false)},
		{"another key", "t", 2, newStreamMAC([]byte("0123456789abcdef0123456789abcdeF"), false)},
		{"no key file: a key of its own", "t", 2, newStreamMAC(nil, false)},
		{"a transactional producer", "t", 2, newStreamMAC(testKey, true)},
	} {
		if _, why := tc.mac.verifier().verify(tc.topic, tc.partition, tagged); why == "" {
			t.Errorf("%s: verified", tc.name)
		}
	}
}

// BenchmarkWithStream is the cost of the stream header per record, in the
// drain's path (withStream, under mu): the value, its MAC, the headers.
func BenchmarkWithStream(b *testing.B) {
	p := &Producer{cfg: Config{Stream: "7000000000000000001/outboxd/9f86d081884c7d65", Idempotence: true, Timeline: 1,
		Timelines: map[uint32]Timeline{1: {}}}, mac: newStreamMAC(testKey, false)}
	t := &topic{name: "km0.comandes", ids: []int{0, 1, 2, 3, 4, 5}}
	part := &partition{topic: t.name, id: 3}
	r := &outboxd.Record{Topic: t.name, Headers: []outboxd.Header{{Key: "tipus", Value: []byte("comanda.creada")}, {Key: "id_esdeveniment", Value: []byte("0b7c1a6e-4a8f-4d5e-9c1b-2f3e4d5c6b7a")}}}
	b.ReportAllocs()
	for i := range b.N {
		r.Pos = outboxd.Pos{LSN: 0x1_6B37_4D28 + uint64(i), Index: uint32(i % 500)}
		if c := p.withStream(t, part, r); len(c.Headers) != 3 {
			b.Fatal("no stream header")
		}
	}
}
