package sink

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/addpartitionstotxn"
	"github.com/segmentio/kafka-go/protocol/describeconfigs"
	"github.com/segmentio/kafka-go/protocol/endtxn"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
	"github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/rawproduce"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/clock/clocktest"
)

// fakeBroker answers the producer's requests in memory. It exists for the
// faults a real broker cannot be made to produce on demand: failing exactly
// one partition of one produce request, blocking, several leaders, an
// answer lost after the append, a leader that lost its producer state. It
// decodes every record batch with kafka-go's own decoder (which checks the
// CRC), so the encoding is checked independently of the encoder. The
// integration tests use a real broker for everything else.
//
// For a batch stamped with a producer id it does what a Kafka 4.1 leader
// does (ProducerStateEntry, ProducerAppendInfo.checkSequence): per
// partition and producer it keeps the epoch and the last five batches; a
// batch equal to one of them is a duplicate, answered as a success (with
// dupCode, DUPLICATE_SEQUENCE_NUMBER, as brokers before 1.0) and not
// appended again; a lower epoch is INVALID_PRODUCER_EPOCH; a higher one
// must start at sequence 0; otherwise the sequence must follow the last
// one, or OUT_OF_ORDER_SEQUENCE_NUMBER; a producer it holds nothing of may
// start at any sequence. What it appended is log, the truth about the
// topic.
type fakeBroker struct {
	partitions int
	leaders    func(partition int) int32 // nil: broker 1 leads all
	// fail says which error code the n-th produce request (from 0) gets for
	// a partition; block, when set, makes requests wait for it.
	fail  func(n int, partition int32) int16
	block chan struct{}
	// slowCancel, when set, is a transport slow to give up a request
	// blocked (block) once its context ends, as one still writing it may
	// be: cancelled is closed when the context ends, and the request
	// returns once slowCancel is closed.
	slowCancel, cancelled chan struct{}
	// arrived counts produce requests that reached the broker (answered or
	// still held by block); progressed is signalled at each, and at each
	// request processed (waitArrived, waitProcessed).
	arrived      atomic.Int32
	progressed   chan struct{}
	progressOnce sync.Once
	// meta, when set, answers the n-th metadata request (from 0) with a
	// topic error code or a transport error instead of the layout.
	meta func(n int) (int16, error)
	// maxBatchBytes, when set, refuses a record batch larger than it (as
	// sent: compressed, without the record set's size prefix) as
	// MESSAGE_TOO_LARGE, as a broker does over max.message.bytes.
	maxBatchBytes int
	// refuse, when set, answers a batch holding one of its values with
	// that value's error code, and refusal as the broker's message: what
	// a real broker answers for a record it refuses whatever the retries
	// (INVALID_TIMESTAMP, INVALID_RECORD) or may refuse because of the
	// network (CORRUPT_MESSAGE), which a real one cannot be made to answer
	// for one chosen record.
	refuse  map[string]int16
	refusal string
	// brokers, when set, are the brokers a metadata answer lists; unset:
	// broker 1 at fake:9092, the controller. noClusterView answers as a
	// broker that does not know the cluster yet: no broker, controller -1.
	brokers       []metadata.ResponseBroker
	noClusterView func(n int) bool
	// autoCreate is every broker's auto.create.topics.enable in a
	// DescribeConfigs answer: "true", "false", or "" (the request is
	// refused: CLUSTER_AUTHORIZATION_FAILED). describes counts them.
	autoCreate string
	describes  int

	// Idempotence. InitProducerId answers ids 1000, 1001, ... (initFail,
	// when set, answers the n-th, from 0, with that error code instead;
	// inits counts them). dupCode: see above. forget, when set, drops the
	// partition's producer state before the n-th produce request (from
	// arrival, 0) is processed, as a leader that lost it would.
	initFail func(n int) int16
	inits    int
	dupCode  bool
	forget   func(n int, partition int32) bool
	// expiry, when set, drops a producer's state in a partition when a
	// batch comes expiry or more after its last append there, on clock
	// (time.Now when unset), as a leader does after
	// producer.id.expiration.ms.
	expiry time.Duration
	clock  func() time.Time
	// cut, when set, fails the n-th produce request (by arrival, from 0)
	// with a transport error: before, without it reaching the log; after,
	// once processed, its answer lost.
	cut func(n int) (before, after bool)
	// gate, when set, is waited for before a produce request whose first
	// record is the value given is processed: a test releases requests in
	// the order it chooses. yield likewise gives way to the other
	// goroutines that many times before the n-th (by arrival) is processed:
	// requests in flight together then reach the log in another order than
	// they were sent. once answers the first batch that starts
	// with a value with that error code, once.
	gate  func(first string) <-chan struct{}
	yield func(n int) int
	once  map[string]int16
	// answer, when set, is waited for after such a request was processed,
	// before its answer goes back.
	answer func(first string) <-chan struct{}
	// refuseRetry, when set, is asked about each batch of one record that
	// a request whose answer is lost (cut) appended: a code other than 0
	// refuses that record's next send with it (once, in once), as a
	// broker does that checks a batch's content before it looks for a
	// duplicate (a timestamp out of range by the time of the retry, a
	// record corrupted on the way): the record is on the topic and its
	// retry refused. retryRefused lists those records.
	refuseRetry  func() int16
	retryRefused []string

	// txn, when set, is the transaction coordinator of a transactional
	// producer (transaction.go), and the leaders check that a
	// transactional batch's partition was added to its transaction.
	txn *fakeCoordinator

	metaN int
	addrs []string // the address of every request, in order

	mu        sync.Mutex
	requests  []fakeRequest
	log       map[int32][]string // the values appended, per partition, in order
	streams   map[string]string  // value -> its outboxd.stream header, when it has one
	producers map[int32]map[int64]*fakeProducer
}

// fakeProducer is what a leader keeps of one producer in one partition.
type fakeProducer struct {
	epoch   int16
	batches [][2]int32 // first and last sequence of the last five batches, oldest first
	last    time.Time  // its last append, on clock
}

type fakeRequest struct {
	parts map[int32][]kafka.Message // records per partition, decoded
	codes map[int32]int16           // the error code answered per partition
	seqs  map[int32]int32           // the base sequence per partition (-1: none)
	pids  map[int32]int64           // the producer id per partition (-1: none)
}

// topic is the values appended to partition part, in order.
func (b *fakeBroker) topic(part int32) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.log[part])
}

// checkSequence is the leader's verdict on a batch of producer pid, epoch
// and sequences [first, first+n): 0 to append it, dup when it holds it
// already, or an error code. Called with mu held.
func (b *fakeBroker) checkSequence(part int32, pid int64, epoch int16, first int32, n int) (code int16, dup bool) {
	st := b.producers[part][pid]
	last := addSeq(first, int32(n-1))
	switch {
	case st == nil:
		return 0, false // any sequence from a producer it holds nothing of
	case epoch < st.epoch:
		return int16(kafka.InvalidProducerEpoch), false
	case epoch > st.epoch:
		if first != 0 {
			return int16(kafka.OutOfOrderSequenceNumber), false
		}
		return 0, false
	}
	for _, bt := range st.batches {
		if bt == [2]int32{first, last} {
			return 0, true
		}
	}
	if len(st.batches) > 0 && first != addSeq(st.batches[len(st.batches)-1][1], 1) {
		return int16(kafka.OutOfOrderSequenceNumber), false
	}
	return 0, false
}

// appendBatch records a batch appended. Called with mu held.
func (b *fakeBroker) appendBatch(part int32, pid int64, epoch int16, first int32, msgs []kafka.Message) {
	if b.log == nil {
		b.log = map[int32][]string{}
	}
	for _, m := range msgs {
		b.log[part] = append(b.log[part], string(m.Value))
		for _, h := range m.Headers {
			if h.Key == HeaderStream {
				if b.streams == nil {
					b.streams = map[string]string{}
				}
				b.streams[string(m.Value)] = string(h.Value)
			}
		}
	}
	if pid < 0 {
		return
	}
	if b.producers == nil {
		b.producers = map[int32]map[int64]*fakeProducer{}
	}
	if b.producers[part] == nil {
		b.producers[part] = map[int64]*fakeProducer{}
	}
	st := b.producers[part][pid]
	if st == nil || st.epoch != epoch {
		st = &fakeProducer{epoch: epoch}
		b.producers[part][pid] = st
	}
	st.batches = append(st.batches, [2]int32{first, addSeq(first, int32(len(msgs)-1))})
	st.last = b.now()
	if len(st.batches) > 5 {
		st.batches = st.batches[1:]
	}
}

// now is the time on clock.
func (b *fakeBroker) now() time.Time {
	if b.clock != nil {
		return b.clock()
	}
	return time.Now()
}

// stamp reads a raw record set's producer id, epoch and base sequence.
func stampOf(raw []byte) (pid int64, epoch int16, seq int32) {
	h := raw[sizePrefix:]
	return int64(binary.BigEndian.Uint64(h[43:])), int16(binary.BigEndian.Uint16(h[51:])), int32(binary.BigEndian.Uint32(h[53:]))
}

// setPartitions changes the topic's partition count, as kafka-topics.sh
// --alter --partitions does.
func (b *fakeBroker) setPartitions(n int) {
	b.mu.Lock()
	b.partitions = n
	b.mu.Unlock()
}

// partitionOf is the partition each value was received in (its first
// delivery).
func (b *fakeBroker) partitionOf() map[string]int32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]int32{}
	for _, r := range b.requests {
		for id, ms := range r.parts {
			for _, m := range ms {
				if _, ok := out[string(m.Value)]; !ok {
					out[string(m.Value)] = id
				}
			}
		}
	}
	return out
}

// progress is signalled whenever a produce request arrives or is
// processed (waitArrived, waitProcessed).
func (b *fakeBroker) progress() chan struct{} {
	b.progressOnce.Do(func() { b.progressed = make(chan struct{}, 1) })
	return b.progressed
}

// waitArrived waits until n produce requests reached the broker.
func (b *fakeBroker) waitArrived(t *testing.T, n int32) {
	t.Helper()
	b.waitCount(t, "arrived", int(n), func() int { return int(b.arrived.Load()) })
}

// waitProcessed waits until n produce requests were processed (their
// batches appended or refused).
func (b *fakeBroker) waitProcessed(t *testing.T, n int) {
	t.Helper()
	b.waitCount(t, "processed", n, func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.requests)
	})
}

// waitCount waits until count reaches n, and fails t if it does not within
// a minute (a generous bound: a loaded machine may be slow to get there).
func (b *fakeBroker) waitCount(t *testing.T, what string, n int, count func() int) {
	t.Helper()
	deadline := time.After(time.Minute)
	for count() < n {
		select {
		case <-b.progress():
		case <-deadline:
			t.Fatalf("%d produce requests %s, want %d", count(), what, n)
		}
	}
}

// advanceFor moves c on by topicWaitStep each time someone waits on it,
// until it has moved d: what the producer waits for (the metadata's next
// attempt, the linger) takes no real time.
func advanceFor(t *testing.T, c *clocktest.Clock, d time.Duration) {
	t.Helper()
	for until := c.Now().Add(d); c.Now().Before(until); {
		c.AwaitWaiter(t)
		c.Advance(topicWaitStep)
	}
}

// advanceUntil moves c on by topicWaitStep each time someone waits on it,
// until done is closed.
func advanceUntil(c *clocktest.Clock, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-c.Waiting:
			c.Advance(topicWaitStep)
		case <-time.After(time.Minute):
			return // the caller's wait fails, saying what is missing
		}
	}
}

// drive moves c on by step each time someone waits on it, until the test
// ends: every wait of step or less on it ends as soon as it begins. Call it
// before building the producer, so that it outlives the producer's Close.
func drive(t *testing.T, c *clocktest.Clock, step time.Duration) {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		for {
			select {
			case <-c.Waiting:
				c.Advance(step)
			case <-stop:
				return
			}
		}
	}()
}

// waitIdle waits until the sender has finished the rounds in flight (its
// Ackers may have heard before): a Flush then finds it idle.
func waitIdle(t *testing.T, p *Producer) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		p.mu.Lock()
		sending := p.rounds > 0
		p.mu.Unlock()
		if !sending {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the sender is still in its round")
		}
		runtime.Gosched()
	}
}

// values lists the values the broker received, request by request.
func (b *fakeBroker) values() [][]string {
	return b.received(false)
}

// accepted lists the values the broker answered with error code 0 (the ones
// on the topic), request by request.
func (b *fakeBroker) accepted() [][]string {
	return b.received(true)
}

// onTopic is the values on the topic, in order, separated by spaces.
func (b *fakeBroker) onTopic() string {
	var all []string
	for _, vs := range b.accepted() {
		all = append(all, vs...)
	}
	return strings.Join(all, " ")
}

func (b *fakeBroker) received(acceptedOnly bool) [][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out [][]string
	for _, r := range b.requests {
		var vs []string
		ids := make([]int, 0, len(r.parts))
		for id := range r.parts {
			ids = append(ids, int(id))
		}
		sort.Ints(ids)
		for _, id := range ids {
			if acceptedOnly && r.codes[int32(id)] != 0 {
				continue
			}
			for _, m := range r.parts[int32(id)] {
				vs = append(vs, string(m.Value))
			}
		}
		if len(vs) > 0 || !acceptedOnly {
			out = append(out, vs)
		}
	}
	return out
}

func (b *fakeBroker) RoundTrip(ctx context.Context, addr net.Addr, req protocol.Message) (protocol.Message, error) {
	b.mu.Lock()
	b.addrs = append(b.addrs, addr.String())
	b.mu.Unlock()
	switch r := req.(type) {
	case *metadata.Request:
		b.mu.Lock()
		k := b.metaN
		b.metaN++
		b.mu.Unlock()
		brokers, controller := b.brokers, int32(1)
		if brokers == nil {
			brokers = []metadata.ResponseBroker{{NodeID: 1, Host: "fake", Port: 9092}}
		}
		if b.noClusterView != nil && b.noClusterView(k) {
			brokers, controller = nil, -1
		}
		if b.meta != nil {
			if code, err := b.meta(k); err != nil {
				return nil, err
			} else if code != 0 {
				return &metadata.Response{Brokers: brokers, ControllerID: controller,
					Topics: []metadata.ResponseTopic{{Name: r.TopicNames[0], ErrorCode: code}}}, nil
			}
		}
		b.mu.Lock()
		n := max(b.partitions, 1)
		b.mu.Unlock()
		ps := make([]metadata.ResponsePartition, n)
		for i := range ps {
			ps[i] = metadata.ResponsePartition{PartitionIndex: int32(i), LeaderID: 1}
			if b.leaders != nil {
				ps[i].LeaderID = b.leaders(i)
			}
		}
		return &metadata.Response{Brokers: brokers, ControllerID: controller, Topics: []metadata.ResponseTopic{{Name: r.TopicNames[0], Partitions: ps}}}, nil
	case *describeconfigs.Request:
		b.mu.Lock()
		b.describes++
		b.mu.Unlock()
		res := &describeconfigs.Response{}
		for _, rr := range r.Resources {
			out := describeconfigs.ResponseResource{ResourceType: rr.ResourceType, ResourceName: rr.ResourceName}
			if b.autoCreate == "" {
				out.ErrorCode = int16(kafka.ClusterAuthorizationFailed)
			} else {
				out.ConfigEntries = []describeconfigs.ResponseConfigEntry{{ConfigName: "auto.create.topics.enable", ConfigValue: b.autoCreate}}
			}
			res.Resources = append(res.Resources, out)
		}
		return res, nil
	case *initProducerIDRequest:
		b.mu.Lock()
		defer b.mu.Unlock()
		n := b.inits
		b.inits++
		if b.initFail != nil {
			if code := b.initFail(n); code != 0 {
				return &initproducerid.Response{ErrorCode: code, ProducerID: -1, ProducerEpoch: -1}, nil
			}
		}
		return &initproducerid.Response{ProducerID: 1000 + int64(n), ProducerEpoch: 0}, nil
	case *initproducerid.Request, *addpartitionstotxn.Request, *endtxn.Request:
		if b.txn == nil {
			return nil, fmt.Errorf("fake broker: %T without a coordinator", req)
		}
		return b.txn.roundTrip(ctx, req)
	case *rawproduce.Request:
		arrival := int(b.arrived.Add(1) - 1)
		select {
		case b.progress() <- struct{}{}:
		default:
		}
		type part struct {
			id   int32
			raw  []byte
			msgs []kafka.Message
		}
		var topics [][]part
		first := ""
		for _, t := range r.Topics {
			var ps []part
			for _, p := range t.Partitions {
				raw, err := io.ReadAll(p.RecordSet.Reader)
				var msgs []kafka.Message
				if err == nil {
					msgs, err = decodeRaw(raw)
				}
				if err != nil {
					return nil, fmt.Errorf("fake broker: bad record batch: %w", err)
				}
				if first == "" && len(msgs) > 0 {
					first = string(msgs[0].Value)
				}
				ps = append(ps, part{p.Partition, raw, msgs})
			}
			topics = append(topics, ps)
		}
		if b.block != nil {
			select {
			case <-b.block:
			case <-ctx.Done():
				if b.slowCancel != nil {
					close(b.cancelled)
					<-b.slowCancel
				}
				return nil, ctx.Err()
			}
		}
		if b.gate != nil {
			if err := hold(ctx, b.gate(first)); err != nil {
				return nil, err
			}
		}
		if b.yield != nil {
			for range b.yield(arrival) {
				runtime.Gosched()
			}
		}
		var lost bool
		if b.cut != nil {
			var before bool
			before, lost = b.cut(arrival)
			if before {
				return nil, errors.New("fake broker: connection reset before the request was read")
			}
		}
		fr := fakeRequest{parts: map[int32][]kafka.Message{}, codes: map[int32]int16{}, seqs: map[int32]int32{}, pids: map[int32]int64{}}
		res := &produce.Response{}
		b.mu.Lock()
		n := len(b.requests)
		for i, t := range r.Topics {
			rt := produce.ResponseTopic{Topic: t.Topic}
			for _, p := range topics[i] {
				raw, msgs := p.raw, p.msgs
				fr.parts[p.id] = msgs
				pid, epoch, seq := stampOf(raw)
				fr.seqs[p.id], fr.pids[p.id] = seq, pid
				if b.forget != nil && b.forget(arrival, p.id) {
					delete(b.producers[p.id], pid)
				}
				if st := b.producers[p.id][pid]; st != nil && b.expiry > 0 && b.now().Sub(st.last) >= b.expiry {
					delete(b.producers[p.id], pid)
				}
				seqCode, dup := int16(0), false
				if pid >= 0 {
					seqCode, dup = b.checkSequence(p.id, pid, epoch, seq, len(msgs))
				}
				code := int16(0)
				if b.fail != nil {
					code = b.fail(n, p.id)
				}
				if c, ok := b.once[string(msgs[0].Value)]; ok && (code == 0 || dup && sequenceError(kafka.Error(code))) {
					code = c
					delete(b.once, string(msgs[0].Value))
				}
				if dup && sequenceError(kafka.Error(code)) {
					code = 0 // a leader holding the batch answers that it does
				}
				if code == 0 && b.maxBatchBytes > 0 && len(raw)-4 > b.maxBatchBytes {
					code = int16(kafka.MessageSizeTooLarge)
				}
				message := ""
				for _, m := range msgs {
					if c, ok := b.refuse[string(m.Value)]; ok && code == 0 {
						code, message = c, b.refusal
					}
				}
				if code == 0 {
					code = seqCode
				}
				if code == 0 && b.txn != nil && pid >= 0 {
					code = b.txn.produced(r.TransactionalID, p.id, pid, epoch, raw[offAttributes+1]&(1<<4) != 0, msgs, dup)
				}
				base := int64(-1) // a duplicate's: not said
				switch {
				case code == 0 && dup && b.dupCode:
					code = int16(kafka.DuplicateSequenceNumber)
				case code == 0 && !dup:
					base = int64(len(b.log[p.id]))
					b.appendBatch(p.id, pid, epoch, seq, msgs)
					if lost && b.refuseRetry != nil && len(msgs) == 1 {
						if c := b.refuseRetry(); c != 0 {
							if b.once == nil {
								b.once = map[string]int16{}
							}
							v := string(msgs[0].Value)
							b.once[v] = c
							b.retryRefused = append(b.retryRefused, v)
						}
					}
				}
				fr.codes[p.id] = code
				if code != 0 {
					base = -1
				}
				rt.Partitions = append(rt.Partitions, produce.ResponsePartition{Partition: p.id, ErrorCode: code, ErrorMessage: message, BaseOffset: base})
			}
			res.Topics = append(res.Topics, rt)
		}
		b.requests = append(b.requests, fr)
		b.mu.Unlock()
		select {
		case b.progress() <- struct{}{}:
		default:
		}
		if b.answer != nil {
			if err := hold(ctx, b.answer(first)); err != nil {
				return nil, err
			}
		}
		if lost {
			return nil, errors.New("fake broker: connection reset before the answer was read")
		}
		return res, nil
	}
	return nil, fmt.Errorf("fake broker: unexpected request %T", req)
}

// hold waits until g is closed (nil: at once) or ctx ends.
func hold(ctx context.Context, g <-chan struct{}) error {
	if g == nil {
		return nil
	}
	select {
	case <-g:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// decodeRaw reads a raw record set with kafka-go's decoder.
func decodeRaw(raw []byte) ([]kafka.Message, error) {
	if len(raw) < 4 || int(binary.BigEndian.Uint32(raw)) != len(raw)-4 {
		return nil, fmt.Errorf("the record set's size prefix does not match its %d bytes", len(raw))
	}
	var set protocol.RecordSet
	if _, err := set.ReadFrom(bytes.NewReader(raw)); err != nil {
		return nil, err
	}
	var out []kafka.Message
	for {
		rec, err := set.Records.ReadRecord()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		m := kafka.Message{Offset: rec.Offset, Time: rec.Time}
		if rec.Key != nil {
			m.Key, _ = io.ReadAll(rec.Key)
			if m.Key == nil {
				m.Key = []byte{}
			}
		}
		if rec.Value != nil {
			m.Value, _ = io.ReadAll(rec.Value)
		}
		for _, h := range rec.Headers {
			m.Headers = append(m.Headers, kafka.Header(h))
		}
		out = append(out, m)
	}
}

type ackRecorder struct {
	mu     sync.Mutex
	places map[string]int64 // where each record was placed (Place), by value
	errs   map[string]error
	order  []string
	done   chan struct{}
	ping   chan struct{} // signalled at each outcome
	want   int
}

func newAckRecorder(want int) *ackRecorder {
	return &ackRecorder{errs: map[string]error{}, done: make(chan struct{}), ping: make(chan struct{}, 1), want: want}
}

func (r *ackRecorder) wait(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("only %d of %d records were acknowledged or failed", len(r.errs), r.want)
	}
}

// told is the records told their outcome so far, in that order.
func (r *ackRecorder) told() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order)
}

func (r *ackRecorder) get(k string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs[k]
}

type ack struct {
	r   *ackRecorder
	key string
}

// Place records where the producer said the broker put the record.
func (a ack) Place(partition int32, offset int64) {
	a.r.mu.Lock()
	defer a.r.mu.Unlock()
	if _, acked := a.r.errs[a.key]; acked {
		panic("record " + a.key + " placed after its acknowledgement")
	}
	if a.r.places == nil {
		a.r.places = map[string]int64{}
	}
	a.r.places[a.key] = int64(partition)<<32 | offset
}

// checkPlaces: every record acknowledged was placed, at its offset in the
// broker's log (the fake's only topic), and no other was.
func checkPlaces(t *testing.T, r *ackRecorder, b *fakeBroker) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, err := range r.errs {
		got, placed := r.places[k]
		if err != nil {
			if placed {
				t.Errorf("%s failed (%v) but was placed at %d", k, err, got)
			}
			continue
		}
		want := int64(-1)
		for part, vs := range b.log {
			for off, v := range vs {
				if v == k {
					want = int64(part)<<32 | int64(off)
				}
			}
		}
		if !placed || got != want {
			t.Errorf("%s placed at %d/%d (placed: %t), the broker holds it at %d/%d", k, got>>32, got&0xffffffff, placed, want>>32, want&0xffffffff)
		}
	}
}

func (a ack) Ack(err error) {
	a.r.mu.Lock()
	defer a.r.mu.Unlock()
	if _, dup := a.r.errs[a.key]; dup {
		panic("record " + a.key + " acknowledged twice")
	}
	a.r.errs[a.key] = err
	a.r.order = append(a.r.order, a.key)
	select {
	case a.r.ping <- struct{}{}:
	default:
	}
	if len(a.r.errs) == a.r.want {
		close(a.r.done)
	}
}

// testProducer builds a producer over b. The fields a test leaves zero get
// the values below (config.Default fills them in production).
func testProducer(t *testing.T, b *fakeBroker, cfg Config) *Producer {
	t.Helper()
	if cfg.Partitioner == "" {
		cfg.Partitioner = "murmur2"
	}
	if cfg.Compression == "" {
		cfg.Compression = "none"
	}
	if cfg.OnPartitionChange == "" {
		cfg.OnPartitionChange = PartitionsFollow
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 1000
	}
	if cfg.BatchBytes == 0 {
		cfg.BatchBytes = 1 << 20
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = time.Second
	}
	cfg.Brokers = []string{"fake:9092"}
	p, err := NewWithTransport(cfg, hclog.NewNullLogger(), b)
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, p)
	return p
}

// closeAtCleanup closes p when the test ends, giving up after 2 s.
func closeAtCleanup(t *testing.T, p *Producer) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = p.Close(ctx)
	})
}

func rec(r *ackRecorder, key, value string) *outboxd.Record {
	return &outboxd.Record{Topic: "t", Key: []byte(key), Value: []byte(value), Ack: ack{r, value},
		Headers: []outboxd.Header{{Key: "tipus", Value: []byte("comanda.creada")}, {Key: "id_esdeveniment", Value: []byte("id-" + value)}}}
}

// produceOne hands records one call at a time, as the replication stream does.
func produceOne(t *testing.T, p *Producer, recs ...*outboxd.Record) {
	t.Helper()
	for i := range recs {
		if err := p.Produce(recs[i]); err != nil {
			t.Fatalf("produce %s: %v", recs[i].Value, err)
		}
	}
}

// observer counts the records Config.Observe is told about.
type observer struct {
	mu         sync.Mutex
	ok, failed int
}

func (o *observer) observe(_ string, records int, _ int64, _ time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		o.failed += records
	} else {
		o.ok += records
	}
}

func (o *observer) counts() (ok, failed int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ok, o.failed
}
