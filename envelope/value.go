package envelope

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
)

// value writes the record's value into sc.value.
func (r *Router) value(v *view, id, tipus []byte, pos Position, sc *Scratch) ([]byte, error) {
	rt := v.b.rt
	ci := rt.role[roleCarrega]
	carrega, null, err := v.value(ci, rt.debezium && rt.payload)
	if err != nil {
		return nil, err
	}
	var val []byte
	switch {
	case rt.ce:
		return v.ceValue(id, tipus, carrega, pos, sc)
	case rt.payload && !rt.payloadEnvelope && rt.Encoder != nil:
		val, err := v.payload(ci, carrega, null, sc)
		if err != nil || val == nil {
			return val, err
		}
		return v.encode(val, tipus, sc)
	case rt.payload && !rt.payloadEnvelope:
		return v.payload(ci, carrega, null, sc)
	case rt.payload:
		val = append(sc.value[:0], `{"payload":`...)
		switch {
		case null:
			val = append(val, "null"...)
		case rt.ValueJSON || !v.isJSON(ci) && !json.Valid(carrega):
			val = appendConnectString(val, carrega)
		default:
			val = append(val, v.rawJSON(ci, carrega)...)
		}
	default:
		if val, err = r.envelope(v, id, tipus, carrega, pos, sc.value[:0]); err != nil {
			return nil, err
		}
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

// payload writes a payload value without envelope fields into sc.value:
// the payload column's bytes (a bytea's decoded), or a JSON string of
// them; NULL is a null value.
func (v *view) payload(ci int, carrega []byte, null bool, sc *Scratch) ([]byte, error) {
	rt := v.b.rt
	switch {
	case null && rt.ValueJSON:
		return jsonNull, nil // JsonConverter writes a null so
	case null:
		return nil, nil // Debezium's null value
	}
	val := sc.value[:0]
	switch {
	case v.b.kind[ci] == kindBytea && !v.b.message:
		var err error
		if val, err = appendBytea(val, carrega, rt.ValueJSON, &sc.key); err != nil {
			return nil, v.rowError(ci, err.Error())
		}
	case rt.ValueJSON:
		val = appendConnectString(val, carrega)
	default:
		// Appended rather than referenced: the same for every mode, and
		// the record's value is sc's memory, never the row's.
		val = append(val, carrega...)
	}
	sc.value = val
	return val, nil
}

// envelope appends the contract's envelope, all but its closing brace, to
// val (sc.value's memory, grown when short).
func (r *Router) envelope(v *view, id, tipus, carrega []byte, pos Position, val []byte) ([]byte, error) {
	rt := v.b.rt
	ci := rt.role[roleCarrega]
	if !v.isJSON(ci) && !json.Valid(carrega) {
		return nil, v.rowError(ci, "the value is not valid JSON")
	}
	versio, err := v.versio()
	if err != nil {
		return nil, err
	}
	us, err := v.created(pos)
	if err != nil {
		return nil, err
	}
	ms := us / 1000
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
	return append(val, v.rawJSON(ci, carrega)...), nil
}

// versio is the event's version: its column's integer, 1 when the route
// has no versio column or a message leaves it out.
func (v *view) versio() (int64, error) {
	i := v.b.rt.role[roleVersio]
	if i < 0 {
		return 1, nil
	}
	raw, null, err := v.value(i, v.b.message)
	if err != nil || null {
		return 1, err
	}
	n, ok := parseInt(raw)
	if !ok {
		return 0, v.rowError(i, "not an integer")
	}
	return n, nil
}

// created is when the event was created, in µs since the epoch: its
// creat_en, or (a message, which has none) its transaction's commit time.
func (v *view) created(pos Position) (int64, error) {
	if i := v.b.rt.role[roleCreatEn]; i >= 0 {
		return v.micros(i)
	}
	return pos.CommitTime, nil
}

// ceValue is a CloudEvent's value in sc.value: carrega (binary mode), or
// the whole event as JSON (structured).
func (v *view) ceValue(id, tipus, carrega []byte, pos Position, sc *Scratch) ([]byte, error) {
	ci := v.b.rt.role[roleCarrega]
	if !v.isJSON(ci) && !json.Valid(carrega) {
		return nil, v.rowError(ci, "the value is not valid JSON")
	}
	data := v.rawJSON(ci, carrega)
	if !v.b.rt.ceStructured {
		// Appended, as a payload is: the record's value is sc's memory.
		sc.value = append(sc.value[:0], data...)
		if v.b.rt.Encoder != nil {
			return v.encode(sc.value, tipus, sc)
		}
		return sc.value, nil
	}
	a, err := v.ceAttrs(id, tipus, pos)
	if err != nil {
		return nil, err
	}
	val := ceStructuredValue(sc.value[:0], v.b.rt.ceSource, a, data)
	sc.value = append(val, '}')
	return sc.value, nil
}

// encode writes val through the route's Encoder into sc.enc.
func (v *view) encode(val, tipus []byte, sc *Scratch) ([]byte, error) {
	versio, err := v.versio()
	if err != nil {
		return nil, err
	}
	out, err := v.b.rt.Encoder.Encode(sc.enc[:0], val, tipus, versio)
	if err != nil {
		return nil, v.rowError(v.b.rt.role[roleCarrega], err.Error())
	}
	sc.enc = out
	return out, nil
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
	switch v.b.kind[i] {
	case kindInteger:
		return append(dst, val...), nil
	case kindBool:
		return append(dst, boolText(val)...), nil
	case kindJSON:
		if embed {
			return append(dst, val...), nil
		}
	}
	if embed {
		return appendString(dst, val), nil
	}
	return appendConnectString(dst, val), nil
}

// millis reads column i as milliseconds since the epoch (micros),
// truncated toward zero, as the relay's data_ms is.
func (v *view) millis(i int) (int64, error) {
	us, err := v.micros(i)
	return us / 1000, err
}

// micros reads column i as microseconds since the epoch: a timestamptz, a
// timestamp without time zone (UTC, as Debezium reads it), an integer of
// milliseconds; a message member as a number of milliseconds or a
// timestamp string.
func (v *view) micros(i int) (int64, error) {
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
		return ms * 1000, nil
	case v.b.message:
		us, err = parseTime(raw, timeMember)
	case v.b.kind[i] == kindInteger:
		ms, ok := parseInt(raw)
		if !ok {
			return 0, v.rowError(i, "not an integer")
		}
		return ms * 1000, nil
	case v.b.kind[i] == kindTimestamp:
		us, err = parseTime(raw, timeNoZone)
	default:
		us, err = ParseTimestamptz(raw)
	}
	if err != nil {
		return 0, v.rowError(i, err.Error())
	}
	return us, nil
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
