package republish

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/envelope"
)

func TestTextArray(t *testing.T) {
	got := string(textArray([][]byte{[]byte("a"), []byte(`b"c`), []byte(`d\e`), []byte("")}))
	if want := `{"a","b\"c","d\\e",""}`; got != want {
		t.Fatalf("textArray = %s, want %s", got, want)
	}
}

// fakeProducer hands each record to produce, after copying it as the sink
// does.
type fakeProducer struct {
	produce func(r *outboxd.Record) error
}

func (p *fakeProducer) Produce(r *outboxd.Record) error {
	c := *r
	c.Key = append([]byte(nil), r.Key...)
	c.Value = append([]byte(nil), r.Value...)
	c.Headers = append([]outboxd.Header(nil), r.Headers...)
	return p.produce(&c)
}

func testBinding(t *testing.T, dlq string) (*envelope.Router, []*envelope.Binding) {
	t.Helper()
	route := envelope.Route{Schema: "public", Table: "outbox", Topic: "comandes", DeadLetterTopic: dlq,
		Columns: envelope.Columns{ID: "id", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "carrega", CreatEn: "creat_en"}}
	router, err := envelope.NewRouter("comandes", []envelope.Route{route}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	rel := &pglogrepl.RelationMessage{Namespace: "public", RelationName: "outbox"}
	for _, c := range []struct {
		name string
		oid  uint32
	}{{"id", 2950}, {"agregat_id", 25}, {"tipus", 25}, {"versio", 23}, {"carrega", 3802}, {"creat_en", 1184}} {
		rel.Columns = append(rel.Columns, &pglogrepl.RelationMessageColumn{Name: c.name, DataType: c.oid})
	}
	return router, router.Bind(rel)
}

func testRow(i int, versio string) []envelope.Column {
	text := func(s string) envelope.Column {
		return envelope.Column{Kind: pglogrepl.TupleDataTypeText, Data: []byte(s)}
	}
	return []envelope.Column{text(fmt.Sprintf("00000000-0000-4000-8000-%012d", i)), text("P-1"), text("comanda.creada"),
		text(versio), text(`{"n": 1}`), text("2026-12-03 10:00:00.123456+00")}
}

// The publisher never has more than max records in flight, and returns from
// drain only once every one was acknowledged.
func TestPublisherBoundsInFlight(t *testing.T) {
	router, b := testBinding(t, "")
	var mu sync.Mutex
	var waiting []outboxd.Acker
	maxSeen := 0
	prod := &fakeProducer{produce: func(r *outboxd.Record) error {
		mu.Lock()
		defer mu.Unlock()
		waiting = append(waiting, r.Ack)
		maxSeen = max(maxSeen, len(waiting))
		return nil
	}}
	p := newPublisher(router, prod, limits{maxInFlight: 3}, nil, "test", hclog.NewNullLogger())
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		for i := 0; i < 20; i++ {
			if err := p.row(ctx, b, testRow(i, "1")); err != nil {
				done <- err
				return
			}
		}
		done <- p.drain(ctx)
	}()
	acked := 0
	for acked < 20 {
		mu.Lock()
		var ack outboxd.Acker
		if len(waiting) > 0 {
			ack, waiting = waiting[0], waiting[1:]
		}
		mu.Unlock()
		if ack == nil {
			select {
			case err := <-done:
				t.Fatalf("finished with %d of 20 acknowledged: %v", acked, err)
			default:
			}
			time.Sleep(time.Millisecond)
			continue
		}
		ack.Ack(nil)
		acked++
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if maxSeen > 3 {
		t.Fatalf("%d records in flight, want at most 3", maxSeen)
	}
	if st := p.state(); st.Read != 20 || st.Acked != 20 || !st.Finished {
		t.Fatalf("progress %+v", st)
	}
}

// A bad row stops the publication on a stop route, and becomes a
// dead-letter record on a dead_letter route; a record the broker refuses is
// replaced by its dead-letter record; a delivery failure is returned.
func TestPublisherBadRowsAndFailures(t *testing.T) {
	ctx := context.Background()
	ackAll := func(topics *[]string) *fakeProducer {
		return &fakeProducer{produce: func(r *outboxd.Record) error {
			*topics = append(*topics, r.Topic)
			r.Ack.Ack(nil)
			return nil
		}}
	}

	router, b := testBinding(t, "")
	var topics []string
	p := newPublisher(router, ackAll(&topics), limits{maxInFlight: 10}, nil, "test", hclog.NewNullLogger())
	err := p.row(ctx, b, testRow(1, "dos"))
	var perm *PermanentError
	if !errors.As(err, &perm) || len(topics) != 0 {
		t.Fatalf("bad row on a stop route: %v, produced %v", err, topics)
	}

	router, b = testBinding(t, "comandes.dlq")
	topics = nil
	p = newPublisher(router, ackAll(&topics), limits{maxInFlight: 10}, nil, "test", hclog.NewNullLogger())
	if err := p.row(ctx, b, testRow(1, "dos")); err != nil {
		t.Fatal(err)
	}
	if err := p.drain(ctx); err != nil || len(topics) != 1 || topics[0] != "comandes.dlq" || p.state().Dead != 1 {
		t.Fatalf("bad row on a dead_letter route: %v, produced %v, %+v", err, topics, p.state())
	}

	topics = nil
	refuse := &fakeProducer{produce: func(r *outboxd.Record) error {
		topics = append(topics, r.Topic)
		if r.Topic == "comandes" {
			r.Ack.Ack(&outboxd.RefusedError{Topic: r.Topic, Key: r.Key, Headers: r.Headers, Size: 100, Err: errors.New("MESSAGE_TOO_LARGE")})
		} else {
			r.Ack.Ack(nil)
		}
		return nil
	}}
	p = newPublisher(router, refuse, limits{maxInFlight: 10}, nil, "test", hclog.NewNullLogger())
	if err := p.row(ctx, b, testRow(2, "1")); err != nil {
		t.Fatal(err)
	}
	if err := p.drain(ctx); err != nil || fmt.Sprint(topics) != "[comandes comandes.dlq]" {
		t.Fatalf("refused record: %v, produced %v", err, topics)
	}

	failure := errors.New("NOT_ENOUGH_REPLICAS")
	fail := &fakeProducer{produce: func(r *outboxd.Record) error { r.Ack.Ack(failure); return nil }}
	p = newPublisher(router, fail, limits{maxInFlight: 10}, nil, "test", hclog.NewNullLogger())
	if err := p.row(ctx, b, testRow(3, "1")); err != nil {
		t.Fatal(err)
	}
	if err := p.drain(ctx); !errors.Is(err, failure) {
		t.Fatalf("drain after a failed delivery: %v, want %v", err, failure)
	}
}

// A broker that acknowledges nothing fails the publication after the
// delivery timeout instead of holding it for ever.
func TestPublisherDeliveryTimeout(t *testing.T) {
	router, b := testBinding(t, "")
	silent := &fakeProducer{produce: func(r *outboxd.Record) error { return nil }}
	p := newPublisher(router, silent, limits{maxInFlight: 10, deliveryTimeout: 50 * time.Millisecond}, nil, "test", hclog.NewNullLogger())
	if err := p.row(context.Background(), b, testRow(1, "1")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := p.drain(context.Background())
	if err == nil || !strings.Contains(err.Error(), "acknowledged nothing") || time.Since(start) > 5*time.Second {
		t.Fatalf("drain with a silent broker: %v after %s", err, time.Since(start))
	}
}
