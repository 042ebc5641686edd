package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
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
}

func (c cellResult) q(p float64) float64 {
	if len(c.lat) == 0 {
		return 0
	}
	return c.lat[int(p*float64(len(c.lat)-1)+0.5)]
}

// consumer reads every partition of a topic from the start and records,
// per cell tag, the latency from the row's bench_t to receipt.
type consumer struct {
	mu      sync.Mutex
	lat     map[int][]float64
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
	c := &consumer{lat: map[int][]float64{}, cancel: cancel}
	for p := 0; p < partitions; p++ {
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers:   strings.Split(brokers, ","),
			Topic:     topic,
			Partition: p,
			MinBytes:  1,
			MaxBytes:  16 << 20,
			MaxWait:   500 * time.Millisecond,
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
				c.mu.Lock()
				c.lat[int(cell)] = append(c.lat[int(cell)], float64(now-t)/1000)
				c.mu.Unlock()
			}
		}()
	}
	return c, nil
}

func (c *consumer) count(cell int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.lat[cell])
}

func (c *consumer) take(cell int) []float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := append([]float64(nil), c.lat[cell]...)
	sort.Float64s(l)
	return l
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
	ins := `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega)
		SELECT gen_random_uuid(), 'comanda', 'P-2026-' || lpad(floor(random() * 5000)::int::text, 6, '0'), 'comanda.creada', ` +
		carregaSQL("g", `, 'bench_c', $1::int, 'bench_t', floor(extract(epoch from clock_timestamp()) * 1000000)::bigint`) + `
		FROM generate_series(1, $2::int) g`
	tokens := make(chan struct{}, 1<<16)
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
			for range tokens {
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
	// Transactions are due at a fixed pace from the start; a late writer
	// catches up rather than slowing the rate down.
	perTxn := time.Duration(float64(time.Second) * float64(txn) / float64(rate))
	sent := 0
	tick := time.NewTicker(500 * time.Microsecond)
	for now := range tick.C {
		if now.After(stop) {
			break
		}
		due := int(now.Sub(start) / perTxn)
		for ; sent < due; sent++ {
			select {
			case tokens <- struct{}{}:
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

// latency runs every (rate, txn) cell against one system.
// It also returns the system's idle CPU use, in CPU seconds per second,
// measured for 3 s with nothing to carry.
func (b *bench) latency(ctx context.Context, sys string, rep int) ([]cellResult, float64, error) {
	name := fmt.Sprintf("bench_lat_%s_%d", map[string]string{sysOutboxd: "outboxd", sysRelay: "relay"}[sys], rep) + b.runTag
	dsn, db, err := b.setupDB(ctx, name)
	if err != nil {
		return nil, 0, err
	}
	defer b.dropDB(ctx, name)
	defer db.Close(ctx)
	var conns []*pgx.Conn
	defer func() {
		for _, c := range conns {
			c.Close(ctx)
		}
	}()
	for i := 0; i < writers; i++ {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return nil, 0, err
		}
		conns = append(conns, c)
	}
	cons, err := startConsumer(b.env.KafkaBrokers, name, b.o.partitions)
	if err != nil {
		return nil, 0, err
	}
	defer cons.close()

	var self, server *cpuWatch
	var d *testenv.Daemon
	var relay *relayProc
	switch sys {
	case sysOutboxd:
		slot := name
		if _, err := db.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
			return nil, 0, err
		}
		if d, err = b.startOutboxd(name, dsn, slot); err != nil {
			return nil, 0, err
		}
		defer d.Close()
		self = newCPUWatch(d.PID())
		for i := 0; i < 500 && server == nil; i++ {
			if pid := b.slotPID(ctx, slot); pid != 0 {
				server = newCPUWatch(pid)
			} else {
				time.Sleep(20 * time.Millisecond)
			}
		}
	case sysRelay:
		if relay, err = b.startRelay(dsn, name); err != nil {
			return nil, 0, err
		}
		defer relay.stop()
		self = newCPUWatch(relay.cmd.Process.Pid)
		for i := 0; i < 500 && server == nil; i++ {
			if pid := b.backendPID(ctx, "bench_relay"); pid != 0 {
				server = newCPUWatch(pid)
			} else {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	if server == nil {
		return nil, 0, fmt.Errorf("%s: no server process found", sys)
	}
	// Warm up (connections, metadata, JIT of the broker): cell 0, not reported.
	if _, err := write(ctx, conns, 500, 1, 0, time.Second); err != nil {
		return nil, 0, err
	}
	time.Sleep(time.Second)
	self.sample()
	idle0, idleT := self.cur, time.Now()
	time.Sleep(3 * time.Second)
	self.sample()
	idle := (self.cur - idle0) / time.Since(idleT).Seconds()

	var out []cellResult
	cell := 0
	for _, txn := range b.o.txnSizes {
		for _, rate := range b.o.rates {
			cell++
			broker := newCPUWatch(b.brokerPID)
			self.sample()
			server.sample()
			c0, s0 := self.cur, server.cur
			m0, b0, t0 := machineBusy(), ownCPU(), time.Now()
			logf(b.log, "latency %d/%d: %-13s %6d events/s, %2d-row transactions, %s", rep+1, b.o.repeats, sys, rate, txn, b.o.duration)
			// Profile outboxd during one cell: the smallest transactions at
			// the middle rate, where the per-transaction cost shows.
			var prof *profiler
			if b.o.perf && rep == 0 && sys == sysOutboxd && txn == b.o.txnSizes[0] && rate == b.o.rates[len(b.o.rates)/2] {
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
			for cons.count(cell) < n && time.Now().Before(deadline) {
				if d != nil && !d.Running() {
					return nil, 0, exitedEarly(d)
				}
				time.Sleep(20 * time.Millisecond)
			}
			self.sample()
			server.sample()
			broker.sample()
			r := cellResult{sys: sys, rate: rate, txn: txn, rep: rep, written: n,
				achieved: float64(n) / b.o.duration.Seconds(), lat: cons.take(cell),
				cpu: self.cur - c0, serverCPU: server.cur - s0, brokerCPU: broker.used(), rss: self.peak(),
				busy: (machineBusy() - m0) / time.Since(t0).Seconds(), benchCPU: ownCPU() - b0}
			r.delivered = len(r.lat)
			logf(b.log, "latency %d/%d: %-13s %6d events/s, %2d-row: wrote %d (%.0f/s), p50 %.1f ms, p99 %.1f ms, max %.1f ms",
				rep+1, b.o.repeats, sys, rate, txn, n, r.achieved, r.q(0.5), r.q(0.99), r.q(1))
			out = append(out, r)
			time.Sleep(500 * time.Millisecond)
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
