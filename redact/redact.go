// Package redact hides the credentials a URL may carry before it is
// logged or quoted in an error: a schema registry's
// (https://key:secret@registry:8081, whose user info Go's HTTP client sends
// as basic authentication) or an OTLP endpoint's. A PostgreSQL DSN has its
// own reading rules (config.Postgres.RedactedDSN).
package redact

import (
	"net/url"
	"strings"
)

// Hidden replaces what is hidden.
const Hidden = "xxxxx"

// URL is raw with its password, and the values of query parameters that
// name a secret (password, secret, token, key, signature...), replaced by
// Hidden; a URL that does not parse shows only its scheme when it may hold
// user info (an @), and is returned as it is otherwise.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if !strings.Contains(raw, "@") {
			return raw
		}
		if i := strings.Index(raw, "://"); i >= 0 {
			return raw[:i+3] + Hidden
		}
		return Hidden
	}
	changed := false
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User, changed = url.UserPassword(u.User.Username(), Hidden), true
		}
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k := range q {
			if secretParam(k) {
				q.Set(k, Hidden)
				changed = true
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
	}
	if !changed {
		return raw
	}
	return u.String()
}

func secretParam(k string) bool {
	k = strings.ToLower(k)
	for _, s := range []string{"password", "passwd", "secret", "token", "key", "signature", "sig", "auth", "credential"} {
		if strings.Contains(k, s) {
			return true
		}
	}
	return false
}
