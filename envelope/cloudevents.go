package envelope

import (
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd"
)

// A route with value: cloudevents writes each event as a CloudEvent 1.0
// in the Kafka protocol binding (github.com/cloudevents/spec,
// kafka-protocol-binding.md). The attributes come from the outbox row:
//
//	id       ← id_esdeveniment        type    ← tipus
//	source   ← CloudEvents.Source     subject ← agregat_id
//	time     ← creat_en (RFC 3339, UTC; a logical message's commit time)
//	versio, commitlsn, txnindex: extensions (the event's version, and its
//	transaction's commit LSN and index in it; none for a row read from
//	its table)
//	data     ← carrega (JSON: datacontenttype application/json)
//	dataschema ← with a schema registry (binary mode), the schema's URI in
//	it, .../schemas/ids/<id>; datacontenttype then the format's media
//	type, the data in the registry's wire format
//
// In binary mode the attributes are ce_ headers, content-type is
// application/json and the value is carrega alone; in structured mode the
// value is the event as JSON (application/cloudevents+json in
// content-type). The key stays agregat_id either way.

// CloudEvents is a route's CloudEvents form.
type CloudEvents struct {
	Mode string // CEBinary ("" too) or CEStructured
	// Source is the source attribute, a URI-reference; {origen} stands for
	// the service's name. "" is DefaultCESource.
	Source string
}

// The CloudEvents content modes, and the default source.
const (
	CEBinary        = "binary"
	CEStructured    = "structured"
	DefaultCESource = "/km0/{origen}"
)

// ValueCloudEvents is the value shape of a CloudEvent (Route.Value).
const ValueCloudEvents = "cloudevents"

var ceModes = []string{CEBinary, CEStructured}

// Content types of the two modes.
const (
	contentTypeJSON        = "application/json"
	contentTypeCloudEvents = "application/cloudevents+json; charset=UTF-8"
	// HeaderContentType is the Kafka binding's content type header.
	HeaderContentType = "content-type"
)

// ceHeaders are the headers of a binary CloudEvent (a field may not take
// their names).
var ceHeaders = []string{"ce_specversion", "ce_id", "ce_source", "ce_type", "ce_subject", "ce_time", "ce_versio", "ce_commitlsn", "ce_txnindex", "ce_dataschema", HeaderContentType}

// cloudEvents checks a route's CloudEvents settings.
func (ps *problems) cloudEvents(r *Route) {
	ce := r.CloudEvents
	if r.Value != ValueCloudEvents {
		if ce != (CloudEvents{}) {
			ps.add("cloudevents", "set, but the route's value is not cloudevents (value: cloudevents)")
		}
		return
	}
	if r.Preset != "" {
		ps.add("value", "cloudevents is the contract's event as a CloudEvent: it does not go with preset %s", r.Preset)
	}
	if ce.Mode != "" {
		ps.oneOf("cloudevents.mode", ce.Mode, ceModes)
	}
	src := strings.ReplaceAll(ce.Source, "{origen}", "")
	if strings.ContainsAny(src, "{} \t\n") {
		ps.add("cloudevents.source", "%q: a URI-reference, in which only {origen} stands for something (the service's name)", ce.Source)
	}
	for k, f := range r.Fields {
		if f.Envelope != "" {
			ps.add("fields["+strconv.Itoa(k)+"].envelope", "a CloudEvent has no envelope: put the column in a header")
		}
	}
}

// ceSource is the route's source attribute for the service origen.
func ceSource(ce CloudEvents, origen string) string {
	src := ce.Source
	if src == "" {
		src = DefaultCESource
	}
	return strings.ReplaceAll(src, "{origen}", origen)
}

// ceAttrs are what a CloudEvent carries besides its data.
type ceAttrs struct {
	id, tipus, subject []byte
	versio             int64
	us                 int64 // its time, µs since the epoch
	pos                Position
}

// ceAttrs reads the row's attributes.
func (v *view) ceAttrs(id, tipus []byte, pos Position) (ceAttrs, error) {
	a := ceAttrs{id: id, tipus: tipus, pos: pos}
	var err error
	if a.subject, _, err = v.value(v.b.rt.role[roleKey], false); err != nil {
		return a, err
	}
	if a.versio, err = v.versio(); err != nil {
		return a, err
	}
	a.us, err = v.created(pos)
	return a, err
}

// appendCETime appends us as RFC 3339 in UTC, to the microsecond.
func appendCETime(dst []byte, us int64) []byte {
	return time.UnixMicro(us).UTC().AppendFormat(dst, "2006-01-02T15:04:05.999999Z07:00")
}

// ceHeaderList appends a binary CloudEvent's headers to hs, their built
// values to hdr; with a schema registry's wire format the data's schema
// (ce_dataschema) and media type (content-type), else application/json.
func ceHeaderList(hs []outboxd.Header, hdr []byte, src []byte, a ceAttrs, dataschema, contentType []byte) ([]outboxd.Header, []byte) {
	add := func(key string, build func([]byte) []byte) {
		at := len(hdr)
		hdr = build(hdr)
		hs = append(hs, outboxd.Header{Key: key, Value: hdr[at:len(hdr):len(hdr)]})
	}
	hs = append(hs, outboxd.Header{Key: "ce_specversion", Value: ceSpecVersion}, outboxd.Header{Key: "ce_id", Value: a.id},
		outboxd.Header{Key: "ce_source", Value: src}, outboxd.Header{Key: "ce_type", Value: a.tipus}, outboxd.Header{Key: "ce_subject", Value: a.subject})
	add("ce_time", func(b []byte) []byte { return appendCETime(b, a.us) })
	add("ce_versio", func(b []byte) []byte { return strconv.AppendInt(b, a.versio, 10) })
	if a.pos.CommitLSN != 0 {
		add("ce_commitlsn", func(b []byte) []byte { return strconv.AppendUint(b, uint64(a.pos.CommitLSN), 10) })
		add("ce_txnindex", func(b []byte) []byte { return strconv.AppendUint(b, uint64(a.pos.Index), 10) })
	}
	if dataschema != nil {
		hs = append(hs, outboxd.Header{Key: "ce_dataschema", Value: dataschema})
	}
	if contentType == nil {
		contentType = ceJSON
	}
	return append(hs, outboxd.Header{Key: HeaderContentType, Value: contentType}), hdr
}

// Shared header values (records are only read).
var (
	ceSpecVersion = []byte("1.0")
	ceJSON        = []byte(contentTypeJSON)
	ceStructured  = []byte(contentTypeCloudEvents)
)

// ceStructuredValue appends a structured CloudEvent, all but its closing
// brace, to val.
func ceStructuredValue(val, src []byte, a ceAttrs, data []byte) []byte {
	val = append(val, `{"specversion":"1.0","id":`...)
	val = appendString(val, a.id)
	val = append(val, `,"source":`...)
	val = appendString(val, src)
	val = append(val, `,"type":`...)
	val = appendString(val, a.tipus)
	val = append(val, `,"subject":`...)
	val = appendString(val, a.subject)
	val = append(val, `,"time":"`...)
	val = appendCETime(val, a.us)
	val = append(val, `","datacontenttype":"`+contentTypeJSON+`","versio":`...)
	val = strconv.AppendInt(val, a.versio, 10)
	if a.pos.CommitLSN != 0 {
		val = append(val, `,"commitlsn":"`...)
		val = strconv.AppendUint(val, uint64(a.pos.CommitLSN), 10)
		val = append(val, `","txnindex":`...)
		val = strconv.AppendUint(val, uint64(a.pos.Index), 10)
	}
	val = append(val, `,"data":`...)
	return append(val, data...)
}
