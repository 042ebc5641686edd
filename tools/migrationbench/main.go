// Command migrationbench measures what a migration elsewhere in the
// database does to outbox events (issue 33): one large transaction on a
// table outside the publication, while outbox events commit one by one. It
// is not a test; the numbers are published in docs/reports/PERFORMANCE.md.
//
// Against a real PostgreSQL (testenv: 15, or OUTBOXD_PG_VERSION) and a real
// Kafka 4.1, for each -rows value a table `mig` of that many rows, then
// for each mode in turn, on a slot of its own made just before:
//
//   - outboxd-1: outboxd with postgres.streaming false (pgoutput protocol 1:
//     the server queues the migration, spilling it to disk past
//     logical_decoding_work_mem, until its commit);
//   - outboxd-2: outboxd with its default, streaming on (protocol 2: the
//     server streams the migration's changes through the publication's
//     filter as they come);
//   - recvlogical-1, recvlogical-2: pg_recvlogical with the same protocol
//     options, writing nowhere: the floor.
//
// A writer commits one outbox row per transaction at -rate; after -before
// the migration (`UPDATE mig SET v = v + 1`, one transaction) runs; the
// writer goes on for -after past the migration's commit. An event's lag is
// the time from its commit (as the writer saw it return) to Kafka's append
// (the topic's message.timestamp.type is LogAppendTime) for outboxd, and to
// the walsender's sent_lsn passing it (pg_stat_replication, sampled every
// 2 ms) for pg_recvlogical. Printed per mode: the lag's p50, p99 and max
// over every event, the lag of the first event committed after the
// migration's commit, the slot's spill and stream bytes
// (pg_stat_replication_slots), the walsender's CPU seconds, outboxd's peak
// RSS.
//
//	CGO_ENABLED=0 go build -trimpath -o /tmp/outboxd ./cmd/outboxd
//	go run ./tools/migrationbench -outboxd-bin /tmp/outboxd                 # 2,000,000 rows
//	go run ./tools/migrationbench -outboxd-bin /tmp/outboxd -rows 2000000,10000000
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/testenv"
)

type options struct {
	rows          []int
	rate          int
	before, after time.Duration
	modes         []string
	binary        string
}

var allModes = []string{"outboxd-1", "outboxd-2", "recvlogical-1", "recvlogical-2"}

func main() {
	var o options
	rows := flag.String("rows", "2000000", "rows of the migrated table, one run of every mode for each (comma-separated)")
	flag.IntVar(&o.rate, "rate", 500, "outbox events per second, one per transaction")
	flag.DurationVar(&o.before, "before", 3*time.Second, "events before the migration starts")
	flag.DurationVar(&o.after, "after", 5*time.Second, "events after the migration's commit")
	modes := flag.String("modes", strings.Join(allModes, ","), "which readers, in turn")
	flag.StringVar(&o.binary, "outboxd-bin", "", "the outboxd binary (default: build the working tree's)")
	flag.Parse()
	for _, r := range strings.Split(*rows, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "migrationbench: -rows %q\n", *rows)
			os.Exit(2)
		}
		o.rows = append(o.rows, n)
	}
	for _, m := range strings.Split(*modes, ",") {
		if !slices.Contains(allModes, m) {
			fmt.Fprintf(os.Stderr, "migrationbench: mode %q: want one of %s\n", m, strings.Join(allModes, ", "))
			os.Exit(2)
		}
		o.modes = append(o.modes, m)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "migrationbench:", err)
		os.Exit(1)
	}
}

const name = "migrationbench"

type bench struct {
	o   options
	dir string
	env *testenv.Env
	dsn string
	db  *pgx.Conn // the harness': setup, slots, samples
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func run(o options) error {
	tool, err := testenv.StartTool("migrationbench", o.binary, logf)
	if err != nil {
		return err
	}
	defer tool.Close()
	dir, env := tool.Dir, tool.Env
	b := &bench{o: o, dir: dir, env: env}
	ctx := context.Background()
	var version string
	fmt.Printf("%-14s %10s | %8s %8s %8s | %12s | %12s %12s | %10s | %9s\n",
		"mode", "migration", "lag p50", "p99", "max", "after commit", "spill bytes", "stream bytes", "walsndr s", "peak RSS")
	for _, rows := range o.rows {
		if err := b.setup(ctx, rows); err != nil {
			return err
		}
		if version == "" {
			_ = b.db.QueryRow(ctx, "SHOW server_version").Scan(&version)
			logf("PostgreSQL %s", version)
		}
		for _, mode := range o.modes {
			r, err := b.measure(ctx, mode, rows)
			if err != nil {
				return fmt.Errorf("%s, %d rows: %w", mode, rows, err)
			}
			fmt.Printf("%-14s %10d | %8s %8s %8s | %12s | %12d %12d | %10.2f | %9s\n", mode, rows,
				ms(r.p50), ms(r.p99), ms(r.max), ms(r.afterCommit), r.spill, r.stream, r.walsender, r.rss)
		}
		b.db.Close(ctx)
	}
	return nil
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64) + " ms"
}

// setup makes the database: the seed's outbox, a publication of it alone,
// and mig, rows rows of about 100 bytes.
func (b *bench) setup(ctx context.Context, rows int) error {
	seed, err := testenv.SeedSchema()
	if err != nil {
		return err
	}
	db := fmt.Sprintf("%s_%d", name, rows)
	if b.dsn, err = b.env.CreateDatabase(db, seed+`
		CREATE PUBLICATION `+name+` FOR TABLE outbox WITH (publish = 'insert');
		CREATE TABLE mig (id int PRIMARY KEY, v int NOT NULL, pad text NOT NULL);`); err != nil {
		return err
	}
	if b.db, err = pgx.Connect(ctx, b.dsn); err != nil {
		return err
	}
	t0 := time.Now()
	if _, err := b.db.Exec(ctx, "INSERT INTO mig SELECT g, 0, repeat('x', 80) FROM generate_series(1, $1::int) g", rows); err != nil {
		return fmt.Errorf("fill mig: %w", err)
	}
	if _, err := b.db.Exec(ctx, "VACUUM ANALYZE mig"); err != nil {
		return err
	}
	logf("mig: %d rows in %.1f s", rows, time.Since(t0).Seconds())
	return nil
}

// result is one mode's figures.
type result struct {
	p50, p99, max, afterCommit time.Duration
	spill, stream              int64
	walsender                  float64
	rss                        string
}

// event is one outbox row: when its commit returned, and the WAL position
// inside its transaction (before its commit record).
type event struct {
	committed time.Time
	lsn       pglogrepl.LSN
}

func (b *bench) measure(ctx context.Context, mode string, rows int) (result, error) {
	slot := strings.ReplaceAll(fmt.Sprintf("%s_%s_%d", name, mode, rows), "-", "_")
	if _, err := b.db.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		return result{}, fmt.Errorf("create the slot: %w", err)
	}
	defer func() { _, _ = b.db.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", slot) }()
	topic := slot
	if err := testenv.CreateTopicWith(ctx, b.env.KafkaBrokers, topic, 1, map[string]string{"message.timestamp.type": "LogAppendTime"}); err != nil {
		return result{}, err
	}
	stop, rss, err := b.startReader(mode, slot, topic)
	if err != nil {
		return result{}, err
	}
	defer stop()
	pid, err := b.walsender(ctx, slot)
	if err != nil {
		return result{}, err
	}
	cpu0 := cpuSeconds(pid)

	// The recvlogical floor: the walsender's sent_lsn, sampled.
	var sampler *lsnSampler
	if strings.HasPrefix(mode, "recvlogical") {
		if sampler, err = startSampler(ctx, b.dsn, pid); err != nil {
			return result{}, err
		}
		defer sampler.stop()
	}

	logf("%s, %d rows: events at %d/s, the migration after %s", mode, rows, b.o.rate, b.o.before)
	w, err := startWriter(ctx, b.dsn, b.o.rate)
	if err != nil {
		return result{}, err
	}
	time.Sleep(b.o.before)
	t0 := time.Now()
	if _, err := b.db.Exec(ctx, "UPDATE mig SET v = v + 1"); err != nil {
		w.stop()
		return result{}, fmt.Errorf("the migration: %w", err)
	}
	migrated := time.Now()
	logf("  the migration committed in %.1f s", migrated.Sub(t0).Seconds())
	time.Sleep(b.o.after)
	events, err := w.stop()
	if err != nil {
		return result{}, err
	}

	var lags []time.Duration
	if sampler != nil {
		lags, err = sampler.lags(events, 2*time.Minute)
	} else {
		lags, err = kafkaLags(ctx, b.env.KafkaBrokers, topic, events, 2*time.Minute)
	}
	if err != nil {
		return result{}, err
	}
	r := result{walsender: cpuSeconds(pid) - cpu0, rss: "-"}
	for i, e := range events {
		if e.committed.After(migrated) {
			r.afterCommit = lags[i]
			break
		}
	}
	sorted := slices.Clone(lags)
	slices.Sort(sorted)
	r.p50, r.p99, r.max = sorted[len(sorted)/2], sorted[len(sorted)*99/100], sorted[len(sorted)-1]
	if err := b.db.QueryRow(ctx, "SELECT spill_bytes, stream_bytes FROM pg_stat_replication_slots WHERE slot_name = $1", slot).Scan(&r.spill, &r.stream); err != nil {
		return result{}, fmt.Errorf("pg_stat_replication_slots: %w", err)
	}
	if rss != nil {
		r.rss = fmt.Sprintf("%.1f MiB", float64(rss())/1024)
	}
	// The next mode's migration on a table of the same size.
	if _, err := b.db.Exec(ctx, "VACUUM mig"); err != nil {
		return result{}, err
	}
	return r, nil
}

// startReader starts mode's reader on slot; stop ends it; rss, for outboxd,
// is its peak RSS so far (kB).
func (b *bench) startReader(mode, slot, topic string) (stop func(), rss func() int64, err error) {
	proto := mode[len(mode)-1:]
	if strings.HasPrefix(mode, "outboxd") {
		d, err := testenv.NewDaemon(b.dir, testenv.Config{
			DSN: b.dsn, Brokers: b.env.KafkaBrokers, Slot: slot,
			Routes:   []testenv.Route{{Table: "public.outbox", Topic: topic}},
			Postgres: testenv.Section{"publication": name, "create_slot": "false", "create_publication": "false", "streaming": strconv.FormatBool(proto == "2")},
			Log:      testenv.Section{"level": "warn"},
			Bin:      b.o.binary,
		})
		if err != nil {
			return nil, nil, err
		}
		if err := d.Start(); err != nil {
			return nil, nil, err
		}
		if err := d.WaitReady(context.Background(), 60*time.Second); err != nil {
			d.Kill()
			return nil, nil, fmt.Errorf("%w\n%s", err, d.Log())
		}
		return func() { _ = d.Term(60 * time.Second); d.Close() }, func() int64 { return d.PeakMemory().RSS }, nil
	}
	args := []string{"-d", b.dsn, "--slot", slot, "--start", "-f", "/dev/null", "-s", "1", "--no-loop",
		"-o", "proto_version=" + proto, "-o", "publication_names=" + name}
	if proto == "2" {
		args = append(args, "-o", "streaming=on")
	}
	cmd := exec.Command(testenv.RecvLogical(), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	return func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}, nil, nil
}

// walsender is the pid of the walsender that streams slot, once it does.
func (b *bench) walsender(ctx context.Context, slot string) (int, error) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var pid *int
		if err := b.db.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid); err != nil {
			return 0, err
		}
		if pid != nil {
			return *pid, nil
		}
	}
	return 0, fmt.Errorf("nothing streams slot %s after 30 s", slot)
}

// writer commits one outbox row per transaction at a rate, recording each.
type writer struct {
	cancel context.CancelFunc
	done   chan error
	events []event
}

func startWriter(ctx context.Context, dsn string, rate int) (*writer, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &writer{cancel: cancel, done: make(chan error, 1)}
	go func() {
		defer conn.Close(context.Background())
		every := time.Second / time.Duration(rate)
		next := time.Now()
		for i := 0; ; i++ {
			if d := time.Until(next); d > 0 {
				select {
				case <-ctx.Done():
					w.done <- nil
					return
				case <-time.After(d):
				}
			}
			next = next.Add(every)
			var lsn string
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, `WITH r AS (INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega)
					VALUES (gen_random_uuid(), 'comanda', 'G-' || ($1::int % 100), 'comanda.creada', jsonb_build_object('n', $1::int)) RETURNING 1)
					SELECT pg_current_wal_insert_lsn()::text FROM r`, i).Scan(&lsn)
			})
			if ctx.Err() != nil {
				w.done <- nil
				return
			}
			if err != nil {
				w.done <- err
				return
			}
			l, err := pglogrepl.ParseLSN(lsn)
			if err != nil {
				w.done <- err
				return
			}
			w.events = append(w.events, event{committed: time.Now(), lsn: l})
		}
	}()
	return w, nil
}

// stop ends the writer and returns its events, in commit order.
func (w *writer) stop() ([]event, error) {
	w.cancel()
	err := <-w.done
	if err == nil && len(w.events) == 0 {
		err = errors.New("the writer committed nothing")
	}
	return w.events, err
}

// kafkaLags reads topic until it holds every event (one per record, in
// commit order: one partition) and returns each one's lag, Kafka's append
// time minus its commit.
func kafkaLags(ctx context.Context, brokers, topic string, events []event, timeout time.Duration) ([]time.Duration, error) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: strings.Split(brokers, ","), Topic: topic, Partition: 0, MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lags := make([]time.Duration, 0, len(events))
	for len(lags) < len(events) {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			return nil, fmt.Errorf("read %s: %d of %d records: %w", topic, len(lags), len(events), err)
		}
		// Kafka's append time has a millisecond's resolution, the commit
		// a microsecond's: an append in the commit's millisecond is 0.
		lags = append(lags, max(m.Time.Sub(events[len(lags)].committed), 0))
	}
	return lags, nil
}

// lsnSampler samples a walsender's sent_lsn every 2 ms.
type lsnSampler struct {
	mu      sync.Mutex
	samples []lsnSample
	cancel  context.CancelFunc
	done    chan struct{}
}

type lsnSample struct {
	at  time.Time
	lsn pglogrepl.LSN
}

func startSampler(ctx context.Context, dsn string, pid int) (*lsnSampler, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &lsnSampler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer conn.Close(context.Background())
		for ctx.Err() == nil {
			var sent string
			if err := conn.QueryRow(ctx, "SELECT sent_lsn::text FROM pg_stat_replication WHERE pid = $1", pid).Scan(&sent); err == nil {
				if l, err := pglogrepl.ParseLSN(sent); err == nil {
					s.mu.Lock()
					s.samples = append(s.samples, lsnSample{time.Now(), l})
					s.mu.Unlock()
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return s, nil
}

func (s *lsnSampler) stop() {
	s.cancel()
	<-s.done
}

// lags waits until the walsender has sent past the last event, then
// returns each event's lag: the first sample at or past its position,
// minus its commit.
func (s *lsnSampler) lags(events []event, timeout time.Duration) ([]time.Duration, error) {
	last := events[len(events)-1].lsn
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		s.mu.Lock()
		n := len(s.samples)
		reached := n > 0 && s.samples[n-1].lsn > last
		s.mu.Unlock()
		if reached {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the walsender did not send past %s in %s", last, timeout)
		}
	}
	s.mu.Lock()
	samples := slices.Clone(s.samples)
	s.mu.Unlock()
	lags := make([]time.Duration, len(events))
	j := 0
	for i, e := range events {
		for j < len(samples) && samples[j].lsn <= e.lsn {
			j++
		}
		if j == len(samples) {
			return nil, fmt.Errorf("no sample past %s", e.lsn)
		}
		lags[i] = max(samples[j].at.Sub(e.committed), 0)
	}
	return lags, nil
}

// cpuSeconds is the CPU time pid used so far; 0 when unreadable.
func cpuSeconds(pid int) float64 {
	c, _ := testenv.CPUSeconds(pid)
	return c
}
