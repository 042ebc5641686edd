package outboxd_test

import (
	"strings"
	"testing"

	"github.com/outboxd/outboxd"
)

// TestWireSize checks WireSize against a batch of one record encoded by
// hand, field by field, as Kafka's v2 format lays it out.
func TestWireSize(t *testing.T) {
	for _, r := range []outboxd.Record{
		{},
		{Key: []byte("P-2026-000123"), Value: []byte(`{"a":1}`)},
		{Key: []byte{}, Value: []byte(strings.Repeat("x", 200)), Headers: []outboxd.Header{{Key: "tipus", Value: []byte("comanda.creada")}, {Key: "n", Value: nil}}},
		{Value: []byte(strings.Repeat("y", 1<<20))},
	} {
		body := 1 + 1 + 1 + field(r.Key) + field(r.Value) + uvar(len(r.Headers))
		for _, h := range r.Headers {
			body += uvar(len(h.Key)) + len(h.Key) + field(h.Value)
		}
		want := 4 + 61 + uvar(body) + body
		if got := r.WireSize(); got != want {
			t.Errorf("key %d, value %d, %d headers: WireSize %d, want %d", len(r.Key), len(r.Value), len(r.Headers), got, want)
		}
	}
}

// uvar is the length of n as a zigzag varint.
func uvar(n int) int {
	u := uint64(n) << 1
	l := 1
	for u >= 0x80 {
		u >>= 7
		l++
	}
	return l
}

func field(b []byte) int {
	if b == nil {
		return 1
	}
	return uvar(len(b)) + len(b)
}
