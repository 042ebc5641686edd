package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// pollEvery is how often the partitions' high watermarks are read during
// a measured start, from the broker directly (not through the proxy: it
// costs outboxd nothing); outboxd's /metrics is read every scrapeEvery
// polls (read every 20 ms it took ~9 % of outboxd's CPU).
const (
	pollEvery   = 20 * time.Millisecond
	scrapeEvery = 5
)

// measurement is what the measured start showed, times from the process
// start.
type measurement struct {
	first, all       time.Duration // the first new record in Kafka, a new record in every partition; 0: not seen
	firstAck, allAck time.Duration // outboxd_events_total at 1, at every partition's record; 0: not seen
	events           float64       // outboxd_events_total at the end: the records acknowledged
	givenUp, skipped float64       // tails given up, duplicates skipped
	cpu, runQueue    float64       // seconds outboxd's threads ran, and waited for a CPU, until the last record
	load             [2]string     // the machine's 1-minute load average at the start and at the end
	warnings         map[string]int
}

// measure starts outboxd with s's route and waits until every partition
// holds one record more than before (or -timeout). A record in Kafka's
// high watermark is an acknowledged one: the topic has one replica.
func (b *tb) measure(ctx context.Context, s startSpec, before []int64) (measurement, error) {
	d, err := b.newDaemon(s)
	if err != nil {
		return measurement{}, err
	}
	defer d.Close()
	b.logf("outboxd starts with the route changed (variant %d), %s added each way (%s)", s.variant, b.o.latency, s)
	var m measurement
	m.load[0] = loadAvg()
	t0 := time.Now()
	if err := b.startDaemon(d); err != nil {
		return m, err
	}
	pid := d.PID()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	lastLog := t0
	want := float64(b.o.partitions)
	for i := 0; m.all == 0 || m.allAck == 0; i++ {
		<-tick.C
		if !d.Running() {
			return m, exited(d)
		}
		now := time.Since(t0)
		if i%10 == 0 {
			m.sample(pid)
		}
		if i%scrapeEvery == 0 || m.all != 0 {
			if got, ok := scrape(ctx, d); ok {
				m.events, m.givenUp, m.skipped = got.events, got.givenUp, got.skipped
				if m.firstAck == 0 && m.events >= 1 {
					m.firstAck = now
				}
				if m.allAck == 0 && m.events >= want {
					m.allAck = now
				}
			}
		}
		if m.all != 0 {
			continue // outboxd has yet to count the acknowledgements
		}
		ends, err := b.offsets(ctx)
		if err != nil {
			continue // asked again at the next tick
		}
		grown := 0
		for p := range ends {
			if ends[p] > before[p] {
				grown++
			}
		}
		if m.first == 0 && grown > 0 {
			m.first = now
			b.logf("  first new record in Kafka after %.2f s", now.Seconds())
		}
		if grown == len(ends) {
			m.all = now
			b.logf("  a new record in every partition after %.2f s", now.Seconds())
		}
		if time.Since(lastLog) >= 10*time.Second {
			b.logf("  %.1f s: new records in %d of %d partitions", now.Seconds(), grown, len(ends))
			lastLog = time.Now()
		}
		if now > b.o.timeout {
			return m, fmt.Errorf("new records in %d of %d partitions after %s\n%s", grown, len(ends), b.o.timeout, tailOf(d.Log(), 3000))
		}
	}
	m.sample(pid)
	if err := b.stopDaemon(d); err != nil {
		return m, err
	}
	m.warnings = warnings(d.Log())
	return m, nil
}

// sample reads outboxd's scheduler times and the load average.
func (m *measurement) sample(pid int) {
	if r, w, err := schedTimes(pid); err == nil {
		m.cpu, m.runQueue = r, w
	}
	m.load[1] = loadAvg()
}

// scraped is one reading of /metrics.
type scraped struct {
	events, givenUp, skipped float64
}

// scrape reads /metrics once; false when it could not.
func scrape(ctx context.Context, d *testenv.Daemon) (scraped, bool) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	code, body, err := d.Get(ctx, "/metrics")
	if err != nil || code != http.StatusOK {
		return scraped{}, false
	}
	var s scraped
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			continue
		}
		metric, _, _ := strings.Cut(l[:i], "{")
		switch metric {
		case "outboxd_events_total":
			s.events += v
		case "outboxd_dedupe_tails_given_up_total":
			s.givenUp += v
		case "outboxd_duplicates_skipped_total":
			s.skipped += v
		}
	}
	return s, true
}

// warnings counts outboxd's log lines by their message (hclog's text
// format: time, [LEVEL], logger: message: key=value...).
func warnings(log string) map[string]int {
	out := map[string]int{}
	for _, l := range strings.Split(log, "\n") {
		i := strings.Index(l, "[WARN]")
		if i < 0 {
			i = strings.Index(l, "[ERROR]")
		}
		if i < 0 {
			continue
		}
		msg := strings.TrimSpace(l[i:])
		// The message ends where the first key=value begins.
		if j := strings.Index(msg, "="); j > 0 {
			if k := strings.LastIndex(msg[:j], ":"); k > 0 {
				msg = msg[:k]
			}
		}
		out[msg]++
	}
	return out
}

func (m measurement) print(w io.Writer, o options, s startSpec, lo, hi int64) {
	timeout := "default"
	if o.deliveryTimeout > 0 {
		timeout = o.deliveryTimeout.String()
	}
	fmt.Fprintf(w, "\nA start's tail reads on a distant cluster: %d partitions holding %d-%d records each (written by outboxd), the route changed, %s added each way (proxy: %s), one new row per partition, kafka.delivery_timeout %s\n\n",
		o.partitions, lo, hi, o.latency, s, timeout)
	sec := func(d time.Duration) string {
		if d == 0 {
			return "never"
		}
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	row := func(label, format string, args ...any) {
		fmt.Fprintf(w, "  %-40s %s\n", label, fmt.Sprintf(format, args...))
	}
	row("from outboxd's process start to", "in Kafka (high watermark, polled every %s) / acknowledged (outboxd_events_total, every %s)", pollEvery, scrapeEvery*pollEvery)
	row("  the first record", "%s / %s", sec(m.first), sec(m.firstAck))
	row("  a record in every partition", "%s / %s", sec(m.all), sec(m.allAck))
	row("outboxd's threads until then", "ran %.1f s, waited %.1f s for a CPU (load average %s at the start, %s at the end, %d CPUs)",
		m.cpu, m.runQueue, m.load[0], m.load[1], runtime.NumCPU())
	row("tails given up", "%.0f of %d", m.givenUp, o.partitions)
	row("duplicates skipped", "%.0f", m.skipped)
	if len(m.warnings) > 0 {
		fmt.Fprintf(w, "  outboxd's warnings and errors\n")
		msgs := make([]string, 0, len(m.warnings))
		for k := range m.warnings {
			msgs = append(msgs, k)
		}
		sort.Strings(msgs)
		for _, k := range msgs {
			fmt.Fprintf(w, "    %4d × %s\n", m.warnings[k], k)
		}
	}
}

// schedTimes are the seconds pid's threads ran on a CPU and waited in a
// run queue for one, so far, summed over /proc/PID/task/*/schedstat (a
// thread that ended is left out: the Go runtime seldom ends one).
func schedTimes(pid int) (run, wait float64, err error) {
	files, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(files) == 0 {
		return 0, 0, fmt.Errorf("no schedstat for pid %d", pid)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended meanwhile
		}
		var r, w float64
		if _, err := fmt.Sscan(string(b), &r, &w); err != nil {
			return 0, 0, fmt.Errorf("parse %s: %w", f, err)
		}
		run, wait = run+r/1e9, wait+w/1e9
	}
	return run, wait, nil
}

// loadAvg is the machine's 1-minute load average.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
