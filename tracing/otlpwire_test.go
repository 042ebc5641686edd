package tracing

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
)

// randomSpans are n spans over two resources and three scopes, with
// attributes of every type, events, links, every status, remote and local
// parents, trace states and dropped counts, some fields left zero.
//
// scalar: only what outboxd's own spans hold (scalar attributes, no trace
// state, events or links).
func randomSpans(r *rand.Rand, n int, scalar bool) []sdktrace.ReadOnlySpan {
	resources := []*resource.Resource{
		resource.NewSchemaless(attribute.String("service.name", "outboxd"), attribute.Int("n", 1)),
		resource.NewWithAttributes("https://opentelemetry.io/schemas/1.26.0", attribute.String("service.name", "other")),
	}
	scopes := []instrumentation.Scope{
		{Name: "outboxd"},
		{Name: "lib", Version: "1.2.3", SchemaURL: "https://example.test/s", Attributes: attribute.NewSet(attribute.Bool("x", true))},
		{},
	}
	value := func() attribute.Value {
		k := r.IntN(12)
		if scalar && k >= 4 && k <= 7 {
			k = 11
		}
		switch k {
		case 0:
			return attribute.BoolValue(r.IntN(2) == 0)
		case 1:
			return attribute.Int64Value(r.Int64() - r.Int64())
		case 2:
			return attribute.Float64Value(r.NormFloat64())
		case 3:
			return attribute.StringValue("")
		case 4:
			return attribute.BoolSliceValue([]bool{true, false})
		case 5:
			return attribute.Int64SliceValue([]int64{0, -1, 1 << 40})
		case 6:
			return attribute.Float64SliceValue([]float64{0, 1.5})
		case 7:
			return attribute.StringSliceValue([]string{"a", "", "ç"})
		case 8:
			return attribute.Int64Value(0)
		case 9:
			return attribute.BoolValue(false)
		}
		return attribute.StringValue(fmt.Sprintf("v%d", r.IntN(1000)))
	}
	attrs := func(max int) []attribute.KeyValue {
		var kvs []attribute.KeyValue
		for i := range r.IntN(max + 1) {
			kvs = append(kvs, attribute.KeyValue{Key: attribute.Key(fmt.Sprintf("k%d", i)), Value: value()})
		}
		return kvs
	}
	context := func() trace.SpanContext {
		var cfg trace.SpanContextConfig
		for i := range cfg.TraceID {
			cfg.TraceID[i] = byte(r.IntN(256))
		}
		for i := range cfg.SpanID {
			cfg.SpanID[i] = byte(r.IntN(256))
		}
		cfg.TraceFlags = trace.TraceFlags(r.IntN(2))
		cfg.Remote = r.IntN(2) == 0
		if !scalar && r.IntN(3) == 0 {
			ts, _ := trace.ParseTraceState("vendor=x,other=y")
			cfg.TraceState = ts
		}
		return trace.NewSpanContext(cfg)
	}
	var stubs tracetest.SpanStubs
	start := time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)
	for i := range n {
		st := tracetest.SpanStub{
			Name:                 fmt.Sprintf("send topic-%d", i%3),
			SpanContext:          context(),
			SpanKind:             trace.SpanKind(r.IntN(6)),
			StartTime:            start.Add(time.Duration(r.IntN(1e9))),
			Attributes:           attrs(9),
			DroppedAttributes:    r.IntN(2),
			DroppedEvents:        r.IntN(2),
			DroppedLinks:         r.IntN(2),
			Resource:             resources[r.IntN(len(resources))],
			InstrumentationScope: scopes[r.IntN(len(scopes))],
		}
		if r.IntN(4) > 0 {
			st.EndTime = st.StartTime.Add(time.Millisecond)
		}
		if r.IntN(2) == 0 {
			st.Parent = context()
		}
		switch r.IntN(3) {
		case 1:
			st.Status = sdktrace.Status{Code: codes.Ok}
		case 2:
			st.Status = sdktrace.Status{Code: codes.Error, Description: "refused by the broker"}
		}
		for range r.IntN(3) * boolInt(!scalar) {
			st.Events = append(st.Events, sdktrace.Event{Name: "e", Time: start, Attributes: attrs(2), DroppedAttributeCount: r.IntN(2)})
		}
		for range r.IntN(3) * boolInt(!scalar) {
			st.Links = append(st.Links, sdktrace.Link{SpanContext: context(), Attributes: attrs(2), DroppedAttributeCount: r.IntN(2)})
		}
		stubs = append(stubs, st)
	}
	return stubs.Snapshots()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestWireMatchesProto: the exporter's wire encoder writes what the
// generated messages marshal to, byte for byte, for random batches.
func TestWireMatchesProto(t *testing.T) {
	r := rand.New(rand.NewPCG(36, 37))
	for i := range 300 {
		spans := randomSpans(r, 1+r.IntN(20), i%2 == 0)
		want, err := proto.Marshal(tracesData(spans))
		if err != nil {
			t.Fatal(err)
		}
		got := appendTracesData(nil, spans)
		if !bytes.Equal(got, want) {
			t.Fatalf("batch %d of %d spans: the wire encoder wrote %d bytes unlike the generated messages' %d\n got %x\nwant %x", i, len(spans), len(got), len(want), got, want)
		}
	}
}

// TestWireAllocations: a batch of spans like outboxd's costs its grouping,
// not an allocation per span (the generated messages took ~30 per span).
// (A slice attribute or a trace state costs one: the SDK's accessors
// build them.)
func TestWireAllocations(t *testing.T) {
	spans := randomSpans(rand.New(rand.NewPCG(1, 2)), 1000, true)
	buf := appendTracesData(nil, spans)
	allocs := testing.AllocsPerRun(10, func() { buf = appendTracesData(buf[:0], spans) })
	if allocs > 100 {
		t.Fatalf("%.0f allocations for 1,000 spans", allocs)
	}
	t.Logf("%.0f allocations for 1,000 spans", allocs)
}

// BenchmarkWire: a batch of 1,000 spans like outboxd's, encoded.
func BenchmarkWire(b *testing.B) {
	spans := randomSpans(rand.New(rand.NewPCG(1, 2)), 1000, true)
	buf := appendTracesData(nil, spans)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendTracesData(buf[:0], spans)
	}
}

// BenchmarkWireReference: the same batch as the generated messages,
// marshalled (the encoding before appendTracesData).
func BenchmarkWireReference(b *testing.B) {
	spans := randomSpans(rand.New(rand.NewPCG(1, 2)), 1000, true)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := proto.Marshal(tracesData(spans)); err != nil {
			b.Fatal(err)
		}
	}
}
