package health

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/clock"
)

// Metrics collects what the pipeline observes as it runs: per-topic produce
// outcomes and commit-to-acknowledgement latency. Gauges that are snapshots
// (slot, in flight, state) are read at scrape time by the server.
type Metrics struct {
	reg           *prometheus.Registry
	events        *prometheus.CounterVec
	bytes         *prometheus.CounterVec
	produceErrors *prometheus.CounterVec
	produceTime   *prometheus.HistogramVec
	commitToAck   prometheus.Histogram
	lastProduce   *prometheus.GaugeVec
	partitions    *prometheus.GaugeVec
	partChanges   *prometheus.CounterVec
	skipped       *prometheus.CounterVec
	tailGivenUp   *prometheus.CounterVec
	rejected      *prometheus.CounterVec

	clock clock.Clock

	mu     sync.Mutex
	topics map[string]*TopicStats
	// produced: each topic's series of ObserveProduce, looked up once
	// (a label lookup per batch showed in the profile: issue 36). Under mu.
	produced map[string]*producedSeries
}

// producedSeries are one topic's series that every acknowledged batch
// moves, and the one a failed batch moves (nil until one fails: the series
// appears with the first failure, as before).
type producedSeries struct {
	events, bytes prometheus.Counter
	produceTime   prometheus.Observer
	lastProduce   prometheus.Gauge
	errors        prometheus.Counter
}

// TopicStats is one topic's figures for /status.
type TopicStats struct {
	Events      uint64    `json:"events"`
	Bytes       int64     `json:"bytes"`
	Errors      uint64    `json:"errors"`
	LastProduce time.Time `json:"last_produce"`
}

var latencyBuckets = []float64{.001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10, 30, 60}

// NewMetrics registers the metrics in a registry of their own, with the Go
// runtime's (go_*), the process's (process_*) and outboxd_build_info. c
// (nil: the system's) dates each produce and times each confirmation.
func NewMetrics(c clock.Clock) *Metrics {
	m := &Metrics{
		clock: clock.Or(c),
		reg:   prometheus.NewRegistry(),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_events_total",
			Help: "Records acknowledged by Kafka (acks=all), by topic; replays after a crash count again."}, []string{"topic"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_bytes_total",
			Help: "Key and value bytes of the acknowledged records, by topic."}, []string{"topic"}),
		produceErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_produce_errors_total",
			Help: "Records whose produce failed (they are replayed from the slot), by topic."}, []string{"topic"}),
		produceTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "outboxd_produce_seconds",
			Help: "Time from handing a batch to the producer to its acknowledgement, by topic.", Buckets: latencyBuckets}, []string{"topic"}),
		commitToAck: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outboxd_commit_to_ack_seconds",
			Help: "Time from a transaction's commit in PostgreSQL to the acknowledgement of its last record.", Buckets: latencyBuckets}),
		lastProduce: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outboxd_last_produce_timestamp_seconds",
			Help: "Unix time of the last acknowledged record, by topic."}, []string{"topic"}),
		partitions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outboxd_topic_partitions",
			Help: "Partitions of each topic, as the producer last learnt them (keys are hashed over this count)."}, []string{"topic"}),
		partChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_topic_partition_changes_total",
			Help: "Times a topic's partition count changed while outboxd produced to it (some aggregates moved partition; kafka.on_partition_change)."}, []string{"topic"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_duplicates_skipped_total",
			Help: "Records a new session did not produce again because the partition already held them (kafka.deduplicate), by topic."}, []string{"topic"}),
		tailGivenUp: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_dedupe_tails_given_up_total",
			Help: "Partitions whose tail a session could not read, so that their records went out without restart de-duplication (a duplicate at worst), by topic."}, []string{"topic"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_stream_headers_rejected_total",
			Help: "Records found in a partition's tail whose outboxd.stream header names this stream but whose MAC does not verify under kafka.stream_key_file's key (forged, copied, or written under another key): they prove nothing, by topic."}, []string{"topic"}),
		topics: map[string]*TopicStats{}, produced: map[string]*producedSeries{},
	}
	build := outboxd.BuildInfo()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{Name: "outboxd_build_info",
		Help:        "Always 1; the labels say which build is running.",
		ConstLabels: prometheus.Labels{"version": build.Version, "goversion": build.GoVersion}})
	buildInfo.Set(1)
	m.reg.MustRegister(m.events, m.bytes, m.produceErrors, m.produceTime, m.commitToAck, m.lastProduce, m.partitions, m.partChanges, m.skipped, m.tailGivenUp, m.rejected, buildInfo,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ObserveProduce records one batch's outcome (sink.Config.Observe).
func (m *Metrics) ObserveProduce(topic string, records int, bytes int64, latency time.Duration, err error) {
	now := m.clock.Now()
	m.mu.Lock()
	ts := m.topics[topic]
	if ts == nil {
		ts = &TopicStats{}
		m.topics[topic] = ts
	}
	ps := m.produced[topic]
	if ps == nil {
		ps = &producedSeries{}
		m.produced[topic] = ps
	}
	if err != nil {
		ts.Errors += uint64(records)
		if ps.errors == nil {
			ps.errors = m.produceErrors.WithLabelValues(topic)
		}
	} else {
		ts.Events += uint64(records)
		ts.Bytes += bytes
		ts.LastProduce = now
		if ps.events == nil {
			ps.events, ps.bytes = m.events.WithLabelValues(topic), m.bytes.WithLabelValues(topic)
			ps.produceTime, ps.lastProduce = m.produceTime.WithLabelValues(topic), m.lastProduce.WithLabelValues(topic)
		}
	}
	m.mu.Unlock()
	if err != nil {
		ps.errors.Add(float64(records))
		return
	}
	ps.events.Add(float64(records))
	ps.bytes.Add(float64(bytes))
	ps.produceTime.Observe(latency.Seconds())
	ps.lastProduce.Set(float64(now.UnixNano()) / 1e9)
}

// ObservePartitions records a topic's partition count, first learnt (from
// 0) or changed (sink.Config.Partitions).
func (m *Metrics) ObservePartitions(topic string, from, to int) {
	m.partitions.WithLabelValues(topic).Set(float64(to))
	if from != 0 {
		m.partChanges.WithLabelValues(topic).Inc()
	}
}

// ObserveSkipped counts one record not produced again (sink.Config.Skipped).
func (m *Metrics) ObserveSkipped(topic string) { m.skipped.WithLabelValues(topic).Inc() }

// ObserveTailGivenUp counts one partition whose records went out without
// its tail read (sink.Config.TailGivenUp).
func (m *Metrics) ObserveTailGivenUp(topic string) { m.tailGivenUp.WithLabelValues(topic).Inc() }

// ObserveRejected counts one record whose stream header proves nothing
// (sink.Config.Rejected).
func (m *Metrics) ObserveRejected(topic string) { m.rejected.WithLabelValues(topic).Inc() }

// ObserveConfirm records one confirmed transaction's commit-to-ack latency
// (replication.Config.OnConfirm).
func (m *Metrics) ObserveConfirm(commitTime time.Time) {
	if d := clock.Since(m.clock, commitTime); d >= 0 {
		m.commitToAck.Observe(d.Seconds())
	}
}

// Topics returns a copy of the per-topic figures.
func (m *Metrics) Topics() map[string]TopicStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]TopicStats, len(m.topics))
	for k, v := range m.topics {
		out[k] = *v
	}
	return out
}
