package config

import (
	"net/url"
	"regexp"
	"strings"
)

const redacted = "xxxxx"

var (
	kvPassword       = regexp.MustCompile(`\bpassword(\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:[^\s\\]|\\.)+)`)
	urlQueryPassword = regexp.MustCompile(`(password=)[^&#]*`)
)

// RedactedDSN returns the DSN with any password replaced by "xxxxx", for logs.
// It handles the URL form (postgres://u:pw@h/db, and ?password=) and the
// key=value form (password=pw or password='p w').
func (p Postgres) RedactedDSN() string {
	dsn := p.DSN
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return kvPassword.ReplaceAllString(dsn, "password${1}"+redacted)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		// Unparseable: never risk printing the user info.
		scheme, rest, _ := strings.Cut(dsn, "://")
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			rest = redacted + rest[at:]
		}
		rest = urlQueryPassword.ReplaceAllString(rest, "${1}"+redacted)
		return scheme + "://" + rest
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", redacted)
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
