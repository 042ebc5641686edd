package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/testenv"
)

// The steady phase (issue 36): what outboxd costs at the rates services
// really run, measured from outside. A paced writer at each -steady rate,
// in transactions of 1 to 10 rows (uniform), for -steady-duration; the CPU
// of the outboxd process (utime + stime from /proc) from the cell's start
// until the consumer has every row, per event; the latency of each row;
// outboxd's CPU while idle (keepalives only) for -steady-idle; and a CPU
// profile (outboxd's own /debug/pprof/profile) in an extra, unreported
// cell at the highest rate, so the profiler does not weigh on a measured
// one.

// steadyCell is one rate of the steady phase.
type steadyCell struct {
	rate     int
	written  int
	achieved float64
	lat      []float64 // ms, sorted
	cpu      float64   // outboxd, seconds
	wall     float64   // seconds from the cell's start until every row arrived
	floorCPU float64   // the Go floor beside it (-steady-floor), seconds
}

func (c steadyCell) q(p float64) float64 { return cellResult{lat: c.lat}.q(p) }

// usPerEvent is outboxd's CPU per event in µs.
func (c steadyCell) usPerEvent() float64 { return c.perEvent(c.cpu) }

// perEvent is cpu seconds per event of the cell, in µs.
func (c steadyCell) perEvent(cpu float64) float64 {
	if c.written == 0 {
		return 0
	}
	return cpu / float64(c.written) * 1e6
}

// steadyRun is the steady phase's results.
type steadyRun struct {
	cells    []steadyCell
	idle     float64 // outboxd's CPU seconds per second with nothing to carry
	idleSecs float64
	profile  string // go tool pprof -top of the profiled cell
}

// steadyTxn is a transaction's rows in the steady phase: 1 to 10.
func steadyTxn() int { return 1 + rand.IntN(10) }

func (b *bench) steady(ctx context.Context) (*steadyRun, error) {
	name := "bench_steady" + b.runTag
	bl := backlog{partitions: b.o.partitions, tables: 1}
	dsn, db, conns, done, err := b.setupWriters(ctx, name, bl)
	defer done()
	if err != nil {
		return nil, err
	}
	cons, err := startConsumer(b.env.KafkaBrokers, name, b.o.partitions)
	if err != nil {
		return nil, err
	}
	defer cons.close()
	if _, err := db.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", name); err != nil {
		return nil, err
	}
	d, err := b.startOutboxdWith(name, dsn, name, 1, testenv.Section{"pprof": "true"})
	if err != nil {
		return nil, err
	}
	defer d.Close()
	self := newCPUWatch(d.PID())
	var fw *cpuWatch
	if b.o.steadyFloor != "" {
		p, err := b.startFloor(ctx, db, dsn, name)
		if err != nil {
			return nil, fmt.Errorf("the Go floor: %w", err)
		}
		defer p.Kill()
		fw = newCPUWatch(p.Pid)
	}

	// Warm up (connections, metadata, the broker's JIT): cell 0.
	if _, err := writeSized(ctx, conns, 500, steadyTxn, 0, 2*time.Second); err != nil {
		return nil, err
	}
	time.Sleep(2 * time.Second)
	run := &steadyRun{}
	if b.o.steadyIdle > 0 {
		logf(b.log, "steady: outboxd idle for %s", b.o.steadyIdle)
		self.sample()
		c0, t0 := self.cur, time.Now()
		time.Sleep(b.o.steadyIdle)
		self.sample()
		run.idleSecs = time.Since(t0).Seconds()
		run.idle = (self.cur - c0) / run.idleSecs
	}
	cellOf := func(cell, rate int, dur time.Duration) (steadyCell, error) {
		self.sample()
		fw.sample()
		c0, f0, t0 := self.cur, fw.used(), time.Now()
		n, err := writeSized(ctx, conns, rate, steadyTxn, cell, dur)
		if err != nil {
			return steadyCell{}, err
		}
		deadline := time.Now().Add(dur + time.Minute)
		for cons.count(cell) < n && time.Now().Before(deadline) {
			if !d.Running() {
				return steadyCell{}, exitedEarly(d)
			}
			time.Sleep(20 * time.Millisecond)
		}
		self.sample()
		fw.sample()
		c := steadyCell{rate: rate, written: n, achieved: float64(n) / dur.Seconds(), lat: cons.take(cell),
			cpu: self.cur - c0, wall: time.Since(t0).Seconds(), floorCPU: fw.used() - f0}
		return c, nil
	}
	cell := 0
	for _, rate := range b.o.steadyRates {
		cell++
		logf(b.log, "steady: %6d events/s, transactions of 1-10 rows, %s", rate, b.o.steadyDur)
		c, err := cellOf(cell, rate, b.o.steadyDur)
		if err != nil {
			return nil, err
		}
		logf(b.log, "steady: %6d events/s: wrote %d (%.0f/s), outboxd %.1f µs/event, p50 %.1f ms, p99 %.1f ms, max %.1f ms",
			rate, c.written, c.achieved, c.usPerEvent(), c.q(0.5), c.q(0.99), c.q(1))
		if fw != nil {
			logf(b.log, "steady: %6d events/s: the Go floor (%s) beside it %.1f µs/event", rate, b.o.steadyFloor, c.perEvent(c.floorCPU))
		}
		run.cells = append(run.cells, c)
		time.Sleep(time.Second)
	}
	if b.o.steadyProfile > 0 && len(b.o.steadyRates) > 0 {
		rate := b.o.steadyRates[len(b.o.steadyRates)-1]
		cell++
		logf(b.log, "steady: profiling outboxd for %s at %d events/s (not reported)", b.o.steadyProfile, rate)
		path := filepath.Join(b.o.out, fmt.Sprintf("outboxd-steady-%d.pprof", rate))
		got := make(chan error, 1)
		go func() { got <- fetchProfile(ctx, d, b.o.steadyProfile, path) }()
		if _, err := cellOf(cell, rate, b.o.steadyProfile+2*time.Second); err != nil {
			return nil, err
		}
		if err := <-got; err != nil {
			return nil, fmt.Errorf("profile: %w", err)
		}
		run.profile = pprofTop(path)
	}
	if err := b.stopOutboxd(d); err != nil {
		return nil, fmt.Errorf("outboxd exit: %w", err)
	}
	return run, nil
}

// startFloor starts the Go floor (`bench floor`, floor.go) on a slot of its
// own in the steady phase's database, reading its publication, and, for
// -steady-floor produce, writing to a topic of its own.
func (b *bench) startFloor(ctx context.Context, db *pgx.Conn, dsn, name string) (*os.Process, error) {
	slot := name + "_floor"
	if _, err := db.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		return nil, err
	}
	args := []string{"floor", "-dsn", dsn,
		"-slot", slot, "-publication", name}
	if b.o.steadyFloor == "produce" {
		if err := b.env.CreateTopic(slot, 1); err != nil {
			return nil, err
		}
		args = append(args, "-brokers", strings.Split(b.env.KafkaBrokers, ",")[0], "-topic", slot)
	}
	cmd := exec.Command(b.self, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b.child(cmd.Process)
	go func() { _ = cmd.Wait() }()
	return cmd.Process, nil
}

// fetchProfile saves secs of outboxd's CPU profile at path.
func fetchProfile(ctx context.Context, d *testenv.Daemon, dur time.Duration, path string) error {
	ctx, cancel := context.WithTimeout(ctx, dur+30*time.Second)
	defer cancel()
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", d.Addr(), int(dur.Seconds()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /debug/pprof/profile: %s: %s", resp.Status, body)
	}
	return os.WriteFile(path, body, 0o644)
}

// pprofTop is the profile's top entries, by own time and by cumulative
// time, as `go tool pprof -top` prints them.
func pprofTop(path string) string {
	var out strings.Builder
	for _, mode := range [][]string{{"-top"}, {"-top", "-cum"}} {
		args := append([]string{"tool", "pprof", "-nodecount=25"}, mode...)
		text, err := exec.Command("go", append(args, path)...).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("go tool pprof %s: %v: %s", path, err, text)
		}
		fmt.Fprintf(&out, "## go tool pprof %s\n%s\n", strings.Join(mode, " "), text)
	}
	return strings.TrimSpace(out.String())
}

// writeSteady adds the steady phase to the report.
func (r *report) writeSteady(b *strings.Builder, check func(bool, string, ...any)) (string, error) {
	s := r.steady
	fmt.Fprintf(b, "\n3. Steady state: outboxd's CPU (utime + stime of its process) per event, transactions of 1-10 rows, %s per rate, one run\n", r.o.steadyDur)
	fmt.Fprintf(b, "%7s %9s %8s | %10s %10s | %8s %8s %8s", "rate", "achieved", "events", "outboxd", "outboxd", "p50", "p99", "max")
	floor := r.o.steadyFloor != ""
	if floor {
		fmt.Fprintf(b, " | %10s", "Go floor")
	}
	fmt.Fprintf(b, "\n%7s %9s %8s | %10s %10s | %8s %8s %8s", "ev/s", "ev/s", "", "µs/event", "% of core", "ms", "ms", "ms")
	if floor {
		fmt.Fprintf(b, " | %10s", "µs/event")
	}
	fmt.Fprintln(b)
	for _, c := range s.cells {
		fmt.Fprintf(b, "%7d %9.0f %8d | %10.1f %10.2f | %8.1f %8.1f %8.1f", c.rate, c.achieved, c.written, c.usPerEvent(),
			c.cpu/c.wall*100, c.q(0.5), c.q(0.99), c.q(1))
		if floor {
			fmt.Fprintf(b, " | %10.1f", c.perEvent(c.floorCPU))
		}
		fmt.Fprintln(b)
		switch c.rate {
		case 2000:
			check(c.usPerEvent() <= 15, "steady CPU ≤ 15 µs/event at 2,000 events/s (issue 36): %.1f µs", c.usPerEvent())
		case 200:
			check(c.usPerEvent() <= 40, "steady CPU ≤ 40 µs/event at 200 events/s (issue 36): %.1f µs", c.usPerEvent())
		}
	}
	if s.idleSecs > 0 {
		fmt.Fprintf(b, "idle (keepalives only, %.0f s): outboxd %.3f %% of a core (%.2f ms CPU/s)\n", s.idleSecs, s.idle*100, s.idle*1000)
		check(s.idle <= 0.001, "idle CPU ≤ 0.1 %% of a core (issue 36): %.3f %%", s.idle*100)
	}
	if s.profile == "" {
		return "", nil
	}
	rate := r.o.steadyRates[len(r.o.steadyRates)-1]
	fmt.Fprintf(b, "\noutboxd's CPU profile, %s at %d events/s (an extra cell):\n", r.o.steadyProfile, rate)
	fmt.Fprintln(b, s.profile)
	p := filepath.Join(r.o.out, fmt.Sprintf("outboxd-steady-%d-top.txt", rate))
	return p, os.WriteFile(p, []byte(s.profile+"\n"), 0o644)
}
