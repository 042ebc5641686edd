package health

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxd/outboxd/tracing"
)

// Spans registers the counters of outboxd's own spans (tracing on), read
// from counts at each scrape: those started, sent to the receiver, and
// refused by it or not sent. Started minus the other two is what is
// queued (at most tracing.queue_size) or was dropped from a full queue.
func (m *Metrics) Spans(counts func() tracing.Counts) {
	counter := func(name, help string, of func(tracing.Counts) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(of(counts())) })
	}
	m.reg.MustRegister(
		counter("outboxd_trace_spans_started_total", "Spans outboxd started (sampled records; tracing).", func(c tracing.Counts) uint64 { return c.Started }),
		counter("outboxd_trace_spans_exported_total", "Spans the OTLP receiver took.", func(c tracing.Counts) uint64 { return c.Exported }),
		counter("outboxd_trace_spans_failed_total", "Spans whose export the receiver refused or that could not be sent.", func(c tracing.Counts) uint64 { return c.Failed }),
	)
}
