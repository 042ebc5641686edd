package integration_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/testenv"
)

// TestConsumerExactlyOnceEffect: the inventari example (consumer package)
// decrements stock on comanda.creada. outboxd, its restart de-duplication
// off, is killed (-9) mid-stream until Kafka holds duplicate events; the consumer is killed between its
// database commit and its offset commit; its database refuses connections
// for a while (transient errors, retried with backoff); one order asks for
// more than the stock (permanent: to the dead-letter topic). In the end
// every product's stock went down exactly once per order, and
// missatges_processats holds every applied order once.
func TestConsumerExactlyOnceEffect(t *testing.T) {
	kafkaOnly(t)
	f := newFixture(t, seedSchema, map[string]int{"comandes": 3, "comandes.dlq": 1})
	ctx := context.Background()
	topic, dlq := f.topic("comandes"), f.topic("comandes.dlq")
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	schema, err := os.ReadFile(filepath.Join(root, "examples", "inventari", "schema.sql"))
	if err != nil {
		t.Fatal(err)
	}
	invDB := f.name + "_inventari"
	invDSN, err := env.CreateDatabase(invDB, string(schema)+`
		INSERT INTO estoc VALUES ('tomaquet-rosa', 100000), ('carbasso', 100000), ('formatge-fresc', 100000), ('vi-crianca', 100000), ('formatge-curat', 5);`)
	if err != nil {
		t.Fatal(err)
	}
	// inv reads one row of the inventari database, on a connection of its
	// own (the test cuts the database's connections).
	inv := func(dest []any, sql string, args ...any) error {
		conn, err := pgx.Connect(ctx, invDSN)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		return conn.QueryRow(ctx, sql, args...).Scan(dest...)
	}

	// outboxd confirms every 3 s at most, so a kill -9 leaves events in
	// Kafka that it produces again.
	cfg := f.config(seedRoute(topic))
	// The consumer's de-duplication is what is tested: outboxd's own
	// (kafka.deduplicate, on by default) would leave it nothing to absorb.
	cfg.Kafka["deduplicate"] = "false"
	cfg.Postgres["status_interval"] = "3s"
	d := f.start(cfg)

	products := []string{"tomaquet-rosa", "carbasso", "formatge-fresc", "vi-crianca"}
	want := map[string]int{} // units taken per product by the applied orders
	var mu sync.Mutex
	n := 0
	order := func(lines map[string]int) error {
		mu.Lock()
		n++
		id := fmt.Sprintf("P-2026-%06d", n)
		mu.Unlock()
		var linies []string
		for p, q := range lines {
			linies = append(linies, fmt.Sprintf(`{"producte": %q, "quantitat": %d, "preu_centims": 250}`, p, q))
		}
		tx, err := f.db.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "INSERT INTO comandes (id, client, mercat) VALUES ($1, 'anna', 'girona')", id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega) VALUES (gen_random_uuid(), 'comanda', $1, 'comanda.creada', $2)",
			id, fmt.Sprintf(`{"id": %q, "client": "anna", "linies": [%s]}`, id, strings.Join(linies, ", "))); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	orders := func(count int) <-chan error {
		errc := make(chan error, 1)
		go func() {
			for i := 0; i < count; i++ {
				lines := map[string]int{products[i%4]: 1 + i%3, products[(i+1)%4]: 1}
				if err := order(lines); err != nil {
					errc <- err
					return
				}
				mu.Lock()
				for p, q := range lines {
					want[p] += q
				}
				mu.Unlock()
				time.Sleep(8 * time.Millisecond)
			}
			errc <- nil
		}()
		return errc
	}
	if err := order(map[string]int{"formatge-curat": 9}); err != nil { // more than the stock
		t.Fatal(err)
	}
	errc := orders(300)
	for i := 0; i < 2; i++ {
		time.Sleep(time.Second)
		d.kill()
		d = f.start(cfg)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// Kill right after a burst, before outboxd confirms it, until Kafka
	// holds duplicates.
	for round, dups := 0, 0; dups == 0; round++ {
		if round == 5 {
			t.Fatal("five kills -9 and still no duplicate in Kafka: the test cannot show the consumer absorbing them")
		}
		if err := <-orders(20); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		d.kill()
		d = f.start(cfg)
		all := f.consumeAll(topic, n)
		ids := map[string]bool{}
		for _, m := range all {
			ids[header(m, "id_esdeveniment")] = true
		}
		dups = len(all) - len(ids)
		t.Logf("%d orders, the topic holds %d records: %d duplicates", n, len(all), dups)
	}

	bin := filepath.Join(t.TempDir(), "inventari")
	build := exec.Command("go", "build", "-o", bin, "./examples/inventari")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build inventari: %v\n%s", err, out)
	}
	run := func(args ...string) (*exec.Cmd, *syncBuffer) {
		cmd := exec.Command(bin, append([]string{"-dsn", invDSN, "-brokers", env.KafkaBrokers, "-topic", topic, "-dlq", dlq,
			"-group", f.name + "_inventari", "-session-timeout", "6s"}, args...)...)
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("inventari %v:\n%s", args, out.String())
			}
		})
		return cmd, out
	}

	// The first consumer dies after its 40th database commit, before
	// that offset's commit.
	c1, out1 := run("-crash-after", "40")
	exited := make(chan error, 1)
	go func() { exited <- c1.Wait() }()
	select {
	case <-exited:
	case <-time.After(90 * time.Second):
		t.Fatalf("inventari did not crash after 40 events:\n%s", out1.String())
	}
	crashLine := ""
	for _, l := range strings.Split(out1.String(), "\n") {
		if strings.HasSuffix(l, ": processat") {
			crashLine = l
		}
	}
	if !strings.Contains(out1.String(), "SIGKILL after the database commit") || crashLine == "" {
		t.Fatalf("inventari did not crash as asked:\n%s", out1.String())
	}

	// The second one: the 40th event again, found processed.
	_, out2 := run()
	crashed := strings.TrimSuffix(crashLine, ": processat") + ": duplicat"
	eventually(t, 90*time.Second, "the crashed event read again and found processed", func() bool { return strings.Contains(out2.String(), crashed) })

	// The database refuses connections for 3 s, then comes back.
	if _, err := f.mon.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{invDB}.Sanitize()+" ALLOW_CONNECTIONS false"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.mon.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", invDB); err != nil {
		t.Fatal(err)
	}
	if err := <-orders(10); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the consumer retrying a transient error", func() bool { return strings.Contains(out2.String(), "transient error; retrying") })
	time.Sleep(3 * time.Second)
	if _, err := f.mon.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{invDB}.Sanitize()+" ALLOW_CONNECTIONS true"); err != nil {
		t.Fatal(err)
	}

	applied := n - 1 // every order but the one beyond the stock
	eventually(t, 90*time.Second, fmt.Sprintf("%d orders applied", applied), func() bool {
		var c int
		_ = inv([]any{&c}, "SELECT count(*) FROM missatges_processats WHERE consumidor = 'inventari.descompte_estoc'")
		return c == applied
	})
	time.Sleep(time.Second) // anything left over (a duplicate) is read meanwhile
	for _, p := range products {
		var units int
		if err := inv([]any{&units}, "SELECT unitats FROM estoc WHERE producte = $1", p); err != nil {
			t.Fatal(err)
		}
		if units != 100000-want[p] {
			t.Errorf("%s: %d units, want %d (100000 minus %d ordered)", p, units, 100000-want[p], want[p])
		}
	}
	var curat int
	if err := inv([]any{&curat}, "SELECT unitats FROM estoc WHERE producte = 'formatge-curat'"); err != nil || curat != 5 {
		t.Errorf("formatge-curat: %d units (%v), want 5: the order beyond the stock must change nothing", curat, err)
	}
	dead := f.consumeAll(dlq, 1)
	if len(dead) < 1 || header(dead[0], "id_esdeveniment") == "" || !strings.Contains(header(dead[0], "motiu"), "estoc insuficient de formatge-curat") {
		t.Fatalf("dead-letter topic: %d records, first headers %v", len(dead), dead[0].Headers)
	}
	dups := strings.Count(out1.String()+out2.String(), ": duplicat")
	if t.Failed() {
		return
	}
	t.Logf("%d orders: stock decremented once each; the consumer met %d duplicates (outboxd's and its own crash's), 1 order dead-lettered", n, dups)
	d.term()
}

// consumeAll reads every record the fixture's topic holds, once it holds
// at least atLeast (waiting up to a minute for them).
func (f *fixture) consumeAll(topic string, atLeast int) []kafka.Message {
	f.t.Helper()
	eventually(f.t, 60*time.Second, fmt.Sprintf("%d records in %s", atLeast, topic), func() bool { return f.topicSize(topic) >= int64(atLeast) })
	n := f.topicSize(topic)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	all, err := testenv.Consume(ctx, env.KafkaBrokers, topic, int(n))
	if err != nil {
		f.t.Fatalf("consume %s: %v", topic, err)
	}
	return all
}

// syncBuffer is a bytes.Buffer a process writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
