package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// leftovers lists processes whose command line mentions dir and looks like a
// broker or a postmaster.
func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var out []string
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil || len(b) == 0 {
			continue
		}
		cl := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cl, dir) && (strings.Contains(cl, "kafka.Kafka") || strings.Contains(cl, "postgres")) {
			out = append(out, filepath.Base(filepath.Dir(f))+": "+cl)
		}
	}
	return out
}

func TestEnv(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED: -short: TestEnv starts a real PostgreSQL and Kafka")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// Cycle 1: full exercise, with an extra listener advertised elsewhere.
	proxy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	e, err := Start(Options{Listeners: []Listener{{Name: "PROXIED", Advertise: proxy.Addr().String()}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Cleanup)
	t.Logf("dir=%s pg=%s kafka=%s", e.Dir, e.PGDSN, e.KafkaBrokers)

	const topic = "testenv.events"
	if err := e.CreateTopic(topic, 3); err != nil {
		t.Fatal(err)
	}
	w := &kafka.Writer{
		Addr:         kafka.TCP(e.KafkaBrokers),
		Topic:        topic,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond,
	}
	var msgs []kafka.Message
	for i := 0; i < 10; i++ {
		msgs = append(msgs, kafka.Message{
			Key:     []byte(fmt.Sprintf("k%d", i)),
			Value:   []byte(fmt.Sprintf("v%d", i)),
			Headers: []kafka.Header{{Key: "h", Value: []byte(fmt.Sprint(i))}},
		})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	check := func(label string) {
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		defer ccancel()
		got, err := Consume(cctx, e.KafkaBrokers, topic, 10)
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		seen := map[string]string{}
		parts := map[int]bool{}
		for _, m := range got {
			seen[string(m.Key)] = string(m.Value)
			parts[m.Partition] = true
			if len(m.Headers) != 1 || m.Headers[0].Key != "h" || m.Time.IsZero() {
				t.Errorf("%s: bad message %+v", label, m)
			}
		}
		for i := 0; i < 10; i++ {
			if seen[fmt.Sprintf("k%d", i)] != fmt.Sprintf("v%d", i) {
				t.Errorf("%s: missing k%d (got %v)", label, i, seen)
			}
		}
		t.Logf("%s: %d messages over %d partitions", label, len(got), len(parts))
	}
	check("consume")

	// Exactly 10, no more.
	xctx, xcancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	all, err := Consume(xctx, e.KafkaBrokers, topic, 0)
	xcancel()
	if err != nil || len(all) != 10 {
		t.Fatalf("consume all: %d messages, err %v", len(all), err)
	}

	seed, err := SeedSchema()
	if err != nil {
		t.Fatal(err)
	}
	dsn, err := e.CreateDatabase("outboxd_test", seed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.CreateDatabase("outboxd_test", seed); err != nil {
		t.Fatalf("second CreateDatabase: %v", err)
	}
	walLevel := func() string {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var lvl, db string
		if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&lvl); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
			t.Fatal(err)
		}
		if db != "outboxd_test" {
			t.Fatalf("connected to %q", db)
		}
		return lvl
	}
	if lvl := walLevel(); lvl != "logical" {
		t.Fatalf("wal_level = %q, want logical", lvl)
	}

	// The extra listener answers metadata with the address it advertises.
	listenerAdvertises := func(label string) {
		addr, err := e.KafkaListener("PROXIED")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := kafka.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		defer conn.Close()
		b, err := conn.Brokers()
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		if len(b) != 1 || net.JoinHostPort(b[0].Host, fmt.Sprint(b[0].Port)) != proxy.Addr().String() {
			t.Fatalf("%s: listener PROXIED at %s advertises %+v, want %s", label, addr, b, proxy.Addr())
		}
	}
	listenerAdvertises("first start")

	{
		// Crash + restart: same address, data kept.
		if err := e.KillKafka(); err != nil {
			t.Fatal(err)
		}
		if err := e.StartKafka(); err != nil {
			t.Fatal(err)
		}
		check("after kafka kill+start")
		listenerAdvertises("after kafka kill+start")
		if err := e.RestartPG("immediate"); err != nil {
			t.Fatal(err)
		}
		if lvl := walLevel(); lvl != "logical" {
			t.Fatalf("after restart wal_level = %q", lvl)
		}
	}

	cleanedUp(t, e)

	// Cycle 2: PostgreSQL alone, wal_level=replica; Cleanup again leaves
	// nothing behind.
	e2, err := Start(Options{NoKafka: true, WALLevel: "replica"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e2.Cleanup)
	if e2.Dir == e.Dir || e2.KafkaBrokers != "" {
		t.Fatalf("second Start: dir %s (first %s), brokers %q", e2.Dir, e.Dir, e2.KafkaBrokers)
	}
	if dsn, err = e2.CreateDatabase("outboxd_test", ""); err != nil {
		t.Fatal(err)
	}
	if lvl := walLevel(); lvl != "replica" {
		t.Fatalf("wal_level = %q, want replica", lvl)
	}
	cleanedUp(t, e2)
}

// cleanedUp runs Cleanup and requires that it leaves no process and no
// state folder behind.
func cleanedUp(t *testing.T, e *Env) {
	t.Helper()
	e.Cleanup()
	if l := leftovers(t, e.Dir); len(l) > 0 {
		t.Fatalf("processes left after Cleanup: %v", l)
	}
	if _, err := os.Stat(e.Dir); !os.IsNotExist(err) {
		t.Fatalf("%s still exists (err %v)", e.Dir, err)
	}
}

// TestConfigYAML: the file a Config writes, keys set by the caller winning
// over the ones Config writes itself.
func TestConfigYAML(t *testing.T) {
	c := Config{
		DSN: "postgres://x", Brokers: "127.0.0.1:1, 127.0.0.1:2", Slot: "s1",
		Routes: []Route{
			{Table: "public.outbox", Topic: "t1"},
			{Table: "pagaments.outboxevent", Topic: "t2", More: Section{"on_error": "dead_letter", "dead_letter_topic": "t2.dlq"}},
		},
		Postgres: Section{"publication": "p1", "status_interval": "200ms"},
		Kafka:    Section{"partitioner": "crc32"},
		Health:   Section{"listen": `"127.0.0.1:9"`},
	}
	want := `origen: comandes
postgres:
  dsn: "${TEST_DSN}"
  slot: s1
  publication: p1
  status_interval: 200ms
kafka:
  brokers: ["127.0.0.1:1", "127.0.0.1:2"]
  partitioner: crc32
routes:
  - table: public.outbox
    topic: t1
  - table: pagaments.outboxevent
    topic: t2
    dead_letter_topic: t2.dlq
    on_error: dead_letter
health:
  listen: "127.0.0.1:9"
`
	if got := c.YAML(); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}

// TestOptionsEnviron: the options reach the scripts as their settings; a
// listener is NAME[:PROTOCOL][=HOST:PORT] (kafka.sh).
func TestOptionsEnviron(t *testing.T) {
	t.Setenv("OUTBOXD_PG_VERSION", "")
	t.Setenv("OUTBOXD_KAFKA_VERSION", "3.9.1")
	got, err := Options{PostgresTLS: true, CommitTimestamps: true, PGVersion: "17", Listeners: []Listener{
		{Name: "PROXIED", Advertise: "127.0.0.1:4000"}, {Name: "SASL_SSL", Protocol: "SASL_SSL"}, {Name: "MTLS", Protocol: "SSL", Advertise: "localhost:4001"}}}.environ()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"PG_VERSION=17", "PG_WAL_LEVEL=logical", "PG_SSL=on", "PG_COMMIT_TS=on", "KAFKA_VERSION=3.9.1", "KAFKA_AUTO_CREATE=true", "KAFKA_ACLS=off", "KAFKA_LISTENERS=PROXIED=127.0.0.1:4000,SASL_SSL:SASL_SSL,MTLS:SSL=localhost:4001"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got %q\nwant %q", got, want)
	}
	if _, err := (Options{Listeners: []Listener{{Protocol: "SSL"}}}).environ(); err == nil {
		t.Error("a listener without a name")
	}
}
