package tracing

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// The exporter's encoding before appendTracesData: the generated OTLP
// messages, marshalled by the protobuf runtime. Kept as the reference
// TestWireMatchesProto compares the wire encoder's bytes with.

// tracesData is spans in OTLP's shape, by resource and by scope. It is
// what an ExportTraceServiceRequest holds (both have their resource spans
// as field 1), without linking the collector's service package, which
// brings gRPC.
func tracesData(spans []sdktrace.ReadOnlySpan) *tracepb.TracesData {
	type scopeKey struct {
		res   attribute.Distinct
		scope instrumentation.Scope
	}
	var td tracepb.TracesData
	resources := map[attribute.Distinct]*tracepb.ResourceSpans{}
	scopes := map[scopeKey]*tracepb.ScopeSpans{}
	for _, s := range spans {
		res := s.Resource()
		rk := res.Equivalent()
		rs := resources[rk]
		if rs == nil {
			rs = &tracepb.ResourceSpans{Resource: &resourcepb.Resource{Attributes: keyValues(res.Attributes())}, SchemaUrl: res.SchemaURL()}
			resources[rk] = rs
			td.ResourceSpans = append(td.ResourceSpans, rs)
		}
		sc := s.InstrumentationScope()
		sk := scopeKey{rk, sc}
		ss := scopes[sk]
		if ss == nil {
			ss = &tracepb.ScopeSpans{SchemaUrl: sc.SchemaURL, Scope: &commonpb.InstrumentationScope{
				Name: sc.Name, Version: sc.Version, Attributes: keyValues(sc.Attributes.ToSlice())}}
			scopes[sk] = ss
			rs.ScopeSpans = append(rs.ScopeSpans, ss)
		}
		ss.Spans = append(ss.Spans, span(s))
	}
	return &td
}

func span(s sdktrace.ReadOnlySpan) *tracepb.Span {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	p := &tracepb.Span{
		TraceId:                tid[:],
		SpanId:                 sid[:],
		TraceState:             sc.TraceState().String(),
		Flags:                  flags(sc.TraceFlags(), s.Parent()),
		Name:                   s.Name(),
		Kind:                   kind(s.SpanKind()),
		StartTimeUnixNano:      unixNano(s.StartTime()),
		EndTimeUnixNano:        unixNano(s.EndTime()),
		Attributes:             keyValues(s.Attributes()),
		DroppedAttributesCount: uint32(s.DroppedAttributes()),
		DroppedEventsCount:     uint32(s.DroppedEvents()),
		DroppedLinksCount:      uint32(s.DroppedLinks()),
		Status:                 status(s.Status()),
	}
	if parent := s.Parent(); parent.SpanID().IsValid() {
		psid := parent.SpanID()
		p.ParentSpanId = psid[:]
	}
	for _, ev := range s.Events() {
		p.Events = append(p.Events, &tracepb.Span_Event{TimeUnixNano: unixNano(ev.Time), Name: ev.Name,
			Attributes: keyValues(ev.Attributes), DroppedAttributesCount: uint32(ev.DroppedAttributeCount)})
	}
	for _, l := range s.Links() {
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		p.Links = append(p.Links, &tracepb.Span_Link{TraceId: ltid[:], SpanId: lsid[:], TraceState: l.SpanContext.TraceState().String(),
			Attributes: keyValues(l.Attributes), DroppedAttributesCount: uint32(l.DroppedAttributeCount),
			Flags: flags(l.SpanContext.TraceFlags(), l.SpanContext)})
	}
	return p
}

// status maps the API's codes (Unset 0, Error 1, Ok 2) to OTLP's (Unset
// 0, Ok 1, Error 2); only an error carries its description.
func status(s sdktrace.Status) *tracepb.Status {
	switch s.Code {
	case codes.Error:
		return &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: s.Description}
	case codes.Ok:
		return &tracepb.Status{Code: tracepb.Status_STATUS_CODE_OK}
	}
	return nil
}

func keyValues(attrs []attribute.KeyValue) []*commonpb.KeyValue {
	if len(attrs) == 0 {
		return nil
	}
	kvs := make([]*commonpb.KeyValue, len(attrs))
	for i, a := range attrs {
		kvs[i] = &commonpb.KeyValue{Key: string(a.Key), Value: anyValue(a.Value)}
	}
	return kvs
}

func anyValue(v attribute.Value) *commonpb.AnyValue {
	switch v.Type() {
	case attribute.BOOL:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v.AsBool()}}
	case attribute.INT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v.AsInt64()}}
	case attribute.FLOAT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v.AsFloat64()}}
	case attribute.STRING:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.AsString()}}
	case attribute.BYTESLICE:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BytesValue{BytesValue: v.AsByteSlice()}}
	case attribute.BOOLSLICE:
		return array(v.AsBoolSlice(), attribute.BoolValue)
	case attribute.INT64SLICE:
		return array(v.AsInt64Slice(), attribute.Int64Value)
	case attribute.FLOAT64SLICE:
		return array(v.AsFloat64Slice(), attribute.Float64Value)
	case attribute.STRINGSLICE:
		return array(v.AsStringSlice(), attribute.StringValue)
	case attribute.SLICE:
		return array(v.AsSlice(), func(x attribute.Value) attribute.Value { return x })
	case attribute.MAP:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_KvlistValue{KvlistValue: &commonpb.KeyValueList{Values: keyValues(v.AsMap())}}}
	}
	return &commonpb.AnyValue{} // EMPTY
}

func array[T any](xs []T, value func(T) attribute.Value) *commonpb.AnyValue {
	vs := make([]*commonpb.AnyValue, len(xs))
	for i, x := range xs {
		vs[i] = anyValue(value(x))
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: vs}}}
}
