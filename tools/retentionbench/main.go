// Command retentionbench measures what outboxd's retention job costs
// PostgreSQL in its two modes: the WAL written and the outbox's size and
// dead tuples over a day of events, scaled down, against a real
// PostgreSQL 15 and a real Kafka 4.1 (the project's scripts, via testenv).
// It is not a test; the numbers are published in docs/reports/RETENTION.md.
//
// A "day" is 24 "hours" of -hour each (2 s: a day of 48 s). Each workload
// (-runs) gets a fresh database, topic and slot, and outboxd running the
// same binary with a JSON log; a paced writer inserts -rate rows/s in
// transactions of -txn rows (~300 bytes of JSON in carrega) for two days.
// The first day fills the outbox up to retention.max_age (one day); the
// second is measured, with retention in steady state:
//
//   - baseline: a plain outbox (the seed's table, outbox_pendents and an
//     index on creat_en), retention off;
//   - delete: the same table, retention.mode delete (batch_size 1000);
//   - baseline-partitioned: the outbox partitioned by RANGE (creat_en), one
//     partition per hour made -premake hours ahead every half hour, as
//     pg_partman does, retention off;
//   - drop_partitions: the same, retention.mode drop_partitions.
//
// Retention runs every half hour with max_age one day and
// confirm_timeout one hour. There are two baselines because the writer's own
// WAL differs between the two tables (their indexes differ): the
// retention's own share of the WAL is its run's WAL per event minus its
// table's baseline's.
//
// Over the measured day: WAL (pg_wal_lsn_diff of pg_current_wal_lsn(), and
// pg_stat_wal's records and full-page images), the outbox's total size
// (pg_total_relation_size over pg_partition_tree: heap, indexes, TOAST,
// maps) at the start, the end and its peak (sampled every 250 ms), dead
// tuples (pg_stat_user_tables), autovacuum runs on the outbox (the same
// view) and what each autovacuum logged (the server log, with
// log_autovacuum_min_duration = 0: tuples removed, WAL), the retention
// job's log lines, the rows live and the oldest row at the end. After the
// writer stops, the topic must hold exactly the rows written.
//
// Two server settings are scaled with the day, since a real day holds
// hundreds of checkpoints and autovacuum naps: a CHECKPOINT every -checkpoint
// (one hour by default: 24 a day, so that a page written a day ago is
// logged whole again when the DELETE or vacuum touches it, as it would be),
// and autovacuum_naptime -naptime (ALTER SYSTEM, reset at the end).
//
//	go build -o /tmp/rb/outboxd ./cmd/outboxd
//	bash testenv/services.sh up /tmp/rb/svc
//	go run ./tools/retentionbench -outboxd-bin /tmp/rb/outboxd -services /tmp/rb/svc -out /tmp/rb/out
//	bash testenv/services.sh down /tmp/rb/svc
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/testenv"
)

type options struct {
	hour       time.Duration // one "hour"; a day is 24 of them
	rate       int           // rows/s
	txn        int           // rows per transaction
	writers    int           // connections the rate is split over
	premake    int           // partitions made ahead, in hours
	checkpoint time.Duration // a CHECKPOINT this often; 0: the server's own
	naptime    string        // autovacuum_naptime; "": the server's own
	partitions int           // topic partitions
	runs       []workload
	out        string
	services   string // reuse the services of `services.sh up DIR`
	binary     string // a prebuilt outboxd instead of this tree's
}

// day is 24 hours.
func (o options) day() time.Duration { return 24 * o.hour }

// workload is one run: a table and a retention mode.
type workload struct {
	key         string // the -runs name
	title       string // the table's column heading
	partitioned bool
	mode        string // "" (retention off), "delete", "drop_partitions"
}

var workloads = []workload{
	{key: "baseline", title: "no retention, plain table"},
	{key: "delete", title: "delete", mode: "delete"},
	{key: "baseline-partitioned", title: "no retention, partitioned", partitioned: true},
	{key: "drop_partitions", title: "drop_partitions", partitioned: true, mode: "drop_partitions"},
}

func main() {
	var o options
	var runs string
	flag.DurationVar(&o.hour, "hour", 2*time.Second, `one "hour" of the scaled-down day (a day is 24 of them; two days are written)`)
	flag.IntVar(&o.rate, "rate", 2000, "rows written per second")
	flag.IntVar(&o.txn, "txn", 10, "rows per transaction")
	flag.IntVar(&o.writers, "writers", 2, "writer connections the rate is split over")
	flag.IntVar(&o.premake, "premake", 4, "partitions made ahead of now, in hours (pg_partman's premake)")
	flag.DurationVar(&o.checkpoint, "checkpoint", 0, "a CHECKPOINT this often (default: one hour; negative: only the server's own)")
	flag.StringVar(&o.naptime, "naptime", "1s", `autovacuum_naptime during the runs ("" leaves the server's)`)
	flag.IntVar(&o.partitions, "partitions", 6, "topic partitions")
	flag.StringVar(&runs, "runs", "baseline,delete,baseline-partitioned,drop_partitions", "the workloads, in order")
	flag.StringVar(&o.out, "out", "bench-out/retention", "folder for the table (results.md) and outboxd's logs")
	flag.StringVar(&o.services, "services", "", "reuse the PostgreSQL and Kafka that `bash testenv/services.sh up DIR` started (left running)")
	flag.StringVar(&o.binary, "outboxd-bin", "", "run this outboxd binary instead of building the working tree's")
	flag.Parse()
	if o.checkpoint == 0 {
		o.checkpoint = o.hour
	}
	err := parseRuns(&o, runs)
	if err == nil && (o.rate <= 0 || o.txn <= 0 || o.writers <= 0 || o.hour < 500*time.Millisecond) {
		err = fmt.Errorf("-rate, -txn and -writers must be positive and -hour at least 500ms")
	}
	if err == nil {
		err = run(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "retentionbench:", err)
		os.Exit(1)
	}
}

func parseRuns(o *options, s string) error {
	for _, k := range strings.Split(s, ",") {
		found := false
		for _, w := range workloads {
			if w.key == strings.TrimSpace(k) {
				o.runs, found = append(o.runs, w), true
			}
		}
		if !found {
			return fmt.Errorf("-runs: unknown workload %q", k)
		}
	}
	return nil
}

// bench holds what every workload needs.
type bench struct {
	o      options
	env    *testenv.Env
	admin  *pgx.Conn // the postgres database
	logDir string    // outboxd's configurations and logs
	tag    string    // suffixes database, slot and topic names
	log    io.Writer
}

func run(o options) error {
	b := &bench{o: o, log: os.Stderr, logDir: filepath.Join(o.out, "logs"), tag: fmt.Sprintf("%d", time.Now().Unix()%1000000)}
	if err := os.MkdirAll(b.logDir, 0o755); err != nil {
		return err
	}
	if o.binary == "" {
		logf(b.log, "building outboxd")
		defer testenv.RemoveBinary()
		if _, err := testenv.Binary(); err != nil {
			return err
		}
	}
	var err error
	if o.services != "" {
		logf(b.log, "using the services of %s", o.services)
		b.env, err = testenv.Attach(o.services)
	} else {
		logf(b.log, "starting PostgreSQL and Kafka")
		b.env, err = testenv.Start(testenv.Options{})
	}
	if err != nil {
		return err
	}
	defer b.env.Cleanup()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if b.admin, err = pgx.Connect(ctx, b.env.PGDSN); err != nil {
		return err
	}
	defer b.admin.Close(context.Background())
	machine, err := b.machine(ctx)
	if err != nil {
		return err
	}
	if err := b.scaleServer(ctx); err != nil {
		return err
	}
	defer b.resetServer()

	var results []*result
	for _, w := range o.runs {
		logf(b.log, "%s: two days of %s (one day %s)", w.key, o.hour, o.day())
		r, err := b.measure(ctx, w)
		if err != nil {
			return fmt.Errorf("%s: %w", w.key, err)
		}
		results = append(results, r)
	}
	table := report(o, machine, results)
	fmt.Print(table)
	return os.WriteFile(filepath.Join(o.out, "results.md"), []byte(table), 0o644)
}

// scaleServer sets autovacuum_naptime for the scaled-down day and has every
// autovacuum logged (its tuples and WAL are read from the server log).
func (b *bench) scaleServer(ctx context.Context) error {
	stmts := []string{"ALTER SYSTEM SET log_autovacuum_min_duration = 0"}
	if b.o.naptime != "" {
		stmts = append(stmts, "ALTER SYSTEM SET autovacuum_naptime = "+quote(b.o.naptime))
	}
	for _, s := range append(stmts, "SELECT pg_reload_conf()") {
		if _, err := b.admin.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

func (b *bench) resetServer() {
	ctx := context.Background()
	for _, s := range []string{"ALTER SYSTEM RESET log_autovacuum_min_duration", "ALTER SYSTEM RESET autovacuum_naptime", "SELECT pg_reload_conf()"} {
		if _, err := b.admin.Exec(ctx, s); err != nil {
			logf(b.log, "reset the server's settings: %s: %v", s, err)
		}
	}
}

// machine describes where the numbers come from.
func (b *bench) machine(ctx context.Context) (string, error) {
	var version, fpw, checksums, sb, cpt, mws, walComp string
	if err := b.admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('full_page_writes'), current_setting('data_checksums'),
		current_setting('shared_buffers'), current_setting('checkpoint_timeout'), current_setting('max_wal_size'), current_setting('wal_compression')`).
		Scan(&version, &fpw, &checksums, &sb, &cpt, &mws, &walComp); err != nil {
		return "", err
	}
	bin := b.o.binary
	if bin == "" {
		bin = "this tree's"
	}
	return fmt.Sprintf("%d CPUs, Linux, %s; PostgreSQL %s (fsync=off, full_page_writes=%s, data_checksums=%s, wal_compression=%s, shared_buffers=%s, checkpoint_timeout=%s, max_wal_size=%s); Kafka 4.1 (1 broker); outboxd %s; %s",
		runtime.NumCPU(), runtime.Version(), version, fpw, checksums, walComp, sb, cpt, mws, bin, time.Now().UTC().Format("2006-01-02 15:04 UTC")), nil
}

func logf(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, "%s retentionbench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// quote is a SQL string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// report is the Markdown the bench prints and writes: the settings, one
// column per workload, and the outbox's size every four hours.
func report(o options, machine string, rs []*result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## Retention: WAL and bloat over one day, scaled down\n\n")
	fmt.Fprintf(&b, "Machine: %s.\n\n", machine)
	fmt.Fprintf(&b, "A day is 24 hours of %s (%s). The writer inserts %d rows/s in transactions of %d rows (~300 bytes of carrega) over %d connections for two days; "+
		"the table is over the second day. Retention: max_age %s (one day), interval %s, confirm_timeout %s; delete with batch_size 1000, drop_partitions with lock_timeout 2s "+
		"on one-hour partitions made %d hours ahead every half hour, no default partition. CHECKPOINT every %s, autovacuum_naptime %s, every autovacuum logged.\n\n",
		o.hour, o.day(), o.rate, o.txn, o.writers, o.day(), o.hour/2, o.hour, o.premake, checkpointNote(o.checkpoint), naptimeNote(o.naptime))
	b.WriteString("| over the second day |")
	for _, r := range rs {
		fmt.Fprintf(&b, " %s |", r.w.title)
	}
	b.WriteString("\n| --- |" + strings.Repeat(" ---: |", len(rs)) + "\n")
	row := func(label string, f func(r *result) string) {
		fmt.Fprintf(&b, "| %s |", label)
		for _, r := range rs {
			fmt.Fprintf(&b, " %s |", f(r))
		}
		b.WriteString("\n")
	}
	perK := func(n int64, r *result) float64 { return float64(n) / float64(max(r.dayEvents, 1)) * 1000 }
	// own is the WAL per event beyond its table's baseline's, when both ran.
	own := func(r *result) (float64, bool) {
		if r.w.mode == "" {
			return 0, false
		}
		for _, base := range rs {
			if base.w.mode == "" && base.w.partitioned == r.w.partitioned {
				return float64(r.walBytes)/float64(max(r.dayEvents, 1)) - float64(base.walBytes)/float64(max(base.dayEvents, 1)), true
			}
		}
		return 0, false
	}
	removed := func(r *result) int64 { return r.retention.rowsDeleted + r.retention.rowsDropped }
	dash := "–"
	row("rows written", func(r *result) string { return thousands(r.dayEvents) })
	row("writer's rate over the run, rows/s", func(r *result) string { return fmt.Sprintf("%.0f", r.rate) })
	row("WAL written, MiB", func(r *result) string { return fmt.Sprintf("%.1f", mib(r.walBytes)) })
	row("**WAL per 1,000 events, KiB**", func(r *result) string { return fmt.Sprintf("**%.0f**", perK(r.walBytes, r)/1024) })
	row("retention's own WAL per 1,000 events, KiB (minus its table's baseline)", func(r *result) string {
		if d, ok := own(r); ok {
			return fmt.Sprintf("%.0f", d*1000/1024)
		}
		return dash
	})
	row("retention's own WAL per row removed, bytes", func(r *result) string {
		if d, ok := own(r); ok && removed(r) > 0 {
			return fmt.Sprintf("%.0f", d*float64(r.dayEvents)/float64(removed(r)))
		}
		return dash
	})
	row("retention's own WAL per partition dropped, KiB", func(r *result) string {
		if d, ok := own(r); ok && r.retention.drops > 0 {
			return fmt.Sprintf("%.0f", d*float64(r.dayEvents)/float64(r.retention.drops)/1024)
		}
		return dash
	})
	row("WAL records per 1,000 events (pg_stat_wal)", func(r *result) string { return fmt.Sprintf("%.0f", perK(r.walRecords, r)) })
	row("full-page images per 1,000 events (pg_stat_wal)", func(r *result) string { return fmt.Sprintf("%.0f", perK(r.walFPI, r)) })
	for _, k := range walKinds {
		row("… "+k.name+", KiB (full-page images)", func(r *result) string {
			if r.wal == nil {
				return "n/a"
			}
			v := r.wal[k.name]
			return fmt.Sprintf("%.0f (%.0f)", perK(v.records+v.fpi, r)/1024, perK(v.fpi, r)/1024)
		})
	}
	row("retention log: DELETE passes / rows deleted", func(r *result) string {
		return fmt.Sprintf("%d / %s", r.retention.deletes, thousands(r.retention.rowsDeleted))
	})
	row("retention log: partitions dropped / rows in them", func(r *result) string {
		return fmt.Sprintf("%d / %s", r.retention.drops, thousands(r.retention.rowsDropped))
	})
	row("retention log: waits for the slot", func(r *result) string { return fmt.Sprint(r.retention.waits) })
	row("vacuums of the outbox (pg_stat_user_tables)", func(r *result) string { return fmt.Sprint(r.vacuums) })
	row("autovacuum of the outbox: runs / WAL MiB (server log)", func(r *result) string {
		if !r.logRead {
			return "n/a"
		}
		return fmt.Sprintf("%d / %.1f", r.outboxVacuum.runs, mib(r.outboxVacuum.walBytes))
	})
	row("autovacuum of the database's other tables (catalogs): runs / WAL MiB", func(r *result) string {
		if !r.logRead {
			return "n/a"
		}
		return fmt.Sprintf("%d / %.2f", r.otherVacuum.runs, mib(r.otherVacuum.walBytes))
	})
	row("outbox size at the day's start, MiB", func(r *result) string { return fmt.Sprintf("%.1f", mib(r.sizeStart)) })
	row("outbox size at the day's end, MiB", func(r *result) string { return fmt.Sprintf("%.1f", mib(r.sizeEnd)) })
	row("outbox size, peak in the day, MiB", func(r *result) string { return fmt.Sprintf("%.1f", mib(r.sizePeak)) })
	row("dead tuples at the end / peak", func(r *result) string {
		return fmt.Sprintf("%s / %s", thousands(r.deadEnd), thousands(r.deadPeak))
	})
	row("rows live at the end", func(r *result) string { return thousands(r.liveEnd) })
	row("oldest row at the end, hours", func(r *result) string { return fmt.Sprintf("%.1f", r.oldestEnd.Seconds()/o.hour.Seconds()) })
	row("partitions at the end", func(r *result) string {
		if !r.w.partitioned {
			return dash
		}
		return fmt.Sprint(r.partsEnd)
	})
	row("records in the topic / rows written (whole run)", func(r *result) string {
		verdict := "ok"
		if r.topicRecords != r.written {
			verdict = "**MISMATCH**"
		}
		return fmt.Sprintf("%s / %s %s", thousands(r.topicRecords), thousands(r.written), verdict)
	})

	b.WriteString("\nThe outbox's size (MiB) every four hours from the writer's start:\n\n| hour |")
	for _, r := range rs {
		fmt.Fprintf(&b, " %s |", r.w.title)
	}
	b.WriteString("\n| ---: |" + strings.Repeat(" ---: |", len(rs)) + "\n")
	for i := range rs[0].sizes {
		fmt.Fprintf(&b, "| %d |", 4*i)
		for _, r := range rs {
			if i < len(r.sizes) && r.sizes[i] >= 0 {
				fmt.Fprintf(&b, " %.1f |", mib(r.sizes[i]))
			} else {
				b.WriteString(" – |")
			}
		}
		b.WriteString("\n")
	}
	for _, r := range rs {
		if len(r.retention.trouble) > 0 {
			fmt.Fprintf(&b, "\noutboxd's warnings and errors, %s:\n\n", r.w.title)
			for _, l := range r.retention.trouble {
				fmt.Fprintf(&b, "    %s\n", l)
			}
		}
	}
	return b.String()
}

func checkpointNote(d time.Duration) string {
	if d < 0 {
		return "(none but the server's)"
	}
	return d.String()
}

func naptimeNote(s string) string {
	if s == "" {
		return "(the server's)"
	}
	return s
}

// thousands writes n with commas: 96,000.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
