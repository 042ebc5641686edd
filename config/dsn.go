package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// ConnConfig parses the DSN and applies Password (when set) and
// ConnectTimeout: the one place where the postgres section becomes connection
// settings. pgconn reads the DSN as libpq would, PG* environment variables
// and files the DSN names (sslrootcert, a service file) included. The error
// holds no part of the DSN: pgconn's own can quote the fragment it could not
// read, which may be a piece of the password.
func (p Postgres) ConnConfig() (*pgconn.Config, error) {
	cfg, reason := p.connConfig()
	if reason != "" {
		return nil, fmt.Errorf("postgres.dsn is not a valid connection string: %s", reason)
	}
	return cfg, nil
}

// connConfig is ConnConfig with the reason for a failure on its own, for
// Validate to put after the field and line.
func (p Postgres) connConfig() (*pgconn.Config, string) {
	cfg, err := pgconn.ParseConfig(withTLS(p.DSN, p.TLS))
	if err != nil {
		return nil, parseFailure(err)
	}
	if p.Password != "" {
		cfg.Password = p.Password
	}
	if p.ConnectTimeout > 0 {
		cfg.ConnectTimeout = p.ConnectTimeout
	}
	return cfg, ""
}

// parseFailure says why pgconn could not parse a DSN, in words that are
// pgconn's constants or ours, never text taken from the DSN.
func parseFailure(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return "it cannot be parsed"
	}
	// pgconn's message is "cannot parse `DSN`: what (inner error)": with the
	// DSN blanked and the inner error cut off, "what" is one of its constants.
	bare := *pe
	bare.ConnString = ""
	what := strings.TrimPrefix(bare.Error(), "cannot parse ``: ")
	inner := errors.Unwrap(pe)
	if inner != nil {
		what = strings.TrimSuffix(what, " ("+inner.Error()+")")
	}
	innerIs := func(msgs ...string) bool {
		for _, m := range msgs {
			if inner != nil && inner.Error() == m {
				return true
			}
		}
		return false
	}
	switch {
	case what == "failed to parse as URL" && inner != nil && strings.HasPrefix(inner.Error(), "failed to split host:port"):
		return "invalid host:port"
	case what == "failed to parse as URL":
		return "not a valid URL (percent-encode characters such as @ : / ? # % in the user name and password, or set postgres.password)"
	case what == "failed to parse as keyword/value" && innerIs("invalid keyword/value", "invalid backslash", "unterminated quoted string in connection info string"):
		return inner.Error() + " (quote a value that holds spaces: password='p w'; write \\' and \\\\ for ' and \\)"
	case what == "failed to parse as keyword/value":
		return "not a valid keyword=value string"
	case what == "invalid port", what == "invalid connect_timeout":
		return what
	case what == "failed to configure TLS" && innerIs("sslmode is invalid", `both "sslcert" and "sslkey" are required`):
		return inner.Error()
	case what == "failed to configure TLS" && errors.Is(inner, fs.ErrNotExist):
		return "a TLS file it names (sslrootcert, sslcert, sslkey) does not exist"
	case what == "failed to configure TLS":
		return "invalid TLS settings (sslmode, sslrootcert, sslcert, sslkey)"
	case what == "failed to read service":
		return "cannot read the service file or find the service"
	case strings.HasPrefix(what, "unknown target_session_attrs value"):
		return "unknown target_session_attrs value"
	}
	return "it cannot be parsed"
}

// readSecretFile puts the content of the file named by field (file), less
// one trailing newline, in *password, which the YAML key passwordField must
// not also set. Its errors name the file, never what it holds.
func readSecretFile(lines map[string]int, field, file, passwordField string, password *string, readFile func(string) ([]byte, error)) error {
	if file == "" {
		return nil
	}
	line := fmt.Sprintf("line %d: %s: ", lines[field], field)
	if *password != "" {
		return fmt.Errorf("%sset together with %s (line %d): keep one", line, passwordField, lines[passwordField])
	}
	if readFile == nil {
		return fmt.Errorf("%s%s: no file can be read (Parse was given no readFile)", line, file)
	}
	data, err := readFile(file)
	if err != nil {
		return fmt.Errorf("%s%w", line, err)
	}
	pw := strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
	if pw == "" {
		return fmt.Errorf("%s%s is empty", line, file)
	}
	*password = pw
	return nil
}

// ---- variables in a DSN ----

// joinDSN puts the values of a DSN's variables in place so that the DSN means
// what its author meant, whatever characters a value holds:
//   - in the URL form, a value in the user info or in a query value is
//     percent-encoded (a password with @ or / otherwise moves the host);
//   - in the keyword=value form, a value inside a value is escaped as libpq
//     and pgconn read it (\ before \ and '), and an unquoted value that ends
//     up with white space, or empty, is quoted: pgconn, unlike libpq, keeps
//     the backslash of an escaped space.
//
// Anywhere else (host, port, path, a keyword, the whole DSN) a value goes in
// as it is.
func joinDSN(t template, values []string) string {
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
	if isURL(s) {
		return joinURL(s, at, values)
	}
	return joinKV(s, at, values)
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

// joinURL percent-encodes the values in the user info and in query values,
// where net/url (and so pgconn) reads the URL: the user info ends at the last
// @ before the first / ? or #, the query runs from the first ? to the first #.
func joinURL(s string, at []int, values []string) string {
	start := strings.Index(s, "://") + 3
	authEnd := len(s)
	if i := strings.IndexAny(s[start:], "/?#"); i >= 0 {
		authEnd = start + i
	}
	userEnd := strings.LastIndexByte(s[:authEnd], '@') // < start: no user info
	fragment := len(s)
	if i := strings.IndexByte(s[start:], '#'); i >= 0 {
		fragment = start + i
	}
	query := strings.IndexByte(s[:fragment], '?') // -1: no query

	var b strings.Builder
	from := 0
	for i, pos := range at {
		encode := pos < userEnd
		if query >= 0 && pos > query && pos < fragment {
			param := query + 1 + strings.LastIndexByte(s[query+1:pos], '&') + 1
			encode = strings.IndexByte(s[param:pos], '=') >= 0
		}
		esc := asIs
		if encode {
			esc = percentEncode
		}
		fill(&b, s, from, pos+1, at[i:i+1], values[i:i+1], esc)
		from = pos + 1
	}
	b.WriteString(s[from:])
	return b.String()
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

// scanKV reads a keyword/value DSN with pgconn's rules: a keyword is the
// trimmed text before "="; a value is quoted ('...') or runs to white space;
// a backslash escapes the next byte in both.
func scanKV(s string) ([]kvPair, error) {
	var pairs []kvPair
	pos := 0
	for pos < len(s) {
		eq := strings.IndexByte(s[pos:], '=')
		if eq < 0 {
			return nil, errors.New("invalid keyword/value")
		}
		key := strings.Trim(s[pos:pos+eq], kvSpace)
		if key == "" {
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
				if end++; end == len(s) && !p.quoted {
					return nil, errors.New("invalid backslash")
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

// ---- redaction ----

const redacted = "xxxxx"

// RedactedDSN returns the DSN with its password and sslpassword replaced by
// "xxxxx", for logs. It reads the DSN as pgconn does; where that reading is
// in doubt (an @ after the host, a DSN that does not parse) it hides more
// rather than risk a piece of a password: all of the user info, or, for a
// keyword=value DSN that does not parse, everything.
func (p Postgres) RedactedDSN() string {
	if isURL(p.DSN) {
		return redactURL(p.DSN)
	}
	return redactKV(p.DSN)
}

func redactURL(dsn string) string {
	scheme, rest, _ := strings.Cut(dsn, "://")
	_, parseErr := url.Parse(dsn)
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		if parseErr != nil {
			return scheme + "://" + redacted
		}
		return scheme + "://" + redactQuery(rest)
	}
	user := redacted
	authEnd := strings.IndexAny(rest, "/?#")
	if parseErr == nil && (authEnd < 0 || at < authEnd) {
		// The user info is what net/url (and so pgconn) takes it to be.
		user = rest[:at]
		if name, _, hasPassword := strings.Cut(user, ":"); hasPassword {
			user = name + ":" + redacted
		}
	}
	return scheme + "://" + user + "@" + redactQuery(rest[at+1:])
}

// redactQuery hides the values of password and sslpassword in the query of
// s, keeping everything else as written.
func redactQuery(s string) string {
	q := strings.IndexByte(s, '?')
	if q < 0 {
		return s
	}
	end := len(s)
	if i := strings.IndexByte(s[q:], '#'); i >= 0 {
		end = q + i
	}
	params := strings.Split(s[q+1:end], "&")
	for i, param := range params {
		key, _, _ := strings.Cut(param, "=")
		if k, err := url.QueryUnescape(key); err != nil || secretKey(k) {
			params[i] = key + "=" + redacted
		}
	}
	return s[:q+1] + strings.Join(params, "&") + s[end:]
}

func secretKey(k string) bool { return k == "password" || k == "sslpassword" }

func redactKV(dsn string) string {
	pairs, err := scanKV(dsn)
	if err != nil {
		return redacted
	}
	var b strings.Builder
	from := 0
	for _, p := range pairs {
		if secretKey(p.key) {
			b.WriteString(dsn[from:p.start])
			b.WriteString(redacted)
			from = p.end
		}
	}
	b.WriteString(dsn[from:])
	return b.String()
}

// withTLS adds postgres.tls to the DSN as libpq's settings, where pgconn
// turns them into its TLS configuration (for every host of a multi-host
// DSN). A setting given here replaces the DSN's.
func withTLS(dsn string, t PostgresTLS) string {
	set := [][2]string{{"sslmode", t.Mode}, {"sslrootcert", t.CAFile}, {"sslcert", t.CertFile}, {"sslkey", t.KeyFile}}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return dsn // reported as the DSN's own problem
		}
		q := u.Query()
		for _, kv := range set {
			if kv[1] != "" {
				q.Set(kv[0], kv[1])
			}
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	for _, kv := range set {
		if kv[1] != "" {
			// Later settings win in pgconn's keyword=value parser.
			dsn += " " + kv[0] + "='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(kv[1]) + "'"
		}
	}
	return dsn
}
