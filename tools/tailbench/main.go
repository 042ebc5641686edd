// Command tailbench measures what a start's restart de-duplication costs
// on a distant cluster (issue 32, item 4): the time from outboxd's process
// start to its first acknowledged record, and to one in every partition,
// when each partition's tail must be read through a slow link before its
// first record goes out. It is not a test; the numbers are published in
// docs/reports/PERFORMANCE.md.
//
// Against a real PostgreSQL 15 and a real Kafka 4.1 (testenv), the broker
// advertising a proxy of the chaos suite (chaos.Start) for outboxd:
//
//  1. a topic of -partitions partitions; -partitions × -per-partition outbox
//     rows (distinct keys, ~100-byte carrega) inserted in transactions of
//     -txn rows while nothing reads the slot;
//  2. outboxd drains them with the proxy passing bytes at full speed, so
//     every record carries the outboxd.stream header of the restart
//     de-duplication (sink/dedupe.go); once the slot is confirmed past the
//     last row outboxd stops;
//  3. the route changes (a header field more): the stream identity changes,
//     so no record in Kafka proves anything and every tail read scans its
//     whole window (512 records, then 16,384);
//  4. one row per partition (keys the murmur2 partitioner puts there) is
//     committed, the proxy adds -latency each way (-link: chaos.Proxy.Slow
//     or chaos.Proxy.Delay), and outboxd starts: the partitions' high
//     watermarks are read every 20 ms, from the broker directly, until
//     every partition holds its new record.
//
// Each -link value is one measured start (with -floor, a start with
// kafka.deduplicate false before it: no tail read), one after the other on
// the same topic, each with a route of its own. For each it prints the time
// from outboxd's process start to the first acknowledged record and to the last
// (one in every partition), the seconds outboxd's threads ran and waited for
// a CPU, the tails given up, the duplicates skipped and outboxd's warnings;
// then checks that each partition holds exactly one record more.
//
//	go build -o /tmp/outboxd ./cmd/outboxd
//	go run ./tools/tailbench -outboxd-bin /tmp/outboxd -link slow,delay -floor
//	go run ./tools/tailbench -outboxd-bin /tmp/outboxd -link slow,delay -delivery-timeout 20m
//	go run ./tools/tailbench -partitions 16 -per-partition 2000 -txn 10000   # a quick run
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/chaos"
	"github.com/outboxd/outboxd/testenv"
)

type options struct {
	partitions      int
	perPartition    int
	txn             int
	latency         time.Duration
	links           []string // one measured start for each, in turn: linkSlow or linkDelay
	floor           bool     // a start without de-duplication before each
	deliveryTimeout time.Duration
	timeout         time.Duration
	binary          string
	keep            bool
}

func main() {
	var o options
	flag.IntVar(&o.partitions, "partitions", 256, "topic partitions")
	flag.IntVar(&o.perPartition, "per-partition", 16000, "records per partition (on average) before the restart")
	flag.IntVar(&o.txn, "txn", 100000, "rows per transaction while filling the topic")
	flag.DurationVar(&o.latency, "latency", 50*time.Millisecond, "what the proxy adds each way for the measured starts (-link)")
	links := flag.String("link", linkSlow, `the proxy's delay for each measured start, in turn on the same topic: "slow" (chaos.Proxy.Slow: each chunk waits -latency after the one before it, so a connection carries one read of up to 32 KiB per -latency each way) or "delay" (chaos.Proxy.Delay: -latency each way, the throughput not cut); "slow,delay" measures both`)
	flag.BoolVar(&o.floor, "floor", false, "before each measured start, one with kafka.deduplicate false on the same link: the floor, no tail read")
	flag.DurationVar(&o.deliveryTimeout, "delivery-timeout", 0, "outboxd's kafka.delivery_timeout (0: its default, 30s); a tail read may last half of it before its records go out without it")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up the measured start after this long")
	flag.StringVar(&o.binary, "outboxd-bin", "", "run this outboxd binary instead of building the working tree's (OUTBOXD_BIN works too)")
	flag.BoolVar(&o.keep, "keep-logs", false, "keep outboxd's logs and configs (their folder is printed)")
	flag.Parse()
	o.links = strings.Split(*links, ",")
	for _, l := range o.links {
		if l != linkSlow && l != linkDelay {
			fmt.Fprintf(os.Stderr, "tailbench: -link %q: want slow, delay or both\n", l)
			os.Exit(2)
		}
	}
	if o.partitions < 1 || o.perPartition < 1 || o.txn < 1 {
		fmt.Fprintln(os.Stderr, "tailbench: -partitions, -per-partition and -txn must be positive")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "tailbench:", err)
		os.Exit(1)
	}
}

// The proxy's two ways of adding -latency (-link).
const (
	linkSlow  = "slow"
	linkDelay = "delay"
)

const (
	name  = "tailbench" // the database, publication, slot and topic
	table = "public.outbox"
)

// tb holds what the phases share.
type tb struct {
	o      options
	env    *chaos.Env
	dir    string
	dsn    string
	db     *pgx.Conn
	log    io.Writer
	daemon chan *testenv.Daemon // the running outboxd, for an interrupt
}

func run(o options) error {
	dir, err := os.MkdirTemp("", "outboxd-tailbench-")
	if err != nil {
		return err
	}
	b := &tb{o: o, dir: dir, log: os.Stderr, daemon: make(chan *testenv.Daemon, 1)}
	if o.keep {
		b.logf("outboxd logs and configs in %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	if o.binary == "" && os.Getenv("OUTBOXD_BIN") == "" {
		b.logf("building outboxd")
		defer testenv.RemoveBinary()
		if _, err := testenv.Binary(); err != nil {
			return err
		}
	}
	b.logf("starting PostgreSQL, Kafka and the proxy")
	if b.env, err = chaos.Start(); err != nil {
		return err
	}
	defer b.env.Close()
	b.daemon <- nil
	// An interrupt still stops outboxd and removes the services.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		b.logf("interrupted: stopping outboxd and the services")
		if d := <-b.daemon; d != nil {
			d.Kill()
		}
		b.env.Close()
		os.Exit(130)
	}()
	ctx := context.Background()
	if err := b.setup(ctx); err != nil {
		return err
	}
	defer b.db.Close(ctx)
	endLSN, err := b.fill(ctx)
	if err != nil {
		return err
	}
	if err := b.drain(ctx, endLSN); err != nil {
		return err
	}
	n := 0
	for _, link := range o.links {
		specs := []startSpec{{link: link}}
		if o.floor {
			specs = []startSpec{{link: link, noDedupe: true}, {link: link}}
		}
		for _, s := range specs {
			n++
			s.variant = n
			if err := b.start(ctx, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// startSpec is one measured start: its route variant, the proxy's way of
// adding the latency, and whether restart de-duplication is off (the
// floor: no tail read).
type startSpec struct {
	variant  int
	link     string
	noDedupe bool
}

func (s startSpec) String() string {
	if s.noDedupe {
		return s.link + ", kafka.deduplicate false"
	}
	return s.link
}

// start measures one start: the route changed (its variant), a row committed
// for each partition, the link slowed, outboxd started; then checks that
// every partition got its row, and lets the link pass again.
func (b *tb) start(ctx context.Context, s startSpec) error {
	before, err := b.offsets(ctx)
	if err != nil {
		return err
	}
	lo, hi := slices.Min(before), slices.Max(before)
	b.logf("the topic holds %d records, %d to %d a partition", sum(before), lo, hi)
	if err := b.commitOnePerPartition(ctx); err != nil {
		return err
	}
	if s.link == linkSlow {
		b.env.KafkaProxy.Slow(b.o.latency)
	} else {
		b.env.KafkaProxy.Delay(b.o.latency)
	}
	defer func() { b.env.KafkaProxy.Slow(0); b.env.KafkaProxy.Delay(0) }()
	m, err := b.measure(ctx, s, before)
	m.print(os.Stdout, b.o, s, lo, hi)
	if err != nil {
		return err
	}
	after, err := b.offsets(ctx)
	if err != nil {
		return err
	}
	return checkOneMore(before, after)
}

func (b *tb) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "%s tailbench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// setup makes the database (the seed's schema, an insert-only
// publication), the slot and the topic.
func (b *tb) setup(ctx context.Context) error {
	seed, err := testenv.SeedSchema()
	if err != nil {
		return err
	}
	if b.dsn, err = b.env.CreateDatabase(name, seed+"\nCREATE PUBLICATION "+name+" FOR TABLE outbox WITH (publish = 'insert');"); err != nil {
		return err
	}
	if b.db, err = pgx.Connect(ctx, b.dsn); err != nil {
		return err
	}
	if _, err := b.db.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", name); err != nil {
		return fmt.Errorf("create the slot: %w", err)
	}
	return b.env.CreateTopic(name, b.o.partitions)
}

// fill inserts partitions × per-partition rows, each its own key, and
// returns an LSN inside the last transaction, after its rows: a slot
// confirmed past it has every row in Kafka.
func (b *tb) fill(ctx context.Context) (pglogrepl.LSN, error) {
	rows := b.o.partitions * b.o.perPartition
	b.logf("inserting %d rows in transactions of %d", rows, b.o.txn)
	t0 := time.Now()
	end, err := testenv.CommitOutboxRows(ctx, b.db, rows, b.o.txn, "P-")
	if err != nil {
		return 0, err
	}
	b.logf("inserted in %.1f s", time.Since(t0).Seconds())
	return end, nil
}

// route is the seed's route to the topic; variant n > 0 adds a header
// field of its own, which changes the stream identity.
func route(n int) testenv.Route {
	r := testenv.Route{Table: table, Topic: name}
	if n > 0 {
		r.More = testenv.Section{"fields": fmt.Sprintf("[{column: agregat, header: tailbench-%d}]", n)}
	}
	return r
}

// newDaemon is outboxd through the proxy with s's route variant, its
// default settings but -delivery-timeout (and s.noDedupe).
func (b *tb) newDaemon(s startSpec) (*testenv.Daemon, error) {
	k := testenv.Section{}
	if b.o.deliveryTimeout > 0 {
		k["delivery_timeout"] = b.o.deliveryTimeout.String()
	}
	if s.noDedupe {
		k["deduplicate"] = "false"
	}
	return testenv.NewDaemon(b.dir, testenv.Config{
		DSN: b.dsn, Brokers: b.env.KafkaProxy.Addr(), Slot: name,
		Routes:   []testenv.Route{route(s.variant)},
		Postgres: testenv.Section{"publication": name, "create_slot": "false", "create_publication": "false"},
		Kafka:    k,
		Log:      testenv.Section{"level": "warn"},
		Bin:      b.o.binary,
	})
}

// drain runs outboxd with the first route, the proxy passing bytes at full
// speed, until the slot is confirmed past endLSN; then stops it.
func (b *tb) drain(ctx context.Context, endLSN pglogrepl.LSN) error {
	d, err := b.newDaemon(startSpec{})
	if err != nil {
		return err
	}
	defer d.Close()
	rows := uint64(b.o.partitions * b.o.perPartition)
	b.logf("outboxd drains the rows (no delay)")
	t0 := time.Now()
	if err := b.startDaemon(d); err != nil {
		return err
	}
	last := time.Now()
	for {
		time.Sleep(500 * time.Millisecond)
		if !d.Running() {
			return exited(d)
		}
		if b.confirmed(ctx) >= endLSN {
			break
		}
		if time.Since(last) >= 15*time.Second {
			n, _ := d.Status(ctx)
			b.logf("  %d of %d acknowledged", n.Counters.Events, rows)
			last = time.Now()
		}
		if time.Since(t0) > 2*time.Hour {
			return errors.New("the drain did not end in 2 hours")
		}
	}
	s := time.Since(t0).Seconds()
	b.logf("drained and confirmed in %.1f s (%.0f rows/s)", s, float64(rows)/s)
	return b.stopDaemon(d)
}

// startDaemon starts d's process and makes it the one an interrupt kills.
func (b *tb) startDaemon(d *testenv.Daemon) error {
	<-b.daemon
	err := d.Start()
	b.daemon <- d
	return err
}

func (b *tb) stopDaemon(d *testenv.Daemon) error {
	<-b.daemon
	err := d.Term(60 * time.Second)
	b.daemon <- nil
	if err != nil {
		return fmt.Errorf("stop outboxd: %w\n%s", err, tailOf(d.Log(), 3000))
	}
	return nil
}

// confirmed is the slot's confirmed_flush_lsn.
func (b *tb) confirmed(ctx context.Context) pglogrepl.LSN {
	var s *string
	_ = b.db.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&s)
	if s == nil {
		return 0
	}
	l, _ := pglogrepl.ParseLSN(*s)
	return l
}

// commitOnePerPartition commits, in one transaction, a row whose key the
// murmur2 partitioner (outboxd's default) puts in each partition.
func (b *tb) commitOnePerPartition(ctx context.Context) error {
	keys := keysPerPartition(b.o.partitions)
	_, err := b.db.Exec(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega)
		SELECT gen_random_uuid(), 'comanda', k, 'comanda.creada', jsonb_build_object('id', k, 'client', 'anna', 'mercat', 'girona')
		FROM unnest($1::text[]) k`, keys)
	if err != nil {
		return fmt.Errorf("commit a row per partition: %w", err)
	}
	b.logf("committed %d rows, one per partition", len(keys))
	return nil
}

// keysPerPartition is a key for each of n partitions, where the murmur2
// partitioner puts it.
func keysPerPartition(n int) []string {
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	bal := &kafka.Murmur2Balancer{Consistent: true}
	keys := make([]string, n)
	left := n
	for i := 0; left > 0; i++ {
		k := "T-" + strconv.Itoa(i)
		if p := bal.Balance(kafka.Message{Key: []byte(k)}, parts...); keys[p] == "" {
			keys[p] = k
			left--
		}
	}
	return keys
}

// offsets are the partitions' high watermarks, from the broker directly.
func (b *tb) offsets(ctx context.Context) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, end, err := testenv.LogOffsets(ctx, b.env.KafkaBrokers, name, b.o.partitions)
	if err != nil {
		return nil, err
	}
	out := make([]int64, b.o.partitions)
	for p := range out {
		out[p] = end[p]
	}
	return out, nil
}

// checkOneMore says whether every partition got exactly one record more.
func checkOneMore(before, after []int64) error {
	var bad []string
	for p := range before {
		if d := after[p] - before[p]; d != 1 {
			bad = append(bad, fmt.Sprintf("partition %d: %+d", p, d))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d partitions did not get exactly one record: %s", len(bad), strings.Join(bad[:min(len(bad), 10)], ", "))
	}
	return nil
}

func sum(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}

func exited(d *testenv.Daemon) error {
	_, err := d.Exited(0)
	return fmt.Errorf("outboxd exited: %v\n%s", err, tailOf(d.Log(), 3000))
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
