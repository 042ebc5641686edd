package tracing

import (
	"math"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/protobuf/encoding/protowire"
)

// appendTracesData appends spans as an OTLP TracesData (what an
// ExportTraceServiceRequest holds: resource spans as field 1), by resource
// and by scope, in protobuf's binary form, written field by field as the
// generated code's Marshal would write it, byte for byte
// (TestWireMatchesProto). Building the generated messages first and
// marshalling them by reflection took ~30 allocations per span, a large
// part of what a sampled record costs (docs/reports/PERFORMANCE.md, issue
// 37); written directly, a batch costs its grouping and nothing per span.
func appendTracesData(b []byte, spans []sdktrace.ReadOnlySpan) []byte {
	type scopeGroup struct {
		scope instrumentation.Scope
		spans []sdktrace.ReadOnlySpan
	}
	type resourceGroup struct {
		key    attribute.Distinct
		res    *resource.Resource
		scopes []scopeGroup
	}
	var groups []resourceGroup
	for _, s := range spans {
		res := s.Resource()
		rk := res.Equivalent()
		gi := slices.IndexFunc(groups, func(g resourceGroup) bool { return g.key == rk })
		if gi < 0 {
			groups = append(groups, resourceGroup{key: rk, res: res})
			gi = len(groups) - 1
		}
		g := &groups[gi]
		sc := s.InstrumentationScope()
		si := slices.IndexFunc(g.scopes, func(sg scopeGroup) bool { return sg.scope == sc })
		if si < 0 {
			g.scopes = append(g.scopes, scopeGroup{scope: sc})
			si = len(g.scopes) - 1
		}
		g.scopes[si].spans = append(g.scopes[si].spans, s)
	}
	for _, g := range groups {
		b = appendMessage(b, 1, func(b []byte) []byte { // ResourceSpans
			b = appendMessage(b, 1, func(b []byte) []byte { // Resource
				return appendKeyValues(b, 1, g.res.Attributes())
			})
			for _, sg := range g.scopes {
				b = appendMessage(b, 2, func(b []byte) []byte { // ScopeSpans
					b = appendMessage(b, 1, func(b []byte) []byte { // InstrumentationScope
						b = appendString(b, 1, sg.scope.Name)
						b = appendString(b, 2, sg.scope.Version)
						return appendKeyValues(b, 3, sg.scope.Attributes.ToSlice())
					})
					for _, s := range sg.spans {
						b = appendMessage(b, 2, func(b []byte) []byte { return appendSpan(b, s) })
					}
					return appendString(b, 3, sg.scope.SchemaURL)
				})
			}
			return appendString(b, 3, g.res.SchemaURL())
		})
	}
	return b
}

// appendSpan appends s's fields (an OTLP Span's).
func appendSpan(b []byte, s sdktrace.ReadOnlySpan) []byte {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	b = appendBytes(b, 1, tid[:])
	b = appendBytes(b, 2, sid[:])
	b = appendString(b, 3, sc.TraceState().String())
	if parent := s.Parent(); parent.SpanID().IsValid() {
		psid := parent.SpanID()
		b = appendBytes(b, 4, psid[:])
	}
	b = appendString(b, 5, s.Name())
	b = appendVarint(b, 6, uint64(kind(s.SpanKind())))
	b = appendFixed64(b, 7, unixNano(s.StartTime()))
	b = appendFixed64(b, 8, unixNano(s.EndTime()))
	b = appendKeyValues(b, 9, s.Attributes())
	b = appendVarint(b, 10, uint64(uint32(s.DroppedAttributes())))
	for _, ev := range s.Events() {
		b = appendMessage(b, 11, func(b []byte) []byte {
			b = appendFixed64(b, 1, unixNano(ev.Time))
			b = appendString(b, 2, ev.Name)
			b = appendKeyValues(b, 3, ev.Attributes)
			return appendVarint(b, 4, uint64(uint32(ev.DroppedAttributeCount)))
		})
	}
	b = appendVarint(b, 12, uint64(uint32(s.DroppedEvents())))
	for _, l := range s.Links() {
		b = appendMessage(b, 13, func(b []byte) []byte {
			ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
			b = appendBytes(b, 1, ltid[:])
			b = appendBytes(b, 2, lsid[:])
			b = appendString(b, 3, l.SpanContext.TraceState().String())
			b = appendKeyValues(b, 4, l.Attributes)
			b = appendVarint(b, 5, uint64(uint32(l.DroppedAttributeCount)))
			return appendFixed32(b, 6, flags(l.SpanContext.TraceFlags(), l.SpanContext))
		})
	}
	b = appendVarint(b, 14, uint64(uint32(s.DroppedLinks())))
	// Status (OTLP's codes: Unset 0, Ok 1, Error 2); only an error carries
	// its description.
	switch st := s.Status(); st.Code {
	case codes.Error:
		b = appendMessage(b, 15, func(b []byte) []byte {
			b = appendString(b, 2, st.Description)
			return appendVarint(b, 3, 2)
		})
	case codes.Ok:
		b = appendMessage(b, 15, func(b []byte) []byte { return appendVarint(b, 3, 1) })
	}
	return appendFixed32(b, 16, flags(sc.TraceFlags(), s.Parent()))
}

// appendKeyValues appends attrs as repeated KeyValue field num.
func appendKeyValues(b []byte, num protowire.Number, attrs []attribute.KeyValue) []byte {
	for _, a := range attrs {
		b = appendMessage(b, num, func(b []byte) []byte {
			b = appendString(b, 1, string(a.Key))
			return appendMessage(b, 2, func(b []byte) []byte { return appendAnyValue(b, a.Value) })
		})
	}
	return b
}

// appendAnyValue appends v's fields (an AnyValue's: the one its type sets,
// written even when zero, as a oneof member is).
func appendAnyValue(b []byte, v attribute.Value) []byte {
	switch v.Type() {
	case attribute.BOOL:
		x := uint64(0)
		if v.AsBool() {
			x = 1
		}
		return protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.VarintType), x)
	case attribute.INT64:
		return protowire.AppendVarint(protowire.AppendTag(b, 3, protowire.VarintType), uint64(v.AsInt64()))
	case attribute.FLOAT64:
		return protowire.AppendFixed64(protowire.AppendTag(b, 4, protowire.Fixed64Type), math.Float64bits(v.AsFloat64()))
	case attribute.STRING:
		return protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), v.AsString())
	case attribute.BYTESLICE:
		return protowire.AppendBytes(protowire.AppendTag(b, 7, protowire.BytesType), v.AsByteSlice())
	case attribute.BOOLSLICE:
		return appendArray(b, v.AsBoolSlice(), attribute.BoolValue)
	case attribute.INT64SLICE:
		return appendArray(b, v.AsInt64Slice(), attribute.Int64Value)
	case attribute.FLOAT64SLICE:
		return appendArray(b, v.AsFloat64Slice(), attribute.Float64Value)
	case attribute.STRINGSLICE:
		return appendArray(b, v.AsStringSlice(), attribute.StringValue)
	case attribute.SLICE:
		return appendArray(b, v.AsSlice(), func(x attribute.Value) attribute.Value { return x })
	case attribute.MAP:
		return appendMessage(b, 6, func(b []byte) []byte { return appendKeyValues(b, 1, v.AsMap()) })
	}
	return b // EMPTY
}

func appendArray[T any](b []byte, xs []T, value func(T) attribute.Value) []byte {
	return appendMessage(b, 5, func(b []byte) []byte {
		for _, x := range xs {
			b = appendMessage(b, 1, func(b []byte) []byte { return appendAnyValue(b, value(x)) })
		}
		return b
	})
}

// appendMessage appends field num holding the message fill appends: its
// body is written in place, then moved up by its length's size.
func appendMessage(b []byte, num protowire.Number, fill func([]byte) []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	start := len(b)
	b = fill(b)
	n := len(b) - start
	k := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, k)...)
	copy(b[start+k:], b[start:start+n])
	protowire.AppendVarint(b[start:start], uint64(n))
	return b
}

// The scalar fields, left out when zero as proto3 leaves them.

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendFixed64(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendFixed64(protowire.AppendTag(b, num, protowire.Fixed64Type), v)
}

func appendFixed32(b []byte, num protowire.Number, v uint32) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendFixed32(protowire.AppendTag(b, num, protowire.Fixed32Type), v)
}
