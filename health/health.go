// Package health serves /healthz, /readyz, /status and /metrics for a
// running outboxd. The listener is bound synchronously so a port clash fails
// at start.
package health

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxd/outboxd/replication"
)

// Source reports the pipeline's status.
type Source interface {
	Status() replication.Status
}

// Server is the HTTP health server.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Listen binds addr and prepares the handlers.
func Listen(addr string, src Source) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(src))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		st := src.Status()
		if st.State == "stopped" {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"state": st.State, "last_error": st.LastError})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"state": st.State})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := src.Status()
		if st.State != "streaming" {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"state": st.State, "reason": "not streaming", "last_error": st.LastError})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"state": st.State})
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, statusJSON(src.Status()))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until Shutdown.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops the server within ctx.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

type status struct {
	State           string `json:"state"`
	LastError       string `json:"last_error,omitempty"`
	ConfirmedLSN    string `json:"confirmed_flush_lsn"`
	InFlightEvents  int    `json:"in_flight_events"`
	InFlightBytes   int64  `json:"in_flight_bytes"`
	OpenTxns        int    `json:"unconfirmed_transactions"`
	EventsAcked     uint64 `json:"events_acknowledged"`
	Transactions    uint64 `json:"transactions"`
	LastCommitAcked string `json:"last_acknowledged_commit,omitempty"`
}

func statusJSON(st replication.Status) status {
	out := status{
		State: st.State, LastError: st.LastError,
		ConfirmedLSN:   st.Tracker.Confirmed.String(),
		InFlightEvents: st.Tracker.Events, InFlightBytes: st.Tracker.Bytes, OpenTxns: st.Tracker.Open,
		EventsAcked: st.Events, Transactions: st.Txns,
	}
	if !st.Tracker.LastCommit.IsZero() {
		out.LastCommitAcked = st.Tracker.LastCommit.UTC().Format(time.RFC3339Nano)
	}
	return out
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

type collector struct {
	src                          Source
	events, txns, inflight, conf *prometheus.Desc
}

func newCollector(src Source) *collector {
	return &collector{
		src:      src,
		events:   prometheus.NewDesc("outboxd_events_acknowledged_total", "Outbox records acknowledged by Kafka.", nil, nil),
		txns:     prometheus.NewDesc("outboxd_transactions_total", "Transactions received from the slot.", nil, nil),
		inflight: prometheus.NewDesc("outboxd_in_flight_events", "Records produced and not yet acknowledged.", nil, nil),
		conf:     prometheus.NewDesc("outboxd_confirmed_flush_lsn", "Flush position last confirmed to PostgreSQL, as a number.", nil, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.events
	ch <- c.txns
	ch <- c.inflight
	ch <- c.conf
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.Status()
	ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(st.Events))
	ch <- prometheus.MustNewConstMetric(c.txns, prometheus.CounterValue, float64(st.Txns))
	ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(st.Tracker.Events))
	ch <- prometheus.MustNewConstMetric(c.conf, prometheus.GaugeValue, float64(st.Tracker.Confirmed))
}
