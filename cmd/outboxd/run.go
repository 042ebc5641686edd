package main

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/health"
	"github.com/outboxd/outboxd/replication"
	"github.com/outboxd/outboxd/republish"
	"github.com/outboxd/outboxd/retention"
	"github.com/outboxd/outboxd/sink"
)

func run(ctx context.Context, path string, proc *process) error {
	cfg, err := config.Load(path)
	if err != nil {
		return usageError{err}
	}
	log := hclog.New(&hclog.LoggerOptions{
		Name:       "outboxd",
		Level:      hclog.LevelFromString(cfg.Log.Level),
		JSONFormat: cfg.Log.Format == "json",
		Output:     proc.stderr,
	})
	proc.useLogger(log)
	if limit, ok := cfg.Pipeline.SoftMemoryLimit(); ok && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(limit)
	}
	conn, err := cfg.Postgres.ConnConfig()
	if err != nil {
		return usageError{err}
	}
	metrics := health.NewMetrics()
	var mon *health.Monitor
	var srv *health.Server
	rc := replicationConfig(cfg, conn, metrics)
	sc, err := kafkaConfig(ctx, cfg)
	if err != nil {
		return usageError{err}
	}
	sc.Observe = metrics.ObserveProduce
	sc.Partitions = metrics.ObservePartitions
	if detail, fix := cfg.Postgres.TLSWarning(); detail != "" {
		log.Warn(detail + "; " + fix)
	}
	if cfg.Kafka.TLS.InsecureSkipVerify {
		log.Warn("kafka.tls.insecure_skip_verify is true: the brokers' certificates are NOT verified; anyone on the path can read and change the events")
	}
	if cfg.Kafka.SASL.Mechanism == sink.SASLPlain && !cfg.Kafka.TLS.Enable {
		log.Warn("kafka.sasl.mechanism PLAIN without kafka.tls sends the password in clear text: enable kafka.tls (SASL_SSL) or use SCRAM")
	}
	if cfg.Health.Listen != "" {
		// The same question check asks: does the broker answer as Kafka?
		probe := func(ctx context.Context, addr string) error {
			c, err := sink.Dial(ctx, sc, addr)
			if err == nil {
				c.Close()
			}
			return err
		}
		mon = health.NewMonitor(health.MonitorConfig{Conn: conn, Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication,
			Routes: rc.Routes, Brokers: cfg.Kafka.Brokers, Probe: probe, Interval: cfg.Health.PollInterval}, log.Named("health"))
		rc.OnStreaming = mon.PollNow
	}
	router, err := newRouter(cfg)
	if err != nil {
		return usageError{err}
	}
	var marker *republish.Marker
	if cfg.Postgres.MarkPublished {
		marker = republish.NewMarker(conn, outboxTables(cfg), log.Named("mark"))
		rc.Mark = marker.Wrap
	}
	if cfg.Postgres.Snapshot == config.SnapshotPending {
		snap := &republish.Snapshotter{Conn: conn, Router: router, Tables: outboxTables(cfg), Marker: marker,
			MaxInFlight: cfg.Pipeline.MaxInFlightEvents, DeliveryTimeout: cfg.Kafka.DeliveryTimeout, Log: log.Named("snapshot")}
		rc.Snapshot = func(ctx context.Context, snapshot, at string, prod replication.Producer) error {
			return snap.Publish(ctx, snapshot, at, prod)
		}
	}
	runner := buildRunner(rc, sc, router, log)
	if mon != nil {
		// Bound now, so a port clash fails at start.
		srv, err = health.Listen(cfg.Health.Listen, runner, mon, metrics,
			health.Limits{MaxLag: cfg.Health.MaxLag, MaxRetainedWALBytes: cfg.Health.MaxRetainedWALBytes, Pprof: cfg.Health.Pprof}, log.Named("health"))
		if err != nil {
			return fmt.Errorf("health server: %w", err)
		}
		log.Info("health server listening", "addr", srv.Addr())
	}
	log.Info("starting", "origen", cfg.Origen, "dsn", cfg.Postgres.RedactedDSN(), "slot", cfg.Postgres.Slot,
		"publication", cfg.Postgres.Publication, "brokers", strings.Join(cfg.Kafka.Brokers, ","))

	var parts []part
	if srv != nil {
		parts = append(parts, part{name: "health server", run: func(context.Context) error { return srv.Serve() }, stop: func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}}, part{name: "health monitor", run: func(ctx context.Context) error { mon.Run(ctx, srv.Watch); return nil }})
	}
	if marker != nil {
		// A mark that fails fails its record's acknowledgement: the
		// runner stops on a permanent one (a missing privilege).
		parts = append(parts, part{name: "mark_published", run: func(ctx context.Context) error { marker.Run(ctx); return nil }})
	}
	if rt := cfg.Retention; rt.MaxAge > 0 {
		var tables []retention.Table
		for _, t := range cfg.Tables() {
			tables = append(tables, retention.Table{Schema: t.Schema, Name: t.Name, CreatEn: cfg.Routes[t.Routes[0]].Columns.CreatEn})
		}
		job := retention.New(retention.Config{Conn: conn, Slot: cfg.Postgres.Slot, Tables: tables, MaxAge: rt.MaxAge,
			Interval: rt.Interval, BatchSize: rt.BatchSize, ConfirmTimeout: rt.ConfirmTimeout}, log.Named("retention"))
		parts = append(parts, part{name: "retention", run: func(ctx context.Context) error { job.Run(ctx); return nil }})
	}
	return runBeside(ctx, runner.Run, parts)
}

func replicationConfig(cfg config.Config, conn *pgconn.Config, metrics *health.Metrics) replication.Config {
	p, pl := cfg.Postgres, cfg.Pipeline
	return replication.Config{
		Conn: conn, Slot: p.Slot, Publication: p.Publication, CreateSlot: p.CreateSlot, CreatePublication: p.CreatePublication,
		FailoverSlot: p.FailoverSlot, Routes: cfg.CatalogRoutes(), StatusInterval: p.StatusInterval, IdleStatusInterval: p.IdleStatusInterval,
		MaxInFlightEvents: pl.MaxInFlightEvents, MaxInFlightBytes: pl.MaxInFlightBytes, ShutdownTimeout: pl.ShutdownTimeout,
		BackoffMin: pl.BackoffMin, BackoffMax: pl.BackoffMax, StandbyRetry: p.StandbyRetry,
		ReceiveTimeout: p.ReceiveTimeout, DeliveryTimeout: cfg.Kafka.DeliveryTimeout,
		OnConfirm: metrics.ObserveConfirm,
	}
}

// kafkaConfig is how outboxd talks to Kafka, for the producer, the health
// monitor and check alike: TLS files are read and SASL set up here, so a
// bad file fails at start.
func kafkaConfig(ctx context.Context, cfg config.Config) (sink.Config, error) {
	k := cfg.Kafka
	tlsc, err := sink.BuildTLS(sink.TLSOptions{Enable: k.TLS.Enable, CAFile: k.TLS.CAFile, CertFile: k.TLS.CertFile, KeyFile: k.TLS.KeyFile,
		ServerName: k.TLS.ServerName, MinVersion: k.TLS.MinVersion, InsecureSkipVerify: k.TLS.InsecureSkipVerify})
	if err != nil {
		return sink.Config{}, err
	}
	mech, err := sink.BuildSASL(ctx, sink.SASLOptions{Mechanism: k.SASL.Mechanism, Username: k.SASL.Username, Password: k.SASL.Password, AWSRegion: k.SASL.AWSRegion})
	if err != nil {
		return sink.Config{}, err
	}
	return sink.Config{
		Brokers: k.Brokers, Partitioner: k.Partitioner, Compression: k.Compression,
		Linger: k.Linger, BatchSize: k.BatchSize, BatchBytes: k.BatchBytes,
		MaxAttempts: k.MaxAttempts, WriteTimeout: k.WriteTimeout, ClientID: k.ClientID,
		OnPartitionChange: k.OnPartitionChange, TLS: tlsc, SASL: mech,
	}, nil
}

// buildRunner makes the replication runner, with a Kafka producer per
// session.
func buildRunner(rc replication.Config, sc sink.Config, router *envelope.Router, log hclog.Logger) *replication.Runner {
	sinkLog := log.Named("sink")
	newProducer := func() (replication.Producer, error) { return sink.New(sc, sinkLog) }
	return replication.NewRunner(rc, router, newProducer, log.Named("replication"))
}

// newRouter is the one envelope router of the configuration: the stream,
// the cut-over snapshot and replay build every record through it.
func newRouter(cfg config.Config) (*envelope.Router, error) {
	router, err := envelope.NewRouter(cfg.Origen, cfg.EnvelopeRoutes(), int(cfg.Kafka.BatchBytes))
	if err != nil {
		return nil, fmt.Errorf("routes: %w", err)
	}
	return router, nil
}

// outboxTables are the routed tables (config.Tables), as the table readers
// and writers (snapshot, replay, marks) see them.
func outboxTables(cfg config.Config) []republish.Table {
	var ts []republish.Table
	for _, t := range cfg.Tables() {
		r := cfg.Routes[t.Routes[0]]
		ts = append(ts, republish.Table{Route: r.Envelope(), PublicatEn: r.Columns.PublicatEn})
	}
	return ts
}
