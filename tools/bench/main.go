// Command bench measures outboxd against real PostgreSQL 15 and Kafka 4.1
// (started and removed by the project's scripts), side by side with the
// pgoutput decode limit (pg_recvlogical) and with the seed's polling relay.
// It is run by `make bench`; it is not a test.
//
//  1. Backlog drain: -rows outbox rows (~200-byte carrega, transactions of
//  100. written while nothing reads them; then, in the same run and on
//     the same backlog, pg_recvlogical on a second slot (the decode limit),
//     outboxd on its slot (until every record is acknowledged by Kafka, then
//     until the slot is confirmed) and the polling relay on the table.
//  2. Steady latency: a paced writer at each -rates value, single-row and
//     -txn-row transactions, for -duration each; latency from the row's
//     clock_timestamp() (taken inside the inserting transaction, so just
//     before its commit) to receipt by a kafka-go consumer; outboxd and the
//     polling relay in turn.
//  3. Cost: CPU seconds and peak RSS of outboxd (or the relay), of the Kafka
//     broker, and of the walsender (or the relay's backend), from /proc.
//  4. Steady state (steady.go, issue 36): outboxd's CPU per event at each
//     -steady rate in transactions of 1 to 10 rows, its idle CPU
//     (keepalives only), and the top of its CPU profile (health.pprof) in
//     an extra cell at the highest rate.
//
// With -cost it measures instead how cost grows with the work (cost.go,
// `make bench-cost`): drain rate and CPU per event against carrega size,
// topic partitions, routes and pgoutput's binary option, and latency
// against offered rate up to saturation, each beside pg_recvlogical.
//
// Every workload is repeated -repeats times; the table shows medians and
// ratios measured within a run. Plots (SVG) and the table go to -out.
//
//	go run ./tools/bench -rows 500000 -repeats 5 -duration 20s
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"go.yaml.in/yaml/v3"

	"github.com/outboxd/outboxd/testenv"
)

type options struct {
	rows       int
	repeats    int
	duration   time.Duration
	rates      []int
	txnSizes   []int
	partitions int
	out        string
	perf       bool
	skipDrain  bool
	skipLat    bool
	kafkaYAML  string  // extra keys for outboxd's kafka section, for experiments
	services   string  // reuse the services of `services.sh up DIR` (development)
	binary     string  // a prebuilt outboxd instead of this tree's (A/B runs)
	outboxEnv  string  // extra environment for outboxd, "K=V,K=V" (e.g. GOMAXPROCS=1)
	pipeYAML   string  // keys for outboxd's pipeline section, for experiments
	routing    string  // "" (the seed's route) or "rich" (every routing feature, two records per row)
	trace      float64 // tracing.sample_ratio with a collector; <0: tracing off
	value      string  // the seed route's value: "" (the envelope), cloudevents, cloudevents-structured, jsonschema
	cost       costOptions

	// The steady phase (steady.go): rates, time per rate, idle time, and
	// the profiled extra cell's length (0: none).
	steadyRates                          []int
	steadyDur, steadyIdle, steadyProfile time.Duration
	steadyFloor                          string

	kafka, pipeline testenv.Section // kafkaYAML and pipeYAML, parsed
}

// children are the programs the bench runs as child processes of its own
// binary (`bench relay ...`, `bench floor ...`), so that their CPU and
// memory are their own.
var children = map[string]func(ctx context.Context, args []string) error{
	"relay": relayMain,
	"floor": floorMain,
}

// runChild runs a child until it ends or the bench stops it (SIGTERM,
// SIGINT), which is not an error.
func runChild(child func(context.Context, []string) error, args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := child(ctx, args)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func main() {
	if len(os.Args) > 1 {
		if child, ok := children[os.Args[1]]; ok {
			if err := runChild(child, os.Args[2:]); err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", os.Args[1], err)
				os.Exit(1)
			}
			return
		}
	}
	var o options
	var rates, txns, steadyRates string
	flag.IntVar(&o.rows, "rows", 500000, "backlog size for the drain (env ROWS in make bench)")
	flag.IntVar(&o.repeats, "repeats", 3, "repetitions of every workload; the table shows medians")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "how long the writer runs at each rate")
	flag.StringVar(&rates, "rates", "500,2000,10000", "writer rates, events/s")
	flag.StringVar(&txns, "txn", "1,10", "rows per transaction in the latency workload")
	flag.IntVar(&o.partitions, "partitions", 6, "topic partitions")
	flag.StringVar(&o.out, "out", "bench-out", "folder for the plots and the table")
	flag.BoolVar(&o.perf, "perf", true, "record a perf profile of outboxd during the first drain (when perf works)")
	flag.BoolVar(&o.skipDrain, "no-drain", false, "skip the drain workload")
	flag.BoolVar(&o.skipLat, "no-latency", false, "skip the latency workload")
	flag.StringVar(&o.kafkaYAML, "outboxd-kafka", "", `extra keys for outboxd's kafka section, e.g. "batch_size: 100, compression: none" (default: outboxd's defaults)`)
	flag.StringVar(&o.pipeYAML, "outboxd-pipeline", "", `keys for outboxd's pipeline section, e.g. "max_in_flight_events: 20000"`)
	flag.StringVar(&o.outboxEnv, "outboxd-env", "", `extra environment for outboxd only, "K=V,K=V" (e.g. "GOMAXPROCS=2" to override outboxd's default)`)
	flag.StringVar(&o.binary, "outboxd-bin", "", "run this outboxd binary instead of building the working tree's (to compare versions)")
	flag.StringVar(&o.routing, "routing", "", `"rich": outboxd with every routing feature at once (two routes per row, a template, an override, fields, the trace context, position headers, the record timestamp): two records per row`)
	flag.StringVar(&o.value, "value", "", `the seed route's record: "" (the envelope), "cloudevents" (binary), "cloudevents-structured", "jsonschema" (carrega validated and in the schema registry's wire format, against an Apicurio Registry the bench starts), "avro" (carrega in Avro by the schema, the same registry), "protobuf" (carrega in Protobuf by a .proto, the same registry); the three registry shapes register the key too (key: registered)`)
	flag.Float64Var(&o.trace, "trace", -1, "tracing on with this tracing.sample_ratio (0 to 1): outboxd's spans go to an OpenTelemetry Collector the bench starts (testenv/otelcol.sh); negative: off")
	flag.StringVar(&o.services, "services", "", "reuse the PostgreSQL and Kafka that `bash testenv/services.sh up DIR` started (left running; for repeated development runs)")
	flag.StringVar(&steadyRates, "steady", "200,2000", `steady-phase rates, events/s, in transactions of 1-10 rows: outboxd's CPU per event, latency, idle CPU and a CPU profile ("" skips the phase)`)
	flag.DurationVar(&o.steadyDur, "steady-duration", 20*time.Second, "how long the writer runs at each steady rate")
	flag.DurationVar(&o.steadyIdle, "steady-idle", 30*time.Second, "how long outboxd's idle CPU is measured (keepalives only; 0 skips)")
	flag.StringVar(&o.steadyFloor, "steady-floor", "", `run the Go floor beside outboxd in the steady phase and report its CPU per event: "produce" (reads the stream and produces each transaction, waiting for each answer: outboxd's two wake-ups per transaction) or "read" (reads only, as pg_recvlogical into /dev/null); "" runs none`)
	flag.DurationVar(&o.steadyProfile, "steady-profile", 15*time.Second, "length of outboxd's CPU profile, taken in an extra cell at the highest steady rate (0 skips)")
	parseCost := costFlags(&o.cost)
	flag.Parse()
	var err error
	if o.rates, err = ints(rates); err == nil {
		err = parseCost()
	}
	if err == nil {
		o.txnSizes, err = ints(txns)
	}
	if err == nil && steadyRates != "" {
		o.steadyRates, err = ints(steadyRates)
	}
	if err == nil {
		o.kafka, err = section(o.kafkaYAML)
	}
	if err == nil {
		o.pipeline, err = section(o.pipeYAML)
	}
	if err == nil && o.routing != "" && o.routing != "rich" {
		err = fmt.Errorf("-routing %q: want rich", o.routing)
	}
	if err == nil && o.value != "" && o.value != "cloudevents" && o.value != "cloudevents-structured" && o.value != "jsonschema" && o.value != "avro" && o.value != "protobuf" {
		err = fmt.Errorf("-value %q: want cloudevents, cloudevents-structured, jsonschema, avro or protobuf", o.value)
	}
	if err == nil && o.value != "" && o.routing != "" {
		err = fmt.Errorf("-value and -routing rich: one route shape at a time")
	}
	if err == nil && o.routing != "" && o.cost.on {
		err = fmt.Errorf("-routing rich and -cost: the cost curves use the seed's route")
	}
	if err == nil {
		err = run(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad number %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// section parses "key: value, key: value" (a YAML flow mapping's body)
// into the keys of one section of outboxd's file.
func section(s string) (testenv.Section, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte("{"+s+"}"), &doc); err != nil {
		return nil, fmt.Errorf("bad keys %q: %w", s, err)
	}
	m := doc.Content[0]
	sec := testenv.Section{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		v, err := yaml.Marshal(m.Content[i+1])
		if err != nil {
			return nil, err
		}
		sec[m.Content[i].Value] = strings.TrimSpace(string(v))
	}
	return sec, nil
}

// bench holds what every workload needs.
type bench struct {
	o         options
	env       *testenv.Env
	self      string // this program, for the relay child
	tmp       string
	admin     *pgx.Conn
	brokerPID int
	log       io.Writer
	// runTag suffixes database, slot and topic names on reused services, so
	// a run never reads the topics of an earlier one.
	runTag string
	// collector receives outboxd's spans (-trace).
	collector *testenv.Collector
	// registry is the schema registry's URL (-value jsonschema, avro,
	// protobuf); schemas the directory of the order's schemas.
	registry, schemas string

	mu       sync.Mutex
	children []*os.Process     // relay, pg_recvlogical: killed on an interrupt
	daemons  []*testenv.Daemon // outboxd: killed on an interrupt
}

func (b *bench) child(p *os.Process) {
	b.mu.Lock()
	b.children = append(b.children, p)
	b.mu.Unlock()
}

// startPiped starts a child process whose standard output the bench reads
// and whose errors go to the bench's, unless cmd says where.
func (b *bench) startPiped(cmd *exec.Cmd) (io.Reader, error) {
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b.child(cmd.Process)
	return out, nil
}

func run(o options) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "outboxd-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	b := &bench{o: o, tmp: tmp, log: os.Stderr}
	if b.self, err = os.Executable(); err != nil {
		return err
	}
	if o.binary == "" {
		logf(b.log, "building outboxd")
		defer testenv.RemoveBinary()
		if _, err := testenv.Binary(); err != nil {
			return err
		}
	}
	if _, err := exec.LookPath(recvlogical()); err != nil {
		return fmt.Errorf("pg_recvlogical not found (PostgreSQL 15 server binaries): %w", err)
	}
	if o.services != "" {
		logf(b.log, "using the services of %s", o.services)
		b.env, err = testenv.Attach(o.services)
		b.runTag = fmt.Sprintf("_r%d", time.Now().Unix()%1000000)
	} else {
		logf(b.log, "starting PostgreSQL and Kafka")
		b.env, err = testenv.Start(testenv.Options{})
	}
	if err != nil {
		return err
	}
	defer b.env.Cleanup()
	if o.value == "jsonschema" || o.value == "avro" || o.value == "protobuf" {
		reg, err := testenv.StartRegistry(filepath.Join(tmp, "registry"))
		if err != nil {
			return err
		}
		defer func() { _ = reg.Stop() }()
		b.registry = reg.URL
		root, err := testenv.Root()
		if err != nil {
			return err
		}
		// The order's schemas, those schemareg's BenchmarkEncode writes by.
		b.schemas = filepath.Join(root, "schemareg", "testdata", "order")
	}
	if o.trace >= 0 {
		if b.collector, err = testenv.StartCollector(filepath.Join(tmp, "otelcol")); err != nil {
			return err
		}
		defer func() {
			if spans, err := b.collector.Spans(); err == nil {
				logf(b.log, "the collector received %d spans", len(spans))
			}
			_ = b.collector.Stop()
		}()
	}
	// An interrupt still removes the services and the processes started.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		logf(b.log, "interrupted: stopping what the bench started")
		b.mu.Lock()
		for _, p := range b.children {
			_ = p.Kill()
		}
		for _, d := range b.daemons {
			d.Kill()
		}
		b.mu.Unlock()
		b.env.Cleanup()
		os.Exit(130)
	}()
	ctx := context.Background()
	if b.admin, err = pgx.Connect(ctx, b.env.PGDSN); err != nil {
		return err
	}
	defer b.admin.Close(ctx)
	if b.brokerPID, err = b.env.KafkaPID(); err != nil {
		return err
	}
	var pgVersion string
	if err := b.admin.QueryRow(ctx, "SHOW server_version").Scan(&pgVersion); err != nil {
		return err
	}
	rep := &report{machine: machine(pgVersion, kafkaVersion()) + ", outboxd " + binaryNote(o.binary) + kafkaNote(o.kafkaYAML, o.pipeYAML, o.outboxEnv), o: o, idle: map[string][]float64{}}

	if o.cost.on {
		return b.cost(ctx, rep)
	}
	all := []reader{{sys: sysRecv}, {sys: sysOutboxd}, {sys: sysRelay}}
	main := backlog{rows: o.rows, partitions: o.partitions, tables: 1}
	if !o.skipDrain {
		// A first, unreported drain warms the broker's JIT and the caches:
		// without it the first outboxd drain runs 3-4 times slower.
		warm := main
		warm.rows = max(o.rows/4, 1000)
		if _, err := b.drain(ctx, "warm-up", 100, warm, all, false); err != nil {
			return fmt.Errorf("warm-up drain: %w", err)
		}
		for i := 0; i < o.repeats; i++ {
			d, err := b.drain(ctx, fmt.Sprintf("%d/%d", i+1, o.repeats), i, main, all, false)
			if err != nil {
				return fmt.Errorf("drain %d: %w", i+1, err)
			}
			rep.drains = append(rep.drains, d)
		}
		if o.perf {
			// The profile comes from an extra, unreported drain of at least
			// 300k rows (enough samples): perf would perturb a measured one.
			prof := main
			prof.rows = max(o.rows, 300000)
			d, err := b.drain(ctx, "profiled", 101, prof, []reader{{sys: sysOutboxd}}, true)
			if err != nil {
				return fmt.Errorf("profiled drain: %w", err)
			}
			rep.profile = d.results[sysOutboxd].perfReport
		}
	}
	if len(o.steadyRates) > 0 {
		if rep.steady, err = b.steady(ctx); err != nil {
			return fmt.Errorf("steady: %w", err)
		}
	}
	if !o.skipLat {
		for i := 0; i < o.repeats; i++ {
			for _, sys := range []string{sysOutboxd, sysRelay} {
				cells, idle, err := b.latency(ctx, sys, i, o.txnSizes, o.rates, false)
				if err != nil {
					return fmt.Errorf("latency %s %d: %w", sys, i+1, err)
				}
				rep.cells = append(rep.cells, cells...)
				rep.idle[sys] = append(rep.idle[sys], idle)
			}
		}
	}
	return rep.write(os.Stdout)
}

const (
	sysRecv    = "pg_recvlogical"
	sysOutboxd = "outboxd"
	sysRelay   = "polling relay"
)

func logf(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, "%s bench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// recvlogicalArgs are pg_recvlogical's arguments to stream a slot with
// pgoutput's protocol 1 (and its binary option).
func recvlogicalArgs(dsn, pub, slot string, binary bool) []string {
	args := []string{"-d", dsn, "--slot", slot, "--start", "-o", "proto_version=1", "-o", "publication_names=" + pub, "--no-loop"}
	if binary {
		args = append(args, "-o", "binary=true")
	}
	return args
}

func recvlogical() string { return testenv.RecvLogical() }

func binaryNote(bin string) string {
	if bin != "" {
		return bin
	}
	return gitDescribe()
}

func kafkaVersion() string {
	if v := os.Getenv("KAFKA_VERSION"); v != "" {
		return v
	}
	home, _ := os.UserHomeDir()
	if m, _ := filepath.Glob(filepath.Join(home, ".cache", "outboxd", "kafka-*")); len(m) == 1 {
		return strings.TrimPrefix(filepath.Base(m[0]), "kafka-")
	}
	return "4.1.1"
}

// setupDB makes a database with the seed's tables (and bl.tables - 1
// copies of outbox), an insert-only publication of the outbox tables and a
// topic for each, of bl.partitions partitions.
func (b *bench) setupDB(ctx context.Context, name string, bl backlog) (string, *pgx.Conn, error) {
	_, _ = b.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	seed, err := testenv.SeedSchema()
	if err != nil {
		return "", nil, err
	}
	if b.o.routing == "rich" {
		seed += fmt.Sprintf("\nALTER TABLE outbox ADD COLUMN traceparent text DEFAULT %s;", "'"+richTraceparent+"'")
	}
	tables := []string{"outbox"}
	for i := 1; i < bl.tables; i++ {
		seed += fmt.Sprintf("\nCREATE TABLE %s (LIKE outbox INCLUDING ALL);", outboxTable(i))
		tables = append(tables, outboxTable(i))
	}
	dsn, err := b.env.CreateDatabase(name, seed+"\nCREATE PUBLICATION "+name+" FOR TABLE "+strings.Join(tables, ", ")+" WITH (publish = 'insert');")
	if err != nil {
		return "", nil, err
	}
	topics := b.topics(name, bl.tables)
	if b.o.routing == "rich" {
		topics = append(topics, name+".comanda")
	}
	for _, t := range topics {
		if err := b.env.CreateTopic(t, bl.partitions); err != nil {
			return "", nil, err
		}
	}
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", nil, err
	}
	return dsn, db, nil
}

// outboxTable is the name of outbox table i of a backlog: outbox, then
// outbox_2, outbox_3...
func outboxTable(i int) string {
	if i == 0 {
		return "outbox"
	}
	return fmt.Sprintf("outbox_%d", i+1)
}

// topics are the topics of a database's outbox tables: name, name_2...
func (b *bench) topics(name string, tables int) []string {
	var out []string
	for i := 0; i < tables; i++ {
		out = append(out, strings.Replace(outboxTable(i), "outbox", name, 1))
	}
	return out
}

// deleteTopics removes a drain's topics (outboxd's and the relay's), so
// that the broker's disk does not fill over a sweep of large backlogs.
func (b *bench) deleteTopics(name string, bl backlog) {
	topics := append(b.topics(name, bl.tables), name+"_relay")
	if b.o.routing == "rich" {
		topics = append(topics, name+".comanda")
	}
	if err := testenv.DeleteTopics(context.Background(), b.env.KafkaBrokers, topics...); err != nil {
		logf(b.log, "delete topics: %v", err)
	}
}

// dropDB removes a workload's slots and database to keep the disk small.
func (b *bench) dropDB(ctx context.Context, name string) {
	_, _ = b.admin.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active", name)
	_, _ = b.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
}

// carregaOf is the carrega of row g: the ~200-byte order, and for a size
// over 250 bytes line items (~80 bytes of JSON text each, varied values)
// up to about size bytes; extra adds fields.
func carregaOf(g string, size int, extra string) string {
	if size <= 250 {
		return carregaSQL(g, extra)
	}
	items := (size - 200) / 80
	return carregaSQL(g, fmt.Sprintf(`, 'detall', (SELECT jsonb_agg(jsonb_build_object('linia', i, 'producte', 'p-' || substr(md5((%[1]s)::text || '-' || i), 1, 12),
	  'quantitat', (i * 7 + (%[1]s)) %% 10, 'preu_centims', (i * 131 + (%[1]s)) %% 5000)) FROM generate_series(1, %[2]d) i)`, g, items)+extra)
}

// sizeLabel is a carrega size as a table shows it.
func sizeLabel(n int) string {
	switch {
	case n <= 250:
		return "200 B"
	case n < 1000:
		return fmt.Sprintf("%d B", n)
	case n < 1000000:
		return fmt.Sprintf("%g KB", float64(n)/1000)
	}
	return fmt.Sprintf("%g MB", float64(n)/1e6)
}

// carregaSQL is a ~200-byte order as jsonb; extra adds fields.
func carregaSQL(g, extra string) string {
	return `jsonb_build_object('id', 'P-2026-' || lpad((` + g + `)::text, 6, '0'), 'client', 'anna', 'mercat', 'girona',
	  'linies', jsonb_build_array(jsonb_build_object('producte', 'formatge-curat', 'quantitat', 2, 'preu_centims', 1450),
	                              jsonb_build_object('producte', 'mel-de-romani', 'quantitat', 1, 'preu_centims', 890))` + extra + `)`
}

// startOutboxd runs outboxd on a slot with its default settings (only what
// a deployment must set is set, plus the -outboxd-* experiments).
func (b *bench) startOutboxd(name, dsn, slot string, tables int) (*testenv.Daemon, error) {
	return b.startOutboxdWith(name, dsn, slot, tables, nil)
}

// startOutboxdWith is startOutboxd with keys for outboxd's health section.
func (b *bench) startOutboxdWith(name, dsn, slot string, tables int, health testenv.Section) (*testenv.Daemon, error) {
	d, err := testenv.StartDaemon(b.tmp, testenv.Config{
		DSN: dsn, Brokers: b.env.KafkaBrokers, Slot: slot,
		Routes:   b.routes(name, tables),
		Postgres: testenv.Section{"publication": name, "create_slot": "false", "create_publication": "false"},
		Kafka:    b.o.kafka,
		Pipeline: b.o.pipeline,
		Log:      testenv.Section{"level": "warn"},
		Health:   health,
		Tracing:  b.tracing(),
		Bin:      b.o.binary,
		Env:      envList(b.o.outboxEnv),
	})
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.daemons = append(b.daemons, d)
	b.mu.Unlock()
	return d, nil
}

// richTraceparent is every rich-routing row's trace context.
const richTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// routes is outboxd's routes: the seed's one, or with -routing rich two
// routes per row using every routing feature (the templated one gives
// name.comanda, with the raw payload; the filtered one keeps topic name and
// the envelope, for the latency consumer).
// With more than one table, each table has the seed's route to its topic.
func (b *bench) routes(name string, tables int) []testenv.Route {
	if b.o.routing != "rich" {
		var rs []testenv.Route
		for i, topic := range b.topics(name, tables) {
			rs = append(rs, testenv.Route{Table: "public." + outboxTable(i), Topic: topic, More: b.valueKeys()})
		}
		return rs
	}
	return []testenv.Route{
		{Table: "public.outbox", Topic: `"` + name + `.{agregat}"`, More: testenv.Section{
			"topic_fallback": name, "value": "payload", "position_headers": "true", "timestamp": "creat_en",
			"overrides": "[{when: {tipus: comanda.prova}, drop: true}]", "trace": "{traceparent: traceparent}",
			"fields": "[{column: agregat, header: agregat}]"}},
		{Table: "public.outbox", Topic: name, More: testenv.Section{
			"filter": "{tipus: comanda.creada}", "position_headers": "true", "trace": "{traceparent: traceparent}",
			"fields": "[{column: agregat, header: agregat}, {column: agregat, envelope: agregat}]"}},
	}
}

// tracing is outboxd's tracing section for -trace.
func (b *bench) tracing() testenv.Section {
	if b.collector == nil {
		return nil
	}
	return testenv.Section{"endpoint": b.collector.Endpoint, "sample_ratio": strconv.FormatFloat(b.o.trace, 'f', -1, 64)}
}

// registered is a route whose value is carrega in format by the order's
// schema file, and whose key is registered too (issue 37: "the route's
// value in the registry's wire format, a registered key too").
func (b *bench) registered(format, file string) testenv.Section {
	return testenv.Section{"value": "payload", "schema": fmt.Sprintf(`{registry: %q, format: %s, auto_register: true, key: registered, schemas: {comanda.creada: %q}}`,
		b.registry, format, filepath.Join(b.schemas, file))}
}

// valueKeys are the seed route's keys for -value.
func (b *bench) valueKeys() testenv.Section {
	switch b.o.value {
	case "cloudevents":
		return testenv.Section{"value": "cloudevents"}
	case "cloudevents-structured":
		return testenv.Section{"value": "cloudevents", "cloudevents": "{mode: structured}"}
	case "jsonschema":
		return b.registered("json_schema", "comanda-creada.json")
	case "avro":
		return b.registered("avro", "comanda-creada.avsc")
	case "protobuf":
		return b.registered("protobuf", "comanda_creada.proto")
	}
	return nil
}

// recordsPerRow is how many records outboxd makes of one backlog row.
func (b *bench) recordsPerRow() int {
	if b.o.routing == "rich" {
		return 2
	}
	return 1
}

func envList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// ackedEvents is counters.events of the daemon's /status: records acknowledged.
func ackedEvents(ctx context.Context, d *testenv.Daemon) (uint64, bool) {
	st, err := d.Status(ctx)
	return st.Counters.Events, err == nil
}

// stopOutboxd stops it, passes on what it logged (warnings and errors) and
// returns its exit.
func (b *bench) stopOutboxd(d *testenv.Daemon) error {
	var err error
	if d.Running() {
		err = d.Term(60 * time.Second)
	} else {
		_, err = d.Exited(0)
	}
	for _, l := range strings.Split(strings.TrimSpace(d.Log()), "\n") {
		if l != "" && !strings.HasPrefix(l, "==== testenv:") {
			fmt.Fprintf(b.log, "outboxd: %s\n", l)
		}
	}
	return err
}

// exitedEarly says why outboxd is no longer running, with its log's end.
func exitedEarly(d *testenv.Daemon) error {
	_, err := d.Exited(0)
	log := d.Log()
	if len(log) > 3000 {
		log = log[len(log)-3000:]
	}
	return fmt.Errorf("outboxd exited: %v\n%s", err, log)
}

// slotPID is the walsender serving a slot, 0 while none.
func (b *bench) slotPID(ctx context.Context, slot string) int {
	var pid *int32
	_ = b.admin.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid)
	if pid == nil {
		return 0
	}
	return int(*pid)
}

// relayProc is the polling relay child process.
type relayProc struct {
	cmd    *exec.Cmd
	count  chan int // every pass's running total
	last   int
	closed bool // stdout ended: the relay exited
	waited bool
}

func (b *bench) startRelay(dsn, topic string) (*relayProc, error) {
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	cmd := exec.Command(b.self, "relay", "-dsn", dsn+sep+"application_name=bench_relay", "-brokers", b.env.KafkaBrokers, "-topic", topic)
	out, err := b.startPiped(cmd)
	if err != nil {
		return nil, err
	}
	r := &relayProc{cmd: cmd, count: make(chan int, 1024)}
	go func() {
		defer close(r.count)
		buf := make([]byte, 0, 64)
		one := make([]byte, 4096)
		for {
			n, err := out.Read(one)
			for _, c := range one[:n] {
				if c == '\n' {
					v, _ := strconv.Atoi(string(buf))
					select {
					case r.count <- v:
					default: // the bench is behind; a later total will do
					}
					buf = buf[:0]
				} else {
					buf = append(buf, c)
				}
			}
			if err != nil {
				return
			}
		}
	}()
	return r, nil
}

// published drains the totals reported so far.
func (r *relayProc) published() int {
	for {
		select {
		case v, ok := <-r.count:
			if !ok {
				r.closed = true
				return r.last
			}
			if v > r.last {
				r.last = v
			}
		default:
			return r.last
		}
	}
}

func (r *relayProc) stop() error {
	if r == nil || r.waited {
		return nil
	}
	r.waited = true
	_ = r.cmd.Process.Signal(os.Interrupt)
	for range r.count {
	}
	return r.cmd.Wait()
}

// backendPID is the server process of a client with that application_name.
func (b *bench) backendPID(ctx context.Context, app string) int {
	var pid int32
	if err := b.admin.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1 LIMIT 1", app).Scan(&pid); err != nil {
		return 0
	}
	return int(pid)
}

// gitDescribe names the code measured (the working tree, possibly dirty).
func gitDescribe() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "(unknown revision)"
	}
	return strings.TrimSpace(string(out))
}

func kafkaNote(extra, pipeline, env string) string {
	var parts []string
	if extra != "" {
		parts = append(parts, "kafka: {"+extra+"}")
	}
	if pipeline != "" {
		parts = append(parts, "pipeline: {"+pipeline+"}")
	}
	if env != "" {
		parts = append(parts, "env "+env)
	}
	if len(parts) == 0 {
		return " (default settings)"
	}
	return " with " + strings.Join(parts, ", ")
}
