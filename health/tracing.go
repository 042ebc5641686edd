package health

import "github.com/prometheus/client_golang/prometheus"

// SpanCounts is what became of outboxd's spans so far (tracing.Counts).
type SpanCounts struct{ Started, Exported, Failed uint64 }

// Spans registers the counters of outboxd's own spans (tracing on), read
// from counts at each scrape: those started, sent to the receiver, and
// refused by it or not sent. Started minus the other two is what is
// queued (at most tracing.queue_size) or was dropped from a full queue.
func (m *Metrics) Spans(counts func() SpanCounts) {
	counter := func(name, help string, of func(SpanCounts) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(of(counts())) })
	}
	m.reg.MustRegister(
		counter("outboxd_trace_spans_started_total", "Spans outboxd started (sampled records; tracing).", func(c SpanCounts) uint64 { return c.Started }),
		counter("outboxd_trace_spans_exported_total", "Spans the OTLP receiver took.", func(c SpanCounts) uint64 { return c.Exported }),
		counter("outboxd_trace_spans_failed_total", "Spans whose export the receiver refused or that could not be sent.", func(c SpanCounts) uint64 { return c.Failed }),
	)
}
