package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
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
	if limit, ok := cfg.SoftMemoryLimit(); ok && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(limit)
	}
	conn, err := cfg.Postgres.ConnConfig()
	if err != nil {
		return usageError{err}
	}
	// The routed model, built once: the router, the publication, the
	// cut-over snapshot, marks and retention all read it.
	routing := cfg.Routing()
	metrics := health.NewMetrics(nil)
	var mon *health.Monitor
	var srv *health.Server
	rc := replicationConfig(cfg, routing, conn, metrics)
	sc, err := kafkaConfig(ctx, cfg)
	if err != nil {
		return usageError{err}
	}
	sc.Observe = metrics.ObserveProduce
	sc.Partitions = metrics.ObservePartitions
	sc.Skipped = metrics.ObserveSkipped
	sc.TailGivenUp = metrics.ObserveTailGivenUp
	// A partition's tail that cannot be read is given up within half the
	// delivery timeout: its records go out, never waiting until the
	// timeout calls the broker unreachable (sink/dedupe.go).
	sc.TailTimeout = cfg.Kafka.DeliveryTimeout / 2
	sc.Rejected = metrics.ObserveRejected
	if sc.StreamKey, err = streamKey(cfg, log); err != nil {
		return usageError{err}
	}
	warnInsecure(cfg, log)
	tracer, stopTracing, err := startTracing(cfg, metrics, log.Named("tracing"))
	if err != nil {
		return usageError{err}
	}
	defer stopTracing() // after the runner: every span has ended
	rc.Trace = tracer
	if cfg.Health.Listen != "" {
		// The same question check asks: does the broker answer as Kafka?
		prober := sink.NewProber(sc)
		defer prober.Close()
		mon = health.NewMonitor(health.MonitorConfig{Conn: conn, Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication,
			Tables: rc.Tables, Brokers: cfg.Kafka.Brokers, Probe: prober.Probe, Interval: cfg.Health.PollInterval}, log.Named("health"))
		rc.OnStreaming = mon.PollNow
	}
	schemas, err := resolveSchemas(ctx, cfg, &routing, log.Named("schema"))
	if err != nil {
		return err
	}
	router, err := newRouter(cfg, routing)
	if err != nil {
		return usageError{err}
	}
	tableParts := onTables(cfg, routing.Tables(), conn, router, &rc, metrics, log)
	runner := buildRunner(rc, sc, streamOf(cfg, schemas), transactionalID(cfg), router, log)
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
	keeper := &replication.RecordKeeper{Conn: conn, Table: rc.SlotTable, Slot: rc.Slot, Every: time.Minute, Log: log.Named("replication")}
	parts = append(parts, part{name: "slot record", run: func(ctx context.Context) error { keeper.Run(ctx); return nil }})
	return runBeside(ctx, runner.Run, append(parts, tableParts...))
}

// streamKey is the key of the stream header's MAC (sink.LoadStreamKey)
// when de-duplicating; nil otherwise. When the key file can be neither
// read nor made it is, said loudly, a random key of this process's own:
// its sessions prove positions to each other, but nothing an earlier
// process produced proves one (duplicates after a restart, never a loss).
func streamKey(cfg config.Config, log hclog.Logger) ([]byte, error) {
	if !cfg.Kafka.Deduplicate || !cfg.Kafka.Idempotence {
		return nil, nil
	}
	const degraded = "restart de-duplication signs its records with a key that dies with this process: after a restart, the records the slot had not confirmed are produced again (duplicates, never a loss); "
	path := cfg.Kafka.StreamKeyFile
	if path == "" {
		log.Warn("NO STREAM KEY: kafka.stream_key_file is empty: " + degraded + "give the instances of the slot one key file (docs/guarantees.md)")
		return processKey(), nil
	}
	key, created, err := sink.LoadStreamKey(path)
	switch {
	case errors.Is(err, sink.ErrStreamKeyNotKept):
		log.Warn("NO STREAM KEY FILE: "+degraded+"make kafka.stream_key_file's directory writable, or mount there the key the instances of the slot share (docs/guarantees.md)", "error", err)
		return processKey(), nil
	case err != nil:
		return nil, fmt.Errorf("kafka.stream_key_file: %w", err)
	case created:
		log.Info("made the stream key: every instance of this slot needs the same file (docs/guarantees.md)", "file", path)
	}
	return key, nil
}

// processKey is a random stream key for this process alone.
func processKey() []byte {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // crypto/rand never fails on a supported platform
	return key
}

// warnInsecure logs, at every start, each setting that leaves a connection
// open to being read or changed on the way.
func warnInsecure(cfg config.Config, log hclog.Logger) {
	if detail, fix := cfg.Postgres.TLSWarning(); detail != "" {
		log.Warn(detail + "; " + fix)
	}
	if cfg.Kafka.TLS.InsecureSkipVerify {
		log.Warn("kafka.tls.insecure_skip_verify is true: the brokers' certificates are NOT verified; anyone on the path can read and change the events")
	}
	if cfg.Kafka.SASL.Mechanism == sink.SASLPlain && !cfg.Kafka.TLS.Enable {
		log.Warn("kafka.sasl.mechanism PLAIN without kafka.tls sends the password in clear text: enable kafka.tls (SASL_SSL) or use SCRAM")
	}
	for i, r := range cfg.Routes {
		s := r.Registry
		if strings.HasPrefix(s.URL, "http://") && (s.Password != "" || strings.Contains(s.URL, "@")) {
			log.Warn(fmt.Sprintf("routes[%d].schema: basic authentication over http:// sends the registry's password in clear text: use an https:// registry URL", i))
		}
	}
	if strings.HasPrefix(cfg.Tracing.Endpoint, "http://") && len(cfg.Tracing.Headers) > 0 {
		log.Warn("tracing.headers go to an http:// endpoint in clear text (a bearer token with them): use an https:// tracing.endpoint")
	}
}

// onTables wires what works on the routed tables themselves: the marks
// (postgres.mark_published) and the cut-over snapshot go into rc; the
// parts returned run beside the stream (the marker, retention).
func onTables(cfg config.Config, tables []envelope.Table, conn *pgconn.Config, router *envelope.Router, rc *replication.Config, metrics *health.Metrics, log hclog.Logger) []part {
	var parts []part
	var marker *republish.Marker
	if cfg.Postgres.MarkPublished {
		marker = republish.NewMarker(conn, tables)
		rc.Mark = marker.Wrap
		// A mark that fails fails its record's acknowledgement: the
		// runner stops on a permanent one (a missing privilege).
		parts = append(parts, part{name: "mark_published", run: func(ctx context.Context) error { marker.Run(ctx); return nil }})
	}
	for _, t := range tables {
		if t.Route.Columns.PublicatEn != "" {
			rc.SnapshotTables = append(rc.SnapshotTables, catalog.Table{Schema: t.Schema, Name: t.Name})
		}
	}
	if cfg.Postgres.Snapshot == config.SnapshotPending {
		snap := &republish.Snapshotter{Conn: conn, Router: router, Tables: tables, Marker: marker, Trace: rc.Trace,
			MaxInFlight: cfg.Pipeline.MaxInFlightEvents, DeliveryTimeout: cfg.Kafka.DeliveryTimeout, Log: log.Named("snapshot")}
		rc.Snapshot = func(ctx context.Context, snapshot, at string, prod replication.Producer) error {
			return snap.Publish(ctx, snapshot, at, prod)
		}
	}
	if rt := cfg.Retention; rt.MaxAge > 0 {
		job := retention.New(retention.Config{Conn: conn, Slot: cfg.Postgres.Slot, SlotTable: slotTable(cfg.Postgres), Tables: tables, DropPartitions: rt.Mode == config.RetentionDropPartitions, MaxAge: rt.MaxAge,
			Interval: rt.Interval, BatchSize: rt.BatchSize, ConfirmTimeout: rt.ConfirmTimeout, LockTimeout: rt.LockTimeout,
			Observer: metrics.Retention(rt.Interval)}, log.Named("retention"))
		parts = append(parts, part{name: "retention", run: func(ctx context.Context) error { job.Run(ctx); return nil }})
	}
	return parts
}

func replicationConfig(cfg config.Config, routing envelope.Routing, conn *pgconn.Config, metrics *health.Metrics) replication.Config {
	p, pl := cfg.Postgres, cfg.Pipeline
	return replication.Config{
		Conn: conn, Slot: p.Slot, SlotTable: slotTable(p), Publication: p.Publication, CreateSlot: p.CreateSlot, CreatePublication: p.CreatePublication,
		FailoverSlot: p.FailoverSlot, Tables: routing.Publication(), StatusInterval: p.StatusInterval, IdleStatusInterval: p.IdleStatusInterval,
		MaxInFlightEvents: pl.MaxInFlightEvents, MaxInFlightBytes: pl.MaxInFlightBytes, ShutdownTimeout: pl.ShutdownTimeout,
		BackoffMin: pl.BackoffMin, BackoffMax: pl.BackoffMax, StandbyRetry: p.StandbyRetry,
		ReceiveTimeout: p.ReceiveTimeout, DeliveryTimeout: cfg.Kafka.DeliveryTimeout,
		OnConfirm: metrics.ObserveConfirm, Streaming: p.Streaming, SpillDir: pl.SpillDir,
	}
}

// slotTable is postgres.slot_table, where the slot record is kept
// (catalog.SlotRecord).
func slotTable(p config.Postgres) catalog.Table {
	schema, name := p.SlotTableName()
	return catalog.Table{Schema: schema, Name: name}
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
		MaxAttempts: k.MaxAttempts, WriteTimeout: k.WriteTimeout, ClientID: k.ClientID, Idempotence: k.Idempotence,
		OnPartitionChange: k.OnPartitionChange, TLS: tlsc, SASL: mech, TransactionInterval: k.TransactionInterval,
	}, nil
}

// buildRunner makes the replication runner, with a Kafka producer per
// session.
func buildRunner(rc replication.Config, sc sink.Config, stream string, txnID func(system string) string, router *envelope.Router, log hclog.Logger) *replication.Runner {
	sinkLog := log.Named("sink")
	newProducer := func(src replication.Source) (replication.Producer, error) {
		if txnID != nil {
			sc.TransactionalID = txnID(src.System)
		}
		if stream != "" {
			sc.Stream = src.System + "/" + stream
			sc.Timeline, sc.WALEnd = src.Timeline, src.WALEnd
			sc.Timelines = map[uint32]sink.Timeline{}
			for n, tl := range src.Timelines {
				sc.Timelines[n] = sink.Timeline{Start: tl.Start, End: tl.End}
			}
		}
		return sink.New(sc, sinkLog)
	}
	return replication.NewRunner(rc, router, newProducer, log.Named("replication"))
}

// newRouter is the one envelope router of the configuration: the stream,
// the cut-over snapshot and replay build every record through it.
func newRouter(cfg config.Config, routing envelope.Routing) (*envelope.Router, error) {
	router, err := envelope.NewRouter(cfg.Origen, routing.Routes, int(cfg.Kafka.BatchBytes))
	if err != nil {
		return nil, fmt.Errorf("routes: %w", err)
	}
	return router, nil
}

// transactionalID is the producer's transactional id for a database
// system (config.Config.TransactionalID); nil when kafka.transactions is
// off.
func transactionalID(cfg config.Config) func(system string) string {
	if !cfg.Kafka.Transactions {
		return nil
	}
	return cfg.TransactionalID
}

// streamOf is the part of the records' stream identity (sink.Config.Stream)
// the configuration decides: the slot, and a digest of everything that
// decides a row's topic, partition or dead-letter fate: the routes, the
// partitioner, kafka.batch_bytes (a larger row is a bad row), the
// registry's schemas each route writes by (schemas: which rows pass, and
// a registered key's bytes, which the partitioner hashes), and the
// publication (which changes a transaction's index counts). The session
// puts the database system's identifier before it. "" when
// kafka.deduplicate is off.
func streamOf(cfg config.Config, schemas string) string {
	if !cfg.Kafka.Deduplicate {
		return ""
	}
	routes, err := json.Marshal(cfg.Routes)
	if err != nil {
		panic(err) // plain data: it always marshals
	}
	h := fnv.New64a()
	for _, part := range [][]byte{routes, []byte(cfg.Kafka.Partitioner), []byte(cfg.Postgres.Publication),
		strconv.AppendInt(nil, cfg.Kafka.BatchBytes, 10), []byte(schemas)} {
		h.Write(part)
		h.Write([]byte{0}) // each part ends: no two configurations write the same bytes
	}
	return fmt.Sprintf("%s/%x", cfg.Postgres.Slot, h.Sum64())
}
