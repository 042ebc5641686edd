package main

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/health"
	"github.com/outboxd/outboxd/publish"
	"github.com/outboxd/outboxd/redact"
	"github.com/outboxd/outboxd/tracing"
)

// startTracing starts the span exporter when tracing.endpoint is set: the
// Tracer for every publisher (nil when off) and the function that sends
// what is queued and stops it, to be called once nothing is published any
// more. metrics, when not nil, gets the span counters.
func startTracing(cfg config.Config, metrics *health.Metrics, log hclog.Logger) (publish.Tracer, func(), error) {
	t := cfg.Tracing
	if t.Endpoint == "" {
		return nil, func() {}, nil
	}
	tr, err := tracing.New(tracing.Config{Endpoint: t.Endpoint, SampleRatio: t.SampleRatio, Propagate: t.Propagate,
		ServiceName: t.ServiceName, Version: outboxd.Version, Headers: t.Headers, CAFile: t.CAFile, QueueSize: t.QueueSize,
		RecordKeys: t.RecordKeys, MaxRecordBytes: int(cfg.Kafka.BatchBytes)})
	if err != nil {
		return nil, nil, err
	}
	if metrics != nil {
		metrics.Spans(tr.Counts)
	}
	// The SDK reports an export that failed here (by default on the
	// standard logger, unstructured).
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing: spans not sent", "error", err) }))
	log.Info("tracing: a span per record", "endpoint", redact.URL(t.Endpoint), "sample_ratio", t.SampleRatio, "propagate", t.Propagate)
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := tr.Shutdown(sctx)
		c := tr.Counts()
		// Neither sent nor failed: dropped from a full queue, or not sent
		// within the shutdown's 5 s.
		args := []any{"started", c.Started, "exported", c.Exported, "failed", c.Failed, "dropped", c.Started - c.Exported - c.Failed}
		if err != nil {
			log.Warn("tracing: spans not all sent", append(args, "error", err)...)
			return
		}
		log.Info("tracing: spans", args...)
	}
	return tr, stop, nil
}
