package envelope

import (
	"unicode/utf16"
	"unicode/utf8"
)

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD, as
// encoding/json does; HTML characters are left alone (the value is not
// embedded in HTML).
func appendString(dst, s []byte) []byte {
	// Fast path: nothing to escape (UUIDs, event types, keys).
	plain := true
	for _, c := range s {
		if c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain {
		dst = append(dst, '"')
		dst = append(dst, s...)
		return append(dst, '"')
	}
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		// U+2028 and U+2029 are valid JSON but break JavaScript consumers.
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

const upperHex = "0123456789ABCDEF"

// appendConnectString appends s as a JSON string the way Kafka Connect's
// JsonConverter (Jackson) writes one, so that value_converter: json gives
// the same bytes as a Debezium connector: \b \t \n \f \r and \uXXXX (upper
// case) for the other control characters, a character outside the Basic
// Multilingual Plane as its two escaped UTF-16 surrogates, and every other
// character as it is (no U+2028 escape, no U+FFFD: PostgreSQL's text is
// valid UTF-8).
func appendConnectString(dst, s []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < 0xF0 {
			i++
			continue
		}
		dst = append(dst, s[start:i]...)
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
			i++
		case c < 0x20:
			if e := controlShort(c); e != 0 {
				dst = append(dst, '\\', e)
			} else {
				dst = append(dst, '\\', 'u', '0', '0', upperHex[c>>4], upperHex[c&0xf])
			}
			i++
		default: // a 4-byte UTF-8 sequence
			r, size := utf8.DecodeRune(s[i:])
			if size < 4 {
				dst = append(dst, s[i:i+size]...)
				i += size
				break
			}
			r1, r2 := utf16.EncodeRune(r)
			for _, u := range []rune{r1, r2} {
				dst = append(dst, '\\', 'u', upperHex[u>>12&0xf], upperHex[u>>8&0xf], upperHex[u>>4&0xf], upperHex[u&0xf])
			}
			i += size
		}
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// controlShort is the letter of a control character's two-character JSON
// escape, 0 for none.
func controlShort(c byte) byte {
	for _, l := range []byte("btnfr") {
		if e, _ := controlEscape(l); e == c {
			return l
		}
	}
	return 0
}
