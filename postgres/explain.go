package postgres

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Explain names a failed connection to PostgreSQL that is about its
// TLS settings (postgres.tls, or the DSN's sslmode, sslrootcert, sslcert,
// sslkey), with the fix; "" for any other failure. Such a failure is the
// same at every attempt, so the daemon stops on it rather than retrying for
// ever, and `check` gives the same fix. It never quotes a credential.
func Explain(err error) string {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		pgErr     *pgconn.PgError
		op        *net.OpError
	)
	switch {
	case errors.As(err, &unknownCA):
		return "TLS: the server's certificate is not signed by the CA outboxd trusts: set postgres.tls.ca_file (or the DSN's sslrootcert) to the CA that signed it"
	case errors.As(err, &hostname):
		return fmt.Sprintf("TLS: the server's certificate is not valid for %q: connect by a name it holds (verify-full checks the host name against the certificate)", hostname.Host)
	case errors.As(err, &invalid):
		return "TLS: the server's certificate is not valid (" + invalid.Error() + ")"
	case errors.As(err, &op) && op.Op == "remote error" && op.Err != nil && strings.HasPrefix(op.Err.Error(), "tls: "):
		// crypto/tls's report of an alert the server sent.
		return "TLS: the server refused the handshake (" + op.Err.Error() + "): check postgres.tls.cert_file and key_file (a client certificate signed by the CA the server trusts)"
	case strings.Contains(err.Error(), "server refused TLS connection"):
		return "TLS: the server does not accept TLS connections (ssl = off): turn ssl on in postgresql.conf, with a certificate signed by the CA of postgres.tls.ca_file (without TLS the role's password and the events cross the network in clear)"
	case errors.As(err, &pgErr) && pgErr.Code == "28000" && strings.HasSuffix(pgErr.Message, ", no encryption"):
		return "the server's pg_hba.conf accepts this connection only over TLS (hostssl): set postgres.tls.mode to verify-full, with postgres.tls.ca_file"
	case errors.As(err, &pgErr) && pgErr.Code == "28000" && strings.Contains(pgErr.Message, "requires a valid client certificate"):
		return "TLS: the server requires a client certificate: set postgres.tls.cert_file and key_file"
	}
	return ""
}
