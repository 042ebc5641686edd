package health

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxd/outboxd/replication"
)

// TestProbesAnsweredWhateverOthersHold (issue 35, item 1): connections
// that stay open after a request, from one address or from several, more
// than the server holds, never keep a new client's /healthz out (the
// kubelet restarts a container whose probes time out); connections in the
// middle of a request, over the bounds, make a new one fail at once,
// never wait.
func TestProbesAnsweredWhateverOthersHold(t *testing.T) {
	s, err := Listen("127.0.0.1:0", fakeSource{}, &Monitor{}, NewMetrics(nil), Limits{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve() }()
	t.Cleanup(func() { _ = s.srv.Close() })
	_, port, _ := net.SplitHostPort(s.Addr())
	// dial connects from 127.0.0.<from>: another address of the loopback.
	dial := func(from int) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(from))}}
		c, err := d.Dial("tcp", "127.0.0.1:"+port)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	healthz := func(c net.Conn, wait time.Duration) error {
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	probe := func(from int, why string) {
		t.Helper()
		if err := healthz(dial(from), 2*time.Second); err != nil {
			t.Fatalf("%s: a new /healthz from 127.0.0.%d: %v", why, from, err)
		}
	}

	// Forty kept-alive connections from one address.
	for i := range 40 {
		if err := healthz(dial(1), 10*time.Second); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	probe(1, "40 idle connections from the prober's own address")
	probe(9, "40 idle connections from another address")

	// The server full of idle connections from 8 addresses.
	for from := 2; from < 2+maxConns/maxConnsPerAddr+1; from++ {
		for range maxConnsPerAddr {
			if err := healthz(dial(from), 10*time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	probe(10, fmt.Sprintf("%d idle connections from %d addresses", maxConns, maxConns/maxConnsPerAddr))

	// An address whose every connection is inside a request: its next
	// connection is closed at once; another address is served.
	for range maxConnsPerAddr {
		c := dial(20)
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\n")); err != nil { // headers never finished
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // the server reads their first bytes
	start := time.Now()
	if err := healthz(dial(20), 2*time.Second); err == nil {
		t.Error("a connection over its address's bound, every other one inside a request, was served")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Errorf("a connection over its address's bound waited %s instead of being closed", time.Since(start).Round(time.Millisecond))
	}
	probe(21, "one address's connections all inside a request")
}

// TestPprofBounds: the profiler answers GET only, and a ?seconds= within
// maxProfileSeconds.
func TestPprofBounds(t *testing.T) {
	s := server(t, replication.Status{State: "streaming"}, healthySnap(), Limits{Pprof: true})
	request := func(method, path string) (int, string) {
		rec := httptest.NewRecorder()
		s.srv.Handler.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec.Code, rec.Body.String()
	}
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{http.MethodGet, "/debug/pprof/", 200},
		{http.MethodPost, "/debug/pprof/symbol", 405},
		{http.MethodPut, "/debug/pprof/", 405},
		{http.MethodGet, "/debug/pprof/profile?seconds=3600", 400},
		{http.MethodGet, "/debug/pprof/trace?seconds=31", 400},
		{http.MethodGet, "/debug/pprof/heap?seconds=-1", 400},
		{http.MethodGet, "/debug/pprof/heap?seconds=x", 400},
		{http.MethodGet, "/debug/pprof/heap", 200},
	} {
		if code, body := request(tc.method, tc.path); code != tc.code {
			t.Errorf("%s %s: %d, want %d: %.200s", tc.method, tc.path, code, tc.code, body)
		}
	}
}
