package sink

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/segmentio/kafka-go"
)

// Every connection outboxd opens to Kafka is set up in this file: the
// producer's Transport, and Dial for the probes (check, the health
// monitor). TLS and SASL belong here and nowhere else: kafka.Transport and
// kafka.Dialer both take a tls.Config and a SASL mechanism.

const (
	dialTimeout   = 5 * time.Second
	dialKeepAlive = 10 * time.Second
)

// newTransport is the producer's connection pool to cfg.Brokers.
func newTransport(cfg Config) *kafka.Transport {
	return &kafka.Transport{
		ClientID:    cfg.ClientID,
		Dial:        (&net.Dialer{Timeout: dialTimeout, KeepAlive: dialKeepAlive}).DialContext,
		IdleTimeout: 30 * time.Second,
		MetadataTTL: metadataTTL,
		TLS:         cfg.TLS,
		SASL:        cfg.SASL,
	}
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
	d := &kafka.Dialer{ClientID: cfg.ClientID, Timeout: dialTimeout, KeepAlive: dialKeepAlive, TLS: cfg.TLS, SASLMechanism: cfg.SASL}
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
		// arrives here, on the first read, rather than in the handshake.
		if why, definitive := explain(err); definitive {
			return nil, fmt.Errorf("%s: %w", why, err)
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
