package integration_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// TestMissingTopicAutoCreated: like the Java producer, outboxd asks the
// broker to create a missing topic; with auto.create.topics.enable=true (the
// test broker's setting) the events arrive.
func TestMissingTopicAutoCreated(t *testing.T) {
	f := newFixture(t, seedSchema, nil)
	ctx := context.Background()
	topic := f.name + ".autocreada"
	d := f.start(f.config(seedRoute(topic)))
	w := newWriter(f, 12, 5, "outbox")
	for i := 0; i < 5; i++ {
		if err := w.txn(ctx, 2); err != nil {
			t.Fatal(err)
		}
	}
	f.topics[topic] = 1 // the broker's num.partitions
	rep := w.verify(ctx, topic, "murmur2")
	t.Logf("auto-created topic: %+v", rep)
	d.term()
}

// TestMissingTopicWithoutAutoCreationStops: on a broker that does not
// auto-create topics, a route to a missing topic stops outboxd with an error
// that names the topic and the fix, and the slot does not pass the row.
func TestMissingTopicWithoutAutoCreationStops(t *testing.T) {
	needEnv(t)
	strict, err := testenv.Start(testenv.Options{NoPostgres: true, NoAutoCreateTopics: true})
	if err != nil {
		t.Fatalf("start a broker without auto-creation: %v", err)
	}
	t.Cleanup(strict.Cleanup)
	f := newFixture(t, seedSchema, nil)
	ctx := context.Background()
	topic := f.name + ".inexistent"
	cfg := f.config(seedRoute(topic))
	cfg.Brokers = strict.KafkaBrokers
	d := f.start(cfg)
	w := newWriter(f, 32, 2, "outbox")
	if err := w.txn(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := d.exited(60 * time.Second); err == nil {
		t.Fatal("outboxd exited 0")
	}
	if log := d.Log(); !strings.Contains(log, topic) || !strings.Contains(log, "does not exist") || !strings.Contains(log, "create it") {
		t.Fatalf("the error does not name the topic and the fix:\n%s", log)
	}
	if passed := f.slotPassed(w.committed...); len(passed) > 0 {
		c, _ := f.slot()
		t.Fatalf("the slot passed the rows %v: confirmed at %s", passed, c)
	}
}
