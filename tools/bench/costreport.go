package main

import (
	"fmt"
	"io"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// readerFigures are one reader's medians at one point of a drain curve.
type readerFigures struct {
	rate, mbps, ratio        float64 // events/s, carrega MB/s, × pg_recvlogical in the same run
	cpu, server, broker, rss float64 // µs per event (reader, walsender, broker); peak RSS MiB
}

// figures are r's medians over the runs of the point's backlog. outboxd's
// time is until its slot was confirmed past the backlog.
func (run *costRun) figures(p costPoint, r reader) readerFigures {
	var rate, mbps, ratio, cpu, server, broker, rss []float64
	if !slices.Contains(p.readers(), r) {
		nan := math.NaN()
		return readerFigures{nan, nan, nan, nan, nan, nan, nan}
	}
	for _, d := range run.drains[p.bl] {
		x, ok := d.results[r.name()]
		if !ok {
			continue
		}
		rows := float64(d.bl.rows)
		secs := x.seconds
		if r.sys == sysOutboxd {
			secs = x.confirmed
		}
		rec := d.results[reader{sys: sysRecv, binary: r.binary}.name()]
		rate = append(rate, rows/secs)
		mbps = append(mbps, rows/secs*d.carrega/1e6)
		ratio = append(ratio, (rows/secs)/(rows/rec.seconds))
		cpu = append(cpu, x.cpu/rows*1e6)
		server = append(server, x.serverCPU/rows*1e6)
		broker = append(broker, x.brokerCPU/rows*1e6)
		rss = append(rss, x.rss)
	}
	return readerFigures{median(rate), median(mbps), median(ratio), median(cpu), median(server), median(broker), maxOf(rss)}
}

// binaryRatios compares pg_recvlogical with pgoutput's binary option and
// without on the same backlog, run by run (the noise between runs is
// larger than the effect).
func (run *costRun) binaryRatios(bl backlog) string {
	var server, cpu, rate []float64
	for _, d := range run.drains[bl] {
		t, okT := d.results[reader{sys: sysRecv}.name()]
		x, okB := d.results[reader{sys: sysRecv, binary: true}.name()]
		if okT && okB {
			server = append(server, x.serverCPU/t.serverCPU)
			cpu = append(cpu, x.cpu/t.cpu)
			rate = append(rate, t.seconds/x.seconds)
		}
	}
	return fmt.Sprintf("   pg_recvlogical binary / text, median of the ratios within each run: its walsender's CPU per event ×%.3f, its own ×%.3f, drain rate ×%.3f\n",
		median(server), median(cpu), median(rate))
}

// pointFacts are the backlog's medians: rows, mean carrega bytes, WAL MB.
func (run *costRun) pointFacts(p costPoint) (rows int, carrega, wal float64) {
	var c, w []float64
	for _, d := range run.drains[p.bl] {
		c, w = append(c, d.carrega), append(w, d.walMB)
	}
	return p.bl.rows, median(c), median(w)
}

// writeCost prints the cost curves' tables, writes them to
// cost-results.txt and their plots beside it.
func (r *report) writeCost(stdout io.Writer, run *costRun) error {
	var b strings.Builder
	fmt.Fprintf(&b, "outboxd bench: how cost grows with the work\nmachine: %s\n", r.machine)
	var written []string
	letter := 'A'
	for _, cv := range run.curves {
		fmt.Fprintf(&b, "\n%c. %s; median of %d runs\n", letter, cv.title, r.o.repeats)
		letter++
		fmt.Fprintf(&b, "   outboxd's time ends when its slot is confirmed past the backlog; CPU per event of the reader, of the walsender serving it and of the broker\n")
		fmt.Fprintf(&b, "%-13s %7s %8s %6s | %-21s %9s %7s %6s | %8s %8s %8s | %8s\n", "point", "rows", "carrega", "WAL", "reader", "events/s", "MB/s", "×recv", "reader", "walsndr", "broker", "peak RSS")
		fmt.Fprintf(&b, "%-13s %7s %8s %6s | %-21s %9s %7s %6s | %8s %8s %8s | %8s\n", "", "", "bytes", "MB", "", "", "carrega", "", "µs/ev", "µs/ev", "µs/ev", "MiB")
		for _, p := range cv.points {
			rows, carrega, wal := run.pointFacts(p)
			for i, rd := range p.readers() {
				f := run.figures(p, rd)
				lead := fmt.Sprintf("%-13s %7d %8.0f %6.0f", p.label, rows, carrega, wal)
				if i > 0 {
					lead = fmt.Sprintf("%-13s %7s %8s %6s", "", "", "", "")
				}
				broker := fmt.Sprintf("%8.2f", f.broker)
				if rd.sys == sysRecv {
					broker = fmt.Sprintf("%8s", "-")
				}
				fmt.Fprintf(&b, "%s | %-21s %9.0f %7.1f %6.2f | %8.2f %8.2f %s | %8.1f\n", lead, rd.name(), f.rate, f.mbps, f.ratio, f.cpu, f.server, broker, f.rss)
			}
		}
		if cv.sweep == "binary" {
			b.WriteString(run.binaryRatios(cv.points[0].bl))
		}
		ps, err := r.costPlots(run, cv)
		if err != nil {
			return err
		}
		written = append(written, ps...)
	}
	if len(run.cells) > 0 {
		ps, err := r.rateTable(&b, run, string(letter))
		if err != nil {
			return err
		}
		written = append(written, ps...)
	}
	return r.finish(stdout, &b, "cost-results.txt", written)
}

// costPlots writes a drain curve's two bar charts: events/s, and CPU per
// event of each process.
func (r *report) costPlots(run *costRun, cv costCurve) ([]string, error) {
	var cats []string
	rate := []series{{name: sysRecv, color: palette[0]}, {name: sysOutboxd, color: palette[1]}}
	cpu := []series{
		{name: "pg_recvlogical", color: palette[0]}, {name: "its walsender", color: palette[2]},
		{name: "outboxd", color: palette[1]}, {name: "its walsender", color: palette[3]}, {name: "broker", color: palette[4]},
	}
	for _, p := range cv.points {
		cats = append(cats, p.label)
		rc := run.figures(p, reader{sys: sysRecv, binary: p.binary})
		ob := run.figures(p, reader{sys: sysOutboxd, binary: p.binary})
		rate[0].ys = append(rate[0].ys, rc.rate)
		rate[1].ys = append(rate[1].ys, ob.rate)
		for i, v := range []float64{rc.cpu, rc.server, ob.cpu, ob.server, ob.broker} {
			cpu[i].ys = append(cpu[i].ys, v)
		}
	}
	pr := filepath.Join(r.o.out, "cost-"+cv.sweep+"-rate.svg")
	if err := barChart(pr, cv.title, cv.xlabel, "events/s (outboxd: until the slot is confirmed)", cats, cv.logY, rate); err != nil {
		return nil, err
	}
	pc := filepath.Join(r.o.out, "cost-"+cv.sweep+"-cpu.svg")
	if err := barChart(pc, "CPU per event: "+cv.sweep, cv.xlabel, "CPU µs per event", cats, cv.logY, cpu); err != nil {
		return nil, err
	}
	return []string{pr, pc}, nil
}

// Thresholds of the rate sweep's "limit" column.
const (
	walsenderBusy = 0.85 // cores: the walsender is one process, one core at most
	busyShare     = 0.90 // share of all cores busy
	paceShort     = 0.90 // achieved / offered below this: the writer could not keep the pace
)

// stepFigures are the medians of one system at one offered rate.
type stepFigures struct {
	runs                                             int
	achieved, p50, p99, pmax                         float64
	all                                              bool // every run delivered every row
	reader, server, broker, writer, bench, busy, cap float64
}

// rateTable prints the rate sweep and writes its plots.
func (r *report) rateTable(b *strings.Builder, run *costRun, letter string) ([]string, error) {
	c := r.o.cost
	fmt.Fprintf(b, "\n%s. Latency against offered rate: %d-row transactions on %d connections, %s per step, median of the runs that reached the step\n",
		letter, c.txn, writers, r.o.duration)
	fmt.Fprintf(b, "   latency: commit (clock_timestamp() in the row) to receipt, ms: outboxd's by a Kafka consumer, pg_recvlogical's on its standard output (the decode floor)\n")
	fmt.Fprintf(b, "   cores: CPU seconds per second of the step, of the reader, its walsender, the broker, the writer's %d PostgreSQL backends, the bench (writer client and consumer) and the whole machine (of %d)\n", writers, runtime.NumCPU())
	fmt.Fprintf(b, "%-14s %7s %8s %4s %7s %7s %7s %6s | %6s %6s %6s %6s %6s %7s | %s\n", "", "offered", "achieved", "runs", "p50", "p99", "max", "deliv.",
		"reader", "walsnd", "broker", "writer", "bench", "machine", "limit")
	steps := map[string][]stepFigures{}
	for _, sys := range []string{sysOutboxd, sysRecv} {
		for _, rate := range c.rates {
			var f stepFigures
			var ach, p50, p99, pmax, rd, sv, bk, wr, bn, bu []float64
			f.all = true
			for _, cell := range run.cells {
				if cell.sys != sys || cell.rate != rate {
					continue
				}
				f.runs++
				ach, p50, p99, pmax = append(ach, cell.achieved), append(p50, cell.q(0.5)), append(p99, cell.q(0.99)), append(pmax, cell.q(1))
				rd, sv, bk = append(rd, cell.cpu/cell.wall), append(sv, cell.serverCPU/cell.wall), append(bk, cell.brokerCPU/cell.wall)
				wr, bn, bu = append(wr, cell.writerCPU/cell.wall), append(bn, cell.benchCPU/cell.wall), append(bu, cell.busy)
				f.all = f.all && cell.delivered >= cell.written
			}
			if f.runs == 0 {
				continue
			}
			f.achieved, f.p50, f.p99, f.pmax = median(ach), median(p50), median(p99), median(pmax)
			f.reader, f.server, f.broker, f.writer, f.bench, f.busy = median(rd), median(sv), median(bk), median(wr), median(bn), median(bu)
			f.cap = float64(rate)
			steps[sys] = append(steps[sys], f)
			deliv := "all"
			if !f.all {
				deliv = "SHORT"
			}
			fmt.Fprintf(b, "%-14s %7d %8.0f %4d %7.1f %7.1f %7.1f %6s | %6.2f %6.2f %6.2f %6.2f %6.2f %4.2f/%d | %s\n", sys, rate, f.achieved, f.runs,
				f.p50, f.p99, f.pmax, deliv, f.reader, f.server, f.broker, f.writer, f.bench, f.busy, runtime.NumCPU(), f.limit(c.maxP99))
		}
	}
	fmt.Fprintf(b, "   limit: walsender ≥ %.2f core (it is one process); machine ≥ %.0f%% of its cores busy; writer: achieved < %.0f%% of offered; latency: p99 over %.0f ms; \"-\": none of these\n",
		walsenderBusy, busyShare*100, paceShort*100, c.maxP99)

	var lat, cores []series
	for i, sys := range []string{sysOutboxd, sysRecv} {
		dash := i == 1
		l50 := series{name: sys + " p50", color: palette[0], dash: dash}
		l99 := series{name: sys + " p99", color: palette[1], dash: dash}
		for _, f := range steps[sys] {
			l50.xs, l50.ys = append(l50.xs, f.cap), append(l50.ys, f.p50)
			l99.xs, l99.ys = append(l99.xs, f.cap), append(l99.ys, f.p99)
		}
		lat = append(lat, l50, l99)
		parts := []struct {
			name string
			get  func(stepFigures) float64
		}{{sys, func(f stepFigures) float64 { return f.reader }}, {"walsender", func(f stepFigures) float64 { return f.server }},
			{"writer backends", func(f stepFigures) float64 { return f.writer }}, {"machine", func(f stepFigures) float64 { return f.busy }}}
		if sys == sysOutboxd {
			parts = append(parts, struct {
				name string
				get  func(stepFigures) float64
			}{"broker", func(f stepFigures) float64 { return f.broker }})
		}
		for k, p := range parts {
			s := series{name: p.name, color: palette[k%len(palette)], dash: dash}
			if dash {
				s.name = "recv run: " + strings.TrimPrefix(p.name, "pg_")
			}
			for _, f := range steps[sys] {
				s.xs, s.ys = append(s.xs, f.cap), append(s.ys, p.get(f))
			}
			cores = append(cores, s)
		}
	}
	pl := filepath.Join(r.o.out, "cost-rate-latency.svg")
	if err := lineChart(pl, fmt.Sprintf("Latency against offered rate, %d-row transactions (outboxd solid, pg_recvlogical dashed)", c.txn),
		"offered events/s (log scale)", "ms (log scale)", true, true, lat); err != nil {
		return nil, err
	}
	pc := filepath.Join(r.o.out, "cost-rate-cores.svg")
	if err := lineChart(pc, "Cores busy against offered rate (outboxd's run solid, pg_recvlogical's dashed)",
		"offered events/s (log scale)", "cores (CPU s per s)", true, false, cores); err != nil {
		return nil, err
	}
	return []string{pl, pc}, nil
}

// limit names what held the step back, by the thresholds above.
func (f stepFigures) limit(maxP99 float64) string {
	var l []string
	if f.server >= walsenderBusy {
		l = append(l, "walsender")
	}
	if f.busy >= busyShare*float64(runtime.NumCPU()) {
		l = append(l, "machine")
	}
	if f.achieved < paceShort*f.cap {
		l = append(l, "writer")
	}
	if f.p99 > maxP99 || math.IsNaN(f.p99) {
		l = append(l, "latency")
	}
	if len(l) == 0 {
		return "-"
	}
	return strings.Join(l, "+")
}
