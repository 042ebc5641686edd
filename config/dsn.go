package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
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
	if isURL(p.DSN) && layoutURL(p.DSN).userInDoubt(p.DSN) {
		return nil, "an @ after a ? or #: where the user info ends is in doubt (a password holding @, ? or # must be percent-encoded: @ as %40, ? as %3F, # as %23), or give the password as postgres.password or postgres.password_file"
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

// load reads the schema files and the password file of a route's
// registry, at load time: a file that cannot be read names its line.
func (s *SchemaRegistry) load(lines map[string]int, at string, readFile func(string) ([]byte, error)) []error {
	var errs []error
	if err := readSecretFile(lines, at+".password_file", s.PasswordFile, at+".password", &s.Password, readFile); err != nil {
		errs = append(errs, err)
	}
	for key, file := range s.Schemas {
		field := at + ".schemas." + key
		if readFile == nil {
			errs = append(errs, fmt.Errorf("line %d: %s: %s: no file can be read (Parse was given no readFile)", lines[field], field, file))
			continue
		}
		data, err := readFile(file)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %s: %w", lines[field], field, err))
			continue
		}
		if s.Texts == nil {
			s.Texts = map[string]string{}
		}
		s.Texts[key] = string(data)
	}
	return errs
}

// ---- TLS ----

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
