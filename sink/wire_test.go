package sink

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/apiversions"
	"github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/protocol/produce"
)

// TestProduceRequestEncoding: a request written by produceRequest reads
// back, with kafka-go's own decoder, as the topics, partitions and records
// it was given, with and without a transactional id, a partition taken out
// again (undo) leaving no trace.
func TestProduceRequestEncoding(t *testing.T) {
	recs, stamps := encodingCases()
	base := time.UnixMilli(1789000000000)
	raw := func(n int) []byte {
		b := newBatch(&partition{topic: "t"}, base)
		for i := range recs[:n] {
			recs[i].Ack = nopAck{}
			b.add(&recs[i], base.UnixMilli()+stamps[i])
		}
		out, err := b.encode(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	type part struct {
		id      int32
		records []byte
	}
	topics := []struct {
		name  string
		parts []part
	}{
		{"comandes", []part{{0, raw(2)}, {3, raw(4)}}},
		{"pagaments.àè", []part{{1, raw(1)}}},
	}
	for _, txn := range []string{"", "outboxd-comandes"} {
		var buf bytes.Buffer
		req := startProduceRequest(&buf, "outboxd", txn, 30*time.Second)
		for _, tp := range topics {
			req.topic(tp.name)
			req.undo(req.partition(9)) // encoding failed: not sent
			for _, pt := range tp.parts {
				req.partition(pt.id)
				buf.Write(pt.records)
			}
		}
		req.finish()
		b := buf.Bytes()
		binary.BigEndian.PutUint32(b[0:], uint32(len(b)-4))
		binary.BigEndian.PutUint32(b[8:], 77)
		version, corr, client, msg, err := protocol.ReadRequest(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("txn %q: %v", txn, err)
		}
		got := msg.(*produce.Request)
		if version != produceVersion || corr != 77 || client != "outboxd" || got.TransactionalID != txn || got.Acks != -1 || got.Timeout != 30000 {
			t.Fatalf("txn %q: v%d corr %d client %q %+v", txn, version, corr, client, got)
		}
		if len(got.Topics) != 2 {
			t.Fatalf("topics %d", len(got.Topics))
		}
		for ti, want := range topics {
			gt := got.Topics[ti]
			if gt.Topic != want.name || len(gt.Partitions) != len(want.parts) {
				t.Fatalf("topic %d: %q with %d partitions", ti, gt.Topic, len(gt.Partitions))
			}
			for pi, wp := range want.parts {
				gp := gt.Partitions[pi]
				if gp.Partition != wp.id {
					t.Errorf("partition %d: %d", pi, gp.Partition)
				}
				wantRecs, err := decodeRaw(wp.records)
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for {
					r, err := gp.RecordSet.Records.ReadRecord()
					if err != nil {
						break
					}
					var k []byte
					if r.Key != nil {
						k, _ = io.ReadAll(r.Key)
					}
					if string(k) != string(wantRecs[n].Key) {
						t.Errorf("%s/%d record %d: key %q, want %q", want.name, wp.id, n, k, wantRecs[n].Key)
					}
					n++
				}
				if n != len(wantRecs) {
					t.Errorf("%s/%d: %d records read back, %d written", want.name, wp.id, n, len(wantRecs))
				}
			}
		}
	}
}

// headerOnly is a produce request with no topic, from client.
func headerOnly(client string) *bytes.Buffer {
	var buf bytes.Buffer
	startProduceRequest(&buf, client, "", time.Second).finish()
	return &buf
}

// TestProduceAnswerParsing: an answer written by kafka-go's encoder
// (produce v8: record errors, error messages, null and not) parses into
// each partition's outcome.
func TestProduceAnswerParsing(t *testing.T) {
	res := &produce.Response{ThrottleTimeMs: 5, Topics: []produce.ResponseTopic{
		{Topic: "comandes", Partitions: []produce.ResponsePartition{
			{Partition: 0, BaseOffset: 41, LogAppendTime: -1, LogStartOffset: 0},
			{Partition: 3, ErrorCode: 10, BaseOffset: -1, RecordErrors: []produce.ResponseError{{BatchIndex: 0, BatchIndexErrorMessage: "too large"}},
				ErrorMessage: "the record is too large"},
		}},
		{Topic: "pagaments.àè", Partitions: []produce.ResponsePartition{{Partition: 1, ErrorCode: 6, BaseOffset: -1}}},
	}}
	var buf bytes.Buffer
	if err := protocol.WriteResponse(&buf, produceVersion, 9, res); err != nil {
		t.Fatal(err)
	}
	body, err := readAnswer(&buf, 9)
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseProduceAnswer(body)
	if err != nil {
		t.Fatal(err)
	}
	want := []partitionOutcome{
		{topic: "comandes", partition: 0, baseOffset: 41},
		{topic: "comandes", partition: 3, code: 10, baseOffset: -1, message: "the record is too large"},
		{topic: "pagaments.àè", partition: 1, code: 6, baseOffset: -1},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if _, err := parseProduceAnswer(body[:len(body)-6]); err == nil {
		t.Error("a truncated answer parsed")
	}
	buf.Reset()
	_ = protocol.WriteResponse(&buf, produceVersion, 10, res)
	if _, err := readAnswer(&buf, 9); err == nil {
		t.Error("an answer with another correlation id was taken")
	}
}

// pipeWire is a wire to a server that answers each request it reads
// (size, API key, version, correlation id, client id, ...) with its
// correlation id and, as the body, the request's client id, after delay;
// it reads but does not answer from request stopAt on (0: answers all)
// and then closes the connection. A fake broker: it injects what a real
// one does not do on demand (a connection dropped with requests in flight).
func pipeWire(t *testing.T, delay time.Duration, stopAt int) *wire {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for n := 1; ; n++ {
			var size [4]byte
			if _, err := io.ReadFull(c, size[:]); err != nil {
				return
			}
			req := make([]byte, binary.BigEndian.Uint32(size[:]))
			if _, err := io.ReadFull(c, req); err != nil {
				return
			}
			if stopAt > 0 && n >= stopAt {
				time.Sleep(delay)
				return
			}
			client := req[10 : 10+int(binary.BigEndian.Uint16(req[8:]))]
			time.Sleep(delay)
			ans := binary.BigEndian.AppendUint32(nil, uint32(4+len(client)))
			ans = append(ans, req[4:8]...) // the correlation id
			ans = append(ans, client...)
			if _, err := c.Write(ans); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &wire{c: c}
}

// TestWirePipelines: requests written on one connection by concurrent
// senders each get their own answer (the broker answers in order; each
// sender reads its own when its turn comes), whatever the order they were
// written in.
func TestWirePipelines(t *testing.T) {
	w := pipeWire(t, 5*time.Millisecond, 0)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("sender-%d", i)
			body, err := w.roundTrip(headerOnly(name), 10*time.Second)
			if err != nil {
				errs <- err
			} else if string(body) != name {
				errs <- fmt.Errorf("%s read the answer to %s", name, body)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if w.failed() != nil || len(w.queue) != 0 {
		t.Errorf("after every answer: %v, %d calls left", w.failed(), len(w.queue))
	}
}

// TestWireFailsEveryCall: the broker drops the connection with three
// requests written and one answered: the two unanswered fail, the
// connection is marked broken, and a later request fails at once rather
// than wait.
func TestWireFailsEveryCall(t *testing.T) {
	w := pipeWire(t, 20*time.Millisecond, 2)
	var wg sync.WaitGroup
	results := make([]error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, results[i] = w.roundTrip(headerOnly("x"), 10*time.Second)
		}()
		time.Sleep(2 * time.Millisecond) // written in order
	}
	wg.Wait()
	if results[0] != nil || results[1] == nil || results[2] == nil {
		t.Fatalf("outcomes %v: want the first answered, the others failed", results)
	}
	if w.failed() == nil {
		t.Fatal("the connection is still taken for good")
	}
	start := time.Now()
	if _, err := w.roundTrip(headerOnly("x"), 10*time.Second); err == nil || time.Since(start) > time.Second {
		t.Fatalf("a request on the broken connection: %v after %s", err, time.Since(start))
	}
}

// TestWireTimesOut: a broker that does not answer within the request's
// timeout fails the call (and the connection), as kafka-go's Transport
// did.
func TestWireTimesOut(t *testing.T) {
	w := pipeWire(t, 2*time.Second, 1)
	start := time.Now()
	_, err := w.roundTrip(headerOnly("x"), 200*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > time.Second {
		t.Fatalf("%v after %s", err, time.Since(start))
	}
	if w.failed() == nil {
		t.Fatal("a connection whose answer is overdue is kept")
	}
}

// wireBroker serves produce requests over TCP to a producer whose other
// requests go to a fakeBroker (its metadata names wireBroker as broker 1):
// it answers the API versions, and each produce request (numbered from 0)
// once it takes a token from gate (nil: at once), every partition with
// code(n) (nil: none) and the offsets it gave so far. A fake broker: it
// holds an answer as long as a test needs, which a real one does not.
type wireBroker struct {
	addr     *net.TCPAddr
	gate     chan struct{}
	code     func(n int) int16
	arrived  chan int // a produce request's number, as it arrives
	mu       sync.Mutex
	requests int
	offset   int64
}

func newWireBroker(t *testing.T, gate chan struct{}, code func(n int) int16) *wireBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	wb := &wireBroker{addr: ln.Addr().(*net.TCPAddr), gate: gate, code: code, arrived: make(chan int, 100)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go wb.serve(c)
		}
	}()
	return wb
}

func (wb *wireBroker) serve(c net.Conn) {
	defer c.Close()
	for {
		version, corr, _, msg, err := protocol.ReadRequest(c)
		if err != nil {
			return
		}
		var res protocol.Message
		switch r := msg.(type) {
		case *apiversions.Request:
			res = &apiversions.Response{ApiKeys: []apiversions.ApiKeyResponse{{ApiKey: int16(protocol.Produce), MinVersion: 3, MaxVersion: produceVersion}}}
		case *produce.Request:
			wb.mu.Lock()
			n := wb.requests
			wb.requests++
			wb.mu.Unlock()
			wb.arrived <- n
			if wb.gate != nil {
				<-wb.gate
			}
			code := int16(0)
			if wb.code != nil {
				code = wb.code(n)
			}
			pr := &produce.Response{}
			wb.mu.Lock()
			for _, t := range r.Topics {
				rt := produce.ResponseTopic{Topic: t.Topic}
				for _, p := range t.Partitions {
					out := produce.ResponsePartition{Partition: p.Partition, ErrorCode: code, BaseOffset: -1}
					if code == 0 {
						out.BaseOffset = wb.offset
						for {
							if _, err := p.RecordSet.Records.ReadRecord(); err != nil {
								break
							}
							wb.offset++
						}
					}
					rt.Partitions = append(rt.Partitions, out)
				}
				pr.Topics = append(pr.Topics, rt)
			}
			wb.mu.Unlock()
			res = pr
		default:
			return
		}
		if err := protocol.WriteResponse(c, version, corr, res); err != nil {
			return
		}
	}
}

// wireProducer is a producer whose produce requests go to wb over its own
// connections (wire.go), its other requests to a fakeBroker.
func wireProducer(t *testing.T, wb *wireBroker, cfg Config) *Producer {
	t.Helper()
	fb := &fakeBroker{partitions: 3, brokers: []metadata.ResponseBroker{{NodeID: 1, Host: wb.addr.IP.String(), Port: int32(wb.addr.Port)}}}
	cfg.Partitioner, cfg.Compression, cfg.OnPartitionChange = "murmur2", "lz4", PartitionsFollow
	cfg.BatchSize, cfg.BatchBytes, cfg.Brokers = 1000, 1<<20, []string{"fake:9092"}
	p, err := newProducer(cfg, hclog.NewNullLogger(), fb, newWires(cfg))
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, p)
	return p
}

// TestWireNothingAcknowledgedBeforeTheAnswer: on the producer's own
// connections, no record is told its outcome while the broker holds the
// answer to the request that carries it; once it answers, every record
// is acknowledged, once.
func TestWireNothingAcknowledgedBeforeTheAnswer(t *testing.T) {
	wb := newWireBroker(t, make(chan struct{}), nil)
	p := wireProducer(t, wb, Config{Linger: time.Millisecond, MaxAttempts: 1, WriteTimeout: time.Minute})
	r := newAckRecorder(30)
	for i := range 30 {
		produceOne(t, p, rec(r, fmt.Sprintf("P-%d", i), fmt.Sprintf("v%d", i)))
	}
	<-wb.arrived
	time.Sleep(50 * time.Millisecond) // an answer read early would be told by now
	if told := r.told(); len(told) != 0 {
		t.Fatalf("%d records told before the broker answered: %v", len(told), told)
	}
	close(wb.gate)
	r.wait(t)
	if told := r.told(); len(told) != 30 {
		t.Fatalf("%d outcomes for 30 records", len(told))
	}
	for i := range 30 {
		if err := r.get(fmt.Sprintf("v%d", i)); err != nil {
			t.Errorf("v%d: %v", i, err)
		}
	}
}

// TestWireRetriesOnItsConnection: the broker answers the first request
// NOT_LEADER_OR_FOLLOWER for every partition and the next ones with
// offsets: the batches go again, on the producer's connection, and every
// record is acknowledged once, none from the refused answer.
func TestWireRetriesOnItsConnection(t *testing.T) {
	wb := newWireBroker(t, nil, func(n int) int16 {
		if n == 0 {
			return int16(kafka.NotLeaderForPartition)
		}
		return 0
	})
	p := wireProducer(t, wb, Config{Linger: time.Millisecond, MaxAttempts: 3, WriteTimeout: time.Minute})
	r := newAckRecorder(30)
	for i := range 30 {
		produceOne(t, p, rec(r, fmt.Sprintf("P-%d", i), fmt.Sprintf("v%d", i)))
	}
	r.wait(t)
	told := r.told()
	if len(told) != 30 {
		t.Fatalf("%d outcomes for 30 records", len(told))
	}
	for i := range 30 {
		if err := r.get(fmt.Sprintf("v%d", i)); err != nil {
			t.Errorf("v%d: %v", i, err)
		}
	}
	wb.mu.Lock()
	defer wb.mu.Unlock()
	if wb.requests < 2 || wb.offset != 30 {
		t.Fatalf("%d produce requests, %d records written: want the refused one sent again", wb.requests, wb.offset)
	}
}

// TestWireIdleIsClosed: a connection unused for wireIdle is not used
// again (the broker may have closed it) but closed, with any other idle
// one, when the producer next sends; one in use or used lately is kept.
func TestWireIdleIsClosed(t *testing.T) {
	now := time.Now()
	fresh := pipeWire(t, 0, 0)
	idle := pipeWire(t, 0, 0)
	other := pipeWire(t, 0, 0)
	busy := pipeWire(t, 0, 0)
	fresh.used = now.Add(-wireIdle / 2)
	idle.used, other.used, busy.used = now.Add(-wireIdle), now.Add(-2*wireIdle), now.Add(-2*wireIdle)
	busy.queue = []*call{{corr: 1}} // an answer awaited: not idle
	ws := &wires{conns: map[string]*wire{"a:1": fresh, "b:1": idle, "c:1": other, "d:1": busy}}
	if w, err := ws.conn(context.Background(), "a:1"); w != fresh || err != nil {
		t.Fatalf("a connection used lately: %v, %v", w, err)
	}
	for name, w := range map[string]*wire{"idle": idle, "other": other} {
		if !errors.Is(w.failed(), errWireIdle) {
			t.Errorf("%s connection: %v, want closed as idle", name, w.failed())
		}
	}
	if fresh.failed() != nil || busy.failed() != nil || len(ws.conns) != 2 {
		t.Errorf("kept: fresh %v, busy %v, %d connections", fresh.failed(), busy.failed(), len(ws.conns))
	}
}
