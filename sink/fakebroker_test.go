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
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/describeconfigs"
	"github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/rawproduce"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/clock/clocktest"
)

// fakeBroker answers the producer's requests in memory. It exists for the
// faults a real broker cannot be made to produce on demand: failing exactly
// one partition of one produce request, blocking, several leaders. It
// decodes every record batch with kafka-go's own decoder (which checks the
// CRC), so the encoding is checked independently of the encoder. The
// integration tests use a real broker for everything else.
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
	// still held by block); arrival is signalled at each (waitArrived).
	arrived     atomic.Int32
	arrival     chan struct{}
	arrivalOnce sync.Once
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

	metaN int
	addrs []string // the address of every request, in order

	mu       sync.Mutex
	requests []fakeRequest
}

type fakeRequest struct {
	parts map[int32][]kafka.Message // records per partition, decoded
	codes map[int32]int16           // the error code answered per partition
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

func (b *fakeBroker) arrivals() chan struct{} {
	b.arrivalOnce.Do(func() { b.arrival = make(chan struct{}, 1) })
	return b.arrival
}

// waitArrived waits until n produce requests reached the broker, and fails
// t if they do not within a minute (a generous bound: a loaded machine may
// be slow to get there).
func (b *fakeBroker) waitArrived(t *testing.T, n int32) {
	t.Helper()
	deadline := time.After(time.Minute)
	for b.arrived.Load() < n {
		select {
		case <-b.arrivals():
		case <-deadline:
			t.Fatalf("%d produce requests arrived, want %d", b.arrived.Load(), n)
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

// waitIdle waits until the sender has finished the round in flight (its
// Ackers may have heard before): a Flush then finds it idle.
func waitIdle(t *testing.T, p *Producer) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		p.mu.Lock()
		sending := p.sending
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
	case *rawproduce.Request:
		b.arrived.Add(1)
		select {
		case b.arrivals() <- struct{}{}:
		default:
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
		fr := fakeRequest{parts: map[int32][]kafka.Message{}, codes: map[int32]int16{}}
		res := &produce.Response{}
		b.mu.Lock()
		n := len(b.requests)
		for _, t := range r.Topics {
			rt := produce.ResponseTopic{Topic: t.Topic}
			for _, p := range t.Partitions {
				raw, err := io.ReadAll(p.RecordSet.Reader)
				var msgs []kafka.Message
				if err == nil {
					msgs, err = decodeRaw(raw)
				}
				if err != nil {
					b.mu.Unlock()
					return nil, fmt.Errorf("fake broker: bad record batch: %w", err)
				}
				fr.parts[p.Partition] = msgs
				code := int16(0)
				if b.fail != nil {
					code = b.fail(n, p.Partition)
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
				fr.codes[p.Partition] = code
				rt.Partitions = append(rt.Partitions, produce.ResponsePartition{Partition: p.Partition, ErrorCode: code, ErrorMessage: message})
			}
			res.Topics = append(res.Topics, rt)
		}
		b.requests = append(b.requests, fr)
		b.mu.Unlock()
		return res, nil
	}
	return nil, fmt.Errorf("fake broker: unexpected request %T", req)
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
	mu    sync.Mutex
	errs  map[string]error
	order []string
	done  chan struct{}
	want  int
}

func newAckRecorder(want int) *ackRecorder {
	return &ackRecorder{errs: map[string]error{}, done: make(chan struct{}), want: want}
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

func (r *ackRecorder) get(k string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs[k]
}

type ack struct {
	r   *ackRecorder
	key string
}

func (a ack) Ack(err error) {
	a.r.mu.Lock()
	defer a.r.mu.Unlock()
	if _, dup := a.r.errs[a.key]; dup {
		panic("record " + a.key + " acknowledged twice")
	}
	a.r.errs[a.key] = err
	a.r.order = append(a.r.order, a.key)
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
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = p.Close(ctx)
	})
	return p
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
