package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/outboxd/outboxd/envelope"
)

type nopAck struct{}

func (nopAck) Ack(error) {}

// BenchmarkSpan: one record's span, started, placed and ended, exported
// over OTLP/HTTP to a receiver that reads and drops each request (the
// collector's own cost is not in it).
func BenchmarkSpan(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer srv.Close()
	tr, err := New(Config{Endpoint: srv.URL, SampleRatio: 1, Propagate: true, ServiceName: "outboxd", QueueSize: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		rec := record(sampled)
		a := tr.Start(rec, envelope.Position{CommitLSN: 1 << 20, CommitTime: 1}, "", nopAck{})
		a.(interface{ Place(int32, int64) }).Place(1, int64(i))
		a.Ack(nil)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	c := tr.Counts()
	b.ReportMetric(float64(c.Started-c.Exported), "dropped")
}
