package health

import (
	"testing"

	"github.com/outboxd/outboxd/tracing"
)

// TestSpanMetrics: the span counters read the tracer's counts at each
// scrape.
func TestSpanMetrics(t *testing.T) {
	m := NewMetrics(nil)
	c := tracing.Counts{Started: 10, Exported: 7, Failed: 1}
	m.Spans(func() tracing.Counts { return c })
	check := func(want map[string]float64) {
		t.Helper()
		mfs, err := m.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			if _, ok := want[mf.GetName()]; ok {
				got[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		for name, w := range want {
			if g, ok := got[name]; !ok || g != w {
				t.Errorf("%s = %g (present: %t), want %g", name, g, ok, w)
			}
		}
	}
	check(map[string]float64{"outboxd_trace_spans_started_total": 10, "outboxd_trace_spans_exported_total": 7, "outboxd_trace_spans_failed_total": 1})
	c.Exported = 9
	check(map[string]float64{"outboxd_trace_spans_exported_total": 9})
}
