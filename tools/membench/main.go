// Command membench measures outboxd's peak memory (issue 32: "peak RSS
// under 40 MB"): the resident set, and its anonymous part (the Go heap,
// stacks, the runtime's own) apart from its file-backed part (the binary's
// pages mapped from the page cache: shared by every process of the same
// binary, dropped by the kernel under pressure, and grown by the kernel's
// fault-around more than by what outboxd runs). It is not a test; the
// numbers are published in docs/reports/PERFORMANCE.md.
//
// Against a real PostgreSQL 15 and a real Kafka 4.1 (testenv), for each
// workload in turn, on a topic of -partitions partitions:
//
//   - drain: -drain-rows outbox rows committed in transactions of -txn rows
//     while nothing reads the slot, then drained by outboxd;
//   - txn: one transaction of -txn-rows outbox rows, then drained.
//
// outboxd runs with its defaults (log level warn) until the slot is
// confirmed past the last row; its memory is sampled every 100 ms
// (testenv.Daemon: VmHWM, RssAnon, RssFile of /proc/PID/status). -repeats
// runs each workload that many times, a new outboxd each time, and prints
// every run.
//
//	go build -o /tmp/outboxd ./cmd/outboxd
//	go run ./tools/membench -outboxd-bin /tmp/outboxd
//	go run ./tools/membench -outboxd-bin /tmp/outboxd -trace 1   # tracing on, every record sampled
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/testenv"
)

const name = "membench"

type options struct {
	drainRows, txn, txnRows int
	partitions, repeats     int
	trace                   float64
	binary                  string
	env                     []string
	gctrace                 bool
}

func main() {
	var o options
	flag.IntVar(&o.drainRows, "drain-rows", 200000, "rows of the drain workload (0: skip it)")
	flag.IntVar(&o.txn, "txn", 10, "rows per transaction of the drain workload")
	flag.IntVar(&o.txnRows, "txn-rows", 1000000, "rows of the one-transaction workload (0: skip it)")
	flag.IntVar(&o.partitions, "partitions", 6, "topic partitions")
	flag.IntVar(&o.repeats, "repeats", 3, "runs of each workload")
	flag.Float64Var(&o.trace, "trace", -1, "tracing on with this tracing.sample_ratio, to an OpenTelemetry Collector started here (testenv/otelcol.sh); negative: off")
	flag.StringVar(&o.binary, "outboxd-bin", "", "the outboxd binary (default: build the working tree's)")
	env := flag.String("outboxd-env", "", `extra environment for outboxd, "K=V,K=V" (e.g. "GOGC=50")`)
	flag.BoolVar(&o.gctrace, "gctrace", false, "run outboxd with GODEBUG=gctrace=1 and print the largest heap live after a collection, and the largest heap goal")
	flag.Parse()
	if *env != "" {
		o.env = strings.Split(*env, ",")
	}
	if o.gctrace {
		o.env = append(o.env, "GODEBUG=gctrace=1")
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "membench:", err)
		os.Exit(1)
	}
}

type bench struct {
	o         options
	dir, dsn  string
	env       *testenv.Env
	db        *pgx.Conn
	collector *testenv.Collector
	topic     int // the topic of the next run: each run reads a topic of its own
}

func run(o options) error {
	tool, err := testenv.StartTool("membench", o.binary, logf)
	if err != nil {
		return err
	}
	defer tool.Close()
	dir, env := tool.Dir, tool.Env
	b := &bench{o: o, dir: dir, env: env}
	if o.trace >= 0 {
		if b.collector, err = testenv.StartCollector(dir + "/otelcol"); err != nil {
			return err
		}
		defer b.collector.Stop()
	}
	ctx := context.Background()
	seed, err := testenv.SeedSchema()
	if err != nil {
		return err
	}
	if b.dsn, err = env.CreateDatabase(name, seed+"\nCREATE PUBLICATION "+name+" FOR TABLE outbox WITH (publish = 'insert');"); err != nil {
		return err
	}
	if b.db, err = pgx.Connect(ctx, b.dsn); err != nil {
		return err
	}
	defer b.db.Close(ctx)
	if _, err := b.db.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", name); err != nil {
		return fmt.Errorf("create the slot: %w", err)
	}
	fmt.Printf("%-6s %-4s %9s %8s %8s %9s %9s %9s %9s %9s\n", "work", "run", "rows", "seconds", "CPU s", "peak RSS", "anon", "file", "live heap", "heap goal")
	for _, w := range []struct {
		name      string
		rows, txn int
	}{{"drain", o.drainRows, o.txn}, {"txn", o.txnRows, o.txnRows}} {
		for i := 1; w.rows > 0 && i <= o.repeats; i++ {
			end, err := b.fill(ctx, w.rows, w.txn)
			if err != nil {
				return err
			}
			secs, cpu, m, log, err := b.drain(ctx, end)
			if err != nil {
				return err
			}
			live, goal := "", ""
			if o.gctrace {
				l, g := heaps(log)
				live, goal = strconv.Itoa(l), strconv.Itoa(g)
			}
			fmt.Printf("%-6s %-4d %9d %8.1f %8.2f %9.1f %9.1f %9.1f %9s %9s\n", w.name, i, w.rows, secs, cpu, mib(m.RSS), mib(m.Anon), mib(m.File), live, goal)
		}
	}
	return nil
}

// cpuSeconds is the CPU time pid used so far; 0 when unreadable.
func cpuSeconds(pid int) float64 {
	c, _ := testenv.CPUSeconds(pid)
	return c
}

func mib(kb int64) float64 { return float64(kb) / 1024 }

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// fill commits rows outbox rows in transactions of txn, each row its own
// key, and returns an LSN inside the last transaction, after its rows: a
// slot confirmed past it has every row in Kafka.
func (b *bench) fill(ctx context.Context, rows, txn int) (pglogrepl.LSN, error) {
	t0 := time.Now()
	end, err := testenv.CommitOutboxRows(ctx, b.db, rows, txn, "M-")
	if err != nil {
		return 0, err
	}
	logf("committed %d rows in transactions of %d in %.1f s", rows, txn, time.Since(t0).Seconds())
	return end, nil
}

// gcLine is a collection's line of GODEBUG=gctrace=1: the heap at its
// start, at its end, live after it, and the goal, in MB.
var gcLine = regexp.MustCompile(`(\d+)->(\d+)->(\d+) MB, (\d+) MB goal`)

// heaps are the largest live heap and heap goal of log's collections, MB.
func heaps(log string) (live, goal int) {
	for _, m := range gcLine.FindAllStringSubmatch(log, -1) {
		l, _ := strconv.Atoi(m[3])
		g, _ := strconv.Atoi(m[4])
		live, goal = max(live, l), max(goal, g)
	}
	return live, goal
}

// drain runs a new outboxd, on a topic of its own, until the slot is
// confirmed past end; it returns the seconds that took, outboxd's peak
// memory and its log.
func (b *bench) drain(ctx context.Context, end pglogrepl.LSN) (secs, cpu float64, m testenv.Memory, log string, err error) {
	b.topic++
	topic := name + "-" + strconv.Itoa(b.topic)
	if err := b.env.CreateTopic(topic, b.o.partitions); err != nil {
		return 0, 0, testenv.Memory{}, "", err
	}
	cfg := testenv.Config{
		DSN: b.dsn, Brokers: b.env.KafkaBrokers, Slot: name,
		Routes:   []testenv.Route{{Table: "public.outbox", Topic: topic}},
		Postgres: testenv.Section{"publication": name, "create_slot": "false", "create_publication": "false"},
		Log:      testenv.Section{"level": "warn"},
		Bin:      b.o.binary,
		Env:      b.o.env,
	}
	if b.collector != nil {
		cfg.Tracing = testenv.Section{"endpoint": b.collector.Endpoint, "sample_ratio": strconv.FormatFloat(b.o.trace, 'f', -1, 64)}
	}
	d, err := testenv.NewDaemon(b.dir, cfg)
	if err != nil {
		return 0, 0, testenv.Memory{}, "", err
	}
	defer d.Close()
	t0 := time.Now()
	if err := d.Start(); err != nil {
		return 0, 0, testenv.Memory{}, "", err
	}
	defer d.Kill()
	for {
		time.Sleep(200 * time.Millisecond)
		if !d.Running() {
			return 0, 0, testenv.Memory{}, "", fmt.Errorf("outboxd exited:\n%s", d.Log())
		}
		var confirmed string
		if err := b.db.QueryRow(ctx, "SELECT coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&confirmed); err != nil {
			return 0, 0, testenv.Memory{}, "", err
		}
		if c, err := pglogrepl.ParseLSN(confirmed); err == nil && c >= end {
			break
		}
		if time.Since(t0) > time.Hour {
			return 0, 0, testenv.Memory{}, "", errors.New("the drain did not end in an hour")
		}
	}
	secs = time.Since(t0).Seconds()
	m = d.PeakMemory()
	cpu = cpuSeconds(d.PID())
	if err := d.Term(60 * time.Second); err != nil {
		return 0, 0, testenv.Memory{}, "", fmt.Errorf("stop outboxd: %w", err)
	}
	return secs, cpu, m, d.Log(), nil
}
