package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// sample is a cumulative count of events at a time since the start.
type sample struct {
	t     float64 // seconds
	count float64
}

// drainResult is one system's drain of one backlog.
type drainResult struct {
	sys        string
	seconds    float64 // until the last event was read/acknowledged
	confirmed  float64 // outboxd: until the slot's confirmed_flush_lsn passed the backlog
	cpu        float64 // the reader process (outboxd, relay, pg_recvlogical)
	rss        float64 // its peak RSS, MiB
	serverCPU  float64 // walsender (or the relay's backend)
	serverRSS  float64
	brokerCPU  float64
	samples    []sample
	perfReport string
}

func (d drainResult) rate(rows int) float64 { return float64(rows) / d.seconds }

type drainRun struct {
	bl      backlog
	walMB   float64
	carrega float64                // measured: mean bytes of a row's carrega as text
	results map[string]drainResult // by reader name
}

// backlog is what one drain reads.
type backlog struct {
	rows       int
	carrega    int // bytes of carrega per row (about): 0 is the ~200-byte order
	partitions int // of every topic
	tables     int // outbox tables in the publication, each its own route and topic; transactions rotate over them
}

// reader is one system reading a backlog; pg_recvlogical may ask for
// pgoutput's binary option (-o binary=true: values by their types' send
// functions instead of their output functions).
type reader struct {
	sys    string
	binary bool
}

func (r reader) name() string {
	if r.binary {
		return r.sys + " binary"
	}
	return r.sys
}

// slot is the reader's slot on the backlog's database.
func (r reader) slot(db string) string {
	s := map[string]string{sysRecv: "_recv", sysOutboxd: "_outboxd"}[r.sys]
	if r.binary {
		s += "_bin"
	}
	return db + s
}

const backlogTxn = 100

// drain writes one backlog and has the readers read it, one after the
// other; label names the run in the log. With profile, perf records
// outboxd.
func (b *bench) drain(ctx context.Context, label string, rep int, bl backlog, readers []reader, profile bool) (drainRun, error) {
	name := fmt.Sprintf("bench_drain_%d", rep) + b.runTag
	dsn, db, err := b.setupDB(ctx, name, bl)
	if err != nil {
		return drainRun{}, err
	}
	defer b.dropDB(ctx, name)
	defer db.Close(ctx)
	defer b.deleteTopics(name, bl)
	var slotReaders []reader
	for _, r := range readers {
		if r.sys == sysRelay {
			continue
		}
		slotReaders = append(slotReaders, r)
		if _, err := db.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", r.slot(name)); err != nil {
			return drainRun{}, err
		}
	}
	var startLSN string
	if err := db.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&startLSN); err != nil {
		return drainRun{}, err
	}
	logf(b.log, "drain %s: writing %d rows (carrega %s) in transactions of %d", label, bl.rows, sizeLabel(bl.carrega), backlogTxn)
	endLSN, err := writeBacklog(ctx, dsn, bl)
	if err != nil {
		return drainRun{}, err
	}
	var walBytes float64
	_ = db.QueryRow(ctx, "SELECT $1::pg_lsn - $2::pg_lsn", endLSN, startLSN).Scan(&walBytes)
	run := drainRun{bl: bl, walMB: walBytes / (1 << 20), results: map[string]drainResult{}}
	_ = db.QueryRow(ctx, "SELECT avg(octet_length(carrega::text)) FROM (SELECT carrega FROM outbox LIMIT 1000) s").Scan(&run.carrega)
	start, _ := pglogrepl.ParseLSN(startLSN)
	end, _ := pglogrepl.ParseLSN(endLSN)

	// Rotate which slot reader goes first (a later one finds the WAL in
	// the page cache); the relay, on the table, comes last.
	k := rep % len(slotReaders)
	order := append(slices.Clone(slotReaders[k:]), slotReaders[:k]...)
	for _, r := range readers {
		if r.sys == sysRelay {
			order = append(order, r)
		}
	}
	for _, rd := range order {
		var r drainResult
		var err error
		switch rd.sys {
		case sysRecv:
			r, err = b.drainRecvlogical(ctx, bl.rows, dsn, name, rd.slot(name), endLSN, start, end, rd.binary)
		case sysOutboxd:
			r, err = b.drainOutboxd(ctx, bl, dsn, name, rd.slot(name), endLSN, profile)
		case sysRelay:
			r, err = b.drainRelay(ctx, bl, dsn, name+"_relay")
		}
		if err != nil {
			return drainRun{}, fmt.Errorf("%s: %w", rd.name(), err)
		}
		logf(b.log, "drain %s: %-21s %6.2f s  %8.0f events/s", label, rd.name(), r.seconds, r.rate(bl.rows))
		run.results[rd.name()] = r
	}
	return run, nil
}

// writeBacklog inserts the backlog's rows in transactions of 100 on two
// connections, transaction i into table i % tables, and returns an LSN
// inside the last transaction, after its rows: a reader past it has read
// every row.
func writeBacklog(ctx context.Context, dsn string, bl backlog) (string, error) {
	rows := bl.rows
	insertInto := func(t int) string {
		return `INSERT INTO ` + outboxTable(t%bl.tables) + ` (id, agregat, agregat_id, tipus, carrega)
		SELECT gen_random_uuid(), 'comanda', 'P-2026-' || lpad((g % 5000)::text, 6, '0'), 'comanda.creada', ` + carregaOf("g", bl.carrega, "") + `
		FROM generate_series($1::int, $2::int) g`
	}
	txns := (rows + backlogTxn - 1) / backlogTxn
	next := make(chan int)
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(ctx)
			for t := range next {
				lo := t * backlogTxn
				hi := min(lo+backlogTxn, rows) - 1
				if _, err := conn.Exec(ctx, insertInto(t), lo, hi); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for t := 0; t < txns-1; t++ {
		select {
		case next <- t:
		case err := <-errs:
			close(next)
			wg.Wait()
			return "", err
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return "", err
	default:
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx)
	lo := (txns - 1) * backlogTxn
	if _, err := tx.Exec(ctx, insertInto(txns-1), lo, rows-1); err != nil {
		return "", err
	}
	var lsn string
	if err := tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		return "", err
	}
	return lsn, tx.Commit(ctx)
}

func (b *bench) drainRecvlogical(ctx context.Context, rows int, dsn, pub, slot, endLSN string, start, end pglogrepl.LSN, binary bool) (drainResult, error) {
	cmd := exec.Command(recvlogical(), append(recvlogicalArgs(dsn, pub, slot, binary), "--endpos", endLSN, "-f", "/dev/null")...)
	cmd.Stderr = os.Stderr
	broker := newCPUWatch(b.brokerPID)
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return drainResult{}, err
	}
	b.child(cmd.Process)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var ws *cpuWatch
	var samples []sample
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := t0.Add(30 * time.Minute)
	for i := 0; ; i++ {
		select {
		case err := <-done:
			elapsed := time.Since(t0).Seconds()
			if err != nil {
				return drainResult{}, fmt.Errorf("pg_recvlogical: %w", err)
			}
			broker.sample()
			samples = append(samples, sample{elapsed, float64(rows)})
			ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
			return drainResult{sys: sysRecv, seconds: elapsed,
				cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds(), rss: float64(ru.Maxrss) / 1024,
				serverCPU: ws.used(), serverRSS: ws.peak(), brokerCPU: broker.used(), samples: samples}, nil
		case <-tick.C:
		}
		if ws == nil {
			if pid := b.slotPID(ctx, slot); pid != 0 {
				ws = newCPUWatch(pid)
			}
		}
		ws.sample()
		if i%10 == 0 && ws != nil {
			// Progress for the plot: the walsender's sent position within
			// the backlog's WAL, as a share of its rows.
			var sent *string
			_ = b.admin.QueryRow(ctx, "SELECT sent_lsn::text FROM pg_stat_replication WHERE pid = $1", ws.pid).Scan(&sent)
			if sent != nil {
				s, _ := pglogrepl.ParseLSN(*sent)
				f := min(1, max(0, float64(s-start)/float64(end-start)))
				samples = append(samples, sample{time.Since(t0).Seconds(), f * float64(rows)})
			}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return drainResult{}, fmt.Errorf("pg_recvlogical did not reach %s in 30 minutes", endLSN)
		}
	}
}

func (b *bench) drainOutboxd(ctx context.Context, bl backlog, dsn, name, slot, endLSN string, profile bool) (drainResult, error) {
	rows := bl.rows
	broker := newCPUWatch(b.brokerPID)
	t0 := time.Now()
	d, err := b.startOutboxd(name, dsn, slot, bl.tables)
	if err != nil {
		return drainResult{}, err
	}
	defer d.Close()
	self := newCPUWatch(d.PID())
	var prof *profiler
	if profile {
		prof = startPerf(d.PID(), filepath.Join(b.tmp, "outboxd.perf.data"))
	}
	var ws *cpuWatch
	var samples []sample
	var acked uint64
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := t0.Add(30 * time.Minute)
	var seconds float64
	for i := 0; ; i++ {
		<-tick.C
		if !d.Running() {
			return drainResult{}, exitedEarly(d)
		}
		if n, ok := ackedEvents(ctx, d); ok {
			acked = n
		}
		now := time.Since(t0).Seconds()
		if ws == nil {
			if pid := b.slotPID(ctx, slot); pid != 0 {
				ws = newCPUWatch(pid)
			}
		}
		if i%10 == 0 {
			self.sample()
			ws.sample()
			samples = append(samples, sample{now, float64(acked)})
		}
		if acked >= uint64(rows*b.recordsPerRow()) {
			seconds = now
			samples = append(samples, sample{now, float64(acked)})
			self.sample()
			ws.sample()
			broker.sample()
			break
		}
		if time.Now().After(deadline) {
			return drainResult{}, fmt.Errorf("%d of %d acknowledged after 30 minutes", acked, rows*b.recordsPerRow())
		}
	}
	r := drainResult{sys: sysOutboxd, seconds: seconds, cpu: self.used(), rss: float64(d.PeakRSSKB()) / 1024,
		serverCPU: ws.used(), serverRSS: ws.peak(), brokerCPU: broker.used(), samples: samples}
	r.perfReport = prof.stop()
	// The slot follows within a standby status interval.
	for {
		var ok bool
		if err := b.admin.QueryRow(ctx, "SELECT confirmed_flush_lsn > $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2",
			endLSN, slot).Scan(&ok); err != nil {
			return drainResult{}, err
		}
		if ok {
			r.confirmed = time.Since(t0).Seconds()
			break
		}
		if time.Now().After(deadline) {
			return drainResult{}, fmt.Errorf("slot not confirmed past %s after 30 minutes", endLSN)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := b.stopOutboxd(d); err != nil {
		return drainResult{}, fmt.Errorf("outboxd exit: %w", err)
	}
	return r, nil
}

// profiler is a `perf record` attached to a process, when perf works.
type profiler struct {
	cmd  *exec.Cmd
	data string
}

func startPerf(pid int, data string) *profiler {
	p, err := exec.LookPath("perf")
	if err != nil {
		return nil
	}
	cmd := exec.Command(p, "record", "-q", "-F", "999", "-g", "-p", fmt.Sprint(pid), "-o", data)
	if err := cmd.Start(); err != nil {
		return nil
	}
	return &profiler{cmd: cmd, data: data}
}

// stop ends the recording and summarises it: the functions with the most
// samples, by self time and including callees.
func (p *profiler) stop() string {
	if p == nil {
		return ""
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	_ = p.cmd.Wait()
	var parts []string
	for _, mode := range []string{"--no-children", "--children"} {
		out, err := exec.Command("perf", "report", "-i", p.data, "--stdio", mode, "-g", "none",
			"--percent-limit", "2", "--sort", "dso,symbol").Output()
		if err != nil {
			continue
		}
		keep := []string{"## perf report " + mode}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") && !strings.HasPrefix(l, "# Samples") {
				continue
			}
			keep = append(keep, strings.TrimRight(l, " -"))
		}
		parts = append(parts, strings.Join(keep, "\n"))
	}
	return strings.Join(parts, "\n\n")
}

func (b *bench) drainRelay(ctx context.Context, bl backlog, dsn, topic string) (drainResult, error) {
	rows := bl.rows
	if err := b.env.CreateTopic(topic, bl.partitions); err != nil {
		return drainResult{}, err
	}
	broker := newCPUWatch(b.brokerPID)
	t0 := time.Now()
	r, err := b.startRelay(dsn, topic)
	if err != nil {
		return drainResult{}, err
	}
	defer r.stop()
	self := newCPUWatch(r.cmd.Process.Pid)
	var backend *cpuWatch
	var samples []sample
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := t0.Add(60 * time.Minute)
	for i := 0; ; i++ {
		<-tick.C
		n := r.published()
		now := time.Since(t0).Seconds()
		if backend == nil {
			if pid := b.backendPID(ctx, "bench_relay"); pid != 0 {
				backend = newCPUWatch(pid)
			}
		}
		if i%10 == 0 {
			self.sample()
			backend.sample()
			samples = append(samples, sample{now, float64(n)})
		}
		if n >= rows {
			self.sample()
			backend.sample()
			broker.sample()
			samples = append(samples, sample{now, float64(n)})
			res := drainResult{sys: sysRelay, seconds: now, cpu: self.used(), rss: self.peak(),
				serverCPU: backend.used(), serverRSS: backend.peak(), brokerCPU: broker.used(), samples: samples}
			if err := r.stop(); err != nil {
				return drainResult{}, fmt.Errorf("relay exit: %w", err)
			}
			return res, nil
		}
		if r.closed || time.Now().After(deadline) {
			return drainResult{}, fmt.Errorf("relay published %d of %d", n, rows)
		}
	}
}
