package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"strconv"
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
	if isURL(p.DSN) && layoutURL(p.DSN).misplacedAt(p.DSN) {
		return nil, "an @ after the host: a user name or password holding / or @ must be percent-encoded (/ as %2F, @ as %40), or give the password as postgres.password or postgres.password_file"
	}
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
	case what == "failed to parse as URL":
		return "not a valid URL (percent-encode characters such as @ / % and spaces in the user name and password, or set postgres.password)"
	case what == "failed to parse as keyword/value" && innerIs("invalid keyword/value", "unterminated quoted string in connection info string"):
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
	l := layoutURL(dsn)
	scheme := dsn[:strings.Index(dsn, "://")+3]
	end := len(dsn)
	if l.query >= 0 {
		end = l.query
	}
	if l.misplacedAt(dsn) {
		// A / or @ in the user info: where it ends is in doubt, so all
		// up to the last @ goes.
		return scheme + redacted + redactQuery(dsn[strings.LastIndexByte(dsn[:end], '@'):])
	}
	if !plausibleHosts(dsn[l.hostStart:l.hostEnd]) {
		// A port that is no number may be a piece of a password.
		return scheme + redacted
	}
	out := dsn[:l.hostStart]
	if l.userEnd >= 0 {
		user := dsn[len(scheme):l.userEnd]
		if name, _, hasPassword := strings.Cut(user, ":"); hasPassword {
			user = name + ":" + redacted
		}
		out = scheme + user + "@"
	}
	return out + redactQuery(dsn[l.hostStart:])
}

// plausibleHosts reports whether every port of a URL's host list is a
// number or empty.
func plausibleHosts(hosts string) bool {
	for _, h := range strings.Split(hosts, ",") {
		if i := strings.LastIndexByte(h, ']'); i >= 0 {
			h = h[i+1:]
		}
		_, port, _ := strings.Cut(h, ":")
		if strings.Trim(port, "0123456789") != "" {
			return false
		}
	}
	return true
}

// redactQuery hides the values of password and sslpassword in the query of
// s (from its first ?), keeping everything else as written.
func redactQuery(s string) string {
	q := strings.IndexByte(s, '?')
	if q < 0 {
		return s
	}
	params := strings.Split(s[q+1:], "&")
	for i, param := range params {
		key, _, _ := strings.Cut(param, "=")
		if k, err := url.PathUnescape(strings.Trim(key, " ")); err != nil || secretKey(k) {
			params[i] = key + "=" + redacted
		}
	}
	return s[:q+1] + strings.Join(params, "&")
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
// DSN). A setting given here replaces the DSN's. A ca_file without a mode
// means verify-full: a CA is given to be checked against (libpq's default,
// prefer, would load it and check nothing).
func withTLS(dsn string, t PostgresTLS) string {
	mode := t.Mode
	if mode == "" && t.CAFile != "" {
		mode = "verify-full"
	}
	set := [][2]string{{"sslmode", mode}, {"sslrootcert", t.CAFile}, {"sslcert", t.CertFile}, {"sslkey", t.KeyFile}}
	for _, kv := range set {
		if kv[1] == "" {
			continue
		}
		if !isURL(dsn) {
			// Later settings win in pgconn's keyword=value parser.
			dsn += " " + kv[0] + "='" + escapeKV(kv[1]) + "'"
			continue
		}
		// And in its URL query.
		switch {
		case layoutURL(dsn).query < 0:
			dsn += "?"
		case !strings.HasSuffix(dsn, "?") && !strings.HasSuffix(dsn, "&"):
			dsn += "&"
		}
		dsn += kv[0] + "=" + percentEncode(kv[1])
	}
	return dsn
}

// ---- TLS ----

// TLSWarning says, when the DSN reaches PostgreSQL over the network below
// verify-full, which hosts and what is missing, with the fix; "" when every
// host is verified, or is on this machine (a loopback address, localhost or
// a Unix socket), or the DSN does not parse (Validate says why). libpq's
// default, prefer, checks no certificate and falls back to plaintext: the
// role's password and the events go to whoever answers. The daemon logs it
// at every start and check reports it (a warning, not a failure: a private
// network may be trusted on purpose).
func (p Postgres) TLSWarning() (detail, fix string) {
	cfg, reason := p.connConfig()
	if reason != "" {
		return "", ""
	}
	var hosts []string
	var plain, unchecked bool
	seen := map[string]bool{}
	targets := []*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}
	for _, fb := range append(targets, cfg.Fallbacks...) {
		if onThisMachine(fb.Host) {
			continue
		}
		switch t := fb.TLSConfig; {
		case t == nil:
			plain = true
		case t.InsecureSkipVerify && t.VerifyPeerCertificate == nil:
			unchecked = true
		case !t.InsecureSkipVerify:
			continue // verify-full
		}
		if addr := net.JoinHostPort(fb.Host, strconv.Itoa(int(fb.Port))); !seen[addr] {
			seen[addr] = true
			hosts = append(hosts, addr)
		}
	}
	var how string
	switch {
	case len(hosts) == 0:
		return "", ""
	case plain && unchecked:
		how = "over TLS without checking the server's certificate, or in plaintext when the server offers no TLS (sslmode prefer or allow, libpq's default)"
	case plain:
		how = "in plaintext (sslmode disable)"
	case unchecked:
		how = "over TLS without checking the server's certificate (sslmode require)"
	default:
		how = "over TLS that checks the certificate's CA but not the server's name (sslmode verify-ca)"
	}
	detail = fmt.Sprintf("outboxd reaches PostgreSQL at %s %s: whoever answers at that address gets the role's password and the events", strings.Join(hosts, ", "), how)
	return detail, "set postgres.tls.mode: verify-full and postgres.tls.ca_file to the CA that signed the server's certificate"
}

// onThisMachine: a Unix socket, localhost or a loopback address.
func onThisMachine(host string) bool {
	if strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
