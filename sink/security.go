package sink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/aws_msk_iam_v2"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/outboxd/outboxd/certs"
)

// TLSOptions is kafka.tls, as configured.
type TLSOptions struct {
	Enable     bool
	CAFile     string // "": the system's trusted roots
	CertFile   string // client certificate (mTLS), with KeyFile
	KeyFile    string
	ServerName string // "": the host of the address dialled
	MinVersion string // one of TLSVersions; "": 1.2
	// InsecureSkipVerify accepts any certificate: for a test cluster only;
	// outboxd logs a warning at every start.
	InsecureSkipVerify bool
}

// SASLOptions is kafka.sasl, as configured (secrets already read).
type SASLOptions struct {
	Mechanism string // "": none; one of SASLMechanisms
	Username  string
	Password  string
	// AWSRegion is the MSK cluster's region for AWS_MSK_IAM; "": the AWS
	// SDK's (AWS_REGION, the shared config).
	AWSRegion string
}

// SASL mechanism names, as Kafka spells them.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
	SASLAWSMSKIAM   = "AWS_MSK_IAM"
)

// mechanisms are the SASLOptions.Mechanism values and how each is built.
var mechanisms = []option[func(context.Context, SASLOptions) (sasl.Mechanism, error)]{
	{SASLPlain, plainMechanism}, {SASLScramSHA256, scramMechanism}, {SASLScramSHA512, scramMechanism}, {SASLAWSMSKIAM, awsMechanism},
}

// SASLMechanisms lists the SASLOptions.Mechanism values
// (kafka.sasl.mechanism).
func SASLMechanisms() []string { return names(mechanisms) }

// tlsVersions are the TLSOptions.MinVersion values.
var tlsVersions = []option[uint16]{{"1.2", tls.VersionTLS12}, {"1.3", tls.VersionTLS13}}

// TLSVersions lists the TLSOptions.MinVersion values
// (kafka.tls.min_version).
func TLSVersions() []string { return names(tlsVersions) }

// BuildTLS turns the options into a client tls.Config; nil when TLS is off.
// Files are read now, so a missing or malformed one fails at start.
func BuildTLS(o TLSOptions) (*tls.Config, error) {
	if !o.Enable {
		return nil, nil
	}
	c := &tls.Config{ServerName: o.ServerName, InsecureSkipVerify: o.InsecureSkipVerify, MinVersion: tls.VersionTLS12}
	if o.MinVersion != "" {
		v, ok := lookup(tlsVersions, o.MinVersion)
		if !ok {
			return nil, fmt.Errorf("kafka.tls.min_version %q: want %s", o.MinVersion, either(TLSVersions()))
		}
		c.MinVersion = v
	}
	if o.CAFile != "" {
		pool, err := certs.CAPool(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.tls.ca_file: %w", err)
		}
		c.RootCAs = pool
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, errors.New("kafka.tls.cert_file and kafka.tls.key_file go together (mTLS)")
	}
	if o.CertFile != "" {
		// The error names the files, never the key's content.
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("kafka.tls.cert_file %s / key_file %s: %w", o.CertFile, o.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// BuildSASL turns the options into a kafka-go mechanism; nil when SASL is
// off.
func BuildSASL(ctx context.Context, o SASLOptions) (sasl.Mechanism, error) {
	if o.Mechanism == "" {
		return nil, nil
	}
	build, ok := lookup(mechanisms, o.Mechanism)
	if !ok {
		return nil, fmt.Errorf("kafka.sasl.mechanism %q: want %s", o.Mechanism, either(SASLMechanisms()))
	}
	return build(ctx, o)
}

func plainMechanism(_ context.Context, o SASLOptions) (sasl.Mechanism, error) {
	return plain.Mechanism{Username: o.Username, Password: o.Password}, nil
}

func scramMechanism(_ context.Context, o SASLOptions) (sasl.Mechanism, error) {
	algo := scram.SHA256
	if o.Mechanism == SASLScramSHA512 {
		algo = scram.SHA512
	}
	m, err := scram.Mechanism(algo, o.Username, o.Password)
	if err != nil {
		// SASLprep refused the username or password; say which without
		// quoting either.
		return nil, fmt.Errorf("kafka.sasl: the username or password is not valid for %s (SASLprep refused it)", o.Mechanism)
	}
	return m, nil
}

// awsMechanism takes its credentials from the AWS SDK's default chain:
// environment, shared files, web identity (EKS IRSA), container or
// instance role. They are fetched (and refreshed) when a connection
// authenticates.
func awsMechanism(ctx context.Context, o SASLOptions) (sasl.Mechanism, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if o.AWSRegion != "" {
		opts = append(opts, awsconfig.WithRegion(o.AWSRegion))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka.sasl AWS_MSK_IAM: load the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, errors.New("kafka.sasl AWS_MSK_IAM: no AWS region: set kafka.sasl.aws_region or AWS_REGION")
	}
	return aws_msk_iam_v2.NewMechanism(cfg), nil
}

// Explain names a connection failure for what it is, TLS or SASL, with the
// fix; "" when err is none of those. It never quotes a credential (kafka-go's
// errors do not carry them).
func Explain(err error) string {
	why, _ := explain(err)
	return why
}

// authFailure is err as an AuthError when it is a TLS or SASL failure that
// no retry can fix (an untrusted certificate, a wrong password), nil
// otherwise.
func authFailure(err error) *AuthError {
	var ae *AuthError
	if errors.As(err, &ae) {
		return ae
	}
	if why, definitive := explain(err); definitive {
		return &AuthError{Reason: why, Err: err}
	}
	return nil
}

// explain is Explain, and whether the failure is definitive (the same
// connection fails the same way every time) or may be an outage.
func explain(err error) (why string, definitive bool) {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		recordHdr tls.RecordHeaderError
		kerr      kafka.Error
	)
	switch {
	case errors.As(err, &unknownCA):
		return "TLS: the broker's certificate is not signed by a trusted CA: set kafka.tls.ca_file to the CA that signed it", true
	case errors.As(err, &hostname):
		return fmt.Sprintf("TLS: the broker's certificate is not valid for %q: connect by a name the certificate holds, or set kafka.tls.server_name to one", hostname.Host), true
	case errors.As(err, &invalid):
		return "TLS: the broker's certificate is not valid (" + invalid.Error() + ")", true
	case errors.As(err, &recordHdr):
		return "TLS: the broker's listener does not speak TLS: turn kafka.tls off or use the broker's SSL/SASL_SSL port", true
	case tlsAlert(err) != "":
		return "TLS: the broker refused the handshake (" + tlsAlert(err) + "): it may require a client certificate (kafka.tls.cert_file, key_file) it trusts", true
	case errors.As(err, &kerr) && kerr == kafka.SASLAuthenticationFailed:
		return "SASL: authentication failed: check kafka.sasl.username, the password and kafka.sasl.mechanism (the broker must have the user for that mechanism)", true
	case errors.As(err, &kerr) && (kerr == kafka.UnsupportedSASLMechanism || kerr == kafka.IllegalSASLState):
		return "SASL: the broker does not take kafka.sasl.mechanism on this listener: use one its sasl.enabled.mechanisms lists", true
	case errors.Is(err, errBrokerClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
		return "the broker closed the connection: it may be restarting, or the listener may need TLS (kafka.tls.enable) or SASL (kafka.sasl), or refuse this client", false
	}
	var nerr net.Error
	if errors.As(err, &nerr) && nerr.Timeout() && strings.Contains(err.Error(), "tls") {
		return "TLS: the handshake timed out: the port may not be a TLS listener", false
	}
	return "", false
}

// badRecordMAC: crypto/tls could not decrypt a record the broker sent (a
// net.OpError "local error" around the bad_record_mac alert it raised).
// A Kafka 2.x broker (2.8.2 on Java 17 seen) that requires a client
// certificate and got none sends, after a TLS 1.3 handshake, a record no
// client can decrypt instead of the certificate_required alert (openssl
// s_client: "decryption failed or bad record mac"); Kafka 3.x and 4.x send
// the alert. Taken for the broker's refusal only on the first request of
// a connection outboxd dials itself (dial): later, a record that does not
// decrypt may be a fault on the way, and is retried.
func badRecordMAC(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "local error" && op.Err != nil && op.Err.Error() == "tls: bad record MAC"
}

// tlsAlert is the alert the broker's TLS stack sent ("tls: bad
// certificate"), "" when err is no such alert. Over TCP, crypto/tls reports
// a received alert as a net.OpError "remote error" around its unexported
// alert type (tls.AlertError is QUIC's); a broker that requires a client
// certificate sends one, during the handshake with TLS 1.2 and on the first
// read with TLS 1.3.
func tlsAlert(err error) string {
	var alert tls.AlertError
	if errors.As(err, &alert) {
		return alert.Error()
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" && op.Err != nil && strings.HasPrefix(op.Err.Error(), "tls: ") {
		return op.Err.Error()
	}
	return ""
}
