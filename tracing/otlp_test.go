package tracing

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// receiver is an OTLP/HTTP receiver in a test: it answers each request
// with the next of its answers (the last one again when they run out) and
// keeps what it was sent. The real one (an OpenTelemetry Collector) is
// TestTracingSpans' in the integration suite; this one injects the
// answers a collector gives only when overloaded or half-broken.
type receiver struct {
	mu      sync.Mutex
	answers []func(http.ResponseWriter)
	got     []*tracepb.TracesData
	headers []http.Header
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var td tracepb.TracesData
	if err := proto.Unmarshal(body, &td); err != nil || r.Method != http.MethodPost || r.URL.Path != "/v1/traces" ||
		r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "not an OTLP/HTTP protobuf export", http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.got = append(rc.got, &td)
	rc.headers = append(rc.headers, r.Header.Clone())
	answer := rc.answers[min(len(rc.got), len(rc.answers))-1]
	rc.mu.Unlock()
	answer(w)
}

func answer(code int, header ...string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
	}
}

func newReceiver(t *testing.T, answers ...func(http.ResponseWriter)) (*receiver, *otlpExporter) {
	t.Helper()
	rc := &receiver{answers: answers}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	return rc, newOTLPExporter(srv.URL+"/v1/traces", map[string]string{"authorization": "Bearer t0k"}, nil)
}

// spans are two spans of one resource and scope: a producer span with a
// remote parent, every attribute type, an event, a link and an error; and
// a root span, status OK.
func spans() []sdktrace.ReadOnlySpan {
	res := resource.NewSchemaless(attribute.String("service.name", "outboxd"))
	scope := instrumentation.Scope{Name: "github.com/outboxd/outboxd", Version: "v1"}
	tid, _ := trace.TraceIDFromHex(traceID)
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled, Remote: true})
	start := time.Unix(1700000000, 123)
	stubs := tracetest.SpanStubs{
		{
			Name: "send comandes", SpanKind: trace.SpanKindProducer, Parent: parent,
			SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled}),
			StartTime:   start, EndTime: start.Add(time.Millisecond),
			Attributes: []attribute.KeyValue{attribute.String("s", "v"), attribute.Int64("i", -7), attribute.Bool("b", true),
				attribute.Float64("f", 1.5), attribute.StringSlice("ss", []string{"a", "b"}), attribute.Int64Slice("is", []int64{1, 2})},
			Events:            []sdktrace.Event{{Name: "retry", Time: start, Attributes: []attribute.KeyValue{attribute.Int("n", 1)}}},
			Links:             []sdktrace.Link{{SpanContext: parent, Attributes: []attribute.KeyValue{attribute.String("l", "x")}}},
			Status:            sdktrace.Status{Code: codes.Error, Description: "refused"},
			DroppedAttributes: 3, Resource: res, InstrumentationScope: scope,
		},
		{
			Name: "root", SpanKind: trace.SpanKindInternal, StartTime: start, EndTime: start,
			SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{3}}),
			Status:      sdktrace.Status{Code: codes.Ok}, Resource: res, InstrumentationScope: scope,
		},
	}
	return stubs.Snapshots()
}

func TestOTLPExportEncodesSpans(t *testing.T) {
	rc, exp := newReceiver(t, answer(http.StatusOK))
	if err := exp.ExportSpans(context.Background(), spans()); err != nil {
		t.Fatal(err)
	}
	if len(rc.got) != 1 {
		t.Fatalf("%d requests", len(rc.got))
	}
	if h := rc.headers[0].Get("Authorization"); h != "Bearer t0k" {
		t.Errorf("authorization header %q", h)
	}
	td := rc.got[0]
	if len(td.ResourceSpans) != 1 || len(td.ResourceSpans[0].ScopeSpans) != 1 {
		t.Fatalf("resources and scopes: %v", td)
	}
	rs := td.ResourceSpans[0]
	if a := rs.Resource.Attributes; len(a) != 1 || a[0].Key != "service.name" || a[0].Value.GetStringValue() != "outboxd" {
		t.Errorf("resource %v", a)
	}
	ss := rs.ScopeSpans[0]
	if ss.Scope.Name != "github.com/outboxd/outboxd" || ss.Scope.Version != "v1" || len(ss.Spans) != 2 {
		t.Fatalf("scope %v with %d spans", ss.Scope, len(ss.Spans))
	}
	s, root := ss.Spans[0], ss.Spans[1]
	if got := trace.TraceID(s.TraceId); got.String() != traceID || s.SpanId[0] != 2 || s.ParentSpanId[0] != 1 || len(root.ParentSpanId) != 0 {
		t.Errorf("ids: trace %x span %x parent %x; root's parent %x", s.TraceId, s.SpanId, s.ParentSpanId, root.ParentSpanId)
	}
	if s.Kind != tracepb.Span_SPAN_KIND_PRODUCER || root.Kind != tracepb.Span_SPAN_KIND_INTERNAL || s.Name != "send comandes" {
		t.Errorf("kind %v / %v, name %q", s.Kind, root.Kind, s.Name)
	}
	if s.Flags != 0x301 || root.Flags != 0x100 {
		t.Errorf("flags %#x (want sampled, parent remote: 0x301), root %#x (want 0x100)", s.Flags, root.Flags)
	}
	if s.StartTimeUnixNano != 1700000000000000123 || s.EndTimeUnixNano != 1700000000001000123 {
		t.Errorf("times %d - %d", s.StartTimeUnixNano, s.EndTimeUnixNano)
	}
	attrs := map[string]string{}
	for _, kv := range s.Attributes {
		attrs[kv.Key] = kv.Value.String()
	}
	for k, want := range map[string]string{"s": `string_value:"v"`, "i": "int_value:-7", "b": "bool_value:true", "f": "double_value:1.5",
		"ss": `array_value:{values:{string_value:"a"} values:{string_value:"b"}}`, "is": "array_value:{values:{int_value:1} values:{int_value:2}}"} {
		if got := strings.Join(strings.Fields(attrs[k]), " "); got != want {
			t.Errorf("attribute %s: %s, want %s", k, got, want)
		}
	}
	if s.DroppedAttributesCount != 3 {
		t.Errorf("dropped attributes %d", s.DroppedAttributesCount)
	}
	if len(s.Events) != 1 || s.Events[0].Name != "retry" || s.Events[0].Attributes[0].Value.GetIntValue() != 1 {
		t.Errorf("events %v", s.Events)
	}
	if len(s.Links) != 1 || s.Links[0].SpanId[0] != 1 || s.Links[0].Flags != 0x301 || s.Links[0].Attributes[0].Key != "l" {
		t.Errorf("links %v", s.Links)
	}
	if s.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || s.Status.GetMessage() != "refused" || root.Status.GetCode() != tracepb.Status_STATUS_CODE_OK {
		t.Errorf("status %v / %v", s.Status, root.Status)
	}
}

func TestOTLPExportRetries(t *testing.T) {
	// 503, then 429 with Retry-After 1 s, then taken: three requests.
	rc, exp := newReceiver(t, answer(http.StatusServiceUnavailable), answer(http.StatusTooManyRequests, "Retry-After", "1"), answer(http.StatusOK))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := exp.ExportSpans(ctx, spans()); err != nil {
		t.Fatal(err)
	}
	if len(rc.got) != 3 {
		t.Errorf("%d requests, want 3", len(rc.got))
	}

	// A 400 is not worth another try.
	rc, exp = newReceiver(t, answer(http.StatusBadRequest))
	if err := exp.ExportSpans(ctx, spans()); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("a 400: %v", err)
	}
	if len(rc.got) != 1 {
		t.Errorf("%d requests after a 400, want 1", len(rc.got))
	}

	// Retried until the export's deadline, which ends it.
	rc, exp = newReceiver(t, answer(http.StatusBadGateway))
	short, cancel2 := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel2()
	err := exp.ExportSpans(short, spans())
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "502") {
		t.Errorf("502 until the deadline: %v", err)
	}
	if len(rc.got) != 2 {
		t.Errorf("%d requests in 1.5 s (one at once, one after 1 s), want 2", len(rc.got))
	}
}

func TestOTLPExportPartialSuccess(t *testing.T) {
	// ExportTraceServiceResponse{partial_success: {rejected_spans: 2, error_message: "too old"}}
	var ps []byte
	ps = protowire.AppendTag(ps, 1, protowire.VarintType)
	ps = protowire.AppendVarint(ps, 2)
	ps = protowire.AppendTag(ps, 2, protowire.BytesType)
	ps = protowire.AppendString(ps, "too old")
	var body []byte
	body = protowire.AppendTag(body, 1, protowire.BytesType)
	body = protowire.AppendBytes(body, ps)
	_, exp := newReceiver(t, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(body)
	})
	err := exp.ExportSpans(context.Background(), spans())
	if err == nil || !strings.Contains(err.Error(), "rejected 2 spans: too old") {
		t.Errorf("a partial success: %v", err)
	}
	// Counted: the rejected as failed, the rest as exported.
	c := &counting{SpanExporter: exp}
	three := append(spans(), spans()[0])
	_ = c.ExportSpans(context.Background(), three)
	if c.failed.Load() != 2 || c.exported.Load() != 1 {
		t.Errorf("of 3 spans, 2 rejected: counted %d failed, %d exported", c.failed.Load(), c.exported.Load())
	}
	if n, msg := partialSuccess(nil); n != 0 || msg != "" {
		t.Errorf("an empty answer: %d %q", n, msg)
	}
}
