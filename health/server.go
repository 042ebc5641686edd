// Package health tells the truth about a running outboxd: the replication
// slot as PostgreSQL sees it, the WAL it retains, the lag, what is in
// flight, and whether Kafka is reachable. It serves /healthz, /readyz,
// /status and /metrics; the listener is bound synchronously so a port clash
// fails at start.
package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/replication"
)

// Source reports the pipeline's own status.
type Source interface {
	Status() replication.Status
}

// Limits turn readiness off when crossed; zero disables one.
type Limits struct {
	MaxLag              time.Duration
	MaxRetainedWALBytes int64
	// Pprof adds Go's profiler under /debug/pprof/.
	Pprof bool
}

// Server is the HTTP health server.
type Server struct {
	ln     net.Listener
	srv    *http.Server
	src    Source
	mon    *Monitor
	met    *Metrics
	limits Limits
	log    hclog.Logger
	clock  clock.Clock // the monitor's

	mu       sync.Mutex
	crossing map[string]bool // threshold name -> currently crossed, for logging once per crossing
}

// The server's bounds: a client (a probe, a scraper, or anyone who reaches
// the port) holds a connection for a bounded time; at most maxConns are
// held at once, maxConnsPerAddr from one address, and a new connection
// over either takes the place of the one idle the longest
// (guardedListener), so that idle connections never keep a probe out.
const (
	maxConns          = 32
	maxConnsPerAddr   = 8
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	// writeTimeout bounds a response, a profile included: pprof refuses a
	// ?seconds= at or above it, and maxProfileSeconds stays below.
	writeTimeout      = 60 * time.Second
	idleTimeout       = 30 * time.Second
	maxHeaderBytes    = 16 << 10
	maxProfileSeconds = 30
)

// Listen binds addr.
func Listen(addr string, src Source, mon *Monitor, met *Metrics, limits Limits, log hclog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{src: src, mon: mon, met: met, limits: limits, log: log, clock: clock.Or(mon.cfg.Clock), crossing: map[string]bool{}}
	guard := guardListener(ln, maxConns, maxConnsPerAddr, s.clock.Now)
	s.ln = guard
	met.reg.MustRegister(&collector{s: s})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /status", s.status)
	mux.Handle("GET /metrics", promhttp.HandlerFor(met.reg, promhttp.HandlerOpts{}))
	if limits.Pprof {
		// GET only (pprof's symbol lookup also takes a POST: not needed to
		// read a profile), and a bounded ?seconds= on every profile.
		mux.Handle("GET /debug/pprof/", boundedSeconds(http.HandlerFunc(pprof.Index)))
		mux.Handle("GET /debug/pprof/profile", boundedSeconds(http.HandlerFunc(pprof.Profile)))
		mux.Handle("GET /debug/pprof/symbol", boundedSeconds(http.HandlerFunc(pprof.Symbol)))
		mux.Handle("GET /debug/pprof/trace", boundedSeconds(http.HandlerFunc(pprof.Trace)))
	}
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout,
		WriteTimeout: writeTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes, ConnState: guard.connState}
	return s, nil
}

// boundedSeconds refuses a profile longer than maxProfileSeconds: a CPU
// profile or trace runs for ?seconds=, and a delta profile (heap?seconds=)
// waits that long.
func boundedSeconds(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.URL.Query().Get("seconds"); v != "" {
			if n, err := strconv.ParseFloat(v, 64); err != nil || !(n > 0 && n <= maxProfileSeconds) {
				http.Error(w, fmt.Sprintf("seconds: a number from 1 to %d", maxProfileSeconds), http.StatusBadRequest)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
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

// view is everything the endpoints report, computed once per request.
type view struct {
	st       replication.Status
	snap     Snapshot
	lag      time.Duration
	ready    bool
	reasons  []string
	wedged   string
	problems map[string]string // threshold -> message, for the crossing log
	fresh    bool              // the snapshot was taken in the current state
}

func (s *Server) view(now time.Time) view {
	v := view{st: s.src.Status(), snap: s.mon.Snapshot(), problems: map[string]string{}}
	// Lag: how long the oldest committed transaction not yet acknowledged
	// has waited; 0 when nothing is waiting.
	if !v.st.Tracker.OldestOpen.IsZero() {
		v.lag = now.Sub(v.st.Tracker.OldestOpen)
		if v.lag < 0 {
			v.lag = 0
		}
	}
	if s.limits.MaxLag > 0 && v.lag > s.limits.MaxLag {
		v.problems["lag"] = fmt.Sprintf("replication lag %s exceeds health.max_lag %s", v.lag.Round(time.Millisecond), s.limits.MaxLag)
	}
	// A poll that began before the current state may have seen the
	// server before the stream created the slot or the publication: its
	// verdict on them is not shown next to that state. Before a stream
	// began, they may not exist yet by design (the stream creates them).
	fresh := !v.snap.At.IsZero() && !v.snap.At.Before(v.st.Since)
	judged := fresh && (v.st.State == replication.StateStreaming || v.st.State == replication.StateStopping)
	if s.limits.MaxRetainedWALBytes > 0 && v.snap.RetainedBytes > s.limits.MaxRetainedWALBytes {
		v.problems["retained_wal"] = fmt.Sprintf("the slot retains %d bytes of WAL, over health.max_retained_wal_bytes %d", v.snap.RetainedBytes, s.limits.MaxRetainedWALBytes)
	}
	if sl := v.snap.Slot; sl != nil {
		switch {
		case sl.InvalidationReason != "":
			v.problems["wal_status"] = "the slot cannot be streamed from: " + sl.Unusable + "; events are missing; reconcile the outbox, then drop and recreate the slot (outboxd slot drop)"
		case sl.WALStatus == "unreserved":
			v.problems["wal_status"] = "slot wal_status is unreserved: its WAL is past max_slot_wal_keep_size and will be removed at the next checkpoint unless outboxd catches up now; check Kafka and the lag"
		case sl.WALStatus == "lost":
			v.problems["wal_status"] = "slot wal_status is lost: WAL it needed was removed and events are missing; reconcile the outbox, then drop and recreate the slot (outboxd slot drop)"
		}
	} else if v.snap.Err == "" && judged {
		v.problems["slot"] = "the replication slot does not exist"
	}
	if v.snap.Publication != "" && judged {
		v.problems["publication"] = v.snap.Publication
	}

	if v.st.State != replication.StateStreaming {
		v.reasons = append(v.reasons, "state is "+v.st.State)
	}
	switch {
	case v.snap.At.IsZero():
		v.reasons = append(v.reasons, "the slot has not been read yet")
	case !fresh:
		v.reasons = append(v.reasons, "the slot has not been read since the state became "+v.st.State)
	case v.snap.Err != "":
		v.reasons = append(v.reasons, "cannot read the slot: "+v.snap.Err)
	}
	if v.snap.Brokers > 0 && v.snap.BrokersReachable == 0 && !v.snap.At.IsZero() {
		v.reasons = append(v.reasons, "no Kafka broker answers")
	}
	if v.st.InFlight.Err != nil {
		v.reasons = append(v.reasons, "kafka delivery failed: "+v.st.InFlight.Err.Error())
	}
	for _, k := range problemKeys {
		if msg, ok := v.problems[k]; ok {
			v.reasons = append(v.reasons, msg)
		}
	}
	v.ready = len(v.reasons) == 0

	// Wedged: streaming, yet no standby status went out for longer than
	// the server waits before dropping a silent client.
	if (v.st.State == replication.StateStreaming || v.st.State == replication.StateStopping) && v.st.WALSenderTimeout > 0 &&
		!v.st.LastStatusSent.IsZero() && now.Sub(v.st.LastStatusSent) > v.st.WALSenderTimeout {
		v.wedged = fmt.Sprintf("no standby status sent for %s (wal_sender_timeout %s)", now.Sub(v.st.LastStatusSent).Round(time.Second), v.st.WALSenderTimeout)
	}
	if v.st.State == replication.StateStopped {
		v.wedged = "stopped: " + v.st.LastError
	}
	v.fresh = fresh
	return v
}

// problemKeys orders the problems a view can find.
var problemKeys = []string{"slot", "publication", "wal_status", "lag", "retained_wal"}

// Watch logs a warning once each time a threshold is crossed, and once when
// it clears. Pass it to Monitor.Run.
func (s *Server) Watch(Snapshot) {
	v := s.view(s.clock.Now())
	if v.st.State == replication.StateStarting || !v.fresh {
		// The slot and the publication may not be created yet, or the
		// poll predates the state it would be judged against.
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range problemKeys {
		msg, crossed := v.problems[k]
		if crossed && !s.crossing[k] {
			if k == "wal_status" || k == "slot" || k == "publication" {
				s.log.Error(msg)
			} else {
				s.log.Warn(msg)
			}
		} else if !crossed && s.crossing[k] {
			s.log.Info("back within limits", "check", k)
		}
		s.crossing[k] = crossed
	}
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	v := s.view(s.clock.Now())
	if v.wedged != "" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"state": v.st.State, "reason": v.wedged})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"state": v.st.State})
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	v := s.view(s.clock.Now())
	if !v.ready {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"state": v.st.State, "ready": false, "reasons": v.reasons})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"state": v.st.State, "ready": true})
}

// Status is the /status document.
type Status struct {
	State            string                `json:"state"`
	Since            time.Time             `json:"since"`
	LastError        string                `json:"last_error"`
	Ready            bool                  `json:"ready"`
	NotReady         []string              `json:"not_ready_reasons"`
	Slot             *SlotInfo             `json:"slot"`
	SlotError        string                `json:"slot_error,omitempty"`
	SlotReadAt       time.Time             `json:"slot_read_at"`
	ServerWALLSN     string                `json:"server_wal_lsn"`
	RetainedWALBytes int64                 `json:"retained_wal_bytes"`
	UnconfirmedBytes int64                 `json:"unconfirmed_bytes"`
	LagSeconds       float64               `json:"lag_seconds"`
	ConfirmedLSN     string                `json:"confirmed_lsn"`
	InFlight         InFlight              `json:"in_flight"`
	Counters         Counters              `json:"counters"`
	Topics           map[string]TopicStats `json:"topics"`
	Kafka            KafkaStatus           `json:"kafka"`
}

// InFlight is what outboxd holds unacknowledged.
type InFlight struct {
	Events       int   `json:"events"`
	Bytes        int64 `json:"bytes"`
	Transactions int   `json:"transactions"`
}

// Counters since the process started (replays after a failure included).
type Counters struct {
	Events       uint64 `json:"events"`
	Transactions uint64 `json:"transactions"`
	Bytes        int64  `json:"bytes"`
	DeadLettered uint64 `json:"dead_lettered"`
	Dropped      uint64 `json:"dropped"` // dropped on purpose by a route's override
}

// KafkaStatus is broker reachability from the last poll.
type KafkaStatus struct {
	Brokers          int `json:"brokers"`
	BrokersReachable int `json:"brokers_reachable"`
}

func (s *Server) status(w http.ResponseWriter, _ *http.Request) {
	v := s.view(s.clock.Now())
	out := Status{
		State: v.st.State, Since: v.st.Since, LastError: v.st.LastError, Ready: v.ready, NotReady: v.reasons,
		Slot: v.snap.Slot, SlotError: v.snap.Err, SlotReadAt: v.snap.At, ServerWALLSN: lsnText(v.snap.ServerWAL),
		RetainedWALBytes: v.snap.RetainedBytes, UnconfirmedBytes: v.snap.UnconfirmedBytes,
		LagSeconds:   v.lag.Seconds(),
		ConfirmedLSN: v.st.Confirmed.String(),
		InFlight:     InFlight{Events: v.st.InFlight.Events, Bytes: v.st.InFlight.Bytes, Transactions: v.st.Tracker.Open},
		Counters:     Counters{Events: v.st.Events, Transactions: v.st.Txns, Bytes: v.st.Bytes, DeadLettered: v.st.DeadLettered, Dropped: v.st.Dropped},
		Topics:       s.met.Topics(),
		Kafka:        KafkaStatus{Brokers: v.snap.Brokers, BrokersReachable: v.snap.BrokersReachable},
	}
	if out.NotReady == nil {
		out.NotReady = []string{}
	}
	writeJSON(w, http.StatusOK, out)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// collector exposes the snapshot figures at scrape time.
type collector struct{ s *Server }

var (
	descState       = prometheus.NewDesc("outboxd_state", "1 for the current state.", []string{"state"}, nil)
	descReady       = prometheus.NewDesc("outboxd_ready", "1 when /readyz says ready.", nil, nil)
	descRetained    = prometheus.NewDesc("outboxd_slot_retained_wal_bytes", "WAL the slot retains: pg_current_wal_lsn() - restart_lsn.", []string{"slot"}, nil)
	descUnconfirmed = prometheus.NewDesc("outboxd_slot_unconfirmed_bytes", "pg_current_wal_lsn() - confirmed_flush_lsn.", []string{"slot"}, nil)
	descSlotActive  = prometheus.NewDesc("outboxd_slot_active", "1 when the slot is active (held by a walsender).", []string{"slot"}, nil)
	descSafeWAL     = prometheus.NewDesc("outboxd_slot_safe_wal_size_bytes", "safe_wal_size of the slot (absent when max_slot_wal_keep_size is unset).", []string{"slot"}, nil)
	descLag         = prometheus.NewDesc("outboxd_lag_seconds", "Age of the oldest committed transaction not yet acknowledged by Kafka; 0 when none waits.", nil, nil)
	descInFlightEv  = prometheus.NewDesc("outboxd_in_flight_events", "Records produced and not yet acknowledged.", nil, nil)
	descInFlightB   = prometheus.NewDesc("outboxd_in_flight_bytes", "Bytes of the records in flight.", nil, nil)
	descTxns        = prometheus.NewDesc("outboxd_transactions_total", "Transactions received from the slot (replays included).", nil, nil)
	descDead        = prometheus.NewDesc("outboxd_dead_lettered_total", "Rows written to a dead-letter topic because they could not become records (replays included).", nil, nil)
	descDropped     = prometheus.NewDesc("outboxd_dropped_total", "Rows and messages a route's override dropped on purpose (replays included).", nil, nil)
	descBrokers     = prometheus.NewDesc("outboxd_kafka_brokers_reachable", "Configured brokers that answered a Kafka API versions request at the last poll.", nil, nil)
	descConfirmed   = prometheus.NewDesc("outboxd_confirmed_lsn", "Flush position outboxd has confirmed, as a number.", nil, nil)
	descStreamed    = prometheus.NewDesc("outboxd_streamed_transactions_total", "Transactions the server streamed before their commit (protocol version 2; replays included).", nil, nil)
	descSpilled     = prometheus.NewDesc("outboxd_local_spill_bytes_total", "Bytes of streamed transactions outboxd wrote to spill files while waiting for their commit (replays included).", nil, nil)
	// One series per wal_status, 1 on the current one, so an alert can say
	// "unreserved" or "lost" on its own: safe_wal_size alone cannot tell a
	// lost slot from a server without max_slot_wal_keep_size (both NULL).
	descWALStatus = prometheus.NewDesc("outboxd_slot_wal_status",
		"1 for the slot's wal_status in pg_replication_slots (reserved, extended, unreserved, lost), 0 for the others.", []string{"slot", "status"}, nil)
	walStatuses = []string{"reserved", "extended", "unreserved", "lost"}
	// 1 while PostgreSQL says the slot is invalidated, with why (17+: a
	// wal_status may stay "reserved" for a slot invalidated for another
	// reason than removed WAL, 18's idle_timeout).
	descInvalidated = prometheus.NewDesc("outboxd_slot_invalidated",
		"1 when PostgreSQL invalidated the slot (pg_replication_slots.invalidation_reason, PostgreSQL 17+), with the reason.", []string{"slot", "reason"}, nil)
	// The slot's pg_stat_replication_slots (PostgreSQL 14+) as the server
	// counts it: counters carrying the server's cumulative value, which
	// falls to 0 when the server resets them (pg_stat_reset_replication_slot,
	// a crash). rate() and increase() take such a fall for a counter reset,
	// as for a restarted process; stats_reset says when one happened.
	slotStatMetrics = []struct {
		desc  *prometheus.Desc
		value func(*SlotStats) int64
	}{
		{slotStatDesc("outboxd_slot_spill_txns_total", "Transactions the server spilled to its disk past logical_decoding_work_mem while decoding for the slot (pg_stat_replication_slots.spill_txns)."),
			func(s *SlotStats) int64 { return s.SpillTxns }},
		{slotStatDesc("outboxd_slot_spill_count_total", "Times the server spilled a transaction to its disk for the slot (spill_count)."),
			func(s *SlotStats) int64 { return s.SpillCount }},
		{slotStatDesc("outboxd_slot_spill_bytes_total", "Decoded transaction data the server spilled to its disk for the slot (spill_bytes)."),
			func(s *SlotStats) int64 { return s.SpillBytes }},
		{slotStatDesc("outboxd_slot_stream_txns_total", "Transactions the server streamed to outboxd before their commit (stream_txns)."),
			func(s *SlotStats) int64 { return s.StreamTxns }},
		{slotStatDesc("outboxd_slot_stream_count_total", "Times the server streamed a transaction's changes before its commit (stream_count)."),
			func(s *SlotStats) int64 { return s.StreamCount }},
		{slotStatDesc("outboxd_slot_stream_bytes_total", "Decoded transaction data the server streamed before its commit (stream_bytes)."),
			func(s *SlotStats) int64 { return s.StreamBytes }},
		{slotStatDesc("outboxd_slot_decoded_txns_total", "Transactions the server decoded for the slot (total_txns)."),
			func(s *SlotStats) int64 { return s.TotalTxns }},
		{slotStatDesc("outboxd_slot_decoded_bytes_total", "Transaction data the server decoded for the slot (total_bytes)."),
			func(s *SlotStats) int64 { return s.TotalBytes }},
	}
	descStatsReset = prometheus.NewDesc("outboxd_slot_stats_reset_timestamp_seconds",
		"When the server last reset the slot's pg_stat_replication_slots (stats_reset); absent when never.", []string{"slot"}, nil)
)

func slotStatDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"slot"}, nil)
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descState, descReady, descRetained, descUnconfirmed, descSlotActive, descSafeWAL, descLag,
		descInFlightEv, descInFlightB, descTxns, descDead, descDropped, descBrokers, descConfirmed, descWALStatus, descInvalidated, descStatsReset,
		descStreamed, descSpilled} {
		ch <- d
	}
	for _, m := range slotStatMetrics {
		ch <- m.desc
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	v := c.s.view(c.s.clock.Now())
	for _, st := range replication.States {
		val := 0.0
		if v.st.State == st {
			val = 1
		}
		ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, val, st)
	}
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, b2f(v.ready))
	if sl := v.snap.Slot; sl != nil {
		ch <- prometheus.MustNewConstMetric(descRetained, prometheus.GaugeValue, float64(v.snap.RetainedBytes), sl.Name)
		ch <- prometheus.MustNewConstMetric(descUnconfirmed, prometheus.GaugeValue, float64(v.snap.UnconfirmedBytes), sl.Name)
		ch <- prometheus.MustNewConstMetric(descSlotActive, prometheus.GaugeValue, b2f(sl.Active), sl.Name)
		if sl.SafeWALSize != nil {
			ch <- prometheus.MustNewConstMetric(descSafeWAL, prometheus.GaugeValue, float64(*sl.SafeWALSize), sl.Name)
		}
		known := false
		for _, st := range walStatuses {
			known = known || st == sl.WALStatus
			ch <- prometheus.MustNewConstMetric(descWALStatus, prometheus.GaugeValue, b2f(st == sl.WALStatus), sl.Name, st)
		}
		if !known && sl.WALStatus != "" {
			// A value a later PostgreSQL may add: shown rather than hidden.
			ch <- prometheus.MustNewConstMetric(descWALStatus, prometheus.GaugeValue, 1, sl.Name, sl.WALStatus)
		}
		if sl.InvalidationReason != "" {
			ch <- prometheus.MustNewConstMetric(descInvalidated, prometheus.GaugeValue, 1, sl.Name, sl.InvalidationReason)
		}
		if st := sl.Stats; st != nil {
			for _, m := range slotStatMetrics {
				ch <- prometheus.MustNewConstMetric(m.desc, prometheus.CounterValue, float64(m.value(st)), sl.Name)
			}
			if st.StatsReset != nil {
				ch <- prometheus.MustNewConstMetric(descStatsReset, prometheus.GaugeValue, float64(st.StatsReset.UnixMicro())/1e6, sl.Name)
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, v.lag.Seconds())
	ch <- prometheus.MustNewConstMetric(descInFlightEv, prometheus.GaugeValue, float64(v.st.InFlight.Events))
	ch <- prometheus.MustNewConstMetric(descInFlightB, prometheus.GaugeValue, float64(v.st.InFlight.Bytes))
	ch <- prometheus.MustNewConstMetric(descTxns, prometheus.CounterValue, float64(v.st.Txns))
	ch <- prometheus.MustNewConstMetric(descDead, prometheus.CounterValue, float64(v.st.DeadLettered))
	ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(v.st.Dropped))
	ch <- prometheus.MustNewConstMetric(descBrokers, prometheus.GaugeValue, float64(v.snap.BrokersReachable))
	ch <- prometheus.MustNewConstMetric(descConfirmed, prometheus.GaugeValue, float64(v.st.Confirmed))
	ch <- prometheus.MustNewConstMetric(descStreamed, prometheus.CounterValue, float64(v.st.StreamedTxns))
	ch <- prometheus.MustNewConstMetric(descSpilled, prometheus.CounterValue, float64(v.st.SpilledBytes))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
