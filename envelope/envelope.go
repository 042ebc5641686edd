// Package envelope turns one change (an outbox row as decoded from
// pgoutput, or a transactional logical message) into the Kafka records of
// its routes. By default that is the contract's record: key agregat_id,
// headers tipus and id_esdeveniment, value the standard JSON envelope with
// carrega embedded verbatim (never re-encoded). Routes choose other topics
// (templates, overrides), filter, place extra columns, shape the record as
// Debezium's outbox EventRouter does, and carry the trace context and the
// source position. Router.Build is the one place that decides whether a
// change can become a record (docs/routing.md).
package envelope

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
)

// Header names, as set by the polling relay.
const (
	HeaderTipus = "tipus"
	HeaderID    = "id_esdeveniment"
	// HeaderDebeziumID is the event id header of Debezium's EventRouter.
	HeaderDebeziumID = "id"
)

// Source position headers (Route.Position).
const (
	HeaderCommitLSN = "outboxd.commit_lsn" // the transaction's commit LSN, decimal
	HeaderTxnIndex  = "outboxd.txn_index"  // the change's index in its transaction, from 0
)

// PostgreSQL type OIDs the envelope treats specially.
const (
	oidBool        = 16
	oidBytea       = 17
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidJSON        = 114
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidJSONB       = 3802
)

// RowError says why a change could not become a record. It names the
// table, the row by its id (when readable) and the column, so an operator
// can find the row, and never quotes what the row holds (its agregat_id,
// the bad value): the error reaches the log, /status and the dead-letter
// record's headers, and the id is enough to SELECT the rest.
type RowError struct {
	Table  string
	ID     string // the row's id column, "" when unreadable
	Column string
	Reason string
	// Message: a logical message rather than a row (Table is then
	// `message prefix "..."` and Column a member of its JSON).
	Message bool
}

func (e *RowError) Error() string {
	row, col := "outbox row", "column"
	if e.Message {
		row, col = "logical message", "member"
	}
	if e.ID != "" {
		row += " id=" + strconv.Quote(e.ID)
	}
	if e.Column == "" {
		return fmt.Sprintf("%s in %s: %s", row, e.Table, e.Reason)
	}
	return fmt.Sprintf("%s in %s, %s %q: %s", row, e.Table, col, e.Column, e.Reason)
}

// maxNameInError bounds an id or agregat_id quoted in an error.
const maxNameInError = 200

// Column is one value of a decoded row, as pgoutput sends it.
type Column struct {
	Kind byte // pglogrepl.TupleDataType*: 'n' NULL, 'u' unchanged TOAST, 't' text, 'b' binary
	Data []byte
}

// Position is where a change sits in the WAL.
type Position struct {
	CommitLSN  uint64 // its transaction's commit LSN
	Index      uint32 // its index among the transaction's changes
	CommitTime int64  // the commit time, µs since the epoch
}

// Verdict says what Build made of a change for a route.
type Verdict uint8

const (
	// Publish: the record is to be produced.
	Publish Verdict = iota
	// Filtered: the route's filter does not take the change.
	Filtered
	// Dropped: an override drops the change on purpose.
	Dropped
)

// Scratch is the memory Build reuses from one change to the next.
type Scratch struct {
	value, key, topic, hdr []byte
	headers                []outboxd.Header
	// A logical message's members, as columns (see parseMessage).
	msg    []Column
	msgRaw [][]byte
	msgBuf []byte
}

// Build turns one change into the record of the binding's route: for a
// table, row is the inserted tuple; for a logical message, row is one
// column holding the message's content. The record references the row's
// bytes and, when sc is not nil, sc's memory: it is valid until the row's
// buffer or sc is reused, so it must go to a Producer that copies it before
// then. A Verdict other than Publish comes with no record and no error.
func (r *Router) Build(b *Binding, row []Column, pos Position, sc *Scratch) (outboxd.Record, Verdict, error) {
	if sc == nil {
		sc = &Scratch{}
	}
	if b.Route == nil {
		return outboxd.Record{}, Publish, &RowError{Table: b.Name, Reason: "the table is published but has no route; add a route for it or remove it from the publication"}
	}
	v := view{b: b, row: row}
	if b.message {
		if err := v.parse(row, sc); err != nil {
			return outboxd.Record{}, Publish, err
		}
	}
	rec, verdict, err := r.build(&v, pos, sc)
	if err != nil {
		var re *RowError
		if errors.As(err, &re) {
			re.ID = readable(v.text(roleID))
		}
		return outboxd.Record{}, Publish, err
	}
	if verdict != Publish {
		return outboxd.Record{}, verdict, nil
	}
	if r.maxBytes > 0 {
		if n := rec.WireSize(); n > r.maxBytes {
			return outboxd.Record{}, Publish, &RowError{Table: b.Name, ID: readable(v.text(roleID)), Message: b.message,
				Reason: fmt.Sprintf("the record is %d bytes, over kafka.batch_bytes (%d): raise it together with the broker's and the topic's max.message.bytes, or make the row smaller", n, r.maxBytes)}
		}
	}
	return rec, Publish, nil
}

// view reads a change through its binding: a route column by index.
type view struct {
	b   *Binding
	row []Column
	raw [][]byte // a message's members as JSON, by route column
}

// parse makes a message's members the view's columns.
func (v *view) parse(row []Column, sc *Scratch) error {
	if len(row) != 1 || row[0].Kind != pglogrepl.TupleDataTypeText {
		return &RowError{Table: v.b.Name, Message: true, Reason: "no content"}
	}
	if err := parseMessage(v.b.rt, row[0].Data, sc); err != nil {
		return &RowError{Table: v.b.Name, Message: true, Reason: err.Error()}
	}
	v.row, v.raw = sc.msg, sc.msgRaw
	return nil
}

// col is route column i's value, nil when the column is absent.
func (v *view) col(i int) *Column {
	if i < 0 {
		return nil
	}
	p := v.b.pos[i]
	if p < 0 || p >= len(v.row) || v.row[p].Kind == 0 {
		return nil
	}
	return &v.row[p]
}

// text is the text value of role's column, nil when absent or NULL.
func (v *view) text(role int) []byte {
	if v.b.rt == nil {
		return nil
	}
	c := v.col(v.b.rt.role[role])
	if c == nil || c.Kind != pglogrepl.TupleDataTypeText {
		return nil
	}
	return c.Data
}

func (v *view) rowError(i int, reason string) error {
	return &RowError{Table: v.b.Name, Column: v.b.rt.cols[i], Reason: reason, Message: v.b.message}
}

// value is route column i's text; null reports a NULL (an error unless
// nullable).
func (v *view) value(i int, nullable bool) (val []byte, null bool, err error) {
	c := v.col(i)
	switch {
	case c == nil && v.b.rt.optional[i]:
		return nil, true, nil
	case c == nil && v.b.message:
		return nil, false, v.rowError(i, "the message has no such member (check the route's columns mapping)")
	case c == nil && v.b.pos[i] < 0:
		return nil, false, v.rowError(i, "the column does not exist in the table (check the route's columns mapping)")
	case c == nil:
		return nil, false, v.rowError(i, "the column is missing from the decoded row")
	}
	switch c.Kind {
	case pglogrepl.TupleDataTypeText:
		return c.Data, false, nil
	case pglogrepl.TupleDataTypeNull:
		if nullable {
			return nil, true, nil
		}
		return nil, false, v.rowError(i, "the value is NULL")
	default:
		return nil, false, v.rowError(i, fmt.Sprintf("unexpected tuple data kind %q", c.Kind))
	}
}

// isJSON: route column i's text is JSON as it stands.
func (v *view) isJSON(i int) bool {
	return v.b.message || v.b.oid[i] == oidJSON || v.b.oid[i] == oidJSONB
}

// matches reports whether every condition holds. A column the filter needs
// must exist.
func (v *view) matches(conds []condition) (bool, error) {
	for k := range conds {
		c := &conds[k]
		val, null, err := v.value(c.col, true)
		if err != nil {
			return false, err
		}
		if null || !oneOf(val, c.values) {
			return false, nil
		}
	}
	return true, nil
}

func oneOf(v []byte, values []string) bool {
	for _, s := range values {
		if string(v) == s {
			return true
		}
	}
	return false
}

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
	rec := outboxd.Record{Topic: topic, Key: key, Value: val, Headers: headers,
		// A route with a dead-letter topic takes a record the broker
		// refuses there too.
		Refusable: rt.DeadLetterTopic != ""}
	if !v.b.message {
		rec.RowID = id
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

// value writes the record's value into sc.value.
func (r *Router) value(v *view, id, tipus []byte, pos Position, sc *Scratch) ([]byte, error) {
	rt := v.b.rt
	ci := rt.role[roleCarrega]
	carrega, null, err := v.value(ci, rt.debezium && rt.payload)
	if err != nil {
		return nil, err
	}
	val := sc.value[:0]
	if rt.payload {
		if !rt.payloadEnvelope {
			switch {
			case null && rt.ValueJSON:
				return jsonNull, nil // JsonConverter writes a null so
			case null:
				return nil, nil // Debezium's null value
			}
			switch {
			case v.b.oid[ci] == oidBytea && !v.b.message:
				if val, err = appendBytea(val, carrega, rt.ValueJSON, &sc.key); err != nil {
					return nil, v.rowError(ci, err.Error())
				}
			case rt.ValueJSON:
				val = appendConnectString(val, carrega)
			default:
				// Appended rather than referenced: the same for every mode,
				// and the record's value is sc's memory, never the row's.
				val = append(val, carrega...)
			}
			sc.value = val
			return val, nil
		}
		val = append(val, `{"payload":`...)
		switch {
		case null:
			val = append(val, "null"...)
		case rt.ValueJSON || !v.isJSON(ci) && !json.Valid(carrega):
			val = appendConnectString(val, carrega)
		default:
			val = append(val, v.rawJSON(ci, carrega)...)
		}
	} else {
		if !v.isJSON(ci) && !json.Valid(carrega) {
			return nil, v.rowError(ci, "the value is not valid JSON")
		}
		versio := int64(1)
		if i := rt.role[roleVersio]; i >= 0 {
			raw, null, err := v.value(i, v.b.message)
			if err != nil {
				return nil, err
			}
			if !null {
				var ok bool
				if versio, ok = parseInt(raw); !ok {
					return nil, v.rowError(i, "not an integer")
				}
			}
		}
		ms := pos.CommitTime / 1000
		if i := rt.role[roleCreatEn]; i >= 0 {
			if ms, err = v.millis(i); err != nil {
				return nil, err
			}
		}
		if need := len(id) + len(tipus) + len(carrega) + len(r.origen) + 96; cap(val) < need {
			val = make([]byte, 0, need)
		}
		val = append(val, `{"id_esdeveniment":`...)
		val = appendString(val, id)
		val = append(val, `,"tipus":`...)
		val = appendString(val, tipus)
		val = append(val, `,"versio":`...)
		val = strconv.AppendInt(val, versio, 10)
		val = append(val, `,"data_ms":`...)
		val = strconv.AppendInt(val, ms, 10)
		val = append(val, `,"origen":`...)
		val = append(val, r.origen...)
		val = append(val, `,"dades":`...)
		val = append(val, v.rawJSON(ci, carrega)...)
	}
	for k := range rt.fields {
		f := &rt.fields[k]
		if f.header != "" {
			continue
		}
		val = append(val, ',')
		val = append(val, f.member...)
		if val, err = v.appendJSON(val, f.col, !rt.ValueJSON); err != nil {
			return nil, err
		}
	}
	val = append(val, '}')
	sc.value = val
	return val, nil
}

// rawJSON is column i's JSON text: a message member's own JSON (a string
// member keeps its quotes), a table column's text.
func (v *view) rawJSON(i int, text []byte) []byte {
	if v.b.message {
		return v.raw[i]
	}
	return text
}

// appendJSON appends column i's value as a JSON value: integers and
// booleans as such, JSON columns embedded (when embed) and everything else
// as a string; NULL as null.
func (v *view) appendJSON(dst []byte, i int, embed bool) ([]byte, error) {
	val, null, err := v.value(i, true)
	switch {
	case err != nil:
		return nil, err
	case null:
		return append(dst, "null"...), nil
	case v.b.message && embed:
		return append(dst, v.rawJSON(i, val)...), nil
	case v.b.message:
		return appendConnectString(dst, val), nil
	}
	switch v.b.oid[i] {
	case oidInt2, oidInt4, oidInt8:
		return append(dst, val...), nil
	case oidBool:
		return append(dst, boolText(val)...), nil
	case oidJSON, oidJSONB:
		if embed {
			return append(dst, val...), nil
		}
	}
	if embed {
		return appendString(dst, val), nil
	}
	return appendConnectString(dst, val), nil
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

// headers builds the record's headers in sc.headers; values built here
// (trace from a span context, position numbers) go in sc.hdr.
func (v *view) headers(id, tipus []byte, pos Position, sc *Scratch) ([]outboxd.Header, error) {
	rt := v.b.rt
	hs := sc.headers[:0]
	hdr := sc.hdr[:0]
	if rt.debezium {
		hs = append(hs, outboxd.Header{Key: HeaderDebeziumID, Value: id})
	} else {
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
		if val != nil && !v.b.message && v.b.oid[f.col] == oidBool {
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
	if rt.Position && pos.CommitLSN != 0 {
		at := len(hdr)
		hdr = strconv.AppendUint(hdr, pos.CommitLSN, 10)
		lsn := hdr[at:len(hdr):len(hdr)]
		at = len(hdr)
		hdr = strconv.AppendUint(hdr, uint64(pos.Index), 10)
		hs = append(hs, outboxd.Header{Key: HeaderCommitLSN, Value: lsn}, outboxd.Header{Key: HeaderTxnIndex, Value: hdr[at:len(hdr):len(hdr)]})
	}
	sc.headers, sc.hdr = hs, hdr
	return hs, nil
}

// millis reads column i as milliseconds since the epoch: a timestamptz, a
// timestamp without time zone (UTC, as Debezium reads it), an integer of
// milliseconds; a message member as a number of milliseconds or a
// timestamp string. Truncated toward zero, as the relay's data_ms is.
func (v *view) millis(i int) (int64, error) {
	raw, _, err := v.value(i, false)
	if err != nil {
		return 0, err
	}
	var us int64
	switch {
	case v.b.message && len(raw) > 0 && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9'):
		ms, ok := parseInt(raw)
		if !ok {
			return 0, v.rowError(i, "not an integer number of milliseconds")
		}
		return ms, nil
	case v.b.message:
		us, err = parseTime(raw, timeMember)
	case v.b.oid[i] == oidInt2 || v.b.oid[i] == oidInt4 || v.b.oid[i] == oidInt8:
		ms, ok := parseInt(raw)
		if !ok {
			return 0, v.rowError(i, "not an integer")
		}
		return ms, nil
	case v.b.oid[i] == oidTimestamp:
		us, err = parseTime(raw, timeNoZone)
	default:
		us, err = ParseTimestamptz(raw)
	}
	if err != nil {
		return 0, v.rowError(i, err.Error())
	}
	return us / 1000, nil
}

// appendBytea decodes PostgreSQL's hex output of a bytea ("\x0a1b...")
// after dst, or writes it as a base64 JSON string (Kafka Connect's
// JsonConverter for bytes) when asJSON, decoding into *tmp first.
func appendBytea(dst, text []byte, asJSON bool, tmp *[]byte) ([]byte, error) {
	if len(text) < 2 || text[0] != '\\' || text[1] != 'x' || len(text)%2 != 0 {
		return nil, errors.New("a bytea not in hex output (bytea_output = 'hex')")
	}
	bin := dst
	if asJSON {
		bin = (*tmp)[:0]
	}
	for i := 2; i < len(text); i += 2 {
		hi, lo := unhex(text[i]), unhex(text[i+1])
		if hi < 0 || lo < 0 {
			return nil, errors.New("a bytea with a non-hex digit")
		}
		bin = append(bin, byte(hi<<4|lo))
	}
	if !asJSON {
		return bin, nil
	}
	*tmp = bin
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, bin)
	return append(dst, '"'), nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// text is the text value of column idx of row, nil when absent or NULL.
func text(row []Column, idx int) []byte {
	if idx < 0 || idx >= len(row) || row[idx].Kind != pglogrepl.TupleDataTypeText {
		return nil
	}
	return row[idx].Data
}

// readable is a value as an error may quote it: valid UTF-8, not too long.
func readable(v []byte) string {
	if len(v) > maxNameInError {
		v = append(v[:maxNameInError:maxNameInError], "..."...)
	}
	return strings.ToValidUTF8(string(v), "\ufffd")
}

// parseInt reads a decimal integer as strconv.ParseInt does, without its
// allocation for the common short case.
func parseInt(b []byte) (int64, bool) {
	digits := b
	if len(digits) > 0 && (digits[0] == '-' || digits[0] == '+') {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		v, err := strconv.ParseInt(string(b), 10, 64)
		return v, err == nil
	}
	var v int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if b[0] == '-' {
		v = -v
	}
	return v, true
}
