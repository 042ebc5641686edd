package sink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/apiversions"
	"github.com/segmentio/kafka-go/protocol/saslauthenticate"
	"github.com/segmentio/kafka-go/protocol/saslhandshake"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/outboxd/outboxd/quietconn"
)

// Every connection outboxd opens to Kafka is set up in this file: the
// producer's Transport, its produce connections (wire.go), and Dial for
// the probes (check, the health monitor). TLS and SASL belong here and
// nowhere else: kafka.Transport and kafka.Dialer both take a tls.Config
// and a SASL mechanism, and a produce connection authenticates as the
// Transport does, with the same mechanism (wire.setUp).

const (
	dialTimeout   = 5 * time.Second
	dialKeepAlive = 10 * time.Second
)

// newTransport is the producer's connection pool to cfg.Brokers.
func newTransport(cfg Config) *kafka.Transport {
	return &kafka.Transport{
		ClientID:    cfg.ClientID,
		Dial:        dialer(cfg),
		IdleTimeout: 30 * time.Second,
		MetadataTTL: metadataTTL,
		SASL:        cfg.SASL, // TLS: dialer's
	}
}

// dialer opens a connection to a broker: TCP, then TLS when cfg.TLS is set
// (here rather than in kafka-go, so that what kafka-go reads is what this
// connection returns), as a brokerConn.
func dialer(cfg Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	nd := &net.Dialer{Timeout: dialTimeout, KeepAlive: dialKeepAlive}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := nd.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c = quietconn.Wrap(c) // a produce request's write and read wake no monitor
		if cfg.TLS != nil {
			tc := cfg.TLS
			if tc.ServerName == "" {
				host, _, _ := net.SplitHostPort(addr)
				tc = tc.Clone()
				tc.ServerName = host
			}
			t := tls.Client(c, tc)
			if err := t.HandshakeContext(ctx); err != nil {
				c.Close()
				return nil, err
			}
			c = t
		}
		return brokerConn{c}, nil
	}
}

// errBrokerClosed is what a connection to a broker reads once the broker
// has closed it, instead of io.EOF, on purpose: kafka-go takes an io.EOF in
// the middle of SASL authentication for a refused password
// (SASLAuthenticationFailed, as brokers before Kafka 1.0 said it), which
// would turn a broker restarting under outboxd (a rolling restart) into
// "wrong credentials" and stop it. Brokers since 1.0 refuse credentials in
// a SaslAuthenticate answer (SASL_AUTHENTICATION_FAILED, with a message);
// a closed connection is an outage.
var errBrokerClosed = errors.New("the broker closed the connection")

// brokerConn is a connection to a broker whose end reads as
// errBrokerClosed.
type brokerConn struct{ net.Conn }

func (c brokerConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err == io.EOF {
		err = errBrokerClosed
	}
	return n, err
}

// Dial connects to the broker at addr as the producer does and asks for its
// API versions, so that a port that accepts TCP but does not speak Kafka (a
// PostgreSQL port, say) is not taken for a broker, then for the broker list,
// so that a connection the broker does not serve is not taken for a good
// one: a SASL listener answers the API versions before authentication and
// closes the connection at the next request. The connection has no
// deadline set; the caller closes it.
func Dial(ctx context.Context, cfg Config, addr string) (*kafka.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	d := &kafka.Dialer{ClientID: cfg.ClientID, Timeout: dialTimeout, DialFunc: dialer(cfg), SASLMechanism: cfg.SASL}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if why := Explain(err); why != "" {
			return nil, fmt.Errorf("%s: %w", why, err)
		}
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	if _, err := conn.ApiVersions(); err != nil {
		conn.Close()
		// With TLS 1.3 a broker's refusal of the client (no certificate)
		// arrives here, on the first read, rather than in the handshake:
		// an alert, or from Kafka 2.x a record that does not decrypt.
		if why, definitive := explain(err); definitive {
			return nil, fmt.Errorf("%s: %w", why, err)
		}
		if badRecordMAC(err) {
			return nil, &AuthError{Reason: "TLS: the broker refused the handshake (tls: bad record MAC: its first record after the handshake does not decrypt, which is how Kafka 2.x refuses a client it does not trust): it may require a client certificate (kafka.tls.cert_file, key_file) it trusts", Err: err}
		}
		return nil, fmt.Errorf("%s accepts TCP but does not answer as a Kafka broker: %w", addr, err)
	}
	if _, err := conn.Brokers(); err != nil {
		conn.Close()
		if why := Explain(err); why != "" {
			return nil, fmt.Errorf("%s: %w", why, err)
		}
		return nil, fmt.Errorf("%s answers as a Kafka broker but not a metadata request: %w", addr, err)
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, nil
}

// Prober asks brokers whether they answer as Kafka, as Dial does, on
// connections it keeps between probes: the health monitor's poll dialled
// every broker anew (TCP, TLS, SASL, two requests, a close), a dozen
// wake-ups of an idle outboxd per broker and poll (issue 36). A kept
// connection is asked its API versions; one that does not answer is
// closed and the broker dialled again at once, so that a broker that
// restarted is not reported down for a stale connection, and a broker
// whose new connections fail is.
type Prober struct {
	cfg   Config
	mu    sync.Mutex
	conns map[string]*kafka.Conn // idle, by address
}

// NewProber is a Prober of cfg's brokers; Close closes what it keeps.
func NewProber(cfg Config) *Prober {
	return &Prober{cfg: cfg, conns: map[string]*kafka.Conn{}}
}

// Probe reports whether the broker at addr answers as Kafka.
func (p *Prober) Probe(ctx context.Context, addr string) error {
	p.mu.Lock()
	c := p.conns[addr]
	delete(p.conns, addr) // in use: a concurrent probe of addr dials its own
	p.mu.Unlock()
	if c != nil {
		deadline := time.Now().Add(dialTimeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		_ = c.SetDeadline(deadline)
		if _, err := c.ApiVersions(); err == nil {
			_ = c.SetDeadline(time.Time{})
			p.keep(addr, c)
			return nil
		}
		c.Close()
	}
	c, err := Dial(ctx, p.cfg, addr)
	if err != nil {
		return err
	}
	p.keep(addr, c)
	return nil
}

func (p *Prober) keep(addr string, c *kafka.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil || p.conns[addr] != nil {
		c.Close()
		return
	}
	p.conns[addr] = c
}

// Close closes the kept connections; a probe after it keeps none.
func (p *Prober) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// connect dials addr and readies the connection for produce requests: the
// broker's API versions (it must take produceVersion), then SASL when
// configured, as kafka-go's Transport does for its own connections.
func (ws *wires) connect(ctx context.Context, addr string) (*wire, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	c, err := ws.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	w := &wire{c: c}
	if err := w.setUp(ctx, addr, ws.cfg.ClientID, ws.cfg.SASL); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	w.used = time.Now()
	return w, nil
}

// setUp asks the broker its API versions and authenticates, with
// correlation ids from 1; produce requests follow the last one.
func (w *wire) setUp(ctx context.Context, addr, clientID string, mech sasl.Mechanism) error {
	next := func() int32 { w.corr++; return w.corr }
	m, err := protocol.RoundTrip(w.c, 0, next(), clientID, &apiversions.Request{})
	if err != nil {
		return err
	}
	av := m.(*apiversions.Response)
	if av.ErrorCode != 0 {
		return fmt.Errorf("API versions from the broker at %s: %w", addr, kafka.Error(av.ErrorCode))
	}
	takes := false
	authVersion := int16(1) // SaslAuthenticate: v1 from Kafka 2.2, v0 before
	for _, k := range av.ApiKeys {
		switch protocol.ApiKey(k.ApiKey) {
		case protocol.Produce:
			takes = k.MinVersion <= produceVersion && produceVersion <= k.MaxVersion
		case protocol.SaslAuthenticate:
			authVersion = min(authVersion, k.MaxVersion)
		}
	}
	if !takes {
		return fmt.Errorf("the broker at %s does not take produce requests v%d (Kafka 2.1 and later do)", addr, produceVersion)
	}
	if mech == nil {
		return nil
	}
	m, err = protocol.RoundTrip(w.c, 1, next(), clientID, &saslhandshake.Request{Mechanism: mech.Name()})
	if err != nil {
		return err
	}
	if code := m.(*saslhandshake.Response).ErrorCode; code != 0 {
		return kafka.Error(code)
	}
	host, port, _ := net.SplitHostPort(addr)
	portNum, _ := strconv.Atoi(port)
	ctx = sasl.WithMetadata(ctx, &sasl.Metadata{Host: host, Port: portNum})
	sess, state, err := mech.Start(ctx)
	if err != nil {
		return err
	}
	for done := false; !done; {
		m, err := protocol.RoundTrip(w.c, authVersion, next(), clientID, &saslauthenticate.Request{AuthBytes: state})
		if err != nil {
			return err
		}
		r := m.(*saslauthenticate.Response)
		if r.ErrorCode != 0 {
			return codeError(r.ErrorCode, r.ErrorMessage)
		}
		if done, state, err = sess.Next(ctx, r.AuthBytes); err != nil {
			return err
		}
	}
	return nil
}
