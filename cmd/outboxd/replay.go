package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/republish"
	"github.com/outboxd/outboxd/sink"
)

// replayArgs are the flags of `outboxd replay`.
type replayArgs struct {
	from, to, route string
	ids             idList
	wait            time.Duration
}

// idList is a repeatable --id flag; each value may hold several ids
// separated by commas.
type idList []string

func (l *idList) String() string { return strings.Join(*l, ",") }

func (l *idList) Set(v string) error {
	for _, id := range strings.Split(v, ",") {
		if id = strings.TrimSpace(id); id != "" {
			*l = append(*l, id)
		}
	}
	return nil
}

// replay republishes outbox rows from the table (see republish.Replayer),
// printing progress on stderr and what it published on stdout.
func replay(ctx context.Context, path string, a replayArgs, stdout, stderr io.Writer) error {
	c := clock.System
	now := c.Now()
	var req republish.ReplayRequest
	switch {
	case len(a.ids) > 0 && (a.from != "" || a.to != ""):
		return usageError{errors.New("replay: --id excludes --from and --to")}
	case len(a.ids) > 0:
		req.IDs = a.ids
	case a.from == "":
		return usageError{errors.New("replay: --from TIME (or --id ID) is required")}
	default:
		var err error
		if req.From, err = replayTime(a.from, now); err != nil {
			return usageError{fmt.Errorf("replay: --from: %w", err)}
		}
		if a.to != "" {
			if req.To, err = replayTime(a.to, now); err != nil {
				return usageError{fmt.Errorf("replay: --to: %w", err)}
			}
		}
	}
	cfg, err := config.Load(path)
	if err != nil {
		return usageError{err}
	}
	routing := cfg.Routing()
	for _, t := range routing.Tables() {
		if a.route == "" || a.route == t.String() || a.route == t.Route.Topic {
			req.Tables = append(req.Tables, t)
		}
	}
	if len(req.Tables) == 0 {
		return usageError{fmt.Errorf("replay: no route has the table or topic %q", a.route)}
	}
	conn, err := cfg.Postgres.ConnConfig()
	if err != nil {
		return usageError{err}
	}
	sc, err := kafkaConfig(ctx, cfg)
	if err != nil {
		return usageError{err}
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "outboxd", Level: hclog.LevelFromString(cfg.Log.Level), JSONFormat: cfg.Log.Format == "json", Output: stderr})
	tracer, stopTracing, err := startTracing(cfg, nil, log.Named("tracing"))
	if err != nil {
		return usageError{err}
	}
	defer stopTracing() // after the producer's Close: every span has ended
	prod, err := sink.New(sc, log.Named("sink"))
	if err != nil {
		return fmt.Errorf("kafka producer: %w", err)
	}
	if _, err := resolveSchemas(ctx, cfg, &routing, log.Named("schema")); err != nil {
		return err
	}
	router, err := newRouter(cfg, routing)
	if err != nil {
		return usageError{err}
	}
	r := &republish.Replayer{Conn: conn, Router: router, Slot: cfg.Postgres.Slot, Wait: a.wait, MaxInFlight: cfg.Pipeline.MaxInFlightEvents, Trace: tracer,
		DeliveryTimeout: cfg.Kafka.DeliveryTimeout, Clock: c, Log: log.Named("replay"), OnWait: func(w republish.Waiting) {
			fmt.Fprintf(stderr, "replay: %d rows to publish, waiting until the slot has passed them (%s of %s): %s\n", w.Rows, w.Waited.Round(time.Second), w.Limit, w.Reason)
		}}
	started := c.Now()
	counts, err := r.Replay(ctx, req, prod, func(p republish.Progress) {
		fmt.Fprintf(stderr, "replay: %d of %d rows read, %d of their %d records acknowledged by Kafka (%s)\n", p.Read, p.Total, p.Acked, p.Records, p.Table)
	})
	cctx, cancel := context.WithTimeout(context.Background(), cfg.Pipeline.ShutdownTimeout)
	defer cancel()
	if cerr := prod.Close(cctx); cerr != nil && err == nil {
		err = fmt.Errorf("kafka producer: %w", cerr)
	}
	total := 0
	for _, c := range counts {
		total += c.Rows
	}
	if err != nil {
		return fmt.Errorf("%w (%d rows handed to Kafka before it)", err, total)
	}
	fmt.Fprintf(stdout, "published %d rows in %s, every one acknowledged by Kafka\n", total, clock.Since(c, started).Round(time.Millisecond))
	for _, c := range counts {
		fmt.Fprintf(stdout, "  %s -> %s: %d\n", c.Table, c.Topic, c.Rows)
	}
	return nil
}

// replayTime reads a --from or --to value: an RFC 3339 time, a timestamptz
// as PostgreSQL prints it (what `SELECT creat_en` shows: "2026-12-04
// 11:35:33.065544+00", "+05:30", seconds with or without a fraction), a
// date and time without a zone (UTC), a date (midnight UTC), or a duration
// meaning that long before now ("90m", "48h"). It returns RFC 3339 for
// PostgreSQL.
func replayTime(s string, now time.Time) (string, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return "", fmt.Errorf("%q: a duration means that long ago; give it without a sign", s)
		}
		return now.Add(-d).UTC().Format(time.RFC3339Nano), nil
	}
	for _, layout := range timeLayouts {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t.UTC().Format(time.RFC3339Nano), nil
		}
	}
	return "", fmt.Errorf("%q is not a time: give RFC 3339 (2026-12-03T10:00:00Z), a timestamptz as PostgreSQL prints it (2026-12-03 10:00:00.123456+00), a UTC date and time (2026-12-03 10:00), a date (2026-12-03) or a duration ago (90m)", s)
}

// timeLayouts are the forms replayTime reads, with a zone first. A
// fraction of a second after the seconds is read whether or not a layout
// shows one. PostgreSQL's ISO output gives the zone as +hh, +hh:mm or
// +hh:mm:ss (a zone whose offset is not whole hours, or a historical one).
var timeLayouts = []string{
	time.RFC3339Nano,
	"2006-01-02 15:04:05-07", "2006-01-02 15:04:05-07:00", "2006-01-02 15:04:05-07:00:00",
	"2006-01-02T15:04:05-07", "2006-01-02T15:04:05-07:00:00",
	"2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02T15:04", "2006-01-02 15:04", "2006-01-02",
}
