package sink

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/apiversions"
	meta "github.com/segmentio/kafka-go/protocol/metadata"
)

// answering is a local port that answers as a one-broker cluster does the
// two requests a probe makes (API versions, metadata), on any number of
// connections. It counts the connections it accepted; drop closes the open
// ones, as a broker that restarts does. Not a broker: what a probe asks of
// a real one is tested against Kafka in the integration tests.
type answering struct {
	ln       net.Listener
	accepted atomic.Int32
	mu       sync.Mutex
	open     []net.Conn
	wg       sync.WaitGroup
}

func newAnswering(t *testing.T) *answering {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &answering{ln: ln}
	_, portText, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(portText)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.accepted.Add(1)
			a.mu.Lock()
			a.open = append(a.open, c)
			a.mu.Unlock()
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				defer c.Close()
				serveRequests(c, func(msg protocol.Message) (protocol.Message, bool) {
					switch msg.(type) {
					case *apiversions.Request:
						return &apiversions.Response{ApiKeys: []apiversions.ApiKeyResponse{
							{ApiKey: int16(protocol.ApiVersions), MaxVersion: 2},
							{ApiKey: int16(protocol.Metadata), MaxVersion: 8}}}, false
					case *meta.Request:
						return &meta.Response{Brokers: []meta.ResponseBroker{{NodeID: 1, Host: "127.0.0.1", Port: int32(port)}}}, false
					}
					return nil, true
				})
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		a.drop()
		a.wg.Wait()
	})
	return a
}

func (a *answering) drop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.open {
		c.Close()
	}
	a.open = nil
}

// TestProberKeepsItsConnection: the health monitor's probes of a broker
// share one connection (a new one per poll cost an idle outboxd a dozen
// wake-ups: issue 36); a broker that closed it (a restart) is dialled again
// within the same probe and reported up; a broker that is gone is reported
// down; after Close nothing is kept.
func TestProberKeepsItsConnection(t *testing.T) {
	a := newAnswering(t)
	addr := a.ln.Addr().String()
	p := NewProber(Config{ClientID: "outboxd-test"})
	probe := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return p.Probe(ctx, addr)
	}
	for i := 0; i < 5; i++ {
		if err := probe(); err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
	}
	if n := a.accepted.Load(); n != 1 {
		t.Fatalf("five probes opened %d connections, want 1", n)
	}

	a.drop()
	if err := probe(); err != nil {
		t.Fatalf("probe after the broker closed the kept connection: %v", err)
	}
	if n := a.accepted.Load(); n != 2 {
		t.Fatalf("%d connections after the broker closed the first, want 2", n)
	}

	a.ln.Close()
	a.drop()
	if err := probe(); err == nil {
		t.Fatal("a broker that is gone was reported up")
	}

	p.Close()
	p.mu.Lock()
	kept := len(p.conns)
	p.mu.Unlock()
	if kept != 0 {
		t.Fatalf("%d connections kept after Close", kept)
	}
}
