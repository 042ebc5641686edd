package envelope

import "unicode/utf8"

// W3C Trace Context (https://www.w3.org/TR/trace-context/): outboxd does not
// trace itself; it carries the writer's context to the record, unchanged, so
// that the consumer's spans continue the writer's trace.

// Trace header names.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// validTraceparent reports whether v is a traceparent a receiver may use:
// version-traceid-parentid-flags in lowercase hex, the ids not all zero,
// version ff forbidden; version 00 exactly 55 characters, a later version
// at least that, with "-" after the flags when longer.
func validTraceparent(v []byte) bool {
	if len(v) < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return false
	}
	if !lowerHex(v[0:2]) || !lowerHex(v[3:35]) || !lowerHex(v[36:52]) || !lowerHex(v[53:55]) {
		return false
	}
	switch {
	case v[0] == 'f' && v[1] == 'f':
		return false
	case v[0] == '0' && v[1] == '0' && len(v) != 55:
		return false
	case len(v) > 55 && v[55] != '-':
		return false
	}
	return !allZero(v[3:35]) && !allZero(v[36:52])
}

func lowerHex(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != '0' {
			return false
		}
	}
	return true
}

// spanContext finds the traceparent and tracestate entries of a serialized
// java.util.Properties (Debezium's tracingspancontext column, written with
// Properties.store: "#comment" lines, then key=value lines with \ escapes).
// Their values are unescaped at the end of buf, which is returned grown.
func spanContext(props, buf []byte) (traceparent, tracestate, out []byte) {
	for len(props) > 0 {
		line := props
		if i := indexLineEnd(props); i >= 0 {
			line, props = props[:i], props[i+1:]
		} else {
			props = nil
		}
		i := 0
		for i < len(line) && (line[i] == ' ' || line[i] == '\t' || line[i] == '\f') {
			i++
		}
		if i == len(line) || line[i] == '#' || line[i] == '!' {
			continue
		}
		// The key ends at the first unescaped '=', ':' or white space.
		start := i
		for i < len(line) && line[i] != '=' && line[i] != ':' && line[i] != ' ' && line[i] != '\t' && line[i] != '\f' {
			if line[i] == '\\' {
				i++
			}
			i++
		}
		key := line[start:min(i, len(line))]
		for i < len(line) && (line[i] == ' ' || line[i] == '\t' || line[i] == '\f') {
			i++
		}
		if i < len(line) && (line[i] == '=' || line[i] == ':') {
			i++
		}
		for i < len(line) && (line[i] == ' ' || line[i] == '\t' || line[i] == '\f') {
			i++
		}
		var value []byte
		if i < len(line) {
			value = line[i:]
		}
		switch string(key) {
		case HeaderTraceparent, HeaderTracestate:
			at := len(buf)
			buf = unescapeProperties(buf, value)
			v := buf[at:len(buf):len(buf)]
			if string(key) == HeaderTraceparent {
				traceparent = v
			} else {
				tracestate = v
			}
		}
	}
	return traceparent, tracestate, buf
}

func indexLineEnd(b []byte) int {
	for i, c := range b {
		if c == '\n' || c == '\r' {
			return i
		}
	}
	return -1
}

// unescapeProperties appends a Properties value without its escapes (\t,
// \n, \r, \f, \uXXXX, and \c for any other c).
func unescapeProperties(dst, s []byte) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			dst = append(dst, c)
			continue
		}
		i++
		e, ok := controlEscape(s[i])
		switch {
		case ok && s[i] != 'b': // Properties has no \b
			dst = append(dst, e)
		case s[i] == 'u' && i+4 < len(s):
			dst = utf8.AppendRune(dst, rune(hex4(s[i+1:i+5])))
			i += 4
		default:
			dst = append(dst, s[i])
		}
	}
	return dst
}
