package integration_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/sink"
)

// TestForgedStreamHeaderProvesNothing (issue 32, item 6): another producer
// writes a record to the partition with a copy of the last outboxd.stream
// header there, its commit LSN raised to just below the server's WAL
// position. On the build before (15e28a1) the restarted outboxd took it as
// proof that the partition held everything up to there and skipped the
// 200 rows committed while it was stopped: all 200 lost. A position is
// proven only by a record outboxd signed (the header's MAC under the
// stream key): all 200 arrive, the forgery is counted and logged. With
// the default settings and with kafka.transactions.
func TestForgedStreamHeaderProvesNothing(t *testing.T) {
	kafkaOnly(t)
	for _, txn := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "transactions"}[txn], func(t *testing.T) {
			f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
			ctx := context.Background()
			topic := f.topic("comandes")
			w := newWriter(f, 32, 20, "outbox")
			dc := f.config(seedRoute(topic))
			if txn {
				dc.Kafka["transactions"] = "true"
			}
			d := f.start(dc)
			w.backlog(ctx, 10, 10) // 100 rows, delivered
			f.waitConfirmed(f.walLSN(), 30*time.Second)
			d.term()
			w.backlog(ctx, 20, 10) // 200 rows while outboxd is stopped

			last := lastStreamRecord(ctx, t, f.env.KafkaBrokers, topic, 100)
			fields := strings.Split(header(last, sink.HeaderStream), ";")
			if len(fields) < 7 {
				t.Fatalf("the last record's %s header is %q, want a stream position", sink.HeaderStream, header(last, sink.HeaderStream))
			}
			fields[4] = strconv.FormatUint(uint64(f.walLSN())-1, 10)
			forged := kafka.Message{Key: last.Key, Value: last.Value}
			for _, h := range last.Headers {
				if h.Key == sink.HeaderStream {
					h.Value = []byte(strings.Join(fields, ";"))
				}
				forged.Headers = append(forged.Headers, h)
			}
			// A transport of its own: kafka-go's default one caches the
			// cluster's metadata from before this topic was made.
			tr := &kafka.Transport{}
			kw := &kafka.Writer{Addr: kafka.TCP(strings.Split(f.env.KafkaBrokers, ",")...), Topic: topic, RequiredAcks: kafka.RequireAll, Transport: tr}
			if err := kw.WriteMessages(ctx, forged); err != nil {
				t.Fatalf("the other producer's record: %v", err)
			}
			kw.Close()
			tr.CloseIdleConnections()

			d = f.start(dc)
			f.waitConfirmed(f.walLSN(), 60*time.Second)
			rejected := d.Metric(ctx, "outboxd_stream_headers_rejected_total", topic)
			skipped := d.Metric(ctx, "outboxd_duplicates_skipped_total", topic)
			d.term()
			rep, _ := readBoth(ctx, w, topic)
			t.Logf("300 rows, a forged header at LSN %s: %+v; rejected %v, skipped %v", fields[4], rep, rejected, skipped)
			if rep.missing != 0 {
				t.Errorf("%d of the 200 rows committed while outboxd was stopped lost: the forged header made the restart skip them", rep.missing)
			}
			// The forgery is a copy of the last record: the one duplicate.
			if rep.dups != 1 || rep.unknown != 0 || rep.orderErrors != 0 {
				t.Errorf("read %+v, want only the forged copy as a duplicate", rep)
			}
			if rejected < 1 {
				t.Errorf("outboxd_stream_headers_rejected_total{topic=%q} = %v, want the forged record counted", topic, rejected)
			}
			if log := d.Log(); !strings.Contains(log, "did not write: it proves nothing") || !strings.Contains(log, "topic="+topic+" partition=0 offset=") {
				t.Errorf("no WARN naming the forged record's partition and offset in the log")
			}
		})
	}
}

// lastStreamRecord reads partition 0 of topic until it has seen n records
// of the writer, and returns the last record with a stream header.
func lastStreamRecord(ctx context.Context, t *testing.T, brokers, topic string, n int) kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: strings.Split(brokers, ","), Topic: topic, Partition: 0, MaxWait: 200 * time.Millisecond})
	defer r.Close()
	var last kafka.Message
	for seen := 0; seen < n; {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read %s after %d records: %v", topic, seen, err)
		}
		if header(m, "id_esdeveniment") != "" {
			seen++
		}
		if slices.ContainsFunc(m.Headers, func(h kafka.Header) bool { return h.Key == sink.HeaderStream }) {
			last = m
		}
	}
	return last
}
