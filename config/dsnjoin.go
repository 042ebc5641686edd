package config

import (
	"errors"
	"fmt"
	"strings"
)

// joinDSN puts the values of a DSN's variables in place so that the DSN means
// what its author meant, whatever characters a value holds:
//   - in the URL form, a value in the user info, the database name or the
//     query is percent-encoded (a password with @ or / otherwise moves the
//     host); a value in the hosts is refused if it holds anything a host
//     list does not (a / or ? there would move the database name or add
//     settings such as sslmode=disable);
//   - in the keyword=value form, a value inside a value is escaped as libpq
//     and pgconn read it (\ before \ and '), and an unquoted value that ends
//     up with white space, or empty, is quoted: pgconn, unlike libpq, keeps
//     the backslash of an escaped space.
//
// Anywhere else (a keyword, the whole DSN) a value goes in as it is.
func joinDSN(t template, values []string) (string, []templateError) {
	// The skeleton is the DSN with one placeholder byte for each variable:
	// not a delimiter of either form, so it reads as the DSN will.
	var skel strings.Builder
	at := make([]int, len(values))
	for i := range values {
		skel.WriteString(t.text[i])
		at[i] = skel.Len()
		skel.WriteByte('v')
	}
	skel.WriteString(t.text[len(values)])
	s := skel.String()
	if !isURL(s) {
		return joinKV(s, at, values), nil
	}
	dsn, bad := joinURL(s, at, values)
	if bad >= 0 {
		r := t.refs[bad]
		return "", []templateError{{r.offset, fmt.Sprintf("${%s} stands in the hosts of the URL and its value holds more than host names, ports and commas (letters, digits, . - _ : [ ] ,): a / ? & or = there would change the database or the settings; keep them in the DSN itself", r.name)}}
	}
	return dsn, nil
}

func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// fill writes s[from:to] with each placeholder in it replaced by its value
// passed through esc.
func fill(b *strings.Builder, s string, from, to int, at []int, values []string, esc func(string) string) {
	for i, pos := range at {
		if pos < from || pos >= to {
			continue
		}
		b.WriteString(s[from:pos])
		b.WriteString(esc(values[i]))
		from = pos + 1
	}
	b.WriteString(s[from:to])
}

func asIs(v string) string { return v }

// urlLayout is where the parts of a URL DSN lie, read as libpq (and pgconn)
// reads one: the user info runs to the first @, when that comes before the
// first /; the hosts (host:port, comma-separated) run to the first / or ?;
// the database name to the first ?; the query is &-separated key=value
// pairs, each half percent-decoded. # means nothing.
type urlLayout struct {
	userEnd   int // the @ that ends the user info; -1: none
	hostStart int
	hostEnd   int // the / or ? after the hosts, or len
	query     int // the ? that starts the query; -1: none
}

func layoutURL(s string) urlLayout {
	start := strings.Index(s, "://") + 3
	l := urlLayout{userEnd: -1, hostStart: start, query: -1}
	if i := strings.IndexAny(s[start:], "@/"); i >= 0 && s[start+i] == '@' {
		l.userEnd = start + i
		l.hostStart = l.userEnd + 1
	}
	l.hostEnd = len(s)
	if i := strings.IndexAny(s[l.hostStart:], "/?"); i >= 0 {
		l.hostEnd = l.hostStart + i
	}
	if i := strings.IndexByte(s[l.hostEnd:], '?'); i >= 0 {
		l.query = l.hostEnd + i
	}
	return l
}

// misplacedAt reports an @ where a DSN's author cannot have meant it: in the
// hosts or the database name. A user name or password holding a / or an @
// not percent-encoded puts the rest of it there (postgres://u:99/pw@host/db
// reads as host u, port 99, database pw@host/db).
func (l urlLayout) misplacedAt(s string) bool {
	end := len(s)
	if l.query >= 0 {
		end = l.query
	}
	return strings.IndexByte(s[l.hostStart:end], '@') >= 0
}

// userInDoubt reports a ? or # before the user info's @: libpq reads the
// user info to the @, Go's url.Parse ends the authority at the ? or #, so
// that the @ is a query value's (postgres://db?user=u&password=p@ss): a
// password may be on either side of it.
func (l urlLayout) userInDoubt(s string) bool {
	start := strings.Index(s, "://") + 3
	return l.userEnd >= 0 && strings.ContainsAny(s[start:l.userEnd], "?#")
}

// hostValue is what a variable may hold in the hosts of a URL DSN: host
// names, IP addresses (IPv6 in brackets), ports and the commas of a list.
// Anything else (a /, ?, & or =) would move the database name or add
// settings, and percent-encoding it would only make a host name that cannot
// resolve: such a value is refused.
func hostValue(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(".-_:[],", c) >= 0) {
			return false
		}
	}
	return true
}

// joinURL percent-encodes the values in the user info, the database name
// and the query, where libpq decodes them. A value in the hosts goes in as
// it is, and must be a host list already (hostValue): bad is the index of
// the first that is not, -1 when none.
func joinURL(s string, at []int, values []string) (dsn string, bad int) {
	l := layoutURL(s)
	var b strings.Builder
	from := 0
	for i, pos := range at {
		esc := percentEncode
		if pos >= l.hostStart && pos < l.hostEnd {
			if !hostValue(values[i]) {
				return "", i
			}
			esc = asIs
		}
		fill(&b, s, from, pos+1, at[i:i+1], values[i:i+1], esc)
		from = pos + 1
	}
	b.WriteString(s[from:])
	return b.String(), -1
}

// percentEncode writes every byte but the unreserved ones (RFC 3986: letters,
// digits, - . _ ~) as %XX.
func percentEncode(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// joinKV escapes the values that stand inside the values of a keyword=value
// DSN. A DSN whose skeleton does not read goes in as it is: ConnConfig says
// what is wrong with it.
func joinKV(s string, at []int, values []string) string {
	pairs, err := scanKV(s)
	if err != nil {
		var b strings.Builder
		fill(&b, s, 0, len(s), at, values, asIs)
		return b.String()
	}
	var b, val strings.Builder
	from := 0
	for _, p := range pairs {
		fill(&b, s, from, p.start, at, values, asIs)
		val.Reset()
		fill(&val, s, p.start, p.end, at, values, escapeKV)
		v := val.String()
		if !p.quoted && hasPlaceholder(at, p.start, p.end) && (v == "" || strings.ContainsAny(v, kvSpace)) {
			v = quoteKV(v)
		}
		b.WriteString(v)
		from = p.end
	}
	fill(&b, s, from, len(s), at, values, asIs)
	return b.String()
}

func hasPlaceholder(at []int, from, to int) bool {
	for _, pos := range at {
		if from <= pos && pos < to {
			return true
		}
	}
	return false
}

var kvEscaper = strings.NewReplacer(`\`, `\\`, `'`, `\'`)

func escapeKV(v string) string { return kvEscaper.Replace(v) }

// quoteKV turns an unquoted value into a quoted one that reads the same: an
// escaped pair stays, a bare ' is escaped.
func quoteKV(v string) string {
	var b strings.Builder
	b.WriteByte('\'')
	for i := 0; i < len(v); i++ {
		switch {
		case v[i] == '\\' && i+1 < len(v):
			b.WriteString(v[i : i+2])
			i++
		case v[i] == '\'':
			b.WriteString(`\'`)
		default:
			b.WriteByte(v[i])
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// kvSpace is the white space that ends an unquoted value for pgconn.
const kvSpace = " \t\n\v\f\r"

// kvPair is one keyword=value setting of a keyword/value DSN as pgconn reads
// it, with the value's place in the string (quotes included).
type kvPair struct {
	key        string
	start, end int
	quoted     bool
}

// scanKV reads a keyword/value DSN with pgconn's (and libpq's) rules: a
// keyword is the trimmed text before "=", without white space inside; a
// value is quoted ('...') or runs to white space; a backslash escapes the
// next byte in both (a trailing one in an unquoted value is dropped).
func scanKV(s string) ([]kvPair, error) {
	var pairs []kvPair
	pos := 0
	for pos < len(s) {
		eq := strings.IndexByte(s[pos:], '=')
		if eq < 0 {
			return nil, errors.New("invalid keyword/value")
		}
		key := strings.Trim(s[pos:pos+eq], kvSpace)
		if key == "" || strings.ContainsAny(key, kvSpace) {
			return nil, errors.New("invalid keyword/value")
		}
		pos += eq + 1
		for pos < len(s) && strings.IndexByte(kvSpace, s[pos]) >= 0 {
			pos++
		}
		p := kvPair{key: key, start: pos, quoted: pos < len(s) && s[pos] == '\''}
		end := pos
		if p.quoted {
			end++
		}
		for ; end < len(s); end++ {
			if p.quoted && s[end] == '\'' || !p.quoted && strings.IndexByte(kvSpace, s[end]) >= 0 {
				break
			}
			if s[end] == '\\' {
				if end++; end == len(s) {
					break
				}
			}
		}
		if p.quoted {
			if end >= len(s) {
				return nil, errors.New("unterminated quoted string")
			}
			end++ // the closing quote
		}
		p.end = end
		pairs = append(pairs, p)
		pos = end
		if !p.quoted && pos < len(s) {
			pos++ // the white space that ended the value
		}
	}
	return pairs, nil
}
