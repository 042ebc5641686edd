package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

type report struct {
	machine string
	o       options
	drains  []drainRun
	cells   []cellResult
	profile string // perf summary of outboxd during an extra drain
	idle    map[string][]float64
	steady  *steadyRun
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

// per100k turns CPU seconds over n events into CPU seconds per 100k events.
func per100k(cpu float64, n int) float64 { return cpu / float64(n) * 1e5 }

func (r *report) write(stdout io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "outboxd bench\nmachine: %s\n", r.machine)
	var targets []string
	check := func(ok bool, format string, args ...any) {
		mark := "MISS"
		if ok {
			mark = "MET "
		}
		targets = append(targets, fmt.Sprintf("  [%s] %s", mark, fmt.Sprintf(format, args...)))
	}
	var plots []string

	if len(r.drains) > 0 {
		rows := r.drains[0].bl.rows
		var wal []float64
		for _, d := range r.drains {
			wal = append(wal, d.walMB)
		}
		fmt.Fprintf(&b, "\n1. Backlog drain: %d rows (~200-byte carrega, transactions of 100, %.0f MB of WAL), %d partitions, acks=all; median of %d runs\n",
			rows, median(wal), r.o.partitions, len(r.drains))
		if r.o.routing == "rich" {
			fmt.Fprintf(&b, "   outboxd with -routing rich: two records per row (events/s counts rows; outboxd produced and acknowledged twice as many records)\n")
		}
		if r.o.value != "" {
			fmt.Fprintf(&b, "   outboxd with -value %s\n", r.o.value)
		}
		fmt.Fprintf(&b, "%-26s %9s %9s %9s | %-11s %8s %8s | %-11s %8s | %8s\n", "", "seconds", "events/s", "×recvlog",
			"reader", "CPU s", "peak RSS", "server", "CPU s", "broker")
		fmt.Fprintf(&b, "%-26s %9s %9s %9s | %-11s %8s %8s | %-11s %8s | %8s\n", "", "", "", "",
			"", "/100k ev", "MiB", "", "/100k ev", "CPU s/100k")
		line := func(label, sys string, confirmed bool, readerName, serverName string) {
			var secs, rate, ratio, cpu, rss, scpu, bcpu []float64
			for _, d := range r.drains {
				x := d.results[sys]
				s := x.seconds
				if confirmed {
					s = x.confirmed
				}
				secs = append(secs, s)
				rate = append(rate, float64(rows)/s)
				ratio = append(ratio, (float64(rows)/s)/d.results[sysRecv].rate(rows))
				cpu = append(cpu, per100k(x.cpu, rows))
				rss = append(rss, x.rss)
				scpu = append(scpu, per100k(x.serverCPU, rows))
				bcpu = append(bcpu, per100k(x.brokerCPU, rows))
			}
			fmt.Fprintf(&b, "%-26s %9.2f %9.0f %9.2f | %-11s %8.2f %8.1f | %-11s %8.2f | %8.2f\n", label, median(secs), median(rate), median(ratio),
				readerName, median(cpu), maxOf(rss), serverName, median(scpu), median(bcpu))
		}
		line("pg_recvlogical (limit)", sysRecv, false, "recvlogical", "walsender")
		line("outboxd, last ack", sysOutboxd, false, "outboxd", "walsender")
		line("outboxd, slot confirmed", sysOutboxd, true, "outboxd", "walsender")
		line("polling relay", sysRelay, false, "relay", "backend")
		// The drain ends when the last record is acknowledged and
		// the slot confirmed: the targets use the confirmed time.
		var vsRecv, vsRelay, usPerEv, rss []float64
		for _, d := range r.drains {
			o := d.results[sysOutboxd]
			done := float64(rows) / o.confirmed
			vsRecv = append(vsRecv, done/d.results[sysRecv].rate(rows))
			vsRelay = append(vsRelay, done/d.results[sysRelay].rate(rows))
			usPerEv = append(usPerEv, o.cpu/float64(rows)*1e6)
			rss = append(rss, o.rss)
		}
		fmt.Fprintf(&b, "outboxd (slot confirmed) / polling relay drain rate: %.1f× (median of per-run ratios); outboxd CPU %.2f µs/event\n",
			median(vsRelay), median(usPerEv))
		check(median(vsRecv) >= 0.8, "drain (slot confirmed) ≥ 0.8 × pg_recvlogical: %.2f×", median(vsRecv))
		check(median(usPerEv) <= 8, "outboxd CPU ≤ 8 µs/event during the drain: %.2f µs", median(usPerEv))
		check(maxOf(rss) <= 40, "outboxd peak RSS ≤ 40 MB (drain of %d rows): %.1f MiB", rows, maxOf(rss))
		check(median(vsRelay) >= 10, "drain (slot confirmed) ≥ 10× the polling relay: %.1f×", median(vsRelay))

		// The throughput plot of the run with the median outboxd rate.
		idx := make([]int, len(r.drains))
		for i := range idx {
			idx[i] = i
		}
		sort.Slice(idx, func(i, j int) bool {
			return r.drains[idx[i]].results[sysOutboxd].seconds < r.drains[idx[j]].results[sysOutboxd].seconds
		})
		med := r.drains[idx[len(idx)/2]]
		var ss []series
		for i, sys := range []string{sysRecv, sysOutboxd, sysRelay} {
			ss = append(ss, rateSeries(sys, med.results[sys].samples, palette[i]))
		}
		p := filepath.Join(r.o.out, "drain-throughput.svg")
		if err := lineChart(p, fmt.Sprintf("Backlog drain of %d outbox rows: events/s (100 ms samples)", rows), "seconds since start", "events/s", false, false, ss); err != nil {
			return err
		}
		plots = append(plots, p)
		if r.profile != "" {
			p := filepath.Join(r.o.out, "outboxd-perf-drain.txt")
			if err := os.WriteFile(p, []byte(r.profile+"\n"), 0o644); err != nil {
				return err
			}
			plots = append(plots, p)
		}
	}

	if len(r.cells) > 0 {
		fmt.Fprintf(&b, "\n2. Steady latency: commit (clock_timestamp() in the row) to consumer receipt, ms; %s per rate, median of %d runs\n",
			r.o.duration, r.o.repeats)
		fmt.Fprintf(&b, "%-14s %4s %7s %9s %8s %8s %8s %8s %8s | %-8s %8s | %-8s %8s | %8s | %8s | %7s\n", "", "txn", "rate", "achieved", "p50", "p95", "p99", "max", "deliv.",
			"reader", "CPU s", "server", "CPU s", "broker", "bench", "machine")
		fmt.Fprintf(&b, "%-14s %4s %7s %9s %8s %8s %8s %8s %8s | %-8s %8s | %-8s %8s | %8s | %8s | %7s\n", "", "rows", "ev/s", "ev/s", "", "", "", "", "",
			"", "/100k ev", "", "/100k ev", "CPU s/100k", "CPU s/100k", "busy")
		type key struct {
			sys       string
			txn, rate int
		}
		groups := map[key][]cellResult{}
		for _, c := range r.cells {
			k := key{c.sys, c.txn, c.rate}
			groups[k] = append(groups[k], c)
		}
		p99 := map[key]float64{}
		var latRSS []float64
		for _, sys := range []string{sysOutboxd, sysRelay} {
			for _, txn := range r.o.txnSizes {
				for _, rate := range r.o.rates {
					g := groups[key{sys, txn, rate}]
					if len(g) == 0 {
						continue
					}
					var ach, q50, q95, q99, qmax, cpu, scpu, bcpu, own, busy []float64
					deliv := true
					for _, c := range g {
						ach = append(ach, c.achieved)
						q50 = append(q50, c.q(0.5))
						q95 = append(q95, c.q(0.95))
						q99 = append(q99, c.q(0.99))
						qmax = append(qmax, c.q(1))
						cpu = append(cpu, per100k(c.cpu, c.written))
						scpu = append(scpu, per100k(c.serverCPU, c.written))
						bcpu = append(bcpu, per100k(c.brokerCPU, c.written))
						own = append(own, per100k(c.benchCPU, c.written))
						busy = append(busy, c.busy)
						deliv = deliv && c.delivered >= c.written
						if sys == sysOutboxd {
							latRSS = append(latRSS, c.rss)
						}
					}
					p99[key{sys, txn, rate}] = median(q99)
					d := "all"
					if !deliv {
						d = "SHORT"
					}
					reader, server := "outboxd", "walsnd"
					if sys == sysRelay {
						reader, server = "relay", "backend"
					}
					fmt.Fprintf(&b, "%-14s %4d %7d %9.0f %8.1f %8.1f %8.1f %8.1f %8s | %-8s %8.2f | %-8s %8.2f | %8.2f | %8.2f | %4.2f/%d\n", sys, txn, rate, median(ach),
						median(q50), median(q95), median(q99), median(qmax), d, reader, median(cpu), server, median(scpu), median(bcpu),
						median(own), median(busy), runtime.NumCPU())
				}
			}
		}
		fmt.Fprintf(&b, "idle (nothing to carry, 3 s): outboxd %.1f ms CPU/s, polling relay %.1f ms CPU/s\n",
			median(r.idle[sysOutboxd])*1000, median(r.idle[sysRelay])*1000)
		if len(latRSS) > 0 {
			fmt.Fprintf(&b, "outboxd peak RSS during the latency runs: %.1f MiB\n", maxOf(latRSS))
		}
		for _, txn := range r.o.txnSizes {
			for _, rate := range r.o.rates {
				o, ok := p99[key{sysOutboxd, txn, rate}]
				rl := p99[key{sysRelay, txn, rate}]
				if !ok {
					continue
				}
				switch rate {
				case 2000:
					check(o <= 20, "p99 ≤ 20 ms at 2,000 events/s (%d-row transactions): %.1f ms", txn, o)
				case 10000:
					check(o <= 50, "p99 ≤ 50 ms at 10,000 events/s (%d-row transactions): %.1f ms", txn, o)
				}
				if rl > 0 && o > 0 {
					check(rl/o >= 10, "p99 ≥ 10× lower than polling at %d events/s (%d-row transactions): %.1f ms vs %.1f ms, %.1f×", rate, txn, o, rl, rl/o)
				}
			}
		}
		// One CDF chart per transaction size, all repeats pooled.
		for _, txn := range r.o.txnSizes {
			var ss []series
			for si, sys := range []string{sysOutboxd, sysRelay} {
				for ri, rate := range r.o.rates {
					var all []float64
					for _, c := range groups[key{sys, txn, rate}] {
						all = append(all, c.lat...)
					}
					if len(all) == 0 {
						continue
					}
					sort.Float64s(all)
					s := series{name: fmt.Sprintf("%s %d/s", sys, rate), color: palette[ri%len(palette)], dash: si == 1}
					for i := 0; i <= 200; i++ {
						q := float64(i) / 200
						s.xs = append(s.xs, max(all[int(q*float64(len(all)-1))], 0.01))
						s.ys = append(s.ys, q*100)
					}
					ss = append(ss, s)
				}
			}
			p := filepath.Join(r.o.out, fmt.Sprintf("latency-cdf-txn%d.svg", txn))
			if err := lineChart(p, fmt.Sprintf("Commit to consumer receipt, %d-row transactions (CDF)", txn),
				"latency, ms (log scale)", "percent of events at or below", true, false, ss); err != nil {
				return err
			}
			plots = append(plots, p)
		}
	}

	if r.steady != nil {
		p, err := r.writeSteady(&b, check)
		if err != nil {
			return err
		}
		if p != "" {
			plots = append(plots, p)
		}
	}

	if len(targets) > 0 {
		fmt.Fprintf(&b, "\nTargets (issues 5 and 36):\n%s\n", strings.Join(targets, "\n"))
	}
	if m, _ := filepath.Glob(filepath.Join(r.o.out, "outboxd-perf-latency-*.txt")); len(m) > 0 {
		plots = append(plots, m...)
	}
	return r.finish(stdout, &b, "results.txt", plots)
}

// finish lists the files written, adds the text itself as name in the
// output folder, and prints it.
func (r *report) finish(stdout io.Writer, b *strings.Builder, name string, written []string) error {
	path := filepath.Join(r.o.out, name)
	fmt.Fprintf(b, "\nWritten: %s\n", strings.Join(append(written, path), ", "))
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err
	}
	_, err := io.WriteString(stdout, b.String())
	return err
}

// rateSeries turns cumulative samples into events/s per interval.
func rateSeries(name string, s []sample, color string) series {
	out := series{name: name, color: color, xs: []float64{0}, ys: []float64{0}}
	prev := sample{}
	for _, x := range s {
		dt := x.t - prev.t
		if dt < 0.05 {
			continue
		}
		out.xs = append(out.xs, x.t)
		out.ys = append(out.ys, (x.count-prev.count)/dt)
		prev = x
	}
	return out
}
