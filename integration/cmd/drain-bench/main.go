// Command drain-bench measures how fast outboxd drains a backlog of outbox
// rows into Kafka, per compression codec, against a real PostgreSQL and a
// real Kafka started by the project's scripts. It is run by `make bench`.
//
// For each codec: a fresh database gets N outbox rows (~200-byte carrega, in
// transactions of 100) while outboxd is stopped; then outboxd starts and the
// clock runs until the slot's confirmed_flush_lsn reaches the end of the
// backlog, that is until Kafka acknowledged every record. It prints events/s,
// outboxd's CPU per event and peak RSS (from rusage), and the topic's size
// on the broker's disk.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/integration/testenv"
)

func main() {
	rows := flag.Int("rows", 200000, "backlog size")
	codecs := flag.String("codecs", "none,lz4,zstd", "comma-separated compression codecs to measure")
	partitions := flag.Int("partitions", 6, "topic partitions")
	flag.Parse()
	if err := run(*rows, strings.Split(*codecs, ","), *partitions); err != nil {
		fmt.Fprintln(os.Stderr, "drain-bench:", err)
		os.Exit(1)
	}
}

type result struct {
	codec        string
	seconds      float64
	cpuSeconds   float64
	maxRSSMB     float64
	topicBytes   int64
	eventsPerSec float64
}

func run(rows int, codecs []string, partitions int) error {
	tmp, err := os.MkdirTemp("", "outboxd-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "outboxd")
	build := exec.Command("go", "build", "-o", bin, "github.com/outboxd/outboxd/cmd/outboxd")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer env.Cleanup()

	var results []result
	for i, codec := range codecs {
		r, err := drain(env, bin, tmp, fmt.Sprintf("bench_%d_%s", i, codec), codec, rows, partitions)
		if err != nil {
			return fmt.Errorf("%s: %w", codec, err)
		}
		results = append(results, r)
		fmt.Fprintf(os.Stderr, "%s: %.0f events/s\n", codec, r.eventsPerSec)
	}
	host, _ := os.Hostname()
	fmt.Printf("\nbacklog drain: %d outbox rows (~200-byte carrega, transactions of 100), %d partitions, acks=all\n", rows, partitions)
	fmt.Printf("machine: %s, %d CPUs, %s\n\n", host, runtime.NumCPU(), runtime.Version())
	fmt.Printf("%-6s %10s %12s %14s %12s %14s\n", "codec", "seconds", "events/s", "CPU µs/event", "peak RSS MB", "topic MB")
	for _, r := range results {
		fmt.Printf("%-6s %10.2f %12.0f %14.2f %12.1f %14.1f\n", r.codec, r.seconds, r.eventsPerSec,
			r.cpuSeconds*1e6/float64(rows), r.maxRSSMB, float64(r.topicBytes)/(1<<20))
	}
	return nil
}

// acked reads events_acknowledged from a running instance's /status.
func acked(health string) uint64 {
	resp, err := http.Get("http://" + health + "/status")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var st struct {
		Acked uint64 `json:"events_acknowledged"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return 0
	}
	return st.Acked
}

func drain(env *testenv.Env, bin, tmp, name, codec string, rows, partitions int) (result, error) {
	ctx := context.Background()
	dsn, err := env.CreateDatabase(name)
	if err != nil {
		return result{}, err
	}
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return result{}, err
	}
	defer db.Close(ctx)
	topic := name + ".esdeveniments"
	if err := env.CreateTopic(topic, partitions); err != nil {
		return result{}, err
	}
	setup := []string{
		`CREATE TABLE outbox (id UUID PRIMARY KEY, agregat TEXT NOT NULL, agregat_id TEXT NOT NULL, tipus TEXT NOT NULL,
		 versio INTEGER NOT NULL DEFAULT 1, carrega JSONB NOT NULL, creat_en TIMESTAMPTZ NOT NULL DEFAULT now(), publicat_en TIMESTAMPTZ)`,
		fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE outbox WITH (publish = 'insert')", name),
		fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", name),
	}
	for _, s := range setup {
		if _, err := db.Exec(ctx, s); err != nil {
			return result{}, err
		}
	}
	// The backlog, written while outboxd is not running: one INSERT of 100
	// rows per transaction.
	const txn = 100
	for done := 0; done < rows; done += txn {
		_, err := db.Exec(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega)
			SELECT gen_random_uuid(), 'comanda', 'P-2026-' || lpad((g % 5000)::text, 6, '0'), 'comanda.creada',
			       jsonb_build_object('id', 'P-2026-' || g, 'client', 'anna', 'mercat', 'girona',
			         'linies', jsonb_build_array(jsonb_build_object('producte', 'formatge-curat', 'quantitat', 2, 'preu_centims', 1450),
			                                     jsonb_build_object('producte', 'mel-de-romani', 'quantitat', 1, 'preu_centims', 890)))
			FROM generate_series($1::int, $2::int) g`, done, done+txn-1)
		if err != nil {
			return result{}, err
		}
	}
	var endText string
	if err := db.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&endText); err != nil {
		return result{}, err
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{}, err
	}
	health := ln.Addr().String()
	ln.Close()
	cfgPath := filepath.Join(tmp, name+".yaml")
	cfg := fmt.Sprintf(`origen: comandes
postgres: {dsn: %q, slot: %s, publication: %s, create_slot: false, create_publication: false}
kafka: {brokers: [%q], compression: %s}
routes: [{table: public.outbox, topic: %s}]
health: {listen: %q}
log: {level: warn}
`, dsn, name, name, env.KafkaBrokers, codec, topic, health)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return result{}, err
	}
	cmd := exec.Command(bin, "run", "-c", cfgPath)
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	// The clock stops when the instance reports every record acknowledged
	// by Kafka (polled every 10 ms); the slot's confirmed_flush_lsn follows
	// within one status interval, which is checked afterwards.
	deadline := start.Add(10 * time.Minute)
	for {
		if acked(health) >= uint64(rows) {
			break
		}
		if time.Now().After(deadline) {
			return result{}, fmt.Errorf("not drained after 10 minutes")
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(start)
	for {
		var reached bool
		err := db.QueryRow(ctx, "SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2", endText, name).Scan(&reached)
		if err != nil {
			return result{}, err
		}
		if reached {
			break
		}
		if time.Now().After(deadline) {
			return result{}, fmt.Errorf("slot not confirmed after 10 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		return result{}, fmt.Errorf("outboxd exit: %w", err)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	var topicBytes int64
	matches, _ := filepath.Glob(filepath.Join(env.Dir, "kafka", "data", topic+"-*", "*.log"))
	for _, m := range matches {
		if st, err := os.Stat(m); err == nil {
			topicBytes += st.Size()
		}
	}
	_, _ = db.Exec(ctx, "SELECT pg_drop_replication_slot($1)", name)
	return result{codec: codec, seconds: elapsed.Seconds(), cpuSeconds: cpu, maxRSSMB: float64(ru.Maxrss) / 1024,
		topicBytes: topicBytes, eventsPerSec: float64(rows) / elapsed.Seconds()}, nil
}
