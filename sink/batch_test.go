package sink

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd"
)

type nopAck struct{}

func (nopAck) Ack(error) {}

// encodingCases are records at the edges of the format: keys nil, empty and
// UTF-8, values nil and large, headers with a nil value, timestamps apart.
func encodingCases() ([]outboxd.Record, []int64) {
	recs := []outboxd.Record{
		{Key: []byte("P-2026-000123"), Value: []byte(`{"id_esdeveniment":"6f1c","dades":{"a":1}}`),
			Headers: []outboxd.Header{{Key: "tipus", Value: []byte("comanda.creada")}, {Key: "id_esdeveniment", Value: []byte("6f1c")}}},
		{Key: nil, Value: []byte("null key")},
		{Key: []byte{}, Value: nil, Headers: []outboxd.Header{{Key: "empty", Value: nil}}},
		{Key: []byte("clau-àèò"), Value: []byte(strings.Repeat("carrega ", 5000))},
	}
	return recs, []int64{0, 1, 1, 300000}
}

// TestBatchEncoding encodes batches with every compression and decodes them
// with kafka-go's reader, which checks the CRC: keys (nil, empty, UTF-8),
// values (nil, large), headers and timestamps must come back as given.
func TestBatchEncoding(t *testing.T) {
	recs, stamps := encodingCases()
	base := time.UnixMilli(1789000000000)
	for _, name := range []string{"none", "gzip", "snappy", "lz4", "zstd"} {
		t.Run(name, func(t *testing.T) {
			cd, err := codec(name)
			if err != nil {
				t.Fatal(err)
			}
			b := newBatch(&partition{topic: "t"}, base)
			for i := range recs {
				recs[i].Ack = nopAck{}
				b.add(&recs[i], base.UnixMilli()+stamps[i])
			}
			var out bytes.Buffer
			raw, err := b.encode(cd, &out)
			if err != nil {
				t.Fatal(err)
			}
			if name != "none" && len(raw) >= len(b.buf) {
				t.Errorf("compressed batch %d bytes, raw %d", len(raw), len(b.buf))
			}
			got, err := decodeRaw(raw)
			if err != nil {
				t.Fatal(err)
			}
			checkDecoded(t, got, recs, stamps, base.UnixMilli())
		})
	}
}

// TestSplit: the two halves of a split batch are valid batches (decoded by
// kafka-go's reader) that hold the records as given, each numbered from
// offset delta 0, with their timestamps, their Ackers and Refusable.
func TestSplit(t *testing.T) {
	recs, stamps := encodingCases()
	base := time.UnixMilli(1789000000000)
	b := newBatch(&partition{topic: "t"}, base)
	for i := range recs {
		recs[i].Ack = ack{newAckRecorder(1), fmt.Sprint(i)}
		recs[i].Refusable = i%2 == 1
		b.add(&recs[i], base.UnixMilli()+stamps[i])
	}
	first, rest, err := b.split()
	if err != nil {
		t.Fatal(err)
	}
	half := len(recs) / 2
	for i, h := range []struct {
		b    *batch
		from int
	}{{first, 0}, {rest, half}} {
		want := recs[h.from : h.from+half]
		if h.b.created != base || int(h.b.count) != len(want) {
			t.Fatalf("half %d: %d records created %s, want %d created %s", i, h.b.count, h.b.created, len(want), base)
		}
		for j, p := range h.b.acks {
			if p.ack != want[j].Ack || p.refusable != want[j].Refusable {
				t.Errorf("half %d record %d: Ack or Refusable not kept", i, j)
			}
		}
		raw, err := h.b.encode(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeRaw(raw)
		if err != nil {
			t.Fatalf("half %d: %v", i, err)
		}
		checkDecoded(t, got, want, stamps[h.from:h.from+half], base.UnixMilli())
	}
}

// checkDecoded compares what kafka-go decoded from a batch with the records
// it was built from, added at base+stamps[i].
func checkDecoded(t *testing.T, got []kafka.Message, recs []outboxd.Record, stamps []int64, base int64) {
	t.Helper()
	if len(got) != len(recs) {
		t.Fatalf("%d records decoded, want %d", len(got), len(recs))
	}
	for i, m := range got {
		r := recs[i]
		if (r.Key == nil) != (m.Key == nil) || !bytes.Equal(r.Key, m.Key) {
			t.Errorf("record %d key %q (nil %v), want %q (nil %v)", i, m.Key, m.Key == nil, r.Key, r.Key == nil)
		}
		if !bytes.Equal(r.Value, m.Value) || (r.Value == nil) != (m.Value == nil) {
			t.Errorf("record %d value differs (%d bytes, nil %v)", i, len(m.Value), m.Value == nil)
		}
		if fmt.Sprint(r.Headers) != fmt.Sprint(toHeaders(m.Headers)) {
			t.Errorf("record %d headers %v, want %v", i, m.Headers, r.Headers)
		}
		if want := base + stamps[i]; m.Time.UnixMilli() != want {
			t.Errorf("record %d timestamp %d, want %d", i, m.Time.UnixMilli(), want)
		}
		if m.Offset != int64(i) {
			t.Errorf("record %d offset %d", i, m.Offset)
		}
	}
}

func toHeaders[H interface {
	~struct {
		Key   string
		Value []byte
	}
}](hs []H) []outboxd.Header {
	var out []outboxd.Header
	for _, h := range hs {
		out = append(out, outboxd.Header(h))
	}
	return out
}

// TestEncodedLen: the size the producer checks against batch_bytes is the
// size the record takes.
func TestEncodedLen(t *testing.T) {
	b := newBatch(&partition{topic: "t"}, time.Now())
	for i, v := range []int{0, 1, 63, 64, 127, 128, 8191, 8192, 100000} {
		r := outboxd.Record{Key: []byte("k"), Value: make([]byte, v), Ack: nopAck{},
			Headers: []outboxd.Header{{Key: "h", Value: []byte("x")}}}
		ts := int64(1789000000000 + i*1000)
		want := b.encodedLen(&r, ts)
		before := len(b.buf)
		b.add(&r, ts)
		if got := len(b.buf) - before; got != want {
			t.Errorf("value of %d bytes: encodedLen %d, took %d", v, want, got)
		}
	}
}

// TestSmallBatchUncompressed: a batch whose records take fewer than
// minCompressBytes goes uncompressed whatever the codec (its attributes say
// none), one at the bound is compressed, and both decode as given.
func TestSmallBatchUncompressed(t *testing.T) {
	base := time.UnixMilli(1789000000000)
	for _, name := range []string{"gzip", "snappy", "lz4", "zstd"} {
		cd, err := codec(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			value      int
			compressed bool
		}{{200, false}, {minCompressBytes, true}} {
			recs := []outboxd.Record{{Key: []byte("P-2026-000123"), Value: []byte(strings.Repeat("a", tc.value)), Ack: nopAck{}}}
			b := newBatch(&partition{topic: "t"}, base)
			b.add(&recs[0], base.UnixMilli())
			var out bytes.Buffer
			raw, err := b.encode(cd, &out)
			if err != nil {
				t.Fatal(err)
			}
			codecBits := int(binary.BigEndian.Uint16(raw[offAttributes:]) & 7)
			if got := codecBits != 0; got != tc.compressed {
				t.Errorf("%s, a %d-byte value: compressed %t (attributes codec %d), want %t", name, tc.value, got, codecBits, tc.compressed)
			}
			got, err := decodeRaw(raw)
			if err != nil {
				t.Fatal(err)
			}
			checkDecoded(t, got, recs, []int64{0}, base.UnixMilli())
		}
	}
}
