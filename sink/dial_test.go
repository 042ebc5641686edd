package sink

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
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
