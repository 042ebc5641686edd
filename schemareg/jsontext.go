package schemareg

import (
	"bytes"
	"encoding/json"
	"errors"
	"unicode/utf8"
)

// The encoders read carrega's JSON text where it lies, without building
// Go values. What they accept and how they read a string is what
// encoding/json's Decoder (the reference they replace, and the fuzz
// tests' oracle) accepts and reads: the first JSON value of the text,
// whatever follows it (Decoder.Decode reads one value); a member named
// twice takes its last value; a string's invalid UTF-8 or lone surrogate
// escape reads as U+FFFD. The standard library's tokenizer
// (encoding/json/jsontext) is behind GOEXPERIMENT=jsonv2 in this Go, and
// its defaults (duplicate names and invalid UTF-8 refused) differ: this
// one is small and exact.

// maxJSONDepth is encoding/json's nesting limit.
const maxJSONDepth = 10000

var errNotJSON = errors.New("not JSON")

// jsonCheck is the end of data's first value, or errNotJSON. Everything
// the encoders read afterwards lies inside data[:end] and is valid.
func jsonCheck(data []byte) (int, error) {
	p := skipSpace(data, 0)
	if p == len(data) {
		return 0, errNotJSON
	}
	end, ok := checkValue(data, p, 0)
	if !ok {
		return 0, errNotJSON
	}
	return end, nil
}

// notJSON is the error of a text jsonCheck refused, in encoding/json's
// words (which name a character and an offset, never the value).
func notJSON(data []byte) error {
	var v any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	err := dec.Decode(&v)
	if err == nil {
		err = errNotJSON
	}
	return err
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(data []byte, p int) int {
	for p < len(data) && isSpace(data[p]) {
		p++
	}
	return p
}

// checkValue validates the value at data[p] (not whitespace) and returns
// its end.
func checkValue(data []byte, p, depth int) (int, bool) {
	switch c := data[p]; {
	case c == '{' || c == '[':
		if depth+1 > maxJSONDepth {
			return 0, false
		}
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		p = skipSpace(data, p+1)
		if p < len(data) && data[p] == closing {
			return p + 1, true
		}
		for {
			if p >= len(data) {
				return 0, false
			}
			var ok bool
			if c == '{' {
				if data[p] != '"' {
					return 0, false
				}
				if p, ok = checkString(data, p); !ok {
					return 0, false
				}
				p = skipSpace(data, p)
				if p >= len(data) || data[p] != ':' {
					return 0, false
				}
				if p = skipSpace(data, p+1); p >= len(data) {
					return 0, false
				}
			}
			if p, ok = checkValue(data, p, depth+1); !ok {
				return 0, false
			}
			p = skipSpace(data, p)
			if p >= len(data) {
				return 0, false
			}
			switch data[p] {
			case ',':
				p = skipSpace(data, p+1)
			case closing:
				return p + 1, true
			default:
				return 0, false
			}
		}
	case c == '"':
		return checkString(data, p)
	case c == 't':
		return checkLiteral(data, p, "true")
	case c == 'f':
		return checkLiteral(data, p, "false")
	case c == 'n':
		return checkLiteral(data, p, "null")
	case c == '-' || c >= '0' && c <= '9':
		return checkNumber(data, p)
	}
	return 0, false
}

func checkLiteral(data []byte, p int, lit string) (int, bool) {
	if len(data)-p < len(lit) || string(data[p:p+len(lit)]) != lit {
		return 0, false
	}
	return p + len(lit), true
}

// checkNumber: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func checkNumber(data []byte, p int) (int, bool) {
	if data[p] == '-' {
		p++
	}
	switch {
	case p < len(data) && data[p] == '0':
		p++
	case p < len(data) && data[p] >= '1' && data[p] <= '9':
		p = digits(data, p)
	default:
		return 0, false
	}
	if p < len(data) && data[p] == '.' {
		q := digits(data, p+1)
		if q == p+1 {
			return 0, false
		}
		p = q
	}
	if p < len(data) && (data[p] == 'e' || data[p] == 'E') {
		p++
		if p < len(data) && (data[p] == '+' || data[p] == '-') {
			p++
		}
		q := digits(data, p)
		if q == p {
			return 0, false
		}
		p = q
	}
	return p, true
}

func digits(data []byte, p int) int {
	for p < len(data) && data[p] >= '0' && data[p] <= '9' {
		p++
	}
	return p
}

// checkString validates the string at data[p] ('"') and returns its end.
func checkString(data []byte, p int) (int, bool) {
	for p++; p < len(data); p++ {
		switch c := data[p]; {
		case c == '"':
			return p + 1, true
		case c < ' ':
			return 0, false
		case c == '\\':
			p++
			if p >= len(data) {
				return 0, false
			}
			switch data[p] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(data)-p < 5 || hex4(data[p+1:p+5]) < 0 {
					return 0, false
				}
				p += 4
			default:
				return 0, false
			}
		}
	}
	return 0, false
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

// skipValue is the end of the valid value at data[p].
func skipValue(data []byte, p int) int {
	switch data[p] {
	case '"':
		return skipString(data, p)
	case '{', '[':
		depth := 0
		for ; ; p++ {
			switch data[p] {
			case '"':
				p = skipString(data, p) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return p + 1
				}
			}
		}
	}
	for p < len(data) {
		switch data[p] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return p
		}
		p++
	}
	return p
}

// skipString is the end of the valid string at data[p].
func skipString(data []byte, p int) int {
	for p++; ; p++ {
		switch data[p] {
		case '"':
			return p + 1
		case '\\':
			p++
		}
	}
}

// plainString: the valid string s (quotes included) reads as its own
// bytes: no escape, nothing but printable ASCII.
func plainString(s []byte) bool {
	for _, c := range s[1 : len(s)-1] {
		if c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// appendUnquoted appends what the valid string s (quotes included) reads
// as, as encoding/json reads it.
func appendUnquoted(dst, s []byte) []byte {
	s = s[1 : len(s)-1]
	for r := 0; r < len(s); {
		c := s[r]
		switch {
		case c == '\\':
			switch e := s[r+1]; e {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				rr := hex4(s[r+2:])
				r += 6
				if rr >= 0xD800 && rr < 0xE000 {
					if rr < 0xDC00 && len(s)-r >= 6 && s[r] == '\\' && s[r+1] == 'u' {
						if lo := hex4(s[r+2:]); lo >= 0xDC00 && lo < 0xE000 {
							dst = utf8.AppendRune(dst, (rr-0xD800)<<10|(lo-0xDC00)+0x10000)
							r += 6
							continue
						}
					}
					rr = utf8.RuneError
				}
				dst = utf8.AppendRune(dst, rr)
				continue
			default: // '"', '\\', '/'
				dst = append(dst, e)
			}
			r += 2
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			r++
		default:
			rr, size := utf8.DecodeRune(s[r:])
			if rr == utf8.RuneError && size == 1 {
				dst = utf8.AppendRune(dst, utf8.RuneError)
			} else {
				dst = append(dst, s[r:r+size]...)
			}
			r += size
		}
	}
	return dst
}

// jsonKindAt names the kind of the value at data[p], never its content.
func jsonKindAt(data []byte, p int) string {
	switch data[p] {
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '"':
		return "a string"
	case '[':
		return "an array"
	case '{':
		return "an object"
	}
	return "a number"
}
