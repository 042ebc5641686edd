// Package preflight checks, before outboxd runs, that PostgreSQL and Kafka
// are set up the way the configuration needs: one Result per check, each
// with what is wrong and how to fix it.
//
// Checking never changes anything: no slot, publication or topic is
// created, and topics are listed without asking the broker to create them.
package preflight

import (
	"context"
	"fmt"
	"strings"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/postgres"
	"github.com/outboxd/outboxd/sink"
)

// Check outcomes.
const (
	Pass = "PASS"
	Fail = "FAIL"
	Skip = "SKIP" // not run because a check it depends on failed
	// Warn is a risk outboxd runs with, not a failure: check still exits 0.
	Warn = "WARN"
)

// Result is the outcome of one check.
type Result struct {
	Name   string // "wal_level", "table public.outbox", "topic comandes.esdeveniments"
	Status string // Pass, Fail or Skip
	Detail string // what was found (PASS) or what is wrong (FAIL, WARN)
	Fix    string // FAIL and WARN only: what the operator should do
}

// String is the result as one line: "PASS name: detail" or
// "FAIL name: detail — fix: hint" (WARN likewise).
func (r Result) String() string {
	if (r.Status == Fail || r.Status == Warn) && r.Fix != "" {
		return fmt.Sprintf("%s %s: %s — fix: %s", r.Status, r.Name, r.Detail, r.Fix)
	}
	return fmt.Sprintf("%s %s: %s", r.Status, r.Name, r.Detail)
}

// Run performs every check against cfg, in order: config, the database
// checks (which need a connection), Kafka and its topics, then the routes'
// schema registries.
// kafka is how outboxd connects to the brokers (client id, TLS, SASL).
func Run(ctx context.Context, cfg config.Config, kafka sink.Config) []Result {
	t := newTarget(cfg)
	out := []Result{{Name: "config", Status: Pass, Detail: fmt.Sprintf("%d route(s), slot %s, publication %s", len(t.routing.Routes), cfg.Postgres.Slot, cfg.Postgres.Publication)}}
	out = append(out, checkPostgres(ctx, &t)...)
	out = append(out, checkKafka(ctx, t, kafka)...)
	out = append(out, streamKeyLine(t.Config))
	out = append(out, checkRegistries(ctx, t)...)
	return out
}

// target is what the checks judge: the configuration, and its routing
// (config.Config.Routing) built once.
type target struct {
	config.Config
	routing envelope.Routing
	// system is the database system's identifier, once the database
	// checks read it ("" if they could not): the default transactional id
	// names it.
	system string
	// service is the managed service the database is on, once the
	// database checks recognised it (nil: none, or self-managed).
	service *postgres.Service
}

func newTarget(cfg config.Config) target { return target{Config: cfg, routing: cfg.Routing()} }

// ConfigInvalid is the checklist for a configuration that could not be
// loaded: the config check fails and every other check is skipped.
func ConfigInvalid(err error) []Result {
	out := []Result{{Name: "config", Status: Fail, Detail: oneLine(err.Error()), Fix: "correct the file (each problem names its line)"}}
	for _, name := range []string{"database", "kafka"} {
		out = append(out, skipped(name, "the configuration is not valid"))
	}
	return out
}

func pass(name, format string, args ...any) Result {
	return Result{Name: name, Status: Pass, Detail: fmt.Sprintf(format, args...)}
}

func fail(name, detail, fix string) Result {
	return Result{Name: name, Status: Fail, Detail: detail, Fix: fix}
}

func warn(name, detail, fix string) Result {
	return Result{Name: name, Status: Warn, Detail: detail, Fix: fix}
}

func skipped(name, because string) Result {
	return Result{Name: name, Status: Skip, Detail: "skipped: " + because}
}

// oneLine joins a multi-line error (errors.Join) so that a result stays one
// line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}
