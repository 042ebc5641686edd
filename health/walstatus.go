package health

import "github.com/prometheus/client_golang/prometheus"

// walStatusCollector exposes the slot's wal_status at scrape time, one series
// per value with 1 on the current one, so an alert can say "unreserved" or
// "lost" on its own: safe_wal_size alone cannot tell a lost slot from a
// server without max_slot_wal_keep_size (both NULL).
type walStatusCollector struct{ mon *Monitor }

var (
	descWALStatus = prometheus.NewDesc("outboxd_slot_wal_status",
		"1 for the slot's wal_status in pg_replication_slots (reserved, extended, unreserved, lost), 0 for the others.", []string{"slot", "status"}, nil)
	walStatuses = []string{"reserved", "extended", "unreserved", "lost"}
)

func (c walStatusCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descWALStatus }

func (c walStatusCollector) Collect(ch chan<- prometheus.Metric) {
	sl := c.mon.Snapshot().Slot
	if sl == nil {
		return
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
}
