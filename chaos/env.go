// Package chaos is outboxd's fault-injection suite: TCP proxies between
// outboxd and each of its peers, a load generator that writes outbox rows
// the way services do, and the scenarios of issue 4, run on the test
// environment (testenv) and checked by its Verifier (the topic against the
// outbox table, and the slot's confirmed position against what Kafka
// holds). `make chaos` runs them all (tools/chaos); TestChaosShort runs a
// short subset.
//
// See docs/reports/CHAOS.md for the method, its limits and the measured figures.
package chaos

import (
	"fmt"
	"net"
	"net/url"

	"github.com/outboxd/outboxd/testenv"
)

// Env is the test environment with a proxy in front of each service, for
// outboxd. The harness itself (writers, verifier) connects directly.
type Env struct {
	*testenv.Env
	PGProxy *Proxy
	// KafkaProxy is where outboxd bootstraps: the broker advertises it on a
	// listener of its own ("CHAOS"), and Kafka answers metadata with the
	// addresses of the listener a request came in on, so every connection
	// outboxd makes goes through the proxy and none of the harness' does.
	KafkaProxy *Proxy
}

const proxiedListener = "CHAOS"

// Start starts both services and both proxies.
func Start() (*Env, error) {
	// The proxy's port must be known before the broker starts, since the
	// broker advertises it; nothing connects to it before then.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	te, err := testenv.Start(testenv.Options{Listeners: []testenv.Listener{{Name: proxiedListener, Advertise: ln.Addr().String()}}})
	if err != nil {
		ln.Close()
		return nil, err
	}
	e := &Env{Env: te}
	target, err := te.KafkaListener(proxiedListener)
	if err != nil {
		ln.Close()
		e.Close()
		return nil, err
	}
	e.KafkaProxy = newProxyOn(ln, target)
	u, err := url.Parse(te.PGDSN)
	if err != nil {
		e.Close()
		return nil, err
	}
	if e.PGProxy, err = NewProxy(u.Host); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// ProxiedDSN is a DSN for database db through the PostgreSQL proxy.
func (e *Env) ProxiedDSN(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", e.PGProxy.Addr(), db)
}

// Close stops and removes everything.
func (e *Env) Close() {
	if e.PGProxy != nil {
		e.PGProxy.Close()
	}
	if e.KafkaProxy != nil {
		e.KafkaProxy.Close()
	}
	e.Cleanup()
}
