package tracing

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/envelope"
)

// acks records what its Acker was told.
type acks struct{ got []error }

func (a *acks) Ack(err error) { a.got = append(a.got, err) }

const (
	traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	sampled = "00-" + traceID + "-00f067aa0ba902b7-01"
	dropped = "00-" + traceID + "-00f067aa0ba902b7-00"
)

// The SDK's in-memory exporter stands in for the receiver here: these
// tests are about which spans are made and what they say; the
// integration suite sends them to a real collector (TestTracingSpans).
func newTest(t *testing.T, cfg Config) (*Tracer, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	cfg.ServiceName, cfg.QueueSize = "outboxd", 64
	return newTracer(cfg, exp), exp
}

func record(traceparent string) *outboxd.Record {
	r := &outboxd.Record{Topic: "comandes", Key: []byte("P-1"), RowID: []byte("e-1"),
		Headers: []outboxd.Header{{Key: "id_esdeveniment", Value: []byte("e-1")}}}
	if traceparent != "" {
		r.Headers = append(r.Headers, outboxd.Header{Key: envelope.HeaderTraceparent, Value: []byte(traceparent)},
			outboxd.Header{Key: envelope.HeaderTracestate, Value: []byte("congo=t61rcWkgMzE")})
	}
	return r
}

func TestSpanFromCommitToAck(t *testing.T) {
	tr, exp := newTest(t, Config{SampleRatio: 1, Propagate: true, RecordKeys: true})
	next := &acks{}
	rec := record(sampled)
	committed := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	pos := envelope.Position{CommitLSN: pglogrepl.LSN(0x16B3748), CommitTime: committed.UnixMicro()}
	a := tr.Start(rec, pos, "", next)
	if a == outboxd.Acker(next) {
		t.Fatal("a sampled record's Acker is not wrapped")
	}
	a.(outboxd.Placer).Place(2, 41)
	if len(exp.GetSpans()) != 0 || len(next.got) != 0 {
		t.Fatal("the span ended, or next was told, before the outcome")
	}
	a.Ack(nil)
	if len(next.got) != 1 || next.got[0] != nil {
		t.Fatalf("next told %v, want one nil", next.got)
	}
	if err := tr.provider.ForceFlush(context.Background()); err != nil { // Shutdown would empty the in-memory exporter
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	s := spans[0]
	if s.Parent.TraceID().String() != traceID || s.Parent.SpanID().String() != "00f067aa0ba902b7" || !s.Parent.IsRemote() ||
		s.SpanContext.TraceID().String() != traceID || s.Parent.TraceState().String() != "congo=t61rcWkgMzE" {
		t.Errorf("parent %v, span %v", s.Parent, s.SpanContext)
	}
	if s.SpanKind != trace.SpanKindProducer || s.Name != "send comandes" || !s.StartTime.Equal(committed) || s.EndTime.Before(s.StartTime) {
		t.Errorf("kind %v name %q start %v (committed %v) end %v", s.SpanKind, s.Name, s.StartTime, committed, s.EndTime)
	}
	got := map[string]string{}
	for _, kv := range s.Attributes {
		got[string(kv.Key)] = kv.Value.Emit()
	}
	want := map[string]string{"messaging.system": "kafka", "messaging.operation.type": "send", "messaging.operation.name": "send",
		"messaging.destination.name": "comandes", "messaging.kafka.message.key": "P-1", "messaging.message.id": "e-1",
		"outboxd.commit_lsn": "0/16B3748", "messaging.destination.partition.id": "2", "messaging.kafka.offset": "41"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("attributes %v", got)
	}
	// The record carries the span in the row's traceparent's place.
	if tp := string(rec.Header(envelope.HeaderTraceparent)); tp != "00-"+traceID+"-"+s.SpanContext.SpanID().String()+"-01" {
		t.Errorf("record's traceparent %q, span %v", tp, s.SpanContext.SpanID())
	}
	if n := len(rec.Headers); n != 3 {
		t.Errorf("%d headers, want the row's 3", n)
	}
	if c := tr.Counts(); c.Started != 1 || c.Exported != 1 || c.Failed != 0 {
		t.Errorf("counts %+v", c)
	}
}

func TestSpanOfAFailure(t *testing.T) {
	tr, exp := newTest(t, Config{SampleRatio: 1})
	for _, err := range []error{errors.New("broker gone"), &outboxd.RefusedError{Topic: "comandes", Err: errors.New("too large")}} {
		next := &acks{}
		rec := record("")
		a := tr.Start(rec, envelope.Position{}, "replay", next)
		a.Ack(err)
		if len(next.got) != 1 || next.got[0] != err {
			t.Fatalf("next told %v, want %v once", next.got, err)
		}
		if rec.Header(envelope.HeaderTraceparent) != nil {
			t.Errorf("without propagate the record got a traceparent")
		}
	}
	_ = tr.provider.ForceFlush(context.Background())
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	for i, msg := range []string{"broker gone", "refused by the broker: dead-lettered"} {
		s := spans[i]
		if s.Status.Code != codes.Error || s.Status.Description != msg || s.Parent.IsValid() {
			t.Errorf("span %d: status %v %q, parent %v", i, s.Status.Code, s.Status.Description, s.Parent)
		}
		for _, kv := range s.Attributes {
			switch kv.Key {
			case "messaging.kafka.offset", "outboxd.commit_lsn":
				t.Errorf("span %d has %s without a place or a commit", i, kv.Key)
			case "outboxd.source":
				if kv.Value.AsString() != "replay" {
					t.Errorf("source %q", kv.Value.AsString())
				}
			}
		}
	}
}

// A row whose traceparent is not sampled, or one without any when the
// ratio is 0, gets no span, and its record stays as the row made it.
func TestNotSampled(t *testing.T) {
	tr, exp := newTest(t, Config{SampleRatio: 0, Propagate: true})
	for _, tp := range []string{dropped, ""} {
		next := &acks{}
		rec := record(tp)
		if a := tr.Start(rec, envelope.Position{CommitLSN: 1}, "", next); a != outboxd.Acker(next) {
			t.Errorf("traceparent %q: the Acker was wrapped", tp)
		}
		if got := string(rec.Header(envelope.HeaderTraceparent)); got != tp {
			t.Errorf("traceparent %q became %q", tp, got)
		}
	}
	// Ratio 0 still follows a sampled parent.
	next := &acks{}
	tr.Start(record(sampled), envelope.Position{CommitLSN: 1}, "", next).Ack(nil)
	_ = tr.provider.ForceFlush(context.Background())
	if n := len(exp.GetSpans()); n != 1 {
		t.Errorf("%d spans, want the sampled parent's one", n)
	}
}

func TestParent(t *testing.T) {
	for _, tc := range []struct {
		tp string
		ok bool
	}{
		{sampled, true},
		{"00-" + traceID + "-00f067aa0ba902b7", false},                     // short
		{"00-" + traceID + "-00f067aa0ba902zz-01", false},                  // not hex
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", false}, // zero trace id
	} {
		_, ok := parent(record(tc.tp))
		if ok != tc.ok {
			t.Errorf("%q: %t, want %t", tc.tp, ok, tc.ok)
		}
	}
}

// A record that Kafka would no longer take with a traceparent added (the
// router checked its size without one) keeps its headers; one whose row
// has a traceparent gets the span's in its place, of the same size.
func TestInjectWithinTheRecordLimit(t *testing.T) {
	rec := record("")
	limit := rec.WireSize() + traceparentSize - 1
	tr, _ := newTest(t, Config{SampleRatio: 1, Propagate: true, MaxRecordBytes: limit})
	tr.Start(rec, envelope.Position{}, "", &acks{}).Ack(nil)
	if rec.Header(envelope.HeaderTraceparent) != nil {
		t.Errorf("a traceparent took the record over the limit")
	}
	rec = record("")
	tr.maxRecord = rec.WireSize() + traceparentSize
	tr.Start(rec, envelope.Position{}, "", &acks{}).Ack(nil)
	if rec.Header(envelope.HeaderTraceparent) == nil {
		t.Errorf("no traceparent where it fits")
	}
	rec = record(sampled)
	size := rec.WireSize()
	tr.maxRecord = size
	tr.Start(rec, envelope.Position{}, "", &acks{}).Ack(nil)
	if tp := rec.Header(envelope.HeaderTraceparent); string(tp) == sampled || rec.WireSize() != size {
		t.Errorf("traceparent %q, size %d (was %d)", tp, rec.WireSize(), size)
	}
}

// A record acknowledged without a place was in Kafka already; a commit
// time ahead of outboxd's clock starts the span now; a key that is not
// UTF-8 is sent as valid UTF-8 (OTLP would refuse the whole batch).
func TestSpanEdges(t *testing.T) {
	tr, exp := newTest(t, Config{SampleRatio: 1, RecordKeys: true})
	rec := record("")
	rec.Key = []byte{'P', 0xff}
	ahead := time.Now().Add(time.Hour)
	before := time.Now()
	tr.Start(rec, envelope.Position{CommitLSN: 1, CommitTime: ahead.UnixMicro()}, "", &acks{}).Ack(nil)
	_ = tr.provider.ForceFlush(context.Background())
	s := exp.GetSpans()[0]
	if s.StartTime.Before(before) || s.StartTime.After(time.Now()) || s.EndTime.Before(s.StartTime) {
		t.Errorf("start %v end %v, want now", s.StartTime, s.EndTime)
	}
	got := map[string]string{}
	for _, kv := range s.Attributes {
		got[string(kv.Key)] = kv.Value.Emit()
	}
	if got["outboxd.already_in_kafka"] != "true" || got["messaging.kafka.offset"] != "" {
		t.Errorf("attributes %v: want already_in_kafka and no offset", got)
	}
	if k := got["messaging.kafka.message.key"]; k != "P\uFFFD" {
		t.Errorf("key %q", k)
	}
}

// TestNoKeysByDefault (issue 35, item 4): without tracing.record_keys a
// span carries neither the record's key (its agregat_id) nor its row id.
func TestNoKeysByDefault(t *testing.T) {
	tr, exp := newTest(t, Config{SampleRatio: 1})
	tr.Start(record(""), envelope.Position{CommitLSN: 1}, "", &acks{}).Ack(nil)
	_ = tr.provider.ForceFlush(context.Background())
	for _, kv := range exp.GetSpans()[0].Attributes {
		if kv.Key == "messaging.kafka.message.key" || kv.Key == "messaging.message.id" || strings.Contains(kv.Value.Emit(), "P-1") {
			t.Errorf("a span carries %s = %q", kv.Key, kv.Value.Emit())
		}
	}
}
