package health

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RetentionMetrics is the retention job's figures (retention.Observer).
type RetentionMetrics struct {
	deleted, dropped, droppedRows *prometheus.CounterVec
	oldest, dueSince              *prometheus.GaugeVec
}

// Retention registers the retention job's metrics, run every interval,
// and returns their observer.
func (m *Metrics) Retention(interval time.Duration) *RetentionMetrics {
	r := &RetentionMetrics{
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_retention_rows_deleted_total",
			Help: "Outbox rows the retention job deleted (retention.mode delete), by table."}, []string{"table"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_retention_partitions_dropped_total",
			Help: "Partitions the retention job dropped (retention.mode drop_partitions), by table."}, []string{"table"}),
		droppedRows: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_retention_rows_dropped_total",
			Help: "Outbox rows in the partitions the retention job dropped, by table."}, []string{"table"}),
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outboxd_retention_oldest_partition_timestamp_seconds",
			Help: "Unix time the range of the table's oldest partition (the default aside) starts at; time() minus it is the oldest retained partition's age."}, []string{"table"}),
		dueSince: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outboxd_retention_due_since_timestamp_seconds",
			Help: "Unix time the oldest partition still present became due (its range's end plus retention.max_age); absent while none is due."}, []string{"table"}),
	}
	every := prometheus.NewGauge(prometheus.GaugeOpts{Name: "outboxd_retention_interval_seconds",
		Help: "retention.interval: how often the retention job runs."})
	every.Set(interval.Seconds())
	m.reg.MustRegister(r.deleted, r.dropped, r.droppedRows, r.oldest, r.dueSince, every)
	return r
}

// Deleted counts rows a DELETE batch removed.
func (r *RetentionMetrics) Deleted(table string, rows int) {
	r.deleted.WithLabelValues(table).Add(float64(rows))
}

// Dropped counts one dropped partition and its rows.
func (r *RetentionMetrics) Dropped(table string, rows int64) {
	r.dropped.WithLabelValues(table).Inc()
	r.droppedRows.WithLabelValues(table).Add(float64(rows))
}

// Partitions sets the oldest partition's start and when partitions became
// due; a zero time removes the series.
func (r *RetentionMetrics) Partitions(table string, oldest, dueSince time.Time) {
	for g, t := range map[*prometheus.GaugeVec]time.Time{r.oldest: oldest, r.dueSince: dueSince} {
		if t.IsZero() {
			g.DeleteLabelValues(table)
			continue
		}
		g.WithLabelValues(table).Set(float64(t.UnixNano()) / 1e9)
	}
	// The counters show 0 from the first pass on, not from the first drop.
	r.dropped.WithLabelValues(table)
	r.droppedRows.WithLabelValues(table)
}
