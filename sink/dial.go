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
// PostgreSQL port, say) is not taken for a broker. The connection has no
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
		return nil, fmt.Errorf("%s accepts TCP but does not answer as a Kafka broker: %w", addr, err)
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, nil
}
