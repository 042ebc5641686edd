package health

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxd/outboxd/replication"
)

// TestConnectionCap: with maxConns connections open, the next one is not
// served until one of them closes.
func TestConnectionCap(t *testing.T) {
	s, err := Listen("127.0.0.1:0", fakeSource{}, &Monitor{}, NewMetrics(nil), Limits{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve() }()
	t.Cleanup(func() { _ = s.srv.Close() })
	dial := func() net.Conn {
		c, err := net.Dial("tcp", s.Addr())
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
	held := make([]net.Conn, maxConns)
	for i := range held {
		held[i] = dial()
		if err := healthz(held[i], time.Minute); err != nil { // kept alive, holding its slot
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	extra := dial()
	if err := healthz(extra, time.Second); err == nil {
		t.Fatalf("connection %d was served while %d were open", maxConns+1, maxConns)
	}
	held[0].Close()
	_ = extra.SetReadDeadline(time.Now().Add(time.Minute))
	resp, err := http.ReadResponse(bufio.NewReader(extra), nil)
	if err != nil {
		t.Fatalf("once a connection closed, the waiting one was not served: %v", err)
	}
	resp.Body.Close()
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
