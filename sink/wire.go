package sink

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// Produce requests go on the producer's own connections, one per broker,
// written and read here (issue 36). Through kafka-go's Transport each
// request was handed to the goroutine of one of its connections and its
// answer handed back, both encoded by reflection: at a few hundred
// transactions a second, a fifth of outboxd's CPU. Here the sender that
// writes a request reads its answer itself, from the same socket, when no
// earlier request to that broker is still unanswered; when one is, it
// waits for the earlier one's sender to read that answer and pass it the
// turn. Requests to one broker are pipelined on one connection: Kafka
// answers a connection's requests in the order they came (and takes them
// up one at a time, as it does the Java producer's).
// Everything else (metadata, tails, transactions, producer ids) still goes
// through the Transport.

// produceVersion is the version of the produce requests written here:
// every Kafka since 2.1 takes it (4.0 removed only v0-v2), and it is the
// last before the flexible encoding.
const produceVersion = 8

// wires is the producer's produce connections, by broker address.
type wires struct {
	cfg  Config
	dial func(ctx context.Context, network, addr string) (net.Conn, error)

	mu     sync.Mutex
	conns  map[string]*wire
	closed bool
}

func newWires(cfg Config) *wires {
	return &wires{cfg: cfg, dial: dialer(cfg), conns: map[string]*wire{}}
}

var errWiresClosed = errors.New("the producer's connections are closed")

// produce sends the produce request req (written by produceRequest)
// to the broker at addr and returns its answer's body, after the
// correlation id.
func (ws *wires) produce(ctx context.Context, addr string, req *bytes.Buffer) ([]byte, error) {
	w, err := ws.conn(ctx, addr)
	if err != nil {
		return nil, err
	}
	return w.roundTrip(req, ws.cfg.WriteTimeout)
}

// wireIdle is how long a produce connection may go unused and still be
// used again; one idle longer is closed (when the producer next sends to
// any broker, without a timer of its own). Brokers close connections idle
// for connections.max.idle.ms (10 minutes by default), and a request
// written into a connection the broker closed fails; kafka-go's Transport
// closed its connections idle for 30 s too.
const wireIdle = 30 * time.Second

var errWireIdle = errors.New("the connection to the broker was idle")

// conn is the connection to addr, dialled when there is none, the last
// one broke, or it was idle too long (connections to brokers no longer
// used are closed on the way).
func (ws *wires) conn(ctx context.Context, addr string) (*wire, error) {
	now := time.Now()
	ws.mu.Lock()
	if ws.closed {
		ws.mu.Unlock()
		return nil, errWiresClosed
	}
	var found *wire
	for a, w := range ws.conns {
		if !w.usable(now) {
			w.fail(errWireIdle)
			delete(ws.conns, a)
		} else if a == addr {
			found = w
		}
	}
	ws.mu.Unlock()
	if found != nil {
		return found, nil
	}
	w, err := ws.connect(ctx, addr)
	if err != nil {
		return nil, err
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed {
		w.fail(errWiresClosed)
		return nil, errWiresClosed
	}
	if old := ws.conns[addr]; old != nil && old.usable(now) {
		w.fail(errors.New("dialled twice")) // another sender dialled first
		return old, nil
	}
	ws.conns[addr] = w
	return w, nil
}

// close closes every connection: requests in flight fail.
func (ws *wires) close() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.closed = true
	for a, w := range ws.conns {
		w.fail(errWiresClosed)
		delete(ws.conns, a)
	}
}

// wire is one connection to a broker for produce requests.
type wire struct {
	c net.Conn
	// wmu orders the writes: a request's call joins the queue and the
	// request is written under it, so the queue is in the order of the
	// writes. mu guards the rest, and is never held across a write or a
	// read.
	wmu   sync.Mutex
	mu    sync.Mutex
	corr  int32     // the last correlation id given
	queue []*call   // written (or being written) and not yet answered, in order
	used  time.Time // when the last request was written
	err   error     // once set, the connection is closed and every call fails with it
}

// call is a request written on a wire whose answer is not read yet.
type call struct {
	corr int32
	// turn is signalled when the call's answer is next on the socket, or
	// the connection failed (nil for the call that was first in line).
	turn chan struct{}
}

// usable reports whether the connection may take a request at now: not
// failed, and busy or used within wireIdle.
func (w *wire) usable(now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err == nil && (len(w.queue) > 0 || now.Sub(w.used) < wireIdle)
}

func (w *wire) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// fail closes the connection with err, once: every call waiting fails.
func (w *wire) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failLocked(err)
}

func (w *wire) failLocked(err error) {
	if w.err != nil {
		return
	}
	w.err = err
	w.c.Close()
	for _, cl := range w.queue {
		cl.wake()
	}
	w.queue = nil
}

// wake tells a waiting call to look: its turn came, or the connection
// failed (it looks at wire.err first). A call may be told twice (its turn,
// then a failure, before it ran): once is enough.
func (cl *call) wake() {
	if cl.turn == nil {
		return // first in line: it is reading, not waiting
	}
	select {
	case cl.turn <- struct{}{}:
	default:
	}
}

// roundTrip writes req with the next correlation id and returns its
// answer, giving up after timeout: from the write, or, behind earlier
// requests, from the answer before it (a broker takes a connection's
// requests one at a time, and counts the request's timeout from when it
// takes it up); kafka-go's Transport gave up after the request's timeout
// too.
func (w *wire) roundTrip(req *bytes.Buffer, timeout time.Duration) ([]byte, error) {
	w.wmu.Lock()
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		w.wmu.Unlock()
		return nil, err
	}
	w.corr++
	cl := &call{corr: w.corr}
	if len(w.queue) > 0 {
		cl.turn = make(chan struct{}, 1)
	}
	w.queue = append(w.queue, cl)
	w.used = time.Now()
	w.mu.Unlock()
	b := req.Bytes()
	binary.BigEndian.PutUint32(b[0:], uint32(len(b)-4))
	binary.BigEndian.PutUint32(b[8:], uint32(cl.corr))
	_ = w.c.SetWriteDeadline(w.used.Add(timeout))
	_, err := w.c.Write(b)
	w.wmu.Unlock()
	if err != nil {
		w.fail(err)
		return nil, err
	}
	if cl.turn != nil {
		<-cl.turn
		if err := w.failed(); err != nil {
			return nil, err
		}
	}
	// Only this goroutine reads the socket until it passes the turn on.
	_ = w.c.SetReadDeadline(time.Now().Add(timeout))
	res, err := readAnswer(w.c, cl.corr)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.failLocked(err)
		return nil, err
	}
	if w.err != nil {
		// Closed while this answer was read: the answer counts, the
		// calls after it have failed.
		return res, nil
	}
	w.queue = w.queue[1:]
	if len(w.queue) > 0 {
		w.queue[0].wake()
	}
	return res, nil
}

// maxAnswerBytes bounds what an answer may claim to be: a produce answer
// is tens of bytes per partition; a larger size is not a Kafka answer.
const maxAnswerBytes = 64 << 20

// readAnswer reads one answer from r, which must carry correlation id
// corr, and returns it without its size and correlation id.
func readAnswer(r io.Reader, corr int32) ([]byte, error) {
	var head [8]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	size := int32(binary.BigEndian.Uint32(head[0:]))
	got := int32(binary.BigEndian.Uint32(head[4:]))
	if size < 4 || size > maxAnswerBytes {
		return nil, fmt.Errorf("a produce answer of %d bytes: not a Kafka answer", size)
	}
	if got != corr {
		return nil, fmt.Errorf("a produce answer with correlation id %d where %d was next", got, corr)
	}
	buf := make([]byte, size-4)
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// produceRequest writes a produce request (produceVersion, acks=all) into
// a buffer as its batches are encoded into it (batch.encode), with room for
// its size and correlation id, which roundTrip fills in, and its counts
// filled in by finish.
type produceRequest struct {
	buf      *bytes.Buffer
	topics   int32
	topicsAt int // where the topic count goes
	parts    int32
	partsAt  int // where the current topic's partition count goes; -1: none yet
	scratch  [4]byte
}

func startProduceRequest(buf *bytes.Buffer, clientID, transactionalID string, timeout time.Duration) *produceRequest {
	r := &produceRequest{buf: buf, partsAt: -1}
	r.put32(0) // size
	r.put16(int16(protocol.Produce))
	r.put16(produceVersion)
	r.put32(0) // correlation id
	r.str(clientID)
	if transactionalID == "" {
		r.put16(-1)
	} else {
		r.str(transactionalID)
	}
	r.put16(int16(kafka.RequireAll))
	r.put32(int32(timeout / time.Millisecond))
	r.topicsAt = buf.Len()
	r.put32(0)
	return r
}

// topic starts the partitions of topic name.
func (r *produceRequest) topic(name string) {
	r.endTopic()
	r.topics++
	r.str(name)
	r.partsAt, r.parts = r.buf.Len(), 0
	r.put32(0)
}

// partition starts partition id's record set, which the caller writes
// next (its size first); undo(mark) takes it out again.
func (r *produceRequest) partition(id int32) (mark int) {
	mark = r.buf.Len()
	r.parts++
	r.put32(id)
	return mark
}

func (r *produceRequest) undo(mark int) {
	r.buf.Truncate(mark)
	r.parts--
}

// finish fills in the counts; the request is ready for roundTrip.
func (r *produceRequest) finish() {
	r.endTopic()
	binary.BigEndian.PutUint32(r.buf.Bytes()[r.topicsAt:], uint32(r.topics))
}

func (r *produceRequest) endTopic() {
	if r.partsAt >= 0 {
		binary.BigEndian.PutUint32(r.buf.Bytes()[r.partsAt:], uint32(r.parts))
	}
}

func (r *produceRequest) put16(v int16) {
	binary.BigEndian.PutUint16(r.scratch[:2], uint16(v))
	r.buf.Write(r.scratch[:2])
}

func (r *produceRequest) put32(v int32) {
	binary.BigEndian.PutUint32(r.scratch[:4], uint32(v))
	r.buf.Write(r.scratch[:4])
}

func (r *produceRequest) str(s string) {
	r.put16(int16(len(s)))
	r.buf.WriteString(s)
}

// partitionOutcome is one partition's result in a produce answer.
type partitionOutcome struct {
	topic      string
	partition  int32
	code       int16
	baseOffset int64
	message    string
}

// parseProduceAnswer reads a produce answer's body (after the correlation
// id, produceVersion): each partition's outcome.
func parseProduceAnswer(body []byte) ([]partitionOutcome, error) {
	var outs []partitionOutcome
	d := answerDecoder{buf: body}
	for range d.count() {
		name := d.str()
		for range d.count() {
			o := partitionOutcome{topic: name, partition: d.int32(), code: d.int16(), baseOffset: d.int64()}
			d.int64() // log append time
			d.int64() // log start offset
			// The record errors: the partition's error message says it.
			for range d.count() {
				d.int32()
				d.str()
			}
			o.message = d.str()
			outs = append(outs, o)
		}
	}
	d.int32() // throttle time
	if d.err != nil {
		return nil, fmt.Errorf("a produce answer that does not parse: %w", d.err)
	}
	return outs, nil
}

type answerDecoder struct {
	buf []byte
	err error
}

func (d *answerDecoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.buf) {
		d.err = fmt.Errorf("%d bytes wanted, %d left", n, len(d.buf))
		return nil
	}
	v := d.buf[:n]
	d.buf = d.buf[n:]
	return v
}

func (d *answerDecoder) int16() int16 {
	if v := d.take(2); v != nil {
		return int16(binary.BigEndian.Uint16(v))
	}
	return 0
}

func (d *answerDecoder) int32() int32 {
	if v := d.take(4); v != nil {
		return int32(binary.BigEndian.Uint32(v))
	}
	return 0
}

func (d *answerDecoder) int64() int64 {
	if v := d.take(8); v != nil {
		return int64(binary.BigEndian.Uint64(v))
	}
	return 0
}

// count is an array's length; a null array (-1) is empty.
func (d *answerDecoder) count() int {
	n := d.int32()
	if n < 0 {
		return 0
	}
	if int(n) > len(d.buf) { // every element takes a byte at least
		d.err = fmt.Errorf("an array of %d in %d bytes", n, len(d.buf))
		return 0
	}
	return int(n)
}

// str is a (nullable) string; null reads as "".
func (d *answerDecoder) str() string {
	n := d.int16()
	if n < 0 {
		return ""
	}
	return string(d.take(int(n)))
}
