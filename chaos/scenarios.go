package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/testenv"
)

// Harness runs scenarios against one Env, and the cluster scenarios
// against a Kafka cluster it starts when the first of them runs.
type Harness struct {
	Env   *Env
	Dir   string // configs and outboxd logs
	Short bool   // the CI subset's sizes
	Logf  func(string, ...any)

	cluster *ClusterEnv
}

// Close stops what the harness started (the cluster).
func (h *Harness) Close() {
	if h.cluster != nil {
		h.cluster.Close()
		h.cluster = nil
	}
}

// Result is one row of the table.
type Result struct {
	Name        string
	Runs        int // faults injected
	Events      int // rows in the outbox table
	Lost        int
	Duplicates  int
	MaxRecovery float64 // seconds
	PeakRSSKB   int64
	Report      testenv.Report
	Notes       []string
	Err         error  // the scenario could not run or a check failed
	LostNA      bool   // loss is by design (scenario 7)
	Log         string // outboxd's log file
}

func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

func (r *Result) recovery(d time.Duration) {
	if s := d.Seconds(); s > r.MaxRecovery {
		r.MaxRecovery = s
	}
}

// Failed reports whether the scenario broke a promise or could not run.
func (r *Result) Failed() bool {
	if r.Err != nil {
		return true
	}
	if r.LostNA {
		return !(r.Report.DupDiffer == 0 && r.Report.OrderErrors == 0 && r.Report.LSNViolations == 0 && r.Report.Unknown == 0)
	}
	return !r.Report.OK()
}

// Scenario is one named scenario.
type Scenario struct {
	ID   string
	Name string
	CI   bool // part of TestChaosShort
	Run  func(ctx context.Context, h *Harness, res *Result) error
}

// kafkaSide is where a scenario's topic lives: the single broker behind
// its proxy, or the cluster.
type kafkaSide struct {
	createTopic func(topic string, partitions int) error
	outboxd     string // kafka.brokers for outboxd
	read        string // the verifier's brokers
	readParts   int    // the partitions the verifier reads; 0: the topic's
}

// Scenarios lists every scenario in table order.
func Scenarios() []Scenario {
	return []Scenario{
		{"1", "kill -9 under load", true, killScenario},
		{"1b", "kill -9 half-way through a full-speed drain", false, drainKillScenario},
		{"1c", "10 kill -9 through one 200,000-row drain", false, drainKillsScenario},
		{"2", "broker killed, down >=30 s", false, brokerScenario(35 * time.Second)},
		{"2b", "broker killed, down 3 min under load", false, brokerScenario(3 * time.Minute)},
		{"3", "PostgreSQL restarted fast/immediate", true, pgRestartScenario},
		{"4a", "PG connection cut", true, netScenario("pg", "cut")},
		{"4b", "Kafka connections cut", true, netScenario("kafka", "cut")},
		{"4c", "PG blackholed", false, netScenario("pg", "blackhole")},
		{"4d", "Kafka blackholed", false, netScenario("kafka", "blackhole")},
		{"4e", "PG slowed 200 ms", false, netScenario("pg", "slow")},
		{"4f", "Kafka slowed 200 ms", false, netScenario("kafka", "slow")},
		{"5", "one txn of 1,000,000 rows", false, bigTxnScenario(1000000, 0)},
		{"5b", "one txn of 200 MB of carrega", false, bigTxnScenario(100000, 2000)},
		{"6", "SIGTERM under load, restart", true, termScenario},
		{"7", "slot dropped by an operator", true, slotDropScenario},
		{"8a", "cluster: leader of the busiest partitions kill -9", true, leaderKillScenario},
		{"8b", "cluster: controlled shutdown and restart", false, controlledShutdownScenario},
		{"8c", "cluster: two brokers down at once", false, twoDownScenario},
		{"8d", "cluster: a broker cut off from the others", false, isolateScenario},
		{"8e", "cluster: partitions added", false, partitionsAddedScenario},
	}
}

// RunScenario runs one scenario and fills its Result.
func (h *Harness) RunScenario(ctx context.Context, s Scenario) Result {
	res := Result{Name: s.ID + " " + s.Name}
	start := time.Now()
	h.Logf("scenario %s: %s", s.ID, s.Name)
	res.Err = s.Run(ctx, h, &res)
	h.Logf("scenario %s done in %s: events %d lost %d dups %d maxrec %.1fs rss %d MB err %v notes %v", s.ID, time.Since(start).Round(time.Second),
		res.Events, res.Lost, res.Duplicates, res.MaxRecovery, res.PeakRSSKB/1024, res.Err, res.Notes)
	return res
}

// fixture is one scenario's database, slot, topic, outboxd, load and verifier.
type fixture struct {
	h        *Harness
	res      *Result
	name     string
	dsn      string // direct, for the writers and the checks
	daemon   *testenv.Daemon
	ver      *testenv.Verifier
	records  *records
	load     *Load
	loadCh   chan error
	stopLoad context.CancelFunc // a steady load's end
}

const partitions = 4

// setup makes a scenario's database, topic and outboxd (product defaults,
// through the proxies) and starts reading the topic.
func (h *Harness) setup(ctx context.Context, id string, res *Result) (*fixture, error) {
	return h.setupOn(ctx, id, res, partitions, kafkaSide{createTopic: h.Env.CreateTopic, outboxd: h.Env.KafkaProxy.Addr(), read: h.Env.KafkaBrokers})
}

// setupOn is setup with the topic on k, of n partitions.
func (h *Harness) setupOn(ctx context.Context, id string, res *Result, n int, k kafkaSide) (*fixture, error) {
	name := fmt.Sprintf("chaos_%s_%d", strings.ToLower(id), time.Now().UnixNano()%1e6)
	sql, err := Schema()
	if err != nil {
		return nil, err
	}
	dsn, err := h.Env.CreateDatabase(name, sql)
	if err != nil {
		return nil, err
	}
	if err := k.createTopic(name, n); err != nil {
		return nil, err
	}
	d, err := testenv.NewDaemon(h.Dir, testenv.Config{
		DSN: h.Env.ProxiedDSN(name), Brokers: k.outboxd, Slot: name,
		Routes:   []testenv.Route{{Table: "public.outbox", Topic: name}},
		Pipeline: testenv.Section{"shutdown_timeout": "30s"},
		Log:      testenv.Section{"level": logLevel()},
	})
	if err != nil {
		return nil, err
	}
	res.Log = d.LogPath()
	recs := &records{}
	if k.readParts == 0 {
		k.readParts = n
	}
	v := &testenv.Verifier{Brokers: k.read, Topic: name, Partitions: k.readParts, Check: recs.check, DSN: dsn, Slot: name}
	v.Start(ctx)
	return &fixture{h: h, res: res, name: name, dsn: dsn, daemon: d, ver: v, records: recs}, nil
}

// logLevel is outboxd's log level in the scenarios: info, or
// $CHAOS_LOG_LEVEL (debug shows every retry).
func logLevel() string {
	if l := os.Getenv("CHAOS_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}

func (f *fixture) startLoad(ctx context.Context, total int, rate float64) {
	f.load = &Load{DSN: f.dsn, Writers: 4, Aggregates: 300, Total: total, Rate: rate, Prefix: "P-2026-"}
	f.loadCh = make(chan error, 1)
	go func() { f.loadCh <- f.load.Run(ctx) }()
}

func (f *fixture) loadDone() bool { return len(f.loadCh) > 0 }

// startDaemon starts outboxd and waits until it streams.
func (f *fixture) startDaemon(ctx context.Context) error {
	if err := f.daemon.Start(); err != nil {
		return err
	}
	return f.daemon.WaitState(ctx, "streaming", 60*time.Second)
}

// recovered waits until the first transaction committed after since, and
// every one before it, was delivered, and returns how long that took from
// since.
func (f *fixture) recovered(ctx context.Context, since time.Time, timeout time.Duration) (time.Duration, error) {
	// Wait for a transaction committed after since (unless the load has
	// ended): its delivery shows the pipeline flows again.
	txns := f.load.Txns()
	for !f.loadDone() && (len(txns) == 0 || !txns[len(txns)-1].At.After(since)) {
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return 0, err
		}
		txns = f.load.Txns()
	}
	at, err := f.ver.WaitSeen(ctx, ids(txns), timeout)
	if err != nil {
		// A hung pipeline is diagnosed from its state and its goroutines,
		// written to its log (-keep-logs); outboxd exits.
		if f.daemon.DumpHung(ctx) == nil {
			err = fmt.Errorf("%w (outboxd's /status, /metrics and goroutines dumped to its log)", err)
		}
		return 0, err
	}
	d := at.Sub(since)
	f.res.recovery(d)
	return d, nil
}

func ids(txns []testenv.Txn) []string {
	var out []string
	for _, t := range txns {
		out = append(out, t.IDs...)
	}
	return out
}

// finish waits for the load, for everything to be delivered and confirmed,
// stops outboxd and the verifier, and checks.
func (f *fixture) finish(ctx context.Context) error {
	defer f.daemon.Close()
	var loadErr error
	if f.loadCh != nil {
		select {
		case loadErr = <-f.loadCh:
		case <-ctx.Done():
			return ctx.Err()
		}
		if loadErr != nil {
			return fmt.Errorf("load: %w", loadErr)
		}
		if n := f.load.Ambiguous(); n > 0 {
			f.res.note("%d rows in commits with unknown outcome (the table decides)", n)
		}
	}
	var txns []testenv.Txn
	if f.load != nil {
		txns = f.load.Txns()
	}
	return f.check(ctx, txns, true)
}

// check waits until the table's rows are all delivered and the slot
// confirmed the WAL end (unless running is false), then compares.
func (f *fixture) check(ctx context.Context, txns []testenv.Txn, running bool) error {
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var rows int64
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&rows); err != nil {
		return err
	}
	var waitErr error
	if running {
		var walS string
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&walS); err != nil {
			return err
		}
		wal, _ := pglogrepl.ParseLSN(walS)
		deadline := time.Now().Add(3 * time.Minute)
		for f.ver.Distinct() < rows && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		for time.Now().Before(deadline) {
			var c *string
			_ = conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", f.name).Scan(&c)
			if c != nil {
				if l, _ := pglogrepl.ParseLSN(*c); l >= wal {
					break
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		if f.ver.Distinct() < rows {
			waitErr = fmt.Errorf("only %d of %d rows delivered 3 min after the load ended", f.ver.Distinct(), rows)
		}
		if err := f.daemon.Term(40 * time.Second); err != nil {
			f.res.note("final SIGTERM: %v", err)
		}
	}
	if err := f.ver.CaughtUp(ctx, 60*time.Second); err != nil && waitErr == nil {
		waitErr = err
	}
	f.ver.Stop()
	events, err := Committed(ctx, f.dsn)
	if err != nil {
		return err
	}
	rep := f.ver.Final(events, txns)
	f.records.mismatches(events, &rep)
	f.res.Report = rep
	f.res.Events, f.res.Lost, f.res.Duplicates = rep.Rows, rep.Lost, rep.Duplicates
	f.res.PeakRSSKB = max(f.res.PeakRSSKB, f.daemon.PeakRSSKB())
	f.res.note("LSN check: %d samples, %d transactions covered, %d violations", rep.Samples, rep.Checked, rep.LSNViolations)
	// Leave no slot behind to retain WAL for the next scenarios.
	for i := 0; i < 50; i++ {
		var left int
		_, _ = conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", f.name)
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.name).Scan(&left); err != nil || left == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if waitErr != nil {
		return waitErr
	}
	if !rep.OK() && !f.res.LostNA {
		return fmt.Errorf("verification failed: %s", strings.Join(rep.Examples, "; "))
	}
	return nil
}

// confirmed reads the slot's confirmed_flush_lsn directly (0 on error).
func (f *fixture) confirmed(ctx context.Context) pglogrepl.LSN {
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		return 0
	}
	defer conn.Close(context.Background())
	var c *string
	if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", f.name).Scan(&c); err != nil || c == nil {
		return 0
	}
	l, _ := pglogrepl.ParseLSN(*c)
	return l
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func randDur(lo, hi time.Duration) time.Duration { return lo + rand.N(hi-lo) }

// 1: kill -9 at random moments. Odd kills land right after a restart (in
// the replay), even ones after the previous kill was recovered from; the
// latter measure recovery.
func killScenario(ctx context.Context, h *Harness, res *Result) error {
	kills, total, rate := 20, 36000, 400.0
	if h.Short {
		kills, total, rate = 6, 8000, 400
	}
	f, err := h.setup(ctx, "kill", res)
	if err != nil {
		return err
	}
	if err := f.startDaemon(ctx); err != nil {
		return err
	}
	f.startLoad(ctx, total, rate)
	for i := 0; i < kills; i++ {
		if i%2 == 0 {
			if err := sleepCtx(ctx, randDur(500*time.Millisecond, 2500*time.Millisecond)); err != nil {
				return err
			}
		} else {
			if err := sleepCtx(ctx, randDur(50*time.Millisecond, 1500*time.Millisecond)); err != nil {
				return err
			}
		}
		killedAt := time.Now()
		f.daemon.Kill()
		res.Runs++
		if err := f.daemon.Start(); err != nil {
			return err
		}
		if i%2 == 0 {
			if _, err := f.recovered(ctx, killedAt, 90*time.Second); err != nil {
				return fmt.Errorf("kill %d: %w", i+1, err)
			}
		}
	}
	if f.loadDone() {
		res.note("the load ended before the last kill")
	}
	return f.finish(ctx)
}

// 2: the broker is killed under load and restarted after >= 30 s.
func brokerScenario(down time.Duration) func(ctx context.Context, h *Harness, res *Result) error {
	return func(ctx context.Context, h *Harness, res *Result) error { return brokerDown(ctx, h, res, down) }
}

// brokerDown: the broker killed for down while writers go on (300 rows/s);
// outboxd holds the slot, its reading paused at the in-flight bounds, its
// memory flat, and delivers everything once the broker is back.
func brokerDown(ctx context.Context, h *Harness, res *Result, down time.Duration) error {
	f, err := h.setup(ctx, "broker", res)
	if err != nil {
		return err
	}
	if err := f.startDaemon(ctx); err != nil {
		return err
	}
	f.startLoad(ctx, int(300*(down+30*time.Second).Seconds()), 300)
	if err := sleepCtx(ctx, 8*time.Second); err != nil {
		return err
	}
	before := f.daemon.RSSSamples()
	if err := h.Env.KillKafka(); err != nil {
		return err
	}
	res.Runs++
	killed := time.Now()
	var maxInFlight int
	states := map[string]bool{}
	for time.Since(killed) < down {
		if st, err := f.daemon.Status(ctx); err == nil {
			maxInFlight = max(maxInFlight, st.InFlight.Events)
			states[st.State] = true
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	during := f.daemon.RSSSamples()
	if len(during) > len(before) {
		during = during[len(before):]
	}
	lo, hi := int64(1<<62), int64(0)
	for _, r := range during {
		lo, hi = min(lo, r), max(hi, r)
	}
	if err := h.Env.StartKafka(); err != nil {
		return err
	}
	back := time.Now()
	res.note("broker down %s; outboxd VmRSS during the outage %d..%d MB; max in_flight.events %d; states seen %v; process alive: %v",
		back.Sub(killed).Round(time.Second), lo/1024, hi/1024, maxInFlight, keys(states), f.daemon.Running())
	d, err := f.recovered(ctx, back, 3*time.Minute)
	if err != nil {
		return err
	}
	res.note("all rows committed before the broker came back delivered %.1f s after it did", d.Seconds())
	return f.finish(ctx)
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// 3: PostgreSQL restarted under load, fast and immediate.
func pgRestartScenario(ctx context.Context, h *Harness, res *Result) error {
	modes := []string{"fast", "immediate", "fast", "immediate"}
	if h.Short {
		modes = modes[:2]
	}
	f, err := h.setup(ctx, "pgrestart", res)
	if err != nil {
		return err
	}
	if err := f.startDaemon(ctx); err != nil {
		return err
	}
	f.startLoad(ctx, 4000*len(modes)+2000, 300)
	var lastMode string
	var dups0 int
	dupNote := func() {
		if lastMode != "" {
			res.note("duplicates read after the %s restart (until the next restart): %d", lastMode, f.ver.Dups()-dups0)
		}
	}
	for _, mode := range modes {
		if err := sleepCtx(ctx, randDur(3*time.Second, 6*time.Second)); err != nil {
			return err
		}
		dupNote()
		lastMode, dups0 = mode, f.ver.Dups()
		before := f.confirmed(ctx)
		t0 := time.Now()
		if err := h.Env.RestartPG(mode); err != nil {
			return err
		}
		res.Runs++
		up := time.Now()
		// Read before outboxd is back (it reconnects after a backoff).
		after := f.confirmed(ctx)
		res.note("%s restart: confirmed_flush_lsn %s just before, %s just after (%d bytes back)", mode, before, after, int64(before)-int64(after))
		d, err := f.recovered(ctx, up, 2*time.Minute)
		if err != nil {
			return fmt.Errorf("restart %s: %w", mode, err)
		}
		res.note("%s restart took %.1f s, recovered %.1f s after", mode, up.Sub(t0).Seconds(), d.Seconds())
	}
	err = f.finish(ctx)
	res.note("duplicates read after the last (%s) restart: %d", lastMode, res.Duplicates-dups0)
	return err
}

// 4: a network fault between outboxd and one peer.
func netScenario(peer, mode string) func(ctx context.Context, h *Harness, res *Result) error {
	return func(ctx context.Context, h *Harness, res *Result) error {
		proxy := h.Env.PGProxy
		if peer == "kafka" {
			proxy = h.Env.KafkaProxy
		}
		hold := map[string]time.Duration{"cut": 0, "blackhole": 90 * time.Second, "slow": 15 * time.Second}[mode]
		if peer == "kafka" && mode == "blackhole" {
			hold = 150 * time.Second
		}
		if h.Short && mode == "blackhole" {
			hold = 30 * time.Second
		}
		f, err := h.setup(ctx, "net"+peer+mode, res)
		if err != nil {
			return err
		}
		if err := f.startDaemon(ctx); err != nil {
			return err
		}
		total := int(200 * (20 + hold.Seconds()))
		f.startLoad(ctx, total, 200)
		if err := sleepCtx(ctx, 5*time.Second); err != nil {
			return err
		}
		acc0 := proxy.Accepted()
		t0 := time.Now()
		res.Runs++
		// Watch /status for the moment outboxd notices.
		var detected time.Time
		var detectedState, detectedErr string
		watch := func(until time.Time) {
			for time.Now().Before(until) && detected.IsZero() {
				if st, err := f.daemon.Status(ctx); err == nil && st.State != "streaming" {
					detected, detectedState, detectedErr = time.Now(), st.State, st.LastError
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		switch mode {
		case "cut":
			n := proxy.Cut()
			watch(time.Now().Add(5 * time.Second))
			res.note("cut %d connections", n)
		case "blackhole":
			proxy.Blackhole()
			watch(t0.Add(hold))
			if err := sleepCtx(ctx, time.Until(t0.Add(hold))); err != nil {
				return err
			}
			proxy.Heal()
		case "slow":
			proxy.Slow(200 * time.Millisecond)
			watch(t0.Add(hold))
			if err := sleepCtx(ctx, time.Until(t0.Add(hold))); err != nil {
				return err
			}
			proxy.Heal()
		}
		healed := time.Now()
		if detected.IsZero() {
			res.note("outboxd stayed 'streaming' for the whole %s fault (%.0f s)", mode, time.Since(t0).Seconds())
		} else {
			res.note("outboxd left 'streaming' %.1f s after the fault began (state %s, error %q)", detected.Sub(t0).Seconds(), detectedState, detectedErr)
		}
		d, err := f.recovered(ctx, healed, 5*time.Minute)
		if err != nil {
			return err
		}
		res.note("new connections through the proxy since the fault: %d; rows committed before the fault ended delivered %.1f s after it ended",
			proxy.Accepted()-acc0, d.Seconds())
		return f.finish(ctx)
	}
}

// 5: one transaction of 500,000 outbox rows.
// bigTxnScenario: one transaction of rows outbox rows, each carrega
// padded by pad bytes (0: ~100 bytes): delivered whole, outboxd's memory
// bounded by its in-flight limits whatever the transaction's size, the slot
// confirmed past it only once Kafka has every record.
func bigTxnScenario(rows, pad int) func(ctx context.Context, h *Harness, res *Result) error {
	return func(ctx context.Context, h *Harness, res *Result) error { return bigTxn(ctx, h, res, rows, pad) }
}

func bigTxn(ctx context.Context, h *Harness, res *Result, n, pad int) error {
	if h.Short {
		n = min(n, 50000)
	}
	f, err := h.setup(ctx, "bigtxn", res)
	if err != nil {
		return err
	}
	if err := f.startDaemon(ctx); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	// 1,000 fresh aggregates, seq numbered in insertion order per aggregate.
	rows, err := tx.Query(ctx, `
		WITH g AS (SELECT i, 'BIG-' || lpad((i % 1000)::text, 4, '0') AS k FROM generate_series(0, $1 - 1) i),
		     s AS (SELECT i, k, row_number() OVER (PARTITION BY k ORDER BY i) AS seq FROM g)
		INSERT INTO outbox (id, agregat, agregat_id, tipus, versio, carrega)
		SELECT gen_random_uuid(), 'comanda', k, 'comanda.t' || (i % 5), 1,
		       jsonb_build_object('id', k, 'seq', seq, 'linies', jsonb_build_array(jsonb_build_object('producte', 'formatge-curat', 'quantitat', 1 + i % 9, 'preu_centims', 1450)))
		         || CASE WHEN $2 > 0 THEN jsonb_build_object('nota', repeat(md5(i::text), $2 / 32 + 1)) ELSE '{}' END
		FROM s ORDER BY i
		RETURNING id::text`, n, pad)
	if err != nil {
		return err
	}
	var rowIDs []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		rowIDs = append(rowIDs, id)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	committedAt := time.Now()
	var s string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		return err
	}
	u, _ := pglogrepl.ParseLSN(s)
	res.Runs = 1
	txns := []testenv.Txn{{U: u, At: committedAt, IDs: rowIDs}}
	restarts := 0
	var maxInFlight int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if st, err := f.daemon.Status(ctx); err == nil {
				maxInFlight = max(maxInFlight, st.InFlight.Events)
			}
			if f.ver.Distinct() >= int64(n) {
				return
			}
		}
	}()
	at, err := f.ver.WaitSeen(ctx, rowIDs, 10*time.Minute)
	<-done
	if err != nil {
		return err
	}
	if !f.daemon.Running() {
		restarts++
	}
	res.note("%d rows (carrega padded by %d bytes) delivered %.1f s after COMMIT (%.0f rows/s); max in_flight.events %d; outboxd running throughout: %v",
		n, pad, at.Sub(committedAt).Seconds(), float64(n)/at.Sub(committedAt).Seconds(), maxInFlight, f.daemon.Running())
	if restarts > 0 {
		return fmt.Errorf("outboxd exited during the big transaction; see %s", f.daemon.LogPath())
	}
	return f.check(ctx, txns, true)
}

// 6: SIGTERM under load, restart: no duplicates.
func termScenario(ctx context.Context, h *Harness, res *Result) error {
	stops, total, rate := 5, 16000, 300.0
	if h.Short {
		stops, total, rate = 2, 6000, 300
	}
	f, err := h.setup(ctx, "term", res)
	if err != nil {
		return err
	}
	if err := f.startDaemon(ctx); err != nil {
		return err
	}
	f.startLoad(ctx, total, rate)
	var maxStop time.Duration
	for i := 0; i < stops; i++ {
		if err := sleepCtx(ctx, randDur(2*time.Second, 5*time.Second)); err != nil {
			return err
		}
		t0 := time.Now()
		if err := f.daemon.Term(60 * time.Second); err != nil {
			return fmt.Errorf("SIGTERM %d: outboxd exit: %v (see %s)", i+1, err, f.daemon.LogPath())
		}
		maxStop = max(maxStop, time.Since(t0))
		res.Runs++
		if err := f.daemon.Start(); err != nil {
			return err
		}
		if _, err := f.recovered(ctx, t0, 90*time.Second); err != nil {
			return err
		}
	}
	res.note("longest SIGTERM-to-exit %.1f s", maxStop.Seconds())
	err = f.finish(ctx)
	if err == nil && res.Duplicates > 0 {
		return fmt.Errorf("%d duplicates after clean stops", res.Duplicates)
	}
	return err
}

// 7: an operator drops the slot while outboxd runs.
func slotDropScenario(ctx context.Context, h *Harness, res *Result) error {
	res.LostNA = true
	f, err := h.setup(ctx, "slotdrop", res)
	if err != nil {
		return err
	}
	defer f.daemon.Close()
	if err := f.startDaemon(ctx); err != nil {
		return err
	}
	f.startLoad(ctx, 3000, 300)
	if err := sleepCtx(ctx, 4*time.Second); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	t0 := time.Now()
	dropped := false
	for time.Since(t0) < 20*time.Second && !dropped {
		_, _ = conn.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active", f.name)
		if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", f.name); err == nil {
			dropped = true
		}
	}
	if !dropped {
		return fmt.Errorf("could not drop the slot within 20 s (outboxd kept re-acquiring it)")
	}
	res.Runs = 1
	droppedAt := time.Now()
	exited, exitErr := f.daemon.Exited(90 * time.Second)
	if !exited {
		return fmt.Errorf("outboxd still running 90 s after its slot was dropped (see %s)", f.daemon.LogPath())
	}
	res.recovery(time.Since(droppedAt))
	if err := sleepCtx(ctx, 3*time.Second); err != nil {
		return err
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.name).Scan(&n); err != nil {
		return err
	}
	logText, _ := os.ReadFile(f.daemon.LogPath())
	last := lastLines(string(logText), 2)
	res.note("outboxd exited %.1f s after the drop (%v); slot recreated: %v; last log: %s", time.Since(droppedAt).Seconds()-3, exitErr, n > 0, last)
	if exitErr == nil {
		return fmt.Errorf("outboxd exited with status 0 after its slot was dropped")
	}
	if n > 0 {
		return fmt.Errorf("the slot was recreated")
	}
	if !strings.Contains(string(logText), "does not exist") {
		return fmt.Errorf("outboxd's error does not say the slot does not exist: %s", last)
	}
	// Wait for the load, then see what the topic holds (events after the
	// drop are missing by design: the operator must reconcile).
	<-f.loadCh
	if err := f.check(ctx, f.load.Txns(), false); err != nil {
		return err
	}
	res.note("%d rows committed, %d of them not delivered (committed after the drop: expected, reconcile from the table)", res.Events, res.Lost)
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
