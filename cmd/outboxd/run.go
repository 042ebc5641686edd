package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/health"
	"github.com/outboxd/outboxd/replication"
	"github.com/outboxd/outboxd/sink"
)

func run(ctx context.Context, path string, stderr io.Writer) error {
	cfg, err := config.Load(path)
	if err != nil {
		return usageError{err}
	}
	log := hclog.New(&hclog.LoggerOptions{
		Name:       "outboxd",
		Level:      hclog.LevelFromString(cfg.Log.Level),
		JSONFormat: cfg.Log.Format == "json",
		Output:     stderr,
	})
	metrics := health.NewMetrics()
	runner, err := buildRunner(cfg, metrics, log)
	if err != nil {
		return err
	}
	var srv *health.Server
	var mon *health.Monitor
	if cfg.Health.Listen != "" {
		tables := make([]string, len(cfg.Routes))
		for i, r := range cfg.Routes {
			tables[i] = r.Table
		}
		mon = health.NewMonitor(cfg.Postgres.DSN, cfg.Postgres.Slot, cfg.Postgres.Publication, tables, cfg.Kafka.Brokers, cfg.Health.PollInterval, log.Named("health"))
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

	// The health goroutines live until the runner has stopped.
	hctx, stopHealth := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	serveErr := make(chan error, 1)
	if srv != nil {
		wg.Add(2)
		go func() { defer wg.Done(); serveErr <- srv.Serve() }()
		go func() { defer wg.Done(); mon.Run(hctx, srv.Watch) }()
	}
	runErr := runner.Run(ctx)
	stopHealth()
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
		if err := <-serveErr; err != nil && runErr == nil {
			runErr = fmt.Errorf("health server: %w", err)
		}
	}
	wg.Wait()
	return runErr
}

// buildRunner turns the configuration into a replication runner with a
// Kafka producer per session.
func buildRunner(cfg config.Config, metrics *health.Metrics, log hclog.Logger) (*replication.Runner, error) {
	routes := make([]envelope.Route, len(cfg.Routes))
	tables := make([]replication.Table, len(cfg.Routes))
	for i, r := range cfg.Routes {
		cols := envelope.Columns{ID: r.Columns.ID, AgregatID: r.Columns.AgregatID, Tipus: r.Columns.Tipus,
			Versio: r.Columns.Versio, Carrega: r.Columns.Carrega, CreatEn: r.Columns.CreatEn}
		routes[i] = envelope.Route{Schema: r.Schema, Table: r.Name, Topic: r.Topic, Columns: cols}
		if r.OnError == config.OnErrorDeadLetter {
			routes[i].DeadLetterTopic = r.DeadLetterTopic
		}
		tables[i] = replication.Table{Schema: r.Schema, Name: r.Name}
	}
	sc := sink.Config{
		Brokers: cfg.Kafka.Brokers, Partitioner: cfg.Kafka.Partitioner, Compression: cfg.Kafka.Compression,
		Linger: cfg.Kafka.Linger, BatchSize: cfg.Kafka.BatchSize, BatchBytes: cfg.Kafka.BatchBytes,
		MaxAttempts: cfg.Kafka.MaxAttempts, WriteTimeout: cfg.Kafka.WriteTimeout, ClientID: cfg.Kafka.ClientID,
		Observe: metrics.ObserveProduce,
	}
	sinkLog := log.Named("sink")
	newProducer := func() (replication.Producer, error) { return sink.New(sc, sinkLog) }
	p, pl := cfg.Postgres, cfg.Pipeline
	rc := replication.Config{
		DSN: p.DSN, Slot: p.Slot, Publication: p.Publication, CreateSlot: p.CreateSlot, CreatePublication: p.CreatePublication,
		Tables: tables, StatusInterval: p.StatusInterval, IdleStatusInterval: p.IdleStatusInterval, ConnectTimeout: p.ConnectTimeout,
		MaxInFlightEvents: pl.MaxInFlightEvents, MaxInFlightBytes: pl.MaxInFlightBytes, ShutdownTimeout: pl.ShutdownTimeout,
		BackoffMin: pl.BackoffMin, BackoffMax: pl.BackoffMax, StandbyRetry: p.StandbyRetry,
		MaxRecordBytes: cfg.Kafka.BatchBytes, ReceiveTimeout: p.ReceiveTimeout, DeliveryTimeout: cfg.Kafka.DeliveryTimeout,
		OnConfirm: metrics.ObserveConfirm,
	}
	return replication.NewRunner(rc, envelope.NewRouter(cfg.Origen, routes), newProducer, log.Named("replication"))
}
