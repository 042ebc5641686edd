package integration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// TestLargeRowNotSkippedAfterBatchBytesRaised (issue 32, item 3): on a
// broker that does not create topics, a route with on_error: dead_letter
// whose dead-letter topic does not exist yet; a 1.2 MB row of aggregate A
// (over kafka.batch_bytes: a bad row), then 20 small rows of A. The 20
// reach the topic; outboxd stops on the missing dead-letter topic, the
// slot before the large row. The operator creates the dead-letter topic,
// raises kafka.batch_bytes to 4 MiB as the error said, and starts it
// again: the large row ends in the topic (or the dead-letter topic), never
// in neither. On 15e28a1 the 20 small rows carried positions that proved
// the large row delivered: it was skipped, and the slot confirmed past it.
func TestLargeRowNotSkippedAfterBatchBytesRaised(t *testing.T) {
	kafkaOnly(t)
	needEnv(t)
	strict := startEnv(t, "a broker without auto-creation", testenv.Options{NoPostgres: true, NoAutoCreateTopics: true})
	f := newFixture(t, seedSchema, nil)
	ctx := context.Background()
	topic, dlq := f.topic("comandes"), f.topic("comandes.dlq")
	if err := testenv.CreateTopicWith(ctx, strict.KafkaBrokers, topic, 1, map[string]string{"max.message.bytes": "8388608"}); err != nil {
		t.Fatal(err)
	}
	cfg := f.config(dlqRoute(topic, dlq))
	cfg.Brokers = strict.KafkaBrokers
	d := f.start(cfg)
	const large = "00000000-0000-4000-8000-00000000f001"
	insert := func(id, carrega string) {
		t.Helper()
		if _, err := f.db.Exec(ctx, "INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega) VALUES ($1, 'comanda', 'A', 'comanda.creada', $2)", id, carrega); err != nil {
			t.Fatal(err)
		}
	}
	insert(large, `{"farciment": "`+randomText(3, 1200<<10)+`"}`)
	for i := range 20 {
		insert(fmt.Sprintf("00000000-0000-4000-8000-%012d", 0xa000+i), `{"n": 1}`)
	}
	if err := d.exited(90 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 with its dead-letter topic missing")
	}
	if log := d.Log(); !strings.Contains(log, dlq) {
		t.Fatalf("outboxd did not stop on the missing dead-letter topic:\n%s", lastLines(log, 5))
	}
	if passed := f.slotPassed(large); len(passed) > 0 {
		t.Fatalf("the slot passed the large row before Kafka had it")
	}
	if err := testenv.CreateTopicWith(ctx, strict.KafkaBrokers, dlq, 1, nil); err != nil {
		t.Fatal(err)
	}
	cfg.Kafka["batch_bytes"] = "4194304"
	d = f.start(cfg)
	f.waitConfirmed(f.walLSN(), 60*time.Second)
	where := map[string][]string{}
	for _, tp := range []string{topic, dlq} {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		msgs, err := testenv.Consume(cctx, strict.KafkaBrokers, tp, 0) // all of it, until the deadline
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			id := header(m, "id_esdeveniment") // a dead-letter record's too
			where[id] = append(where[id], tp)
		}
	}
	skipped := d.Metric(ctx, "outboxd_duplicates_skipped_total", topic)
	t.Logf("the large row is in %v; %d records, %v skipped as duplicates", where[large], len(where), skipped)
	if len(where[large]) == 0 {
		t.Errorf("the large row is in neither %s nor %s, and the slot passed it (%v records skipped as duplicates)", topic, dlq, skipped)
	}
	for i := range 20 {
		if id := fmt.Sprintf("00000000-0000-4000-8000-%012d", 0xa000+i); len(where[id]) == 0 {
			t.Errorf("small row %s is missing", id)
		}
	}
	d.term()
}
