package sink

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
)

// testPKI is a throwaway CA and a server certificate for "broker.test".
type testPKI struct {
	caFile   string
	server   tls.Certificate
	certFile string // a client certificate signed by the CA, with keyFile
	keyFile  string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(cn string, usage x509.ExtKeyUsage, dns ...string) (certPEM, keyPEM []byte) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(key)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	}
	p := testPKI{caFile: filepath.Join(dir, "ca.pem"), certFile: filepath.Join(dir, "client.pem"), keyFile: filepath.Join(dir, "client.key")}
	write := func(path string, b []byte) {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
	sc, sk := issue("broker", x509.ExtKeyUsageServerAuth, "broker.test")
	if p.server, err = tls.X509KeyPair(sc, sk); err != nil {
		t.Fatal(err)
	}
	cc, ck := issue("outboxd", x509.ExtKeyUsageClientAuth)
	write(p.certFile, cc)
	write(p.keyFile, ck)
	return p
}

func TestBuildTLS(t *testing.T) {
	p := newTestPKI(t)
	if c, err := BuildTLS(TLSOptions{}); c != nil || err != nil {
		t.Fatalf("TLS off: %v %v", c, err)
	}
	c, err := BuildTLS(TLSOptions{Enable: true, CAFile: p.caFile, CertFile: p.certFile, KeyFile: p.keyFile, ServerName: "broker.test", MinVersion: "1.3"})
	if err != nil || c.RootCAs == nil || len(c.Certificates) != 1 || c.MinVersion != tls.VersionTLS13 || c.ServerName != "broker.test" || c.InsecureSkipVerify {
		t.Fatalf("full options: %+v, %v", c, err)
	}
	if c, err := BuildTLS(TLSOptions{Enable: true}); err != nil || c.RootCAs != nil || c.MinVersion != tls.VersionTLS12 {
		t.Fatalf("system roots, TLS 1.2 at least: %+v, %v", c, err)
	}
	notPEM := filepath.Join(t.TempDir(), "x")
	os.WriteFile(notPEM, []byte("hola"), 0o600)
	for _, tc := range []struct {
		o    TLSOptions
		want string
	}{
		{TLSOptions{Enable: true, CAFile: "/nonexistent/ca.pem"}, "kafka.tls.ca_file"},
		{TLSOptions{Enable: true, CAFile: notPEM}, "holds no PEM certificate"},
		{TLSOptions{Enable: true, CertFile: p.certFile}, "go together"},
		{TLSOptions{Enable: true, CertFile: p.certFile, KeyFile: p.caFile}, "key_file"},
		{TLSOptions{Enable: true, MinVersion: "1.0"}, "want 1.2 or 1.3"},
	} {
		if _, err := BuildTLS(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.o, err, tc.want)
		}
	}
}

func TestBuildSASL(t *testing.T) {
	for _, m := range []string{SASLPlain, SASLScramSHA256, SASLScramSHA512} {
		mech, err := BuildSASL(context.Background(), SASLOptions{Mechanism: m, Username: "outboxd", Password: `p@ss/w"rd`})
		if err != nil || mech == nil || mech.Name() != m {
			t.Errorf("%s: %v %v", m, mech, err)
		}
	}
	if m, err := BuildSASL(context.Background(), SASLOptions{}); m != nil || err != nil {
		t.Errorf("no SASL: %v %v", m, err)
	}
	if _, err := BuildSASL(context.Background(), SASLOptions{Mechanism: "GSSAPI"}); err == nil || !strings.Contains(err.Error(), "SCRAM-SHA-512") {
		t.Errorf("an unknown mechanism: %v", err)
	}
	// SASLprep refuses a control character; the error must not quote it.
	if _, err := BuildSASL(context.Background(), SASLOptions{Mechanism: SASLScramSHA256, Username: "u", Password: "secret\u0007x"}); err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("a password SASLprep refuses: %v", err)
	}
}

// TestTLSFailuresAreNamedAndPermanent dials a TLS listener with the
// producer's own Dial: each misconfiguration fails with an error that says
// it is TLS and how to fix it, and counts as permanent (no replay loop).
func TestTLSFailuresAreNamedAndPermanent(t *testing.T) {
	p := newTestPKI(t)
	tlsLn, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{p.server}})
	if err != nil {
		t.Fatal(err)
	}
	defer tlsLn.Close()
	plainLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer plainLn.Close()
	// Listeners that require a client certificate signed by the CA, as a
	// broker's SSL listener with ssl.client.auth=required: TLS 1.3 (the
	// client learns of the refusal at its first read, after its handshake
	// completed) and TLS 1.2 (during the handshake).
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(p.caFile)
	pool.AppendCertsFromPEM(caPEM)
	// A listener that refuses as Kafka 2.x does: it asks for a client
	// certificate, completes the TLS 1.3 handshake without one, then sends
	// a record the client cannot decrypt instead of an alert.
	garbled, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer garbled.Close()
	go func() {
		for {
			c, err := garbled.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if tls.Server(c, &tls.Config{Certificates: []tls.Certificate{p.server}, ClientAuth: tls.RequestClientCert}).Handshake() != nil {
					return
				}
				record := append([]byte{23, 3, 3, 0, 32}, make([]byte, 32)...) // application data, 32 bytes of nothing
				_, _ = c.Write(record)
				_ = c.SetReadDeadline(time.Now().Add(time.Minute))
				_, _ = c.Read(make([]byte, 1))
			}()
		}
	}()
	var mtlsLns []net.Listener
	for _, v := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{p.server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool, MaxVersion: v})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		mtlsLns = append(mtlsLns, ln)
	}
	// All accept and, for TLS, complete (or fail) the handshake.
	for _, ln := range append([]net.Listener{tlsLn, plainLn}, mtlsLns...) {
		go func(ln net.Listener) {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					if tc, ok := c.(*tls.Conn); ok {
						_ = tc.Handshake()
					} else {
						c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
					}
					// Hold the connection until the client has spoken
					// (or given up), then hang up.
					_ = c.SetReadDeadline(time.Now().Add(time.Minute))
					_, _ = c.Read(make([]byte, 1))
					c.Close()
				}()
			}
		}(ln)
	}
	dial := func(o TLSOptions, addr string) error {
		c, err := BuildTLS(o)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := Dial(context.Background(), Config{ClientID: "outboxd", TLS: c}, addr)
		if err == nil {
			conn.Close()
		}
		return err
	}
	for _, tc := range []struct {
		name string
		o    TLSOptions
		addr string
		want string
	}{
		{"untrusted certificate", TLSOptions{Enable: true, ServerName: "broker.test"}, tlsLn.Addr().String(), "not signed by a trusted CA"},
		{"wrong server name", TLSOptions{Enable: true, CAFile: p.caFile, ServerName: "other.test"}, tlsLn.Addr().String(), `not valid for "other.test"`},
		{"plaintext listener", TLSOptions{Enable: true, CAFile: p.caFile, ServerName: "broker.test"}, plainLn.Addr().String(), "does not speak TLS"},
		{"no client certificate, TLS 1.3", TLSOptions{Enable: true, CAFile: p.caFile, ServerName: "broker.test"}, mtlsLns[0].Addr().String(), "refused the handshake (tls: certificate required)"},
		{"no client certificate, TLS 1.2", TLSOptions{Enable: true, CAFile: p.caFile, ServerName: "broker.test"}, mtlsLns[1].Addr().String(), "refused the handshake (tls: "},
		{"no client certificate, Kafka 2.x", TLSOptions{Enable: true, CAFile: p.caFile, ServerName: "broker.test"}, garbled.Addr().String(), "refused the handshake (tls: bad record MAC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := dial(tc.o, tc.addr)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "TLS: ") {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			if retriable(err) || authFailure(err) == nil {
				t.Errorf("%v must be permanent", err)
			}
		})
	}
	// The right CA and name pass the handshake (the listener is no Kafka
	// broker, so the API versions request fails after it: not a TLS error).
	err = dial(TLSOptions{Enable: true, CAFile: p.caFile, ServerName: "broker.test"}, tlsLn.Addr().String())
	if err == nil || strings.HasPrefix(err.Error(), "TLS: ") {
		t.Errorf("a trusted handshake: %v", err)
	}
}

func TestSASLFailuresArePermanent(t *testing.T) {
	for _, kerr := range []kafka.Error{kafka.SASLAuthenticationFailed, kafka.UnsupportedSASLMechanism} {
		err := error(kerr)
		if !strings.HasPrefix(Explain(err), "SASL: ") || retriable(err) || authFailure(err) == nil {
			t.Errorf("%v: explain %q, retriable %v", kerr, Explain(err), retriable(err))
		}
	}
	// An outage is not an authentication failure, nor is a record that does
	// not decrypt on a connection past its first request (dial takes that
	// for Kafka 2.x's refusal, on the first request only).
	for _, err := range []error{errors.New("dial tcp: connection refused"), kafka.NotLeaderForPartition,
		&net.OpError{Op: "local error", Err: errors.New("tls: bad record MAC")}} {
		if authFailure(err) != nil {
			t.Errorf("%v taken for an authentication failure", err)
		}
	}
}

// TestAWSMSKIAM: not tested against AWS (no AWS account here). It checks the
// wiring: the mechanism takes the region and the credentials from the AWS
// SDK's default chain and signs the kafka-cluster:Connect request that MSK
// checks, for the broker's host.
func TestAWSMSKIAM(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	if _, err := BuildSASL(context.Background(), SASLOptions{Mechanism: SASLAWSMSKIAM}); err == nil || !strings.Contains(err.Error(), "no AWS region") {
		t.Fatalf("without a region: %v", err)
	}
	mech, err := BuildSASL(context.Background(), SASLOptions{Mechanism: SASLAWSMSKIAM, AWSRegion: "eu-west-1"})
	if err != nil || mech.Name() != "AWS_MSK_IAM" {
		t.Fatalf("%v %v", mech, err)
	}
	ctx := sasl.WithMetadata(context.Background(), &sasl.Metadata{Host: "b-1.msk.example", Port: 9098})
	_, ir, err := mech.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var payload map[string]string
	if err := json.Unmarshal(ir, &payload); err != nil {
		t.Fatal(err)
	}
	if payload["action"] != "kafka-cluster:Connect" || payload["host"] != "b-1.msk.example" ||
		!strings.HasPrefix(payload["x-amz-credential"], "AKIDEXAMPLE/") || !strings.Contains(payload["x-amz-credential"], "/eu-west-1/kafka-cluster/") || payload["x-amz-signature"] == "" {
		t.Errorf("signed payload %v", payload)
	}
}
