package sink

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/clock/clocktest"
)

// The idempotent producer against the fake broker, which keeps a leader's
// producer state as Kafka 4.1 does (fakebroker_test.go). A real broker
// cannot be made on demand to lose one chosen answer after the append, to
// hold five requests and release them in a chosen order, or to answer a
// sequence error for one chosen batch; the integration tests
// (TestLostAcknowledgementIsNotDuplicated, TestLeaderKillNoDuplicates) do
// what a real one can.

// idemProducer is testProducer with Idempotence on.
func idemProducer(t *testing.T, b *fakeBroker, cfg Config) *Producer {
	t.Helper()
	cfg.Idempotence = true
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = 10
	}
	return testProducer(t, b, cfg)
}

// initCount is how many producer ids the broker gave.
func (b *fakeBroker) initCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inits
}

// gates holds the first produce request of each of the values v1..v5 (the
// first record of its batch) until a test opens it.
type gates struct {
	mu   sync.Mutex
	chs  map[string]chan struct{}
	used map[string]bool
}

func newGates() *gates {
	g := &gates{chs: map[string]chan struct{}{}, used: map[string]bool{}}
	for i := 1; i <= 5; i++ {
		g.chs[fmt.Sprintf("v%d", i)] = make(chan struct{})
	}
	return g
}

func (g *gates) gate(first string) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.used[first] {
		return nil // sent again: not held
	}
	g.used[first] = true
	return g.chs[first]
}

// open lets v<i>'s held request through and waits until the broker
// processed it.
func (g *gates) open(t *testing.T, b *fakeBroker, i int) {
	t.Helper()
	b.mu.Lock()
	before := len(b.requests)
	b.mu.Unlock()
	close(g.chs[fmt.Sprintf("v%d", i)])
	b.waitProcessed(t, before+1)
}

// warm produces one record and waits for its acknowledgement: the
// partition's leader then holds this producer, and up to five batches may be
// in flight.
func warm(t *testing.T, p *Producer) {
	t.Helper()
	r := newAckRecorder(1)
	produceOne(t, p, rec(r, "P-1", "warm"))
	r.wait(t)
	if err := r.get("warm"); err != nil {
		t.Fatalf("warm: %v", err)
	}
}

// fiveInFlight produces v1..v5 in batches of one while the broker holds
// their requests, and waits until all five arrived: five batches of one
// partition in flight at once.
func fiveInFlight(t *testing.T, b *fakeBroker, p *Producer) *ackRecorder {
	t.Helper()
	r := newAckRecorder(5)
	for i := 1; i <= 5; i++ {
		produceOne(t, p, rec(r, "P-1", fmt.Sprintf("v%d", i)))
	}
	b.waitArrived(t, 6)
	return r
}

// wantTopic requires partition 0 to hold want, in order, and every record of
// it acknowledged.
func wantTopic(t *testing.T, b *fakeBroker, r *ackRecorder, want string) {
	t.Helper()
	r.wait(t)
	if got := strings.Join(b.topic(0), " "); got != want {
		t.Errorf("the partition holds %q, want %q", got, want)
	}
	for _, v := range strings.Fields(want) {
		if v == "warm" {
			continue
		}
		if err := r.get(v); err != nil {
			t.Errorf("%s: %v", v, err)
		}
	}
}

// TestRetryAfterLostAnswerIsNotDuplicated: the leader appended a batch and
// the answer was lost (a connection reset, the leader killed after
// replicating); the batch is sent again and the leader recognises it:
// answered as a success (DUPLICATE_SEQUENCE_NUMBER from brokers before
// 1.0), acknowledged, and on the topic once. Without idempotence the same
// retry leaves a duplicate, which is what Kafka's retries did to outboxd
// before (605 after three leader kills, docs/reports/CHAOS.md).
func TestRetryAfterLostAnswerIsNotDuplicated(t *testing.T) {
	for _, tc := range []struct {
		name        string
		idempotence bool
		dupCode     bool
		want        string
	}{
		{"idempotent, success", true, false, "a b c"},
		{"idempotent, DUPLICATE_SEQUENCE_NUMBER", true, true, "a b c"},
		{"not idempotent", false, false, "a a b c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBroker{dupCode: tc.dupCode, cut: func(n int) (bool, bool) { return false, n == 0 }}
			p := testProducer(t, b, Config{Idempotence: tc.idempotence, BatchSize: 1, Linger: time.Millisecond, MaxAttempts: 3})
			r := newAckRecorder(3)
			produceOne(t, p, rec(r, "P-1", "a"), rec(r, "P-1", "b"), rec(r, "P-1", "c"))
			wantTopic(t, b, r, tc.want)
			if tc.idempotence && b.initCount() != 1 {
				t.Errorf("%d producer ids asked for, want 1", b.initCount())
			}
		})
	}
}

// TestFiveInFlightKeepOrder: once the leader acknowledged a batch, five
// batches of the partition go out together (five rounds in flight). The
// first fails (NOT_LEADER_OR_FOLLOWER, not appended); the four behind it
// are refused by the leader for the gap (OUT_OF_ORDER_SEQUENCE_NUMBER) and
// sent again after it, in order: the partition holds each record once, in
// order, no producer id is reset, and the records are acknowledged in
// their order. Also with the five answered in reverse order (the later
// requests overtaking the earlier ones on their connections).
func TestFiveInFlightKeepOrder(t *testing.T) {
	for _, reverse := range []bool{false, true} {
		t.Run(map[bool]string{false: "first fails", true: "answered in reverse"}[reverse], func(t *testing.T) {
			g := newGates()
			b := &fakeBroker{gate: g.gate}
			if !reverse {
				b.once = map[string]int16{"v1": int16(kafka.NotLeaderForPartition)}
			}
			p := idemProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond})
			warm(t, p)
			r := fiveInFlight(t, b, p)
			for i := 1; i <= 5; i++ {
				if reverse {
					i = 6 - i
				}
				g.open(t, b, i)
				if reverse {
					i = 6 - i
				}
			}
			wantTopic(t, b, r, "warm v1 v2 v3 v4 v5")
			if n := b.initCount(); n != 1 {
				t.Errorf("%d producer ids asked for, want 1: a gap behind a failed batch is no reason to reset", n)
			}
			r.mu.Lock()
			order := strings.Join(r.order, " ")
			r.mu.Unlock()
			if order != "v1 v2 v3 v4 v5" {
				t.Errorf("acknowledged in the order %q", order)
			}
			b.mu.Lock()
			refused := 0
			for _, req := range b.requests {
				if req.codes[0] == int16(kafka.OutOfOrderSequenceNumber) {
					refused++
				}
			}
			b.mu.Unlock()
			if refused != 4 {
				t.Errorf("%d batches refused as out of order, want the 4 behind the first", refused)
			}
		})
	}
}

// TestOvertakingBatchIsNotAReset: v2 reaches the leader before v1, which
// it was sent behind (requests to one broker travel on connections of
// their own), and is refused for the gap; v1 is appended and acknowledged
// before v2's refusal comes back. v2 is sent again after v1: no new
// producer id (which would also have cost a needless wait for every batch
// in flight). Seen in make bench's drain before the fix, every few hundred
// milliseconds.
func TestOvertakingBatchIsNotAReset(t *testing.T) {
	g := newGates()
	v2answer := make(chan struct{})
	b := &fakeBroker{gate: g.gate, answer: func(first string) <-chan struct{} {
		if first == "v2" {
			return v2answer
		}
		return nil
	}}
	p := idemProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond})
	warm(t, p)
	r := newAckRecorder(2)
	produceOne(t, p, rec(r, "P-1", "v1"), rec(r, "P-1", "v2"))
	b.waitArrived(t, 3)
	g.open(t, b, 2) // processed: refused out of order; its answer held
	g.open(t, b, 1)
	waitTold(t, r, "v1")
	if err := r.get("v1"); err != nil {
		t.Fatalf("v1: %v", err)
	}
	close(v2answer)
	wantTopic(t, b, r, "warm v1 v2")
	if n := b.initCount(); n != 1 {
		t.Errorf("%d producer ids asked for, want 1: an overtaking batch is no reason to reset", n)
	}
}

// TestLeaderChangeWithFiveInFlight: five batches in flight when the leader
// changes: the first two were appended and replicated but their answers
// lost with the old leader's connection, the other three answered
// NOT_LEADER_OR_FOLLOWER. Metadata names the new leader; the five are sent
// again to it in order, the first two recognised as duplicates: each record
// once, in order, all acknowledged.
func TestLeaderChangeWithFiveInFlight(t *testing.T) {
	g := newGates()
	var leader atomic.Int32
	leader.Store(1)
	var moved atomic.Bool
	// Requests 1 and 2 (by arrival; 0 is warm's) are appended and their
	// answers lost; once the leader moved, the old one refuses v3 to v5.
	b := &fakeBroker{gate: g.gate, leaders: func(int) int32 { return leader.Load() },
		cut:  func(n int) (bool, bool) { return false, n == 1 || n == 2 },
		once: map[string]int16{"v3": int16(kafka.NotLeaderForPartition), "v4": int16(kafka.NotLeaderForPartition), "v5": int16(kafka.NotLeaderForPartition)}}
	p := idemProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond})
	warm(t, p)
	r := fiveInFlight(t, b, p)
	g.open(t, b, 1)
	g.open(t, b, 2)
	moved.Store(true)
	leader.Store(2)
	for i := 3; i <= 5; i++ {
		g.open(t, b, i)
	}
	wantTopic(t, b, r, "warm v1 v2 v3 v4 v5")
	if n := b.initCount(); n != 1 {
		t.Errorf("%d producer ids asked for, want 1", n)
	}
}

// TestSequenceRefusalResetsTheProducerID: the leader refuses the
// partition's first open batch for its sequence or producer (its producer
// state lost: OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID), or for
// its epoch (INVALID_PRODUCER_EPOCH). No earlier batch explains it: the
// producer takes a new producer id and sends the refused batch (which the
// leader did not append) again under it, from sequence 0: each record once,
// in order. The fake broker answers the error for one chosen batch, which
// a real leader does only after losing state (an unclean election).
func TestSequenceRefusalResetsTheProducerID(t *testing.T) {
	for _, code := range []kafka.Error{kafka.OutOfOrderSequenceNumber, kafka.UnknownProducerId, kafka.InvalidProducerEpoch} {
		t.Run(codeName(code), func(t *testing.T) {
			b := &fakeBroker{once: map[string]int16{"a": int16(code)}}
			p := idemProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond})
			warm(t, p)
			r := newAckRecorder(2)
			produceOne(t, p, rec(r, "P-1", "a"), rec(r, "P-1", "b"))
			wantTopic(t, b, r, "warm a b")
			wantNewProducerID(t, b, "a")
		})
	}
}

// TestContentRefusalTakesANewProducerID: a record refused for its content
// (dead-lettered) leaves a gap in its partition's sequences; the producer
// takes a new producer id and the records after it go under it from
// sequence 0, instead of being numbered down into the gap under the old
// one, which the leader may hold already:
//
//   - r was appended, its answer lost, and its retry refused for content
//     (a broker checks content before it looks for a duplicate): numbered
//     into r's place, s was answered as r's duplicate and never appended;
//   - the leader had lost the producer's state (it takes any sequence) and
//     appended v2, in flight beside v1, which it refused: numbered into
//     v2's place, d was answered as v2's duplicate and never appended;
//   - v2, in flight beside v1, refused for the gap v1 left: sent again
//     under the new id.
//
// The fake broker refuses the chosen records; a real one refuses a
// timestamp out of range or an invalid record the same way.
func TestContentRefusalTakesANewProducerID(t *testing.T) {
	t.Run("appended, its retry refused", func(t *testing.T) {
		b := &fakeBroker{cut: func(n int) (bool, bool) { return false, n == 1 },
			refuseRetry: func() int16 { return int16(kafka.InvalidTimestamp) }}
		p := idemProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond})
		warm(t, p)
		r := newAckRecorder(2)
		x := rec(r, "P-1", "r")
		x.Refusable = true
		produceOne(t, p, x)
		waitTold(t, r, "r")
		produceOne(t, p, rec(r, "P-1", "s"))
		r.wait(t)
		wantRefused(t, r, "r")
		if got := strings.Join(b.topic(0), " "); got != "warm r s" || r.get("s") != nil {
			t.Errorf("the partition holds %q and s was told %v, want \"warm r s\" and s acknowledged", got, r.get("s"))
		}
		wantNewProducerID(t, b, "s")
	})
	for _, tc := range []struct {
		name   string
		forget bool   // the leader lost the producer's state before v2
		order  [2]int // the order the leader takes v1 and v2 in
		want   string // the partition
		first  string // the first record under the new producer id
	}{
		{"a later batch appended by a leader without the producer", true, [2]int{2, 1}, "warm v2 d", "d"},
		{"a later batch refused for the gap", false, [2]int{1, 2}, "warm v2 d", "v2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGates()
			b := &fakeBroker{gate: g.gate, refuse: map[string]int16{"v1": int16(kafka.InvalidRecord)}}
			if tc.forget {
				processed := 0
				b.forget = func(int, int32) bool { processed++; return processed == 2 } // warm's, then v2's
			}
			p := idemProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond})
			warm(t, p)
			r := newAckRecorder(3)
			x := rec(r, "P-1", "v1")
			x.Refusable = true
			produceOne(t, p, x, rec(r, "P-1", "v2"))
			b.waitArrived(t, 3)
			g.open(t, b, tc.order[0])
			g.open(t, b, tc.order[1])
			waitTold(t, r, "v1", "v2")
			produceOne(t, p, rec(r, "P-1", "d"))
			r.wait(t)
			wantRefused(t, r, "v1")
			wantTopic(t, b, r, tc.want)
			wantNewProducerID(t, b, tc.first)
		})
	}
}

// waitTold waits until each of vs was told its outcome.
func waitTold(t *testing.T, r *ackRecorder, vs ...string) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		told := r.told()
		n := 0
		for _, v := range vs {
			if slices.Contains(told, v) {
				n++
			}
		}
		if n == len(vs) {
			return
		}
		select {
		case <-r.ping:
		case <-deadline:
			t.Fatalf("told %v, want %v among them", told, vs)
		}
	}
}

// wantRefused requires v refused for its content, for its route to
// dead-letter.
func wantRefused(t *testing.T, r *ackRecorder, v string) {
	t.Helper()
	var re *outboxd.RefusedError
	if err := r.get(v); !errors.As(err, &re) {
		t.Errorf("%s: want a RefusedError, got %v", v, err)
	}
}

// wantNewProducerID requires a second producer id, and v the first record
// sent under it, at sequence 0.
func wantNewProducerID(t *testing.T, b *fakeBroker, v string) {
	t.Helper()
	if n := b.initCount(); n != 2 {
		t.Errorf("%d producer ids asked for, want 2 (a reset)", n)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, req := range b.requests {
		if req.pids[0] == 1001 {
			if got := string(req.parts[0][0].Value); got != v || req.seqs[0] != 0 {
				t.Errorf("the first batch under the new producer id is %s at sequence %d, want %s at 0", got, req.seqs[0], v)
			}
			return
		}
	}
	t.Errorf("no batch under a new producer id")
}

// TestFirstBatchAfterIdleGoesAlone: a leader forgets a producer that
// appended nothing for producer.id.expiration.ms (a day by default) and
// then appends a batch at any sequence. After a day without records, v1
// is refused before its append (NOT_ENOUGH_REPLICAS, retriable); had v2
// been sent beside it, the leader would have appended v2, then refused v1
// for its sequence, sent again under a new producer id after v2: two
// events of one key out of commit order. After pipelineIdle without an
// acknowledgement the first batch goes alone. The producer and the fake
// broker (which expires the producer) share a clock the test moves a day
// on; v1's retry waits on it too (drive).
func TestFirstBatchAfterIdleGoesAlone(t *testing.T) {
	c := clocktest.New()
	drive(t, c, time.Second)
	g := newGates()
	b := &fakeBroker{gate: g.gate, once: map[string]int16{"v1": int16(kafka.NotEnoughReplicas)}, expiry: 24 * time.Hour, clock: c.Now}
	p := idemProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond, Clock: c})
	warm(t, p)
	c.Advance(25 * time.Hour)
	r := newAckRecorder(2)
	produceOne(t, p, rec(r, "P-1", "v1"), rec(r, "P-1", "v2"))
	b.waitArrived(t, 2)
	g.open(t, b, 1)
	g.open(t, b, 2)
	wantTopic(t, b, r, "warm v1 v2")
	if told := strings.Join(r.told(), " "); told != "v1 v2" {
		t.Errorf("acknowledged in the order %q", told)
	}
}

// TestProducerFencedStops: PRODUCER_FENCED (another producer took the id
// over) is not retried: the record fails for good and the producer is
// fenced.
func TestProducerFencedStops(t *testing.T) {
	b := &fakeBroker{once: map[string]int16{"a": int16(kafka.ProducerFenced)}}
	p := idemProducer(t, b, Config{BatchSize: 1, Linger: time.Millisecond})
	warm(t, p)
	r := newAckRecorder(2)
	produceOne(t, p, rec(r, "P-1", "a"), rec(r, "P-1", "b"))
	r.wait(t)
	var re *RecordError
	if err := r.get("a"); !errors.As(err, &re) || !errors.Is(err, kafka.ProducerFenced) {
		t.Fatalf("a: want a RecordError wrapping PRODUCER_FENCED, got %v", err)
	}
	if err := r.get("b"); !errors.Is(err, ErrFenced) {
		t.Errorf("b: want ErrFenced, got %v", err)
	}
	if got := strings.Join(b.topic(0), " "); got != "warm" {
		t.Errorf("the partition holds %q", got)
	}
}

// TestProducerIDRefused: a cluster that refuses the principal a producer id
// (CLUSTER_AUTHORIZATION_FAILED: IDEMPOTENT_WRITE missing on a broker
// before 2.8) stops the producer before any record is sent, with an
// IdempotenceError that names the way out; an outage (no coordinator yet)
// is retried.
func TestProducerIDRefused(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		b := &fakeBroker{initFail: func(int) int16 { return int16(kafka.ClusterAuthorizationFailed) }}
		p := idemProducer(t, b, Config{Linger: time.Millisecond})
		r := newAckRecorder(1)
		produceOne(t, p, rec(r, "P-1", "a"))
		r.wait(t)
		var ie *IdempotenceError
		err := r.get("a")
		if !errors.As(err, &ie) || !strings.Contains(err.Error(), "IdempotentWrite") || !strings.Contains(err.Error(), "kafka.idempotence: false") {
			t.Fatalf("want an IdempotenceError naming IdempotentWrite and kafka.idempotence: false, got %v", err)
		}
		if n := b.arrived.Load(); n != 0 {
			t.Errorf("%d produce requests sent without a producer id", n)
		}
	})
	t.Run("outage", func(t *testing.T) {
		b := &fakeBroker{initFail: func(n int) int16 {
			if n < 2 {
				return int16(kafka.GroupCoordinatorNotAvailable) // COORDINATOR_NOT_AVAILABLE
			}
			return 0
		}}
		p := idemProducer(t, b, Config{Linger: time.Millisecond})
		r := newAckRecorder(1)
		produceOne(t, p, rec(r, "P-1", "a"))
		wantTopic(t, b, r, "a")
	})
}

// TestProbeIdempotence: check's probe (ProbeIdempotence) retries what the
// producer retries, as a KRaft broker's first InitProducerId after its
// start is answered COORDINATOR_LOAD_IN_PROGRESS (a real Kafka 4.1 broker
// did in TestIdempotenceNeedsAProducerID: check warned instead of passing),
// and reports a refusal at once.
func TestProbeIdempotence(t *testing.T) {
	addr := kafka.TCP("fake:9092")
	loading := int16(kafka.GroupLoadInProgress) // COORDINATOR_LOAD_IN_PROGRESS
	t.Run("loading, then given", func(t *testing.T) {
		b := &fakeBroker{initFail: func(n int) int16 {
			if n < 2 {
				return loading
			}
			return 0
		}}
		if err := probeIdempotence(context.Background(), b, addr, 30*time.Second, clock.System); err != nil {
			t.Fatalf("want a producer id after two retries, got %v", err)
		}
		if b.initCount() != 3 {
			t.Errorf("asked %d times, want 3", b.initCount())
		}
	})
	t.Run("refused", func(t *testing.T) {
		b := &fakeBroker{initFail: func(int) int16 { return int16(kafka.ClusterAuthorizationFailed) }}
		var ie *IdempotenceError
		if err := probeIdempotence(context.Background(), b, addr, 30*time.Second, clock.System); !errors.As(err, &ie) {
			t.Fatalf("want an IdempotenceError, got %v", err)
		}
		if b.initCount() != 1 {
			t.Errorf("a refusal asked %d times, want once", b.initCount())
		}
	})
	t.Run("loading past the budget", func(t *testing.T) {
		b := &fakeBroker{initFail: func(int) int16 { return loading }}
		err := probeIdempotence(context.Background(), b, addr, 300*time.Millisecond, clock.System)
		var ie *IdempotenceError
		if !errors.Is(err, kafka.GroupLoadInProgress) || errors.As(err, &ie) {
			t.Fatalf("want the broker's last answer, not a refusal, got %v", err)
		}
	})
}

// TestNothingAcknowledgedThatIsNotOnTheTopic: 200 seeds of random faults on
// three partitions: answers lost after the append or requests lost before
// it, retriable refusals, leader changes, sequence refusals of the first
// open batch (resets), requests delayed so that later ones overtake earlier
// ones, and records refused for their content (dead-lettered), some only
// when sent again after an answer lost after the append (the broker checks
// content before it looks for a duplicate: the record is on the topic, its
// retry refused), and idle days after which the leaders forget the
// producer (producer.id.expiration.ms). Whatever happens: no record is acknowledged that is not
// on its partition, none is on it twice, every partition holds its records
// in the order they were produced, a record refused for its content is
// never on it unless its refusal came on a retry, and every record not
// refused is acknowledged unless the producer stopped.
func TestNothingAcknowledgedThatIsNotOnTheTopic(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 60
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			randomFaults(t, uint64(seed))
		})
	}
}

func randomFaults(t *testing.T, seed uint64) {
	var mu sync.Mutex
	rnd := rand.New(rand.NewPCG(seed, 7))
	roll := func() float64 { mu.Lock(); defer mu.Unlock(); return rnd.Float64() }
	var leaderShift atomic.Int32
	// The producer's and the brokers' clock: every wait on it (the linger,
	// a backoff) ends as soon as it begins; the idle days are moved by hand.
	c := clocktest.New()
	drive(t, c, time.Second)
	const records, parts = 200, 3
	refused := map[string]bool{}
	// Refused on a retry of what the leader appended: on the topic, and
	// refused, or acknowledged when the refusal's answer was lost too.
	onAndRefused := map[string]bool{}
	b := &fakeBroker{partitions: parts, refuse: map[string]int16{}, dupCode: seed%2 == 1, expiry: 24 * time.Hour, clock: c.Now,
		leaders: func(p int) int32 { return 1 + (int32(p)+leaderShift.Load())%3 },
		yield:   func(int) int { return int(roll() * 20) },
		cut: func(int) (bool, bool) {
			x := roll()
			return x < 0.05, x >= 0.05 && x < 0.12
		},
		fail: func(int, int32) int16 {
			x := roll()
			switch {
			case x < 0.04:
				leaderShift.Add(1)
				return int16(kafka.NotLeaderForPartition)
			case x < 0.07:
				return int16(kafka.NotEnoughReplicas)
			case x < 0.08:
				return int16(kafka.OutOfOrderSequenceNumber)
			case x < 0.085:
				return int16(kafka.UnknownProducerId)
			case x < 0.09:
				return int16(kafka.InvalidProducerEpoch)
			}
			return 0
		},
		refuseRetry: func() int16 {
			if roll() < 0.3 {
				return int16(kafka.InvalidTimestamp)
			}
			return 0
		}}
	for i := range records {
		if roll() < 0.02 {
			v := fmt.Sprintf("v%03d", i)
			b.refuse[v], refused[v] = int16(kafka.InvalidRecord), true
		}
	}
	p := idemProducer(t, b, Config{BatchSize: 1 + int(seed%7), Linger: time.Millisecond, MaxAttempts: 30, Clock: c})
	p.metadataTTL = 5 * time.Millisecond
	r := newAckRecorder(records)
	bal := &kafka.Murmur2Balancer{Consistent: true}
	produced := map[int32][]string{}
	var handed []string
	for i := range records {
		key, v := fmt.Sprintf("K-%d", int(roll()*20)), fmt.Sprintf("v%03d", i)
		x := rec(r, key, v)
		x.Refusable = true
		if err := p.Produce(x); err != nil {
			break // fenced: the Acker has been told
		}
		part := int32(bal.Balance(kafka.Message{Key: []byte(key)}, 0, 1, 2))
		produced[part] = append(produced[part], v)
		handed = append(handed, v)
		switch x := roll(); {
		case x < 0.02:
			// A day without records: every leader forgets the producer.
			waitTold(t, r, handed...)
			c.Advance(25 * time.Hour)
		case x < 0.1:
			runtime.Gosched() // the sender may take a round meanwhile
		}
	}
	closeFor(p, 20*time.Second)
	r.wait(t)

	where := map[string]int32{}
	for part := range int32(parts) {
		log := b.topic(part)
		for _, v := range log {
			if _, twice := where[v]; twice {
				t.Errorf("%s is on the topic twice", v)
			}
			where[v] = part
		}
		var want []string
		for _, v := range produced[part] {
			if slices.Contains(log, v) {
				want = append(want, v)
			}
		}
		if !slices.Equal(log, want) {
			t.Errorf("partition %d holds %v, produced in the order %v", part, log, want)
		}
	}
	p.mu.Lock()
	stopped := p.fenced
	p.mu.Unlock()
	b.mu.Lock()
	for _, v := range b.retryRefused {
		onAndRefused[v] = true
	}
	b.mu.Unlock()
	for part, vs := range produced {
		for _, v := range vs {
			err := r.get(v)
			at, on := where[v]
			switch {
			case err == nil && (!on || at != part):
				t.Errorf("%s acknowledged, not on partition %d", v, part)
			case refused[v] && on:
				t.Errorf("%s was refused, and is on the topic", v)
			case refused[v] && err == nil:
				t.Errorf("%s was refused, and acknowledged", v)
			case !refused[v] && !onAndRefused[v] && err != nil && stopped == nil:
				t.Errorf("%s failed while the producer kept going: %v", v, err)
			}
		}
	}
	if stopped != nil {
		t.Logf("seed %d: the producer stopped: %v", seed, stopped)
	}

}

// closeFor closes p, giving up after d.
func closeFor(p *Producer, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_ = p.Close(ctx)
}

// TestSequenceArithmetic: sequences count modulo 2^31 (after MaxInt32
// comes 0), both ways.
func TestSequenceArithmetic(t *testing.T) {
	for _, tc := range []struct{ seq, n, want int32 }{
		{0, 5, 5},
		{math.MaxInt32, 1, 0},
		{math.MaxInt32 - 2, 5, 2},
		{2, -5, math.MaxInt32 - 2},
		{10, -3, 7},
	} {
		if got := addSeq(tc.seq, tc.n); got != tc.want {
			t.Errorf("addSeq(%d, %d) = %d, want %d", tc.seq, tc.n, got, tc.want)
		}
	}
}
