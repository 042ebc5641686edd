package integration_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// TestTracingSpans: with tracing on, a real OpenTelemetry Collector (built
// from its Go modules, OTLP/HTTP in) receives exactly one span per record:
// a producer span from the commit to Kafka's acknowledgement, the child of
// the row's traceparent when it has a sampled one, a root otherwise, with
// the topic, the partition and offset Kafka gave the record, and the
// commit LSN; the record's traceparent header is the span's (consumers
// continue from it). A row whose traceparent is not sampled gets no span
// and keeps its header. Rows of the cut-over snapshot have spans too,
// named by their source.
func TestTracingSpans(t *testing.T) {
	kafkaOnly(t)
	col, err := testenv.StartCollector(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = col.Stop() })
	f := newFixture(t, seedSchema+"\nALTER TABLE outbox ADD COLUMN traceparent TEXT, ADD COLUMN tracestate TEXT;", map[string]int{"traced": 3})
	ctx := context.Background()
	topic := f.topic("traced")

	// Pending before outboxd starts: the cut-over snapshot publishes them.
	snapshot := insertRows(t, f.db, "outbox", 3, "now()", false)
	cfg := f.config(testenv.Route{Table: "public.outbox", Topic: topic, More: testenv.Section{
		"trace": "{traceparent: traceparent, tracestate: tracestate}"}})
	// The spans carry the row ids only when asked (tracing.record_keys):
	// this test finds each row's span by its id.
	cfg.Tracing = testenv.Section{"endpoint": col.Endpoint, "record_keys": "true"}
	// The SDK's batch processor sends every 200 ms instead of 5 s.
	cfg.Env = append(cfg.Env, "OTEL_BSP_SCHEDULE_DELAY=200")
	d := f.start(cfg)

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentOf := map[string]string{} // row id: the span id of its traceparent
	unsampled := map[string]string{}
	tx, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 24 {
		tp, ts := "", ""
		switch i % 3 {
		case 0: // sampled
			tp, ts = fmt.Sprintf("00-%s-%016x-01", traceID, 0xa000+i), "congo=t61rcWkgMzE"
		case 1: // not sampled
			tp = fmt.Sprintf("00-%s-%016x-00", traceID, 0xb000+i)
		}
		var id string
		if err := tx.QueryRow(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega, traceparent, tracestate)
			VALUES (gen_random_uuid(), 'comanda', 'P-' || $1::int % 5, 'comanda.creada', '{"n": 1}', NULLIF($2, ''), NULLIF($3, '')) RETURNING id::text`,
			i, tp, ts).Scan(&id); err != nil {
			t.Fatal(err)
		}
		switch i % 3 {
		case 0:
			parentOf[id] = tp[36:52]
		case 1:
			unsampled[id] = tp
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var commitLSN string
	if err := f.db.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&commitLSN); err != nil {
		t.Fatal(err)
	}
	fromSnapshot := map[string]bool{}
	for _, r := range snapshot {
		fromSnapshot[r.id] = true
	}

	msgs := consumeExactly(t, topic, 3+24)
	want := len(msgs) - len(unsampled)
	var spans []testenv.Span
	eventually(t, 30*time.Second, fmt.Sprintf("the collector holds %d spans", want), func() bool {
		spans, err = col.Spans()
		return err == nil && len(spans) >= want
	})
	// /metrics counts them: as many sent as the collector holds.
	_, body, err := d.Get(ctx, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{fmt.Sprintf("outboxd_trace_spans_started_total %d", want), fmt.Sprintf("outboxd_trace_spans_exported_total %d", want), "outboxd_trace_spans_failed_total 0"} {
		if !strings.Contains(string(body), "\n"+line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	d.term()
	if err := d.exited(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if spans, err = col.Spans(); err != nil {
		t.Fatal(err)
	}

	byID := map[string]testenv.Span{}
	for _, s := range spans {
		id := s.Attributes["messaging.message.id"]
		if _, dup := byID[id]; dup {
			t.Errorf("two spans for the record of row %s", id)
		}
		byID[id] = s
	}
	if len(spans) != want {
		t.Errorf("%d spans, want %d (one per record, none for a row whose traceparent is not sampled)", len(spans), want)
	}
	hexID := regexp.MustCompile(`^[0-9a-f]{16}$`)
	for _, m := range msgs {
		id := header(m, "id_esdeveniment")
		if tp, ok := unsampled[id]; ok {
			if _, has := byID[id]; has {
				t.Errorf("row %s, whose traceparent is not sampled, has a span", id)
			}
			if got := header(m, "traceparent"); got != tp {
				t.Errorf("row %s: traceparent %q, want the row's %q unchanged", id, got, tp)
			}
			continue
		}
		s, ok := byID[id]
		if !ok {
			t.Errorf("row %s (%s/%d@%d) has no span", id, m.Topic, m.Partition, m.Offset)
			continue
		}
		if s.Service != "outboxd" || s.Kind != 4 || s.Name != "send "+topic {
			t.Errorf("row %s: span of %q, kind %d, name %q; want outboxd's producer span \"send %s\"", id, s.Service, s.Kind, s.Name, topic)
		}
		a := s.Attributes
		if a["messaging.system"] != "kafka" || a["messaging.destination.name"] != topic || a["messaging.kafka.message.key"] != string(m.Key) {
			t.Errorf("row %s: attributes %v", id, a)
		}
		if a["messaging.destination.partition.id"] != strconv.Itoa(m.Partition) || a["messaging.kafka.offset"] != strconv.FormatInt(m.Offset, 10) {
			t.Errorf("row %s: span says partition %s offset %s, Kafka holds it at %d/%d", id,
				a["messaging.destination.partition.id"], a["messaging.kafka.offset"], m.Partition, m.Offset)
		}
		if s.StatusCode == 2 || s.End < s.Start || s.Start == 0 {
			t.Errorf("row %s: status %d %q, %d..%d", id, s.StatusCode, s.Status, s.Start, s.End)
		}
		// The record carries the span: a consumer's span is its child.
		if tp := header(m, "traceparent"); tp != "00-"+s.TraceID+"-"+s.SpanID+"-01" {
			t.Errorf("row %s: record's traceparent %q, span %s/%s", id, tp, s.TraceID, s.SpanID)
		}
		if fromSnapshot[id] {
			if !strings.HasPrefix(a["outboxd.source"], "snapshot ") || a["outboxd.commit_lsn"] != "" {
				t.Errorf("snapshot row %s: source %q, commit_lsn %q", id, a["outboxd.source"], a["outboxd.commit_lsn"])
			}
		} else {
			if l := a["outboxd.commit_lsn"]; l == "" || lsn(t, l) > lsn(t, commitLSN) || a["outboxd.source"] != "" {
				t.Errorf("streamed row %s: commit_lsn %q (the WAL was at %s after its commit), source %q", id, l, commitLSN, a["outboxd.source"])
			}
		}
		if p, ok := parentOf[id]; ok {
			if s.TraceID != traceID || s.ParentSpanID != p {
				t.Errorf("row %s: span in trace %s under %q, want the row's trace %s under %s", id, s.TraceID, s.ParentSpanID, traceID, p)
			}
			if header(m, "tracestate") != "congo=t61rcWkgMzE" {
				t.Errorf("row %s: tracestate %q", id, header(m, "tracestate"))
			}
		} else if s.ParentSpanID != "" || s.TraceID == traceID || !hexID.MatchString(s.SpanID) {
			t.Errorf("row %s without a traceparent: span %s/%s under %q, want a root of a trace of its own", id, s.TraceID, s.SpanID, s.ParentSpanID)
		}
	}
	if !strings.Contains(d.Log(), "exported=") {
		t.Errorf("no tracing summary at exit")
	}
}
