package tracing

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
)

// otlpExporter sends spans to an OTLP/HTTP receiver, in binary protobuf
// (the protocol's default): a POST of an ExportTraceServiceRequest to the
// traces URL. It is outboxd's own rather than the SDK's otlptracehttp,
// whose configuration code links gRPC, HTTP/2 and HTML templates into
// outboxd for an exporter that uses none of them: 99 packages, 3.6 MB of
// binary and 2.5 MB of resident memory (docs/reports/PERFORMANCE.md,
// issue 32). What it does is the OTLP/HTTP specification's: retry on 429,
// 502, 503 and 504 (after Retry-After when the receiver sends one) until
// the export's deadline, and read a partial success.
type otlpExporter struct {
	url     string
	headers map[string]string
	client  *http.Client
}

func newOTLPExporter(url string, headers map[string]string, tlsConfig *tls.Config) *otlpExporter {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if tlsConfig != nil {
		tr.TLSClientConfig = tlsConfig
	}
	return &otlpExporter{url: url, headers: headers, client: &http.Client{Transport: tr, Timeout: exportTimeout}}
}

// exportTimeout bounds one request, as OTEL_EXPORTER_OTLP_TIMEOUT's default.
const exportTimeout = 10 * time.Second

// ExportSpans sends spans in one request (the batch processor's batch),
// retrying what the receiver says is worth retrying while ctx lasts.
func (e *otlpExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	// A body of its own per export, never pooled: the HTTP transport may
	// still be reading a request's body after Do returns.
	body := appendTracesData(nil, spans)
	delay := time.Second
	for {
		retryAfter, err := e.post(ctx, body)
		if err == nil || retryAfter < 0 {
			return err
		}
		wait := max(retryAfter, delay)
		delay = min(2*delay, 30*time.Second)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (then %w)", err, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// post makes one request: nil when the receiver took the spans; else the
// error, with how long to wait before trying again, or -1 when trying
// again cannot help.
func (e *otlpExporter) post(ctx context.Context, body []byte) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return -1, err
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("User-Agent", "outboxd")
	for k, v := range e.headers {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, err // the network's: worth another try
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch resp.StatusCode {
	case http.StatusOK, http.StatusAccepted, http.StatusNoContent:
		if n, msg := partialSuccess(answer); n > 0 {
			return -1, &rejectedError{spans: n, msg: msg}
		}
		return 0, nil
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		wait := time.Duration(0)
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			wait = time.Duration(s) * time.Second
		}
		return wait, fmt.Errorf("the receiver answered %s", resp.Status)
	}
	return -1, fmt.Errorf("the receiver answered %s", resp.Status)
}

// rejectedError is a partial success: the receiver took the request and
// rejected some of its spans.
type rejectedError struct {
	spans int64
	msg   string
}

func (e *rejectedError) Error() string {
	return fmt.Sprintf("the receiver rejected %d spans: %s", e.spans, e.msg)
}

// Shutdown closes the idle connections; the batch processor calls it last.
func (e *otlpExporter) Shutdown(context.Context) error {
	e.client.CloseIdleConnections()
	return nil
}

// partialSuccess reads an ExportTraceServiceResponse: its partial_success
// (field 1) holds rejected_spans (1) and error_message (2).
func partialSuccess(b []byte) (rejected int64, msg string) {
	ps := field(b, 1, protowire.BytesType)
	for len(ps) > 0 {
		num, typ, n := protowire.ConsumeTag(ps)
		if n < 0 {
			return rejected, msg
		}
		ps = ps[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(ps)
			if m < 0 {
				return rejected, msg
			}
			rejected, n = int64(v), m
		case num == 2 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(ps)
			if m < 0 {
				return rejected, msg
			}
			msg, n = string(v), m
		default:
			n = protowire.ConsumeFieldValue(num, typ, ps)
		}
		if n < 0 {
			return rejected, msg
		}
		ps = ps[n:]
	}
	return rejected, msg
}

// field is the value of the last field num of type typ in message b (the
// bytes of a length-delimited one), nil when there is none.
func field(b []byte, num protowire.Number, typ protowire.Type) []byte {
	var found []byte
	for len(b) > 0 {
		n, t, m := protowire.ConsumeTag(b)
		if m < 0 {
			return found
		}
		b = b[m:]
		if n == num && t == typ && t == protowire.BytesType {
			v, k := protowire.ConsumeBytes(b)
			if k < 0 {
				return found
			}
			found, m = v, k
		} else {
			m = protowire.ConsumeFieldValue(n, t, b)
		}
		if m < 0 {
			return found
		}
		b = b[m:]
	}
	return found
}

// flags are OTLP's span flags: the W3C trace flags in the low byte, and
// whether the parent (or a link's span) is remote, known (bit 8) and true
// (bit 9).
func flags(tf trace.TraceFlags, other trace.SpanContext) uint32 {
	f := uint32(tf) | uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK)
	if other.IsRemote() {
		f |= uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
	}
	return f
}

func unixNano(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(t.UnixNano())
}

// kind maps the API's span kinds to OTLP's (the same numbers; the API's
// unspecified is an internal span, as the SDK makes it).
func kind(k trace.SpanKind) tracepb.Span_SpanKind {
	switch k {
	case trace.SpanKindServer:
		return tracepb.Span_SPAN_KIND_SERVER
	case trace.SpanKindClient:
		return tracepb.Span_SPAN_KIND_CLIENT
	case trace.SpanKindProducer:
		return tracepb.Span_SPAN_KIND_PRODUCER
	case trace.SpanKindConsumer:
		return tracepb.Span_SPAN_KIND_CONSUMER
	}
	return tracepb.Span_SPAN_KIND_INTERNAL
}

var _ sdktrace.SpanExporter = (*otlpExporter)(nil)
