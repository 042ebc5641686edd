package envelope

import (
	"bytes"
	"encoding/json"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"
)

// parseMessage reads a logical message's content, a JSON object, into
// sc.msg: one Column per route column, by member name. A string member
// gives its text unescaped, any other member its JSON text, null a NULL; a
// missing member has Kind 0 (absent). sc.msgRaw keeps each member's JSON
// text. The values reference content and sc.msgBuf.
func parseMessage(rt *route, content []byte, sc *Scratch) error {
	n := len(rt.cols)
	if cap(sc.msg) < n {
		sc.msg, sc.msgRaw = make([]Column, n), make([][]byte, n)
	}
	sc.msg, sc.msgRaw = sc.msg[:n], sc.msgRaw[:n]
	clear(sc.msg)
	clear(sc.msgRaw)
	if !json.Valid(content) {
		return errNotJSONObject
	}
	i := skipSpace(content, 0)
	if i >= len(content) || content[i] != '{' {
		return errNotJSONObject
	}
	buf := sc.msgBuf[:0]
	for i = skipSpace(content, i+1); i < len(content) && content[i] != '}'; {
		keyEnd := skipValue(content, i)
		key := content[i+1 : keyEnd-1]
		i = skipSpace(content, keyEnd) + 1 // the colon
		i = skipSpace(content, i)
		end := skipValue(content, i)
		raw := content[i:end]
		if j := memberIndex(rt.cols, key, &buf); j >= 0 && sc.msg[j].Kind == 0 {
			sc.msgRaw[j] = raw
			switch raw[0] {
			case '"':
				start := len(buf)
				buf = unescape(buf, raw[1:len(raw)-1])
				sc.msg[j] = Column{Kind: pglogrepl.TupleDataTypeText, Data: buf[start:len(buf):len(buf)]}
			case 'n':
				sc.msg[j] = Column{Kind: pglogrepl.TupleDataTypeNull}
			default:
				sc.msg[j] = Column{Kind: pglogrepl.TupleDataTypeText, Data: raw}
			}
		}
		i = skipSpace(content, end)
		if i < len(content) && content[i] == ',' {
			i = skipSpace(content, i+1)
		}
	}
	sc.msgBuf = buf
	return nil
}

type constError string

func (e constError) Error() string { return string(e) }

const errNotJSONObject = constError("the message's content is not a JSON object")

// memberIndex is the index in cols of the member name key (raw, as between
// its quotes), -1 when none. A key with escapes is unescaped at the end of
// *buf, which is then cut back.
func memberIndex(cols []string, key []byte, buf *[]byte) int {
	if bytes.IndexByte(key, '\\') >= 0 {
		start := len(*buf)
		*buf = unescape(*buf, key)
		j := indexOf(cols, (*buf)[start:])
		*buf = (*buf)[:start]
		return j
	}
	return indexOf(cols, key)
}

func indexOf(cols []string, name []byte) int {
	for j, c := range cols {
		if c == string(name) {
			return j
		}
	}
	return -1
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the JSON value starting at b[i], in a
// document already known to be valid.
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		for i++; i < len(b); i++ {
			switch b[i] {
			case '\\':
				i++
			case '"':
				return i + 1
			}
		}
		return i
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipValue(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return i
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i
}

// unescape appends the text of a JSON string's contents s (valid JSON) to
// dst.
func unescape(dst, s []byte) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			dst = append(dst, c)
			continue
		}
		i++
		if e, ok := controlEscape(s[i]); ok {
			dst = append(dst, e)
			continue
		}
		if s[i] != 'u' {
			dst = append(dst, s[i]) // " \ /
			continue
		}
		r := rune(hex4(s[i+1 : i+5]))
		i += 4
		if utf16.IsSurrogate(r) && i+6 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
			if r2 := utf16.DecodeRune(r, rune(hex4(s[i+3:i+7]))); r2 != utf8.RuneError {
				r = r2
				i += 6
			}
		}
		dst = utf8.AppendRune(dst, r)
	}
	return dst
}

// controlEscape is the byte a backslash escape of a control character
// stands for (\b, \f, \n, \r, \t), in JSON and in java.util.Properties.
func controlEscape(c byte) (byte, bool) {
	switch c {
	case 'b':
		return '\b', true
	case 'f':
		return '\f', true
	case 'n':
		return '\n', true
	case 'r':
		return '\r', true
	case 't':
		return '\t', true
	}
	return 0, false
}

func hex4(b []byte) int {
	v := 0
	for _, c := range b {
		v = v<<4 | unhex(c)
	}
	return v
}
