// Package tracing is outboxd's own OpenTelemetry spans: one per record,
// from its transaction's commit to Kafka's acknowledgement, the child of
// the row's traceparent when it has one, made by the official Go SDK and
// exported over OTLP/HTTP in its batches (otlp.go).
//
// A span is started when the publisher hands a record to the producer,
// with the commit's time as its start, and ended by the record's Acker
// when Kafka answers: the Acker the publisher gave is wrapped, and told
// the outcome right after the span has it. Nothing on the way waits for
// the exporter: a span that finds the export queue full is dropped, never
// the record (Counts tells).
package tracing

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/certs"
	"github.com/outboxd/outboxd/envelope"
)

// Config is what a Tracer needs (config.Tracing).
type Config struct {
	Endpoint    string // the OTLP/HTTP receiver's base URL
	SampleRatio float64
	Propagate   bool
	ServiceName string
	Version     string
	Headers     map[string]string
	CAFile      string
	QueueSize   int
	// RecordKeys adds the record's key and row id to its span.
	RecordKeys bool
	// MaxRecordBytes is the largest record Kafka takes (kafka.batch_bytes):
	// a traceparent is not added to a record it would take over it.
	MaxRecordBytes int
}

// Tracer makes the spans of one outboxd process.
type Tracer struct {
	provider  *sdktrace.TracerProvider
	tracer    trace.Tracer
	exporter  *counting
	propagate bool
	keys      bool // RecordKeys
	maxRecord int
	started   atomic.Uint64
}

// New starts the exporter and the batch processor; nothing is sent until
// the first span ends.
func New(cfg Config) (*Tracer, error) {
	u, err := url.Parse(cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("tracing.endpoint: %w", err)
	}
	// A base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is: the signal's path is
	// added (http://collector:4318 → http://collector:4318/v1/traces).
	if !strings.HasSuffix(u.Path, "/v1/traces") {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	}
	var tlsConfig *tls.Config
	if cfg.CAFile != "" {
		roots, err := certs.CAPool(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tracing.ca_file: %w", err)
		}
		tlsConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	exp := newOTLPExporter(u.String(), cfg.Headers, tlsConfig)
	return newTracer(cfg, exp), nil
}

// newTracer makes the spans of cfg and hands them to exp in batches.
func newTracer(cfg Config, exp sdktrace.SpanExporter) *Tracer {
	res := resource.NewSchemaless(semconv.ServiceName(cfg.ServiceName), semconv.ServiceVersion(cfg.Version))
	t := &Tracer{propagate: cfg.Propagate, keys: cfg.RecordKeys, maxRecord: cfg.MaxRecordBytes, exporter: &counting{SpanExporter: exp}}
	// The batch timeout is the SDK's (5 s; OTEL_BSP_SCHEDULE_DELAY).
	bopts := []sdktrace.BatchSpanProcessorOption{sdktrace.WithMaxQueueSize(max(cfg.QueueSize, 1)), sdktrace.WithMaxExportBatchSize(min(max(cfg.QueueSize, 1), 2048))}
	t.provider = sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		// A key is the service's, of any length.
		sdktrace.WithRawSpanLimits(spanLimits()),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
		sdktrace.WithSpanProcessor(sdktrace.NewBatchSpanProcessor(t.exporter, bopts...)),
	)
	t.tracer = t.provider.Tracer("github.com/outboxd/outboxd", trace.WithInstrumentationVersion(cfg.Version))
	return t
}

// Shutdown sends the spans still queued and stops the exporter; ctx bounds
// the wait.
func (t *Tracer) Shutdown(ctx context.Context) error {
	return t.provider.Shutdown(ctx)
}

// Counts is what became of the sampled spans: started, sent to the
// receiver, refused by it or not sent (a network error). Those started
// and neither sent nor failed are queued, or were dropped from a full
// queue.
type Counts struct{ Started, Exported, Failed uint64 }

// Counts tells what became of the spans so far.
func (t *Tracer) Counts() Counts {
	return Counts{Started: t.started.Load(), Exported: t.exporter.exported.Load(), Failed: t.exporter.failed.Load()}
}

// counting is the exporter, counting the spans of each export by outcome.
type counting struct {
	sdktrace.SpanExporter
	exported, failed atomic.Uint64
}

func (c *counting) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := c.SpanExporter.ExportSpans(ctx, spans)
	failed := uint64(len(spans))
	var rejected *rejectedError
	switch {
	case err == nil:
		failed = 0
	case errors.As(err, &rejected):
		failed = min(uint64(rejected.spans), failed)
	}
	c.failed.Add(failed)
	c.exported.Add(uint64(len(spans)) - failed)
	return err
}

// Start begins rec's span at pos (its commit; a row read from its table,
// or a dead-letter record of one, has no commit position and starts now),
// from source ("" for the stream, else where the row was read), and
// returns the Acker to put in rec's place: it ends the span with Kafka's
// answer, then tells next. When the span is sampled and Propagate is on,
// rec's traceparent header becomes the span's.
func (t *Tracer) Start(rec *outboxd.Record, pos envelope.Position, source string, next outboxd.Acker) outboxd.Acker {
	ctx := context.Background()
	if sc, ok := parent(rec); ok {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	// The commit's time is PostgreSQL's clock: never after outboxd's now,
	// so that a skew between the two makes no span end before it starts.
	start := time.Now()
	if c := time.UnixMicro(pos.CommitTime); pos.CommitTime != 0 && c.Before(start) {
		start = c
	}
	_, span := t.tracer.Start(ctx, "send "+rec.Topic, trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(start))
	if !span.IsRecording() {
		return next // not sampled: the record as the row made it
	}
	t.started.Add(1)
	attrs := make([]attribute.KeyValue, 0, 8)
	attrs = append(attrs,
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("send"),
		semconv.MessagingDestinationName(rec.Topic),
	)
	// The key and the row id only when asked for (tracing.record_keys):
	// the backend is not where a service's keys are expected to go. OTLP
	// carries strings as UTF-8: one that is not would fail its whole
	// export batch.
	if t.keys && rec.Key != nil {
		attrs = append(attrs, semconv.MessagingKafkaMessageKey(strings.ToValidUTF8(string(rec.Key), "\uFFFD")))
	}
	if t.keys && rec.RowID != nil {
		attrs = append(attrs, semconv.MessagingMessageID(strings.ToValidUTF8(string(rec.RowID), "\uFFFD")))
	}
	if pos.CommitLSN != 0 {
		attrs = append(attrs, AttrCommitLSN.String(pos.CommitLSN.String()))
	}
	if source != "" {
		attrs = append(attrs, AttrSource.String(source))
	}
	span.SetAttributes(attrs...)
	if t.propagate {
		t.inject(rec, span.SpanContext())
	}
	return &spanAck{span: span, next: next}
}

// The attributes of outboxd's own.
const (
	// AttrCommitLSN is the commit LSN of the row's transaction.
	AttrCommitLSN = attribute.Key("outboxd.commit_lsn")
	// AttrAlreadyInKafka marks a record acknowledged without being
	// written: Kafka held it already.
	AttrAlreadyInKafka = attribute.Key("outboxd.already_in_kafka")
	// AttrSource is where a row not streamed was read: "snapshot
	// <position>" (the cut-over snapshot) or "replay".
	AttrSource = attribute.Key("outboxd.source")
)

// spanAck ends its span with the record's outcome, then tells next.
type spanAck struct {
	span      trace.Span
	next      outboxd.Acker
	partition int32
	offset    int64
	placed    bool
}

func (a *spanAck) Place(partition int32, offset int64) {
	a.partition, a.offset, a.placed = partition, offset, true
}

func (a *spanAck) Ack(err error) {
	switch {
	case a.placed:
		a.span.SetAttributes(semconv.MessagingDestinationPartitionID(strconv.Itoa(int(a.partition))), semconv.MessagingKafkaOffset(int(a.offset)))
	case err == nil:
		// Acknowledged without a place: found in Kafka already (a
		// record a new session does not produce again, kafka.deduplicate,
		// whose copy carries the earlier span), or a batch the broker
		// reported as a duplicate.
		a.span.SetAttributes(AttrAlreadyInKafka.Bool(true))
	}
	if err != nil {
		var refused *outboxd.RefusedError
		if errors.As(err, &refused) {
			a.span.SetStatus(codes.Error, "refused by the broker: dead-lettered")
		} else {
			a.span.SetStatus(codes.Error, err.Error())
		}
	}
	a.span.End()
	a.next.Ack(err)
}

// parent is the span context of rec's traceparent (and tracestate)
// header, if it has a valid one (the router forwards only those).
func parent(rec *outboxd.Record) (trace.SpanContext, bool) {
	tp := rec.Header(envelope.HeaderTraceparent)
	if len(tp) < 55 {
		return trace.SpanContext{}, false
	}
	var cfg trace.SpanContextConfig
	var flags [1]byte
	if _, err := hex.Decode(cfg.TraceID[:], tp[3:35]); err != nil {
		return trace.SpanContext{}, false
	}
	if _, err := hex.Decode(cfg.SpanID[:], tp[36:52]); err != nil {
		return trace.SpanContext{}, false
	}
	if _, err := hex.Decode(flags[:], tp[53:55]); err != nil {
		return trace.SpanContext{}, false
	}
	cfg.TraceFlags = trace.TraceFlags(flags[0])
	cfg.Remote = true
	if ts := rec.Header(envelope.HeaderTracestate); len(ts) > 0 {
		if state, err := trace.ParseTraceState(string(ts)); err == nil {
			cfg.TraceState = state
		}
	}
	sc := trace.NewSpanContext(cfg)
	return sc, sc.IsValid()
}

// traceparentSize is what a traceparent header adds to a record on the
// wire: the key's and the value's lengths (varints) and bytes, and the
// record's own length growing by a byte.
const traceparentSize = 1 + len(envelope.HeaderTraceparent) + 1 + 55 + 1

// inject makes sc rec's traceparent header: in the place of the row's, or
// added, when the record stays within MaxRecordBytes (the router checked
// it without the header: tracing must not change what Kafka takes). The
// tracestate, when the row had one, is the span's too (a child carries its
// parent's).
func (t *Tracer) inject(rec *outboxd.Record, sc trace.SpanContext) {
	at := -1
	for i := range rec.Headers {
		if rec.Headers[i].Key == envelope.HeaderTraceparent {
			at = i
			break
		}
	}
	if at < 0 && t.maxRecord > 0 && rec.WireSize()+traceparentSize > t.maxRecord {
		return
	}
	v := make([]byte, 0, 55)
	v = append(v, "00-"...)
	tid, sid := sc.TraceID(), sc.SpanID()
	v = hex.AppendEncode(v, tid[:])
	v = append(v, '-')
	v = hex.AppendEncode(v, sid[:])
	v = append(v, '-')
	v = hex.AppendEncode(v, []byte{byte(sc.TraceFlags())})
	if at >= 0 {
		rec.Headers[at].Value = v // 55 bytes, as the row's (a valid version 00 one) or fewer
		return
	}
	rec.Headers = append(rec.Headers, outboxd.Header{Key: envelope.HeaderTraceparent, Value: v})
}

// spanLimits are the SDK's defaults, with attribute values cut at 1 KiB.
func spanLimits() sdktrace.SpanLimits {
	l := sdktrace.NewSpanLimits()
	l.AttributeValueLengthLimit = 1024
	return l
}
