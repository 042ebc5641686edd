package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/testenv"
)

// cellResult is one (system, rate, transaction size) latency measurement.
type cellResult struct {
	sys       string
	rate, txn int
	rep       int
	written   int
	achieved  float64 // events/s the writer reached
	delivered int
	lat       []float64 // ms, sorted
	cpu       float64   // outboxd or relay, seconds
	serverCPU float64   // walsender or the relay's backend
	brokerCPU float64
	rss       float64 // peak RSS of the daemon so far, MiB
	busy      float64 // the machine's busy cores during the cell (of runtime.NumCPU())
	benchCPU  float64 // this process (writer and consumer), seconds
	writerCPU float64 // the writer's PostgreSQL backends, seconds
	wall      float64 // seconds from the cell's start until every row arrived
}

func (c cellResult) q(p float64) float64 {
	if len(c.lat) == 0 {
		return 0
	}
	return c.lat[int(p*float64(len(c.lat)-1)+0.5)]
}

// latencies are the latencies received so far, per cell tag.
type latencies struct {
	mu  sync.Mutex
	lat map[int][]float64
}

func (l *latencies) add(cell int, ms float64) {
	l.mu.Lock()
	if l.lat == nil {
		l.lat = map[int][]float64{}
	}
	l.lat[cell] = append(l.lat[cell], ms)
	l.mu.Unlock()
}

func (l *latencies) count(cell int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lat[cell])
}

func (l *latencies) take(cell int) []float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]float64(nil), l.lat[cell]...)
	sort.Float64s(out)
	return out
}

// consumer reads every partition of a topic from the start and records,
// per cell tag, the latency from the row's bench_t to receipt.
type consumer struct {
	latencies
	readers []*kafka.Reader
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

var (
	// jsonb prints `"k": v`; the relay's encoding/json compacts to `"k":v`.
	tagCell = []byte(`"bench_c":`)
	tagTime = []byte(`"bench_t":`)
)

func field(v, tag []byte) (int64, bool) {
	i := bytes.Index(v, tag)
	if i < 0 {
		return 0, false
	}
	v = bytes.TrimLeft(v[i+len(tag):], " ")
	j := 0
	for j < len(v) && (v[j] == '-' || v[j] >= '0' && v[j] <= '9') {
		j++
	}
	n, err := strconv.ParseInt(string(v[:j]), 10, 64)
	return n, err == nil
}

func startConsumer(brokers, topic string, partitions int) (*consumer, error) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &consumer{cancel: cancel}
	for p := 0; p < partitions; p++ {
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers:   strings.Split(brokers, ","),
			Topic:     topic,
			Partition: p,
			MinBytes:  1,
			MaxBytes:  16 << 20,
			MaxWait:   500 * time.Millisecond,
			// What a read_committed consumer sees, when: with
			// kafka.transactions a record once its transaction commits (a
			// transaction's markers are read too, and have no cell). The
			// same as read_uncommitted without transactions.
			IsolationLevel: kafka.ReadCommitted,
		})
		if err := r.SetOffset(kafka.FirstOffset); err != nil {
			cancel()
			return nil, err
		}
		c.readers = append(c.readers, r)
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					return
				}
				now := time.Now().UnixMicro()
				cell, ok1 := field(m.Value, tagCell)
				t, ok2 := field(m.Value, tagTime)
				if !ok1 || !ok2 {
					continue
				}
				c.add(int(cell), float64(now-t)/1000)
			}
		}()
	}
	return c, nil
}

func (c *consumer) close() {
	c.cancel()
	for _, r := range c.readers {
		_ = r.Close()
	}
	c.wg.Wait()
}

// write inserts rows at rate events/s in transactions of txn rows, tagged
// with cell, for dur, on several connections; it returns the rows committed.
func write(ctx context.Context, conns []*pgx.Conn, rate, txn, cell int, dur time.Duration) (int, error) {
	return writeSized(ctx, conns, rate, func() int { return txn }, cell, dur)
}

// writeSized is write with each transaction's rows drawn from size: the
// pace counts rows, so the rate holds whatever the sizes.
func writeSized(ctx context.Context, conns []*pgx.Conn, rate int, size func() int, cell int, dur time.Duration) (int, error) {
	ins := `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega)
		SELECT gen_random_uuid(), 'comanda', 'P-2026-' || lpad(floor(random() * 5000)::int::text, 6, '0'), 'comanda.creada', ` +
		carregaSQL("g", `, 'bench_c', $1::int, 'bench_t', floor(extract(epoch from clock_timestamp()) * 1000000)::bigint`) + `
		FROM generate_series(1, $2::int) g`
	tokens := make(chan int, 1<<16)
	var written atomic.Int64
	var firstErr error
	var errOnce sync.Once
	start := time.Now()
	stop := start.Add(dur)
	var wg sync.WaitGroup
	for _, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for txn := range tokens {
				if time.Now().After(stop) {
					continue
				}
				if _, err := conn.Exec(ctx, ins, cell, txn); err != nil {
					errOnce.Do(func() { firstErr = err })
					continue
				}
				written.Add(int64(txn))
			}
		}()
	}
	// Rows are due at a fixed pace from the start; a late writer catches
	// up rather than slowing the rate down.
	perRow := time.Duration(float64(time.Second) / float64(rate))
	sent, next := 0, size()
	tick := time.NewTicker(500 * time.Microsecond)
	for now := range tick.C {
		if now.After(stop) {
			break
		}
		due := int(now.Sub(start) / perRow)
		for ; sent+next <= due; sent, next = sent+next, size() {
			select {
			case tokens <- next:
			default: // the writer is far behind: the achieved rate says so
			}
		}
	}
	tick.Stop()
	close(tokens)
	wg.Wait()
	return int(written.Load()), firstErr
}

const writers = 6

// setupWriters makes the database and topics name (setupDB) and the
// writer's connections to it; done closes and removes all of it, whatever
// the error.
func (b *bench) setupWriters(ctx context.Context, name string, bl backlog) (dsn string, db *pgx.Conn, conns []*pgx.Conn, done func(), err error) {
	done = func() {}
	dsn, db, err = b.setupDB(ctx, name, bl)
	if err != nil {
		return "", nil, nil, done, err
	}
	done = func() {
		for _, c := range conns {
			c.Close(ctx)
		}
		b.deleteTopics(name, bl)
		db.Close(ctx)
		b.dropDB(ctx, name)
	}
	for i := 0; i < writers; i++ {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return dsn, db, conns, done, err // done closes those made
		}
		conns = append(conns, c)
	}
	return dsn, db, conns, done, nil
}

// latency runs the (txn, rate) cells against one system: outboxd or the
// relay (commit to a Kafka consumer's receipt), or pg_recvlogical (commit
// to receipt through its standard output: the decode floor). With sweep,
// the rates are a sweep to saturation: after a cell the writer could not
// pace, that lost rows or whose p99 passed -cost-max-p99, the rest of
// them are skipped; and no idle measurement and no profile. It also
// returns the system's idle CPU use, in CPU seconds per second, measured
// for 3 s with nothing to carry.
func (b *bench) latency(ctx context.Context, sys string, rep int, txns, rates []int, sweep bool) ([]cellResult, float64, error) {
	short := map[string]string{sysOutboxd: "outboxd", sysRelay: "relay", sysRecv: "recv"}[sys]
	name := fmt.Sprintf("bench_lat_%s_%d", short, rep) + b.runTag
	bl := backlog{partitions: b.o.partitions, tables: 1}
	dsn, db, conns, done, err := b.setupWriters(ctx, name, bl)
	defer done()
	if err != nil {
		return nil, 0, err
	}
	var backends []*cpuWatch // the writer's
	for _, c := range conns {
		backends = append(backends, newCPUWatch(int(c.PgConn().PID())))
	}
	var got *latencies
	if sys != sysRecv {
		cons, err := startConsumer(b.env.KafkaBrokers, name, b.o.partitions)
		if err != nil {
			return nil, 0, err
		}
		defer cons.close()
		got = &cons.latencies
	}

	var self, server *cpuWatch
	var d *testenv.Daemon
	var recv *recvProc
	var relay *relayProc
	findServer := func(pid func() int) {
		for i := 0; i < 500 && server == nil; i++ {
			if p := pid(); p != 0 {
				server = newCPUWatch(p)
			} else {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	switch sys {
	case sysOutboxd, sysRecv:
		slot := name
		if _, err := db.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
			return nil, 0, err
		}
		if sys == sysRecv {
			got = &latencies{}
			if recv, err = b.startRecvlogical(dsn, name, slot, got); err != nil {
				return nil, 0, err
			}
			defer recv.stop()
			self = newCPUWatch(recv.cmd.Process.Pid)
		} else {
			if d, err = b.startOutboxd(name, dsn, slot, 1); err != nil {
				return nil, 0, err
			}
			defer d.Close()
			self = newCPUWatch(d.PID())
		}
		findServer(func() int { return b.slotPID(ctx, slot) })
	case sysRelay:
		if relay, err = b.startRelay(dsn, name); err != nil {
			return nil, 0, err
		}
		defer relay.stop()
		self = newCPUWatch(relay.cmd.Process.Pid)
		findServer(func() int { return b.backendPID(ctx, "bench_relay") })
	}
	if server == nil {
		return nil, 0, fmt.Errorf("%s: no server process found", sys)
	}
	// Warm up (connections, metadata, JIT of the broker): cell 0, not reported.
	if _, err := write(ctx, conns, 500, 1, 0, time.Second); err != nil {
		return nil, 0, err
	}
	time.Sleep(time.Second)
	var idle float64
	if !sweep {
		self.sample()
		idle0, idleT := self.cur, time.Now()
		time.Sleep(3 * time.Second)
		self.sample()
		idle = (self.cur - idle0) / time.Since(idleT).Seconds()
	}

	var out []cellResult
	cell := 0
	for _, txn := range txns {
		for _, rate := range rates {
			cell++
			broker := newCPUWatch(b.brokerPID)
			self.sample()
			server.sample()
			c0, s0, w0 := self.cur, server.cur, cpuSum(backends)
			m0, b0, t0 := machineBusy(), ownCPU(), time.Now()
			logf(b.log, "latency %d/%d: %-13s %6d events/s, %2d-row transactions, %s", rep+1, b.o.repeats, sys, rate, txn, b.o.duration)
			// Profile outboxd during one cell: the smallest transactions at
			// the middle rate, where the per-transaction cost shows.
			var prof *profiler
			if b.o.perf && !sweep && rep == 0 && sys == sysOutboxd && txn == txns[0] && rate == rates[len(rates)/2] {
				prof = startPerf(d.PID(), filepath.Join(b.tmp, "outboxd-latency.perf.data"))
			}
			n, err := write(ctx, conns, rate, txn, cell, b.o.duration)
			if err != nil {
				return nil, 0, err
			}
			if rep := prof.stop(); rep != "" {
				p := filepath.Join(b.o.out, fmt.Sprintf("outboxd-perf-latency-%drow-%d.txt", txn, rate))
				if err := os.WriteFile(p, []byte(rep+"\n"), 0o644); err != nil {
					return nil, 0, err
				}
			}
			// Wait until every row written has been received.
			deadline := time.Now().Add(b.o.duration + time.Minute)
			for got.count(cell) < n && time.Now().Before(deadline) {
				if d != nil && !d.Running() {
					return nil, 0, exitedEarly(d)
				}
				if recv != nil && recv.exited() != nil {
					return nil, 0, recv.exited()
				}
				time.Sleep(20 * time.Millisecond)
			}
			self.sample()
			server.sample()
			broker.sample()
			r := cellResult{sys: sys, rate: rate, txn: txn, rep: rep, written: n,
				achieved: float64(n) / b.o.duration.Seconds(), lat: got.take(cell),
				cpu: self.cur - c0, serverCPU: server.cur - s0, brokerCPU: broker.used(), rss: self.peak(),
				busy: (machineBusy() - m0) / time.Since(t0).Seconds(), benchCPU: ownCPU() - b0,
				writerCPU: cpuSum(backends) - w0, wall: time.Since(t0).Seconds()}
			r.delivered = len(r.lat)
			logf(b.log, "latency %d/%d: %-13s %6d events/s, %2d-row: wrote %d (%.0f/s), p50 %.1f ms, p99 %.1f ms, max %.1f ms",
				rep+1, b.o.repeats, sys, rate, txn, n, r.achieved, r.q(0.5), r.q(0.99), r.q(1))
			out = append(out, r)
			time.Sleep(500 * time.Millisecond)
			if sweep && (r.achieved < 0.9*float64(rate) || r.delivered < r.written || r.q(0.99) > b.o.cost.maxP99) {
				logf(b.log, "latency %d/%d: %s saturated at %d events/s: the sweep stops there", rep+1, b.o.repeats, sys, rate)
				break
			}
		}
	}
	if d != nil {
		if err := b.stopOutboxd(d); err != nil {
			return nil, 0, fmt.Errorf("outboxd exit: %w", err)
		}
	}
	return out, idle, nil
}

func ownCPU() float64 {
	c, _ := cpuSeconds(os.Getpid())
	return c
}

// recvProc is pg_recvlogical streaming a slot to its standard output,
// which the bench reads for the rows' latency tags.
type recvProc struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer  // what it said: shown if it ends on its own
	done   chan struct{} // it exited (and its output was read)
}

// startRecvlogical streams the slot through pg_recvlogical and adds the
// latency of every tagged row to got as its output arrives (pg_recvlogical
// writes each message with its own write(2), unbuffered).
func (b *bench) startRecvlogical(dsn, pub, slot string, got *latencies) (*recvProc, error) {
	cmd := exec.Command(recvlogical(), append(recvlogicalArgs(dsn, pub, slot, false), "-f", "-", "-F", "0")...)
	p := &recvProc{cmd: cmd, done: make(chan struct{})}
	// Kept, not shown: an interrupted pg_recvlogical says "unexpected
	// termination of replication stream", which is no news at the end.
	cmd.Stderr = &p.stderr
	out, err := b.startPiped(cmd)
	if err != nil {
		return nil, err
	}
	go func() {
		defer close(p.done)
		readTags(out, got)
		_ = cmd.Wait()
	}()
	return p, nil
}

// exited is nil while pg_recvlogical runs, and says how it ended once it
// has.
func (p *recvProc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("pg_recvlogical exited: %v: %s", p.cmd.ProcessState, strings.TrimSpace(p.stderr.String()))
	default:
		return nil
	}
}

func (p *recvProc) stop() {
	_ = p.cmd.Process.Signal(os.Interrupt)
	<-p.done
}

// readTags reads a stream of pgoutput messages until it ends and records
// the latency of every row tagged with bench_c and bench_t, at the time
// the bytes holding it were read.
func readTags(r io.Reader, got *latencies) {
	buf := make([]byte, 0, 1<<20)
	chunk := make([]byte, 256<<10)
	for {
		n, err := r.Read(chunk)
		now := time.Now().UnixMicro()
		buf = append(buf, chunk[:n]...)
		buf = scanTags(buf, func(cell, t int64) { got.add(int(cell), float64(now-t)/1000) })
		if err != nil {
			return
		}
	}
}

// scanTags calls emit for every complete bench_c ... bench_t pair in buf
// and returns what may hold the start of an incomplete one, moved to the
// start of buf.
func scanTags(buf []byte, emit func(cell, t int64)) []byte {
	p := 0
	for {
		c := bytes.Index(buf[p:], tagCell)
		if c < 0 {
			p = max(p, len(buf)-len(tagCell))
			break
		}
		c += p
		t := bytes.Index(buf[c:], tagTime)
		if t < 0 {
			p = c
			break
		}
		end := c + t + len(tagTime)
		for end < len(buf) && buf[end] == ' ' {
			end++
		}
		for end < len(buf) && (buf[end] == '-' || buf[end] >= '0' && buf[end] <= '9') {
			end++
		}
		if end == len(buf) {
			p = c
			break
		}
		cell, ok1 := field(buf[c:end+1], tagCell)
		ts, ok2 := field(buf[c:end+1], tagTime)
		if ok1 && ok2 {
			emit(cell, ts)
		}
		p = end
	}
	return buf[:copy(buf, buf[p:])]
}

func cpuSum(ws []*cpuWatch) float64 {
	var sum float64
	for _, w := range ws {
		w.sample()
		sum += w.cur
	}
	return sum
}
