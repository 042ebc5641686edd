package sink

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/apiversions"
	meta "github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/protocol/saslauthenticate"
	"github.com/segmentio/kafka-go/protocol/saslhandshake"
	"github.com/segmentio/kafka-go/sasl/plain"
)

// notKafka listens on a local port and answers the first connection with
// serve, as a service that is not Kafka would. It returns the address and
// what the connection received before serve returned.
func notKafka(t *testing.T, serve func(c net.Conn, received *bytes.Buffer)) (string, func() string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		serve(c, &got)
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String(), func() string {
		ln.Close()
		wg.Wait()
		return got.String()
	}
}

// serveRequests answers the requests c receives with answer's response
// until answer returns nil or last, or the connection ends.
func serveRequests(c net.Conn, answer func(msg protocol.Message) (res protocol.Message, last bool)) {
	for {
		version, id, _, msg, err := protocol.ReadRequest(c)
		if err != nil {
			return
		}
		res, last := answer(msg)
		if res == nil {
			return
		}
		if err := protocol.WriteResponse(c, version, id, res); err != nil || last {
			return
		}
	}
}

// readRequest reads what the client sent first into got.
func readRequest(c net.Conn, got *bytes.Buffer) {
	buf := make([]byte, 512)
	n, _ := c.Read(buf)
	got.Write(buf[:n])
}

// TestDialRefusesWhatIsNotKafka: Dial asks the address for its API versions
// with the configured client id, and a port that accepts TCP but does not
// answer as a Kafka broker fails with an error that says so; a port that
// refuses the connection fails as a dial error.
func TestDialRefusesWhatIsNotKafka(t *testing.T) {
	const notABroker = "accepts TCP but does not answer as a Kafka broker"
	for _, tc := range []struct {
		name    string
		serve   func(c net.Conn, got *bytes.Buffer) // nil: nothing listens
		timeout time.Duration
		reads   bool // serve reads the request
	}{
		{"nothing listens", nil, time.Second, false},
		{"closes at once", func(net.Conn, *bytes.Buffer) {}, time.Second, false},
		{"answers as PostgreSQL", func(c net.Conn, got *bytes.Buffer) {
			readRequest(c, got)
			// An ErrorResponse to what PostgreSQL takes for a startup packet
			// of protocol 18.0 (ApiVersions' key), then the end.
			msg := "SFATAL\x00C0A000\x00Munsupported frontend protocol 18.0\x00\x00"
			_, _ = c.Write(append([]byte{'E', 0, 0, 0, byte(4 + len(msg))}, msg...))
		}, time.Second, true},
		{"silent", func(c net.Conn, got *bytes.Buffer) {
			readRequest(c, got)
			_, _ = io.Copy(io.Discard, c) // until the client gives up
		}, 300 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, received := "127.0.0.1:1", func() string { return "" }
			if tc.serve != nil {
				addr, received = notKafka(t, tc.serve)
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			conn, err := Dial(ctx, Config{ClientID: "outboxd-probe"}, addr)
			if err == nil {
				conn.Close()
				t.Fatal("Dial took it for a Kafka broker")
			}
			if tc.serve == nil {
				if strings.Contains(err.Error(), notABroker) {
					t.Errorf("a refused connection reported as %q", err)
				}
				return
			}
			if !strings.Contains(err.Error(), notABroker) || !strings.Contains(err.Error(), addr) {
				t.Errorf("want %q naming %s, got %v", notABroker, addr, err)
			}
			if got := received(); tc.reads && !strings.Contains(got, "outboxd-probe") {
				t.Errorf("the request did not carry the client id: %q", got)
			}
		})
	}
}

// saslBroker listens on a local port (with TLS when cert is set) and speaks
// Kafka as far as SASL authentication: it answers ApiVersions and
// SaslHandshake, then meets SaslAuthenticate by closing the connection
// (refuse false: what a broker restarting under its clients does, as in a
// rolling restart) or by refusing the credentials as a broker of Kafka 1.0
// and later does (SASL_AUTHENTICATION_FAILED with a message, then the end of
// the connection). A real broker cannot be made to close a connection at
// that exact request: this is the fake for it.
func saslBroker(t *testing.T, refuse bool, cert *tls.Certificate) string {
	t.Helper()
	var ln net.Listener
	var err error
	if cert != nil {
		ln, err = tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{*cert}})
	} else {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	serve := func(c net.Conn) {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		serveRequests(c, func(msg protocol.Message) (protocol.Message, bool) {
			switch msg.(type) {
			case *apiversions.Request:
				return &apiversions.Response{ApiKeys: []apiversions.ApiKeyResponse{
					{ApiKey: int16(protocol.ApiVersions), MaxVersion: 2},
					{ApiKey: int16(protocol.SaslHandshake), MaxVersion: 1},
					{ApiKey: int16(protocol.SaslAuthenticate), MaxVersion: 1},
					{ApiKey: int16(protocol.Metadata), MaxVersion: 8}}}, false
			case *saslhandshake.Request:
				return &saslhandshake.Response{Mechanisms: []string{"PLAIN"}}, false
			case *saslauthenticate.Request:
				if !refuse {
					return nil, true // the broker goes away
				}
				return &saslauthenticate.Response{ErrorCode: int16(kafka.SASLAuthenticationFailed), ErrorMessage: "Authentication failed: Invalid username or password"}, true
			}
			return nil, true
		})
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); serve(c) }()
		}
	}()
	return ln.Addr().String()
}

// TestSASLClosedIsAnOutage (issue 19 item 8): a broker that closes the
// connection in the middle of SASL authentication (a rolling restart) is an
// outage: retried, not taken for a wrong password, on the producer's
// connections and on check's and the health monitor's (Dial), in clear and
// over TLS (where the broker's end is a close_notify). A broker that refuses
// the credentials is still a permanent SASL failure. Before, kafka-go's
// reading of the end as SASL_AUTHENTICATION_FAILED stopped outboxd (exit
// 1) with "SASL: authentication failed: check kafka.sasl.username ...".
func TestSASLClosedIsAnOutage(t *testing.T) {
	p := newTestPKI(t)
	for _, useTLS := range []bool{false, true} {
		for _, refuse := range []bool{false, true} {
			t.Run(fmt.Sprintf("tls=%v/refuse=%v", useTLS, refuse), func(t *testing.T) {
				cfg := Config{ClientID: "outboxd-test", SASL: plain.Mechanism{Username: "outboxd", Password: "secret"}}
				var cert *tls.Certificate
				if useTLS {
					cert = &p.server
					tc, err := BuildTLS(TLSOptions{Enable: true, CAFile: p.caFile, ServerName: "broker.test"})
					if err != nil {
						t.Fatal(err)
					}
					cfg.TLS = tc
				}
				addr := saslBroker(t, refuse, cert)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				tr := newTransport(cfg)
				defer tr.CloseIdleConnections()
				_, produceErr := tr.RoundTrip(ctx, kafka.TCP(addr), &meta.Request{})
				_, dialErr := Dial(ctx, cfg, addr)
				for path, err := range map[string]error{"producer": produceErr, "Dial": dialErr} {
					if err == nil {
						t.Fatalf("%s: no error from a broker that does not let the client in", path)
					}
					t.Logf("%s: %v", path, err)
					if refuse {
						if authFailure(err) == nil || retriable(err) || !strings.HasPrefix(Explain(err), "SASL: authentication failed") {
							t.Errorf("%s: refused credentials must be a permanent SASL failure: %v (explained %q)", path, err, Explain(err))
						}
						continue
					}
					if authFailure(err) != nil || !retriable(err) || !strings.Contains(Explain(err), "closed the connection") {
						t.Errorf("%s: a connection closed during SASL must be an outage: %v (explained %q)", path, err, Explain(err))
					}
				}
			})
		}
	}
}
