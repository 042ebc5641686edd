package envelope

import (
	"fmt"
	"strconv"

	"github.com/outboxd/outboxd"
)

func (r *Router) build(v *view, pos Position, sc *Scratch) (outboxd.Record, Verdict, error) {
	rt := v.b.rt
	if ok, err := v.matches(rt.filter); err != nil || !ok {
		return outboxd.Record{}, Filtered, err
	}
	tmpl := &rt.topic
	for k := range rt.over {
		o := &rt.over[k]
		ok, err := v.matches(o.when)
		if err != nil {
			return outboxd.Record{}, Publish, err
		}
		if ok {
			if o.drop {
				return outboxd.Record{}, Dropped, nil
			}
			tmpl = &o.topic
			break
		}
	}

	id, _, err := v.value(rt.role[roleID], false)
	if err != nil {
		return outboxd.Record{}, Publish, err
	}
	key, _, err := v.value(rt.role[roleKey], rt.debezium)
	if err != nil {
		return outboxd.Record{}, Publish, err
	}
	var tipus []byte
	if i := rt.role[roleTipus]; i >= 0 {
		if tipus, _, err = v.value(i, false); err != nil {
			return outboxd.Record{}, Publish, err
		}
	}
	topic, err := r.topic(v, tmpl, sc)
	if err != nil {
		return outboxd.Record{}, Publish, err
	}
	val, err := r.value(v, id, tipus, pos, sc)
	if err != nil {
		return outboxd.Record{}, Publish, err
	}
	switch {
	case rt.KeyEncoder != nil && key != nil:
		sc.key = rt.KeyEncoder.EncodeKey(sc.key[:0], key)
		key = sc.key
	case rt.KeyJSON && key != nil:
		sc.key = appendConnectString(sc.key[:0], key)
		key = sc.key
	case rt.KeyJSON:
		key = jsonNull // JsonConverter writes a null of an optional schema so
	}
	headers, err := v.headers(id, tipus, pos, sc)
	if err != nil {
		return outboxd.Record{}, Publish, err
	}
	// Refusable is the publisher's to set (publish.DeadLetters).
	rec := outboxd.Record{Topic: topic, Key: key, Value: val, Headers: headers}
	if !v.b.message {
		rec.RowID = id
	}
	if pos.CommitLSN != 0 {
		rec.Pos = outboxd.Pos{LSN: uint64(pos.CommitLSN), Index: pos.Index}
	}
	if i := rt.role[roleTimestamp]; i >= 0 {
		// NULL: the produce time, as Debezium falls back to its own.
		if _, null, _ := v.value(i, true); !null {
			if rec.Time, err = v.millis(i); err != nil {
				return outboxd.Record{}, Publish, err
			}
			if rec.Time <= 0 {
				return outboxd.Record{}, Publish, v.rowError(i, "a record timestamp at or before 1970-01-01: Kafka takes none")
			}
		}
	}
	return rec, Publish, nil
}

// topic renders the template for the change: a name that is not a valid
// topic goes to the route's fallback, or makes the change a bad row.
func (r *Router) topic(v *view, t *template, sc *Scratch) (string, error) {
	if t.parts == nil {
		return t.static, nil
	}
	name := sc.topic[:0]
	for _, p := range t.parts {
		if p.col < 0 {
			name = append(name, p.literal...)
			continue
		}
		val, null, err := v.value(p.col, true)
		if err != nil {
			return "", err
		}
		if null {
			sc.topic = name
			return r.fallback(v, "a NULL "+v.b.rt.cols[p.col]+" in the topic template")
		}
		name = append(name, val...)
	}
	sc.topic = name
	if topic, ok := t.cache.lookup(name); ok {
		return topic, nil
	}
	return r.fallback(v, fmt.Sprintf("the topic template gives a name that is not a valid Kafka topic name (letters, digits, '.', '_', '-'; at most %d)", MaxTopicLen))
}

func (r *Router) fallback(v *view, why string) (string, error) {
	if f := v.b.rt.fallback; f != "" {
		return f, nil
	}
	return "", &RowError{Table: v.b.Name, Message: v.b.message, Reason: why + "; set the route's topic_fallback, or on_error: dead_letter"}
}

// headers builds the record's headers in sc.headers; values built here
// (trace from a span context, position numbers) go in sc.hdr.
func (v *view) headers(id, tipus []byte, pos Position, sc *Scratch) ([]outboxd.Header, error) {
	rt := v.b.rt
	hs := sc.headers[:0]
	hdr := sc.hdr[:0]
	switch {
	case rt.ce && rt.ceStructured:
		hs = append(hs, outboxd.Header{Key: HeaderContentType, Value: ceStructured})
	case rt.ce:
		a, err := v.ceAttrs(id, tipus, pos)
		if err != nil {
			return nil, err
		}
		var schema, contentType []byte
		if rt.Encoder != nil {
			schema, contentType = rt.Encoder.Describe(tipus, a.versio)
		}
		hs, hdr = ceHeaderList(hs, hdr, rt.ceSource, a, schema, contentType)
	case rt.debezium:
		hs = append(hs, outboxd.Header{Key: HeaderDebeziumID, Value: id})
	default:
		hs = append(hs, outboxd.Header{Key: HeaderTipus, Value: tipus}, outboxd.Header{Key: HeaderID, Value: id})
	}
	for k := range rt.fields {
		f := &rt.fields[k]
		if f.header == "" {
			continue
		}
		val, _, err := v.value(f.col, true)
		if err != nil {
			return nil, err
		}
		if val != nil && !v.b.message && v.b.kind[f.col] == kindBool {
			if boolText(val) == "true" {
				val = boolBytes[1]
			} else {
				val = boolBytes[0]
			}
		}
		hs = append(hs, outboxd.Header{Key: f.header, Value: val})
	}
	var tp, ts []byte
	if i := rt.role[roleSpanContext]; i >= 0 {
		props, _, err := v.value(i, true)
		if err != nil {
			return nil, err
		}
		tp, ts, hdr = spanContext(props, hdr)
	}
	if i := rt.role[roleTraceparent]; i >= 0 {
		var err error
		if tp, _, err = v.value(i, true); err != nil {
			return nil, err
		}
	}
	if i := rt.role[roleTracestate]; i >= 0 {
		var err error
		if ts, _, err = v.value(i, true); err != nil {
			return nil, err
		}
	}
	// An invalid traceparent is ignored, as the W3C text tells receivers
	// to: the event goes on, without it (and without its tracestate).
	if tp != nil && validTraceparent(tp) {
		hs = append(hs, outboxd.Header{Key: HeaderTraceparent, Value: tp})
		if len(ts) > 0 {
			hs = append(hs, outboxd.Header{Key: HeaderTracestate, Value: ts})
		}
	}
	// A row read from the table (cut-over snapshot, replay) has no WAL
	// position: no position headers, rather than a position that would
	// sort before everything.
	if rt.Position && pos.CommitLSN != 0 && !rt.ce {
		at := len(hdr)
		hdr = strconv.AppendUint(hdr, uint64(pos.CommitLSN), 10)
		lsn := hdr[at:len(hdr):len(hdr)]
		at = len(hdr)
		hdr = strconv.AppendUint(hdr, uint64(pos.Index), 10)
		hs = append(hs, outboxd.Header{Key: HeaderCommitLSN, Value: lsn}, outboxd.Header{Key: HeaderTxnIndex, Value: hdr[at:len(hdr):len(hdr)]})
	}
	sc.headers, sc.hdr = hs, hdr
	return hs, nil
}

// jsonNull is the JSON null that Kafka Connect's JsonConverter writes for
// a NULL key or payload (shared: records are only read).
var jsonNull = []byte("null")

// boolBytes are a boolean header's values, as Kafka Connect's
// SimpleHeaderConverter writes them (shared: headers are only read).
var boolBytes = [2][]byte{[]byte("false"), []byte("true")}

func boolText(pg []byte) string {
	if len(pg) == 1 && pg[0] == 't' {
		return "true"
	}
	return "false"
}
