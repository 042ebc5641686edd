package postgres

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestExplain: a connection failure caused by the TLS settings is named
// with its fix; anything else is not explained (the runner retries it, or
// stops on its SQLSTATE).
func TestExplain(t *testing.T) {
	wrap := func(err error) error {
		return fmt.Errorf("failed to connect to `user=u database=d`: tls error: %w", err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want string // "" : not a TLS matter
	}{
		{"unknown CA", wrap(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), "postgres.tls.ca_file"},
		{"wrong host", wrap(&tls.CertificateVerificationError{Err: x509.HostnameError{Host: "db.invalid", Certificate: &x509.Certificate{}}}), `not valid for "db.invalid"`},
		{"expired", wrap(&tls.CertificateVerificationError{Err: x509.CertificateInvalidError{Reason: x509.Expired, Cert: &x509.Certificate{}}}), "TLS: the server's certificate is not valid"},
		{"client certificate refused", wrap(&net.OpError{Op: "remote error", Err: errors.New("tls: bad certificate")}), "postgres.tls.cert_file"},
		{"ssl off", errors.New("failed to connect to `user=u database=d`: server refused TLS connection"), "ssl = off"},
		{"hostssl only", &pgconn.PgError{Code: "28000", Message: `no pg_hba.conf entry for host "127.0.0.1", user "u", database "d", no encryption`}, "postgres.tls.mode"},
		{"cert auth without a certificate", &pgconn.PgError{Code: "28000", Message: "connection requires a valid client certificate"}, "postgres.tls.cert_file"},
		{"no pg_hba entry at all", &pgconn.PgError{Code: "28000", Message: `no pg_hba.conf entry for host "10.0.0.1", user "u", database "d", SSL encryption`}, ""},
		{"wrong password", &pgconn.PgError{Code: "28P01", Message: "password authentication failed for user \"u\""}, ""},
		{"refused", &net.OpError{Op: "dial", Err: errors.New("connect: connection refused")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why := Explain(tc.err)
			if tc.want == "" {
				if why != "" {
					t.Fatalf("explained as %q", why)
				}
				return
			}
			if !strings.Contains(why, tc.want) {
				t.Fatalf("got %q, want %q", why, tc.want)
			}
		})
	}
}
