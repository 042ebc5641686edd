package sink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
	"time"

	"github.com/segmentio/kafka-go/compress"

	"github.com/outboxd/outboxd"
)

// A record batch in Kafka's v2 format (magic 2), the only one brokers of
// 3.0 and later accept from a producer:
//
//	baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 |
//	magic int8 | crc uint32 | attributes int16 | lastOffsetDelta int32 |
//	baseTimestamp int64 | maxTimestamp int64 | producerId int64 |
//	producerEpoch int16 | baseSequence int32 | records count int32 | records
//
// The crc is CRC-32C over everything from attributes to the end. With
// compression, only the records (after the count) are compressed. Each
// record is
//
//	length varint | attributes int8 | timestampDelta varint |
//	offsetDelta varint | key varbytes | value varbytes |
//	header count varint | (key varstring, value varbytes)...
//
// where varints are zigzag-encoded and a length of -1 is null.
//
// On the wire (and in a kafka-go RawRecordSet) the batch is preceded by its
// size as an int32, so the buffer starts with that prefix.
const (
	sizePrefix     = 4
	batchHeaderLen = sizePrefix + 61 // the prefix and the batch header
	offAttributes  = sizePrefix + 21
	offCRC         = sizePrefix + 17
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// partition is one partition of a topic and its batches.
type partition struct {
	topic  string
	id     int32
	leader int32 // broker id, -1 when unknown
	open   *batch
	queued []*batch // full batches, oldest first, never sent
	// sent: the batches sent and not yet completed, oldest first: in
	// flight, to be sent again, or settled and waiting for the ones before
	// them (records are acknowledged in their partition's order).
	sent     []*batch
	inFlight int // batches of sent in a request now
	// nextSeq is the sequence of the next record stamped (idempotence).
	nextSeq int32
	// pipelined: its leader acknowledged a batch under the current producer
	// id since its last failure or leader change, less than pipelineIdle
	// ago (acked), so it holds this producer's sequence and more than one
	// batch may be in flight: a leader without it would append a batch
	// that overtook a failed one (it takes any sequence from a producer it
	// does not know).
	pipelined bool
	acked     time.Time // its last acknowledgement, on the producer's clock
	// proof: what restart de-duplication knows of the partition
	// (dedupe.go).
	proof partProof
}

// batch is one partition's record batch being filled: the records are
// encoded as they arrive, after room left for the header, so a record's
// bytes are copied once and the caller's buffers can be reused at once.
type batch struct {
	part     *partition
	buf      []byte // header room + encoded records, uncompressed
	count    int32
	baseTime int64 // ms, the first record's timestamp
	maxTime  int64
	acks     []pending
	// offset is the first record's offset in the broker's last answer to
	// the batch, -1 when it did not say (a duplicate, or not answered).
	offset  int64
	kvBytes int64     // sum of the records' key and value bytes, for the observer
	created time.Time // when its first record was added (linger)
	// abandoned: a request carrying buf was given up while it may still
	// be read; buf is left to the garbage collector.
	abandoned bool
	// isolating: split from a batch the broker refused for its records'
	// content (Producer.isolate): a refusal that was retried is not
	// retried again.
	isolating bool

	// Its stamp (idempotence.go): the producer id and epoch it was sent
	// under and the sequence of its first record; pid -1 while it has none
	// (not idempotent, not sent yet, or to be sent again under a new id).
	pid   int64
	epoch int16
	seq   int32
	txn   bool // part of a transaction (transaction.go)

	// Its send state (sender.go), changed by the sender goroutine only,
	// under the producer's mu.
	state    batchState
	attempts int       // sends that failed with an error a retry may fix
	retryAt  time.Time // retrying: not before then
	err      error     // failed: the outcome its records get
	// reseq: refused for its sequence or producer id; it and the batches
	// after it wait for a new producer id (Producer.reset).
	reseq bool
	// stream: a record of it carries the outboxd.stream header (dedupe.go).
	stream bool
	// sentTo: the leader it was last sent to (its partition's, then).
	sentTo int32
	// resent: in flight again after a failure; its partition sends nothing
	// else until it is settled.
	resent bool
	// behind: sent while an earlier batch of its partition was open, which
	// it may have overtaken on the way to the leader (several requests to
	// one broker go on connections of their own).
	behind bool
}

// pending is a record waiting for its outcome.
type pending struct {
	ack       outboxd.Acker
	refusable bool // outboxd.Record.Refusable
}

var bufPool = sync.Pool{New: func() any { return new([]byte) }}

func newBatch(p *partition, now time.Time) *batch {
	bp := bufPool.Get().(*[]byte)
	buf := (*bp)[:0]
	if cap(buf) < 4096 {
		buf = make([]byte, 0, 16384)
	}
	return &batch{part: p, buf: append(buf, make([]byte, batchHeaderLen)...), created: now, pid: -1, epoch: -1, seq: -1, offset: -1}
}

// release returns the batch's buffer for reuse; the batch is dead after.
func (b *batch) release() {
	if b.buf != nil && !b.abandoned && cap(b.buf) <= 4<<20 {
		buf := b.buf[:0]
		bufPool.Put(&buf)
	}
	b.buf, b.acks = nil, nil
}

// recordLen is the encoded size of r in a batch where its deltas are
// timestampDelta and offsetDelta, without the leading length varint.
func recordLen(r *outboxd.Record, timestampDelta int64, offsetDelta int32) int {
	n := 1 + varintLen(timestampDelta) + varintLen(int64(offsetDelta)) +
		nullBytesLen(r.Key) + nullBytesLen(r.Value) + varintLen(int64(len(r.Headers)))
	for i := range r.Headers {
		h := &r.Headers[i]
		n += varintLen(int64(len(h.Key))) + len(h.Key) + nullBytesLen(h.Value)
	}
	return n
}

// encodedLen is what appending r would add to the batch.
func (b *batch) encodedLen(r *outboxd.Record, ts int64) int {
	delta := int64(0)
	if b.count > 0 {
		delta = ts - b.baseTime
	}
	n := recordLen(r, delta, b.count)
	return varintLen(int64(n)) + n
}

// add encodes r at timestamp ts (ms since the epoch).
func (b *batch) add(r *outboxd.Record, ts int64) {
	if b.count == 0 {
		b.baseTime, b.maxTime = ts, ts
	}
	if ts > b.maxTime {
		b.maxTime = ts
	}
	delta := ts - b.baseTime
	n := recordLen(r, delta, b.count)
	buf := binary.AppendVarint(b.buf, int64(n))
	buf = append(buf, 0) // record attributes: none
	buf = binary.AppendVarint(buf, delta)
	buf = binary.AppendVarint(buf, int64(b.count))
	buf = appendNullBytes(buf, r.Key)
	buf = appendNullBytes(buf, r.Value)
	buf = binary.AppendVarint(buf, int64(len(r.Headers)))
	for i := range r.Headers {
		h := &r.Headers[i]
		buf = binary.AppendVarint(buf, int64(len(h.Key)))
		buf = append(buf, h.Key...)
		buf = appendNullBytes(buf, h.Value)
	}
	b.buf = buf
	b.count++
	b.kvBytes += int64(len(r.Key) + len(r.Value))
	b.acks = append(b.acks, pending{ack: r.Ack, refusable: r.Refusable})
}

// split re-encodes b's records into two batches, the first half and the
// rest, each with its own offset and timestamp deltas, for a batch the
// broker refused for its records' content. b is released.
func (b *batch) split() (*batch, *batch, error) {
	recs, stamps, err := b.records()
	if err != nil {
		return nil, nil, err
	}
	first, rest := newBatch(b.part, b.created), newBatch(b.part, b.created)
	first.isolating, rest.isolating = true, true
	first.stream, rest.stream = b.stream, b.stream
	for i := range recs {
		dst := first
		if i >= len(recs)/2 {
			dst = rest
		}
		dst.add(&recs[i], stamps[i])
	}
	// The halves keep the sequences of their records: the batches after
	// them were numbered after the whole.
	if b.pid >= 0 {
		first.pid, first.epoch, first.seq, first.txn = b.pid, b.epoch, b.seq, b.txn
		rest.pid, rest.epoch, rest.seq, rest.txn = b.pid, b.epoch, addSeq(b.seq, first.count), b.txn
	}
	b.release()
	return first, rest, nil
}

// records decodes b's records, with their timestamps. Their bytes
// reference b.buf; their Ack and Refusable are the ones b was given.
func (b *batch) records() ([]outboxd.Record, []int64, error) {
	recs := make([]outboxd.Record, 0, b.count)
	stamps := make([]int64, 0, b.count)
	d := decoder{buf: b.buf[batchHeaderLen:]}
	for len(d.buf) > 0 && d.err == nil && len(recs) < len(b.acks) {
		n := d.varint()
		end := len(d.buf) - int(n)
		_ = d.byte() // attributes
		ts := b.baseTime + d.varint()
		_ = d.varint() // offset delta
		r := outboxd.Record{Topic: b.part.topic, Key: d.bytes(), Value: d.bytes(),
			Ack: b.acks[len(recs)].ack, Refusable: b.acks[len(recs)].refusable}
		if nh := d.varint(); nh > 0 && nh <= int64(len(d.buf)) {
			r.Headers = make([]outboxd.Header, nh)
			for i := range r.Headers {
				r.Headers[i] = outboxd.Header{Key: string(d.bytes()), Value: d.bytes()}
			}
		}
		if d.err == nil && len(d.buf) != end {
			d.err = fmt.Errorf("record %d: length %d does not match its fields", len(recs), n)
		}
		recs, stamps = append(recs, r), append(stamps, ts)
	}
	if d.err == nil && (len(d.buf) > 0 || len(recs) != len(b.acks)) {
		d.err = fmt.Errorf("%d records decoded, %d encoded", len(recs), len(b.acks))
	}
	if d.err != nil {
		return nil, nil, fmt.Errorf("%w: decode the records again: %w", errEncode, d.err)
	}
	return recs, stamps, nil
}

// decoder reads the fields of encoded records; the first error sticks and
// every later read returns zero.
type decoder struct {
	buf []byte
	err error
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.buf)
	if n <= 0 {
		d.err = errors.New("bad varint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) byte() byte {
	if d.err == nil && len(d.buf) == 0 {
		d.err = io.ErrUnexpectedEOF
	}
	if d.err != nil {
		return 0
	}
	c := d.buf[0]
	d.buf = d.buf[1:]
	return c
}

// bytes reads a length-prefixed field: nil for a length of -1.
func (d *decoder) bytes() []byte {
	n := d.varint()
	if d.err == nil && (n < -1 || n > int64(len(d.buf))) {
		d.err = fmt.Errorf("field length %d with %d bytes left", n, len(d.buf))
	}
	if d.err != nil || n == -1 {
		return nil
	}
	v := d.buf[:n:n]
	d.buf = d.buf[n:]
	return v
}

// minCompressBytes is the smallest batch (its records, encoded) that is
// compressed: below it a codec has too little to find repeats in to pay
// for its frame and its time. At the rates services run, most batches
// hold a record or two of a transaction, and lz4 took 8 % of outboxd's CPU
// to save a few bytes of each (issue 36). Each batch says whether it is
// compressed; a broker and a consumer read both alike.
const minCompressBytes = 1024

// encode returns the finished batch, with its stamp: compressed with codec
// when not nil and the batch is not under minCompressBytes, appended to
// out (a produce request being written, or a buffer of its own); else in
// the batch's own buffer.
func (b *batch) encode(codec compress.Codec, out *bytes.Buffer) ([]byte, error) {
	if b.abandoned {
		// A request given up may still be reading the buffer: the header
		// written below, with perhaps another stamp, goes into a copy.
		b.buf, b.abandoned = bytes.Clone(b.buf), false
	}
	raw := b.buf
	attributes := int16(0)
	if codec != nil && len(raw)-batchHeaderLen >= minCompressBytes {
		attributes = int16(codec.Code()) // the low three bits
		start := out.Len()
		out.Write(raw[:batchHeaderLen])
		w := codec.NewWriter(out)
		if _, err := w.Write(raw[batchHeaderLen:]); err != nil {
			_ = w.Close()
			return nil, fmt.Errorf("compress record batch: %w", err)
		}
		if err := w.Close(); err != nil {
			return nil, fmt.Errorf("compress record batch: %w", err)
		}
		raw = out.Bytes()[start:]
	}
	if b.txn {
		attributes |= 1 << 4 // transactional
	}
	h := raw[sizePrefix:batchHeaderLen]
	be := binary.BigEndian
	be.PutUint32(raw[0:], uint32(len(raw)-sizePrefix))  // the record set's size
	be.PutUint64(h[0:], 0)                              // base offset: the broker assigns it
	be.PutUint32(h[8:], uint32(len(raw)-sizePrefix-12)) // batch length: after this field
	be.PutUint32(h[12:], 0xffffffff)                    // partition leader epoch: -1
	h[16] = 2                                           // magic
	be.PutUint16(h[21:], uint16(attributes))            // compression, CreateTime, transactional
	be.PutUint32(h[23:], uint32(b.count-1))             // last offset delta
	be.PutUint64(h[27:], uint64(b.baseTime))            // base timestamp
	be.PutUint64(h[35:], uint64(b.maxTime))             // max timestamp
	be.PutUint64(h[43:], uint64(b.pid))                 // producer id: -1 without idempotence
	be.PutUint16(h[51:], uint16(b.epoch))               // producer epoch: -1 likewise
	be.PutUint32(h[53:], uint32(b.seq))                 // base sequence: -1 likewise
	be.PutUint32(h[57:], uint32(b.count))               // records
	be.PutUint32(raw[offCRC:], crc32.Checksum(raw[offAttributes:], castagnoli))
	return raw, nil
}

func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

func nullBytesLen(b []byte) int {
	if b == nil {
		return 1
	}
	return varintLen(int64(len(b))) + len(b)
}

func appendNullBytes(dst, b []byte) []byte {
	if b == nil {
		return binary.AppendVarint(dst, -1)
	}
	dst = binary.AppendVarint(dst, int64(len(b)))
	return append(dst, b...)
}
