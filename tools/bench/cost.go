package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
)

// costOptions are the cost curves' flags (-cost, `make bench-cost`).
type costOptions struct {
	on         bool
	sweeps     []string // of costSweeps
	sizes      []int    // carrega bytes
	partitions []int
	tables     []int
	rows       int // rows of a 200-byte backlog
	mb         int // carrega MB per backlog at most: fewer rows for larger carrega
	rates      []int
	txn        int     // rows per transaction in the rate sweep
	maxP99     float64 // ms: a rate step whose p99 is over this ends the rate sweep
}

// The sweeps -cost runs, in the order of the report.
var costSweeps = []string{"size", "partitions", "routes", "binary", "rate"}

// costFlags registers the cost flags; the returned function parses their
// lists once flag.Parse has run.
func costFlags(c *costOptions) func() error {
	var sweeps, sizes, parts, tables, rates string
	flag.BoolVar(&c.on, "cost", false, "measure how cost grows with the work (the cost curves of docs/reports/PERFORMANCE.md) instead of the default workloads")
	flag.StringVar(&sweeps, "cost-sweeps", strings.Join(costSweeps, ","), "which cost curves: "+strings.Join(costSweeps, ", "))
	flag.StringVar(&sizes, "cost-sizes", "200,2000,20000,200000", "carrega sizes, bytes")
	flag.StringVar(&parts, "cost-partitions", "1,6,60", "topic partitions")
	flag.StringVar(&tables, "cost-tables", "1,4", "outbox tables in the publication, each its own route and topic")
	flag.IntVar(&c.rows, "cost-rows", 500000, "rows of a backlog of 200-byte carrega")
	flag.IntVar(&c.mb, "cost-mb", 400, "carrega MB per backlog at most: larger carrega, fewer rows")
	flag.StringVar(&rates, "cost-rates", "500,2000,5000,10000,20000,40000,80000", "offered rates of the rate sweep, events/s, until saturation")
	flag.IntVar(&c.txn, "cost-txn", 10, "rows per transaction in the rate sweep")
	flag.Float64Var(&c.maxP99, "cost-max-p99", 1000, "ms: the rate sweep stops after a step whose p99 is higher")
	return func() error {
		var err error
		for _, f := range []struct {
			s   string
			dst *[]int
		}{{sizes, &c.sizes}, {parts, &c.partitions}, {tables, &c.tables}, {rates, &c.rates}} {
			if *f.dst, err = ints(f.s); err != nil {
				return err
			}
		}
		for _, s := range strings.Split(sweeps, ",") {
			if s = strings.TrimSpace(s); !slices.Contains(costSweeps, s) {
				return fmt.Errorf("-cost-sweeps: unknown %q (want some of %s)", s, strings.Join(costSweeps, ", "))
			}
			c.sweeps = append(c.sweeps, s)
		}
		slices.Sort(c.sizes)
		slices.Sort(c.partitions)
		slices.Sort(c.tables)
		slices.Sort(c.rates)
		return nil
	}
}

func (c costOptions) has(sweep string) bool { return slices.Contains(c.sweeps, sweep) }

// rowsFor is the row count of a backlog of size-byte carrega.
func (c costOptions) rowsFor(size int) int {
	return max(100, min(c.rows, c.mb*1000000/max(size, 200)))
}

// costPoint is one point of a drain curve: a backlog, read by
// pg_recvlogical and outboxd, or with binary by pg_recvlogical alone with
// pgoutput's binary option (outboxd reads text only: docs/reports/PERFORMANCE.md
// says why).
type costPoint struct {
	label  string
	bl     backlog
	binary bool
}

func (p costPoint) readers() []reader {
	if p.binary {
		return []reader{{sys: sysRecv, binary: true}}
	}
	return []reader{{sys: sysRecv}, {sys: sysOutboxd}}
}

// costCurve is one drain curve: its points, in order.
type costCurve struct {
	sweep, title, xlabel string
	points               []costPoint
	logY                 bool // rates and costs spanning decades
}

// curves are the drain curves asked for. Every curve passes through the
// base point (the first size, -partitions partitions, one table, text
// format) so that one backlog serves them all.
func (c costOptions) curves(partitions int) []costCurve {
	base := backlog{rows: c.rowsFor(c.sizes[0]), carrega: c.sizes[0], partitions: partitions, tables: 1}
	var out []costCurve
	if c.has("size") {
		cv := costCurve{sweep: "size", xlabel: "carrega per row", logY: true,
			title: fmt.Sprintf("Drain against carrega size (rows: min(%d, %d MB / size)); %d partitions, 1 table", c.rows, c.mb, partitions)}
		for _, s := range c.sizes {
			bl := base
			bl.carrega, bl.rows = s, c.rowsFor(s)
			cv.points = append(cv.points, costPoint{label: sizeLabel(s), bl: bl})
		}
		out = append(out, cv)
	}
	if c.has("partitions") {
		cv := costCurve{sweep: "partitions", xlabel: "topic partitions",
			title: fmt.Sprintf("Drain against topic partitions: %d rows of %s carrega, 1 table", base.rows, sizeLabel(base.carrega))}
		for _, n := range c.partitions {
			bl := base
			bl.partitions = n
			cv.points = append(cv.points, costPoint{label: fmt.Sprintf("%d partitions", n), bl: bl})
		}
		out = append(out, cv)
	}
	if c.has("routes") {
		cv := costCurve{sweep: "routes", xlabel: "outbox tables (routes, topics)",
			title: fmt.Sprintf("Drain against routes: %d rows of %s carrega spread over the tables, %d partitions each", base.rows, sizeLabel(base.carrega), partitions)}
		for _, n := range c.tables {
			bl := base
			bl.tables = n
			cv.points = append(cv.points, costPoint{label: fmt.Sprintf("%d table%s", n, map[bool]string{true: "s"}[n > 1]), bl: bl})
		}
		out = append(out, cv)
	}
	if c.has("binary") {
		out = append(out, costCurve{sweep: "binary", xlabel: "pgoutput value format",
			title:  fmt.Sprintf("Drain against pgoutput's binary option (pg_recvlogical; outboxd reads text): %d rows of %s carrega, %d partitions, 1 table", base.rows, sizeLabel(base.carrega), partitions),
			points: []costPoint{{label: "text", bl: base}, {label: "binary", bl: base, binary: true}}})
	}
	return out
}

// costRun is what the cost curves measured.
type costRun struct {
	curves []costCurve
	drains map[backlog][]drainRun // every repeat's drain of each backlog
	cells  []cellResult           // the rate sweep's steps, every system and repeat
}

// cost runs the cost curves: each backlog once per repeat, read by every
// reader its points need; then the rate sweep, outboxd and pg_recvlogical
// in turn.
func (b *bench) cost(ctx context.Context, rep *report) error {
	c := b.o.cost
	run := &costRun{curves: c.curves(b.o.partitions), drains: map[backlog][]drainRun{}}
	var backlogs []backlog
	readers := map[backlog][]reader{}
	for _, cv := range run.curves {
		for _, p := range cv.points {
			if _, ok := readers[p.bl]; !ok {
				backlogs = append(backlogs, p.bl)
			}
			for _, r := range p.readers() {
				if !slices.Contains(readers[p.bl], r) {
					readers[p.bl] = append(readers[p.bl], r)
				}
			}
		}
	}
	// A first, unreported drain warms the broker's JIT and the caches,
	// before the drains and the rate sweep alike (a cold broker spent a
	// core at 2,000 events/s).
	warm := backlog{rows: max(c.rowsFor(c.sizes[0])/4, 1000), carrega: c.sizes[0], partitions: b.o.partitions, tables: 1}
	if _, err := b.drain(ctx, "warm-up", 100, warm, []reader{{sys: sysRecv}, {sys: sysOutboxd}}, false); err != nil {
		return fmt.Errorf("warm-up drain: %w", err)
	}
	for i := 0; i < b.o.repeats; i++ {
		for k, bl := range backlogs {
			label := fmt.Sprintf("cost %d/%d, backlog %d/%d", i+1, b.o.repeats, k+1, len(backlogs))
			d, err := b.drain(ctx, label, i, bl, readers[bl], false)
			if err != nil {
				return fmt.Errorf("%s: %w", label, err)
			}
			run.drains[bl] = append(run.drains[bl], d)
		}
	}
	if c.has("rate") {
		for i := 0; i < b.o.repeats; i++ {
			for _, sys := range []string{sysOutboxd, sysRecv} {
				cells, _, err := b.latency(ctx, sys, i, []int{c.txn}, c.rates, true)
				if err != nil {
					return fmt.Errorf("rate sweep %s %d: %w", sys, i+1, err)
				}
				run.cells = append(run.cells, cells...)
			}
		}
	}
	return rep.writeCost(os.Stdout, run)
}
