package config

import (
	"net/url"
	"strings"
)

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
	if l.userInDoubt(dsn) {
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
