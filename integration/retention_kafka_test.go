package integration_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// TestDedupeAfterKafkaRetention (issue 32, item 1): Kafka's own retention
// deletes a partition's oldest records (retention.ms after a week,
// DeleteRecords at once). A session's restart de-duplication reads each
// partition's tail before its first record; below the log start the fetch
// is refused, and a partition retention emptied holds nothing to read.
// Neither may hold the new rows back: after a kill -9 and a restart, rows
// committed then reach Kafka within seconds, every one once. On 15e28a1
// none of them arrived: the tail read was retried for ever, and the
// session ended on "broker presumed unreachable", session after session.
func TestDedupeAfterKafkaRetention(t *testing.T) {
	kafkaOnly(t)
	cases := []struct {
		name       string
		partitions int
		configs    map[string]string // the topic's
		rows       int               // delivered before the kill
		// trim deletes records of the delivered topic and says which
		// partitions it emptied.
		trim func(t *testing.T, f *fixture, topic string)
	}{
		{
			// 600 records, those below offset 300 deleted: the first
			// window (the last 512) starts below the log start.
			name: "records deleted below the window", partitions: 1, rows: 600,
			trim: func(t *testing.T, f *fixture, topic string) {
				deleteBelow(t, f, topic, map[int]int64{0: 300})
			},
		},
		{
			// retention.ms deletes every closed segment, then the active
			// one is rolled and deleted too: the log start reaches the end.
			name: "a partition emptied by retention.ms", partitions: 1, rows: 100,
			configs: map[string]string{"retention.ms": "3000", "segment.ms": "1000"},
			trim: func(t *testing.T, f *fixture, topic string) {
				eventually(t, 90*time.Second, "retention to empty the partition", func() bool {
					start, end := offsetsOf(t, f, topic, 1)
					return end[0] > 0 && start[0] == end[0]
				})
			},
		},
		{
			// Half the partitions emptied, half trimmed below their middle.
			name: "64 partitions, half emptied, half trimmed", partitions: 64, rows: 1200,
			trim: func(t *testing.T, f *fixture, topic string) {
				_, end := offsetsOf(t, f, topic, 64)
				below := map[int]int64{}
				for p := 0; p < 64; p++ {
					if p%2 == 0 {
						below[p] = -1 // up to the high watermark
					} else if end[p] > 1 {
						below[p] = end[p] / 2
					}
				}
				deleteBelow(t, f, topic, below)
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, seedSchema, nil)
			ctx := context.Background()
			topic := f.topic("comandes")
			if err := testenv.CreateTopicWith(ctx, f.env.KafkaBrokers, topic, c.partitions, c.configs); err != nil {
				t.Fatal(err)
			}
			f.topics[topic] = c.partitions
			w := newWriter(f, 32, 4*c.partitions, "outbox")
			dc := f.config(seedRoute(topic))
			d := f.start(dc)
			w.txns(ctx, c.rows/5, 9) // 5 rows a transaction on average
			f.waitConfirmed(f.walLSN(), 60*time.Second)
			c.trim(t, f, topic)
			d.kill()
			d = f.start(dc)
			before := len(w.committed)
			w.txns(ctx, 10, 9)
			fresh := w.committed[before:]
			v := &testenv.Verifier{Brokers: f.env.KafkaBrokers, Topic: topic, Partitions: c.partitions}
			v.Start(ctx)
			_, err := v.WaitSeen(ctx, fresh, 20*time.Second)
			if err == nil {
				err = v.CaughtUp(ctx, 30*time.Second)
			}
			v.Stop()
			if err != nil {
				t.Fatalf("after Kafka deleted old records and a kill -9, the new rows did not arrive: %v\n%s", err, lastLines(d.Log(), 5))
			}
			if n := v.Dups(); n != 0 {
				t.Errorf("%d records read twice", n)
			}
			if log := d.Log(); strings.Contains(log, "presumed unreachable") {
				t.Errorf("the log blames the broker:\n%s", lastLines(log, 5))
			}
			t.Logf("%d new rows delivered after the restart; tails given up: %v", len(fresh),
				d.Metric(ctx, "outboxd_dedupe_tails_given_up_total", topic))
			d.term()
		})
	}
}

// offsetsOf reads each partition's log start offset and high watermark.
func offsetsOf(t *testing.T, f *fixture, topic string, partitions int) (start, end map[int]int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start, end, err := testenv.LogOffsets(ctx, f.env.KafkaBrokers, topic, partitions)
	if err != nil {
		t.Fatal(err)
	}
	return start, end
}

// deleteBelow deletes topic's records below an offset in each partition
// (-1: all of them), as retention would, and checks the log starts moved.
func deleteBelow(t *testing.T, f *fixture, topic string, below map[int]int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	starts, err := testenv.DeleteRecords(ctx, f.env.KafkaBrokers, topic, below)
	if err != nil {
		t.Fatal(err)
	}
	for p, off := range below {
		if off > 0 && starts[p] != off {
			t.Fatalf("partition %d starts at %d after deleting below %d", p, starts[p], off)
		}
	}
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
