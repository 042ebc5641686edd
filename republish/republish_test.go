package republish

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/publish"
	"github.com/outboxd/outboxd/publish/publishtest"
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

// TestPublicationProgress: a publication's progress counts the rows read,
// the records made of them (dead-letter records of bad rows included), the
// records acknowledged (replacements of refused ones included) and the
// dead-lettered; a bad row on a route without a dead-letter topic stops it
// with the way out, as a permanent error.
func TestPublicationProgress(t *testing.T) {
	ctx := context.Background()
	router, b := publishtest.Outbox(t, "")
	var topics []string
	ackAll := &fakeProducer{produce: func(r *outboxd.Record) error {
		topics = append(topics, r.Topic)
		r.Ack.Ack(nil)
		return nil
	}}
	p := newPublication(publish.Config{Router: router, Producer: ackAll, MaxEvents: 10, Source: "test", Log: hclog.NewNullLogger()}, nil)
	err := p.row(ctx, b, publishtest.Row(1, "dos"))
	var perm interface{ Permanent() string }
	if !errors.As(err, &perm) || !strings.HasSuffix(err.Error(), "(the row then goes to that topic with the reason) and start again") || len(topics) != 0 {
		t.Fatalf("bad row on a stop route: %v, produced %v", err, topics)
	}

	router, b = publishtest.Outbox(t, "comandes.dlq")
	refuseFirst := &fakeProducer{produce: func(r *outboxd.Record) error {
		topics = append(topics, r.Topic)
		if r.Topic == "comandes" && len(topics) == 1 {
			r.Ack.Ack(&outboxd.RefusedError{Topic: r.Topic, Key: r.Key, Headers: r.Headers, Size: 100, Err: errors.New("MESSAGE_TOO_LARGE")})
		} else {
			r.Ack.Ack(nil)
		}
		return nil
	}}
	p = newPublication(publish.Config{Router: router, Producer: refuseFirst, MaxEvents: 10, Source: "test", Log: hclog.NewNullLogger()}, nil)
	for i, versio := range []string{"1", "dos", "1"} {
		if err := p.row(ctx, b, publishtest.Row(i, versio)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.drain(ctx); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(topics) != "[comandes comandes.dlq comandes.dlq comandes]" {
		t.Fatalf("produced %v", topics)
	}
	if st := p.state(); st != (Progress{Read: 3, Records: 3, Acked: 3, Dead: 2, Finished: true}) {
		t.Fatalf("progress %+v", st)
	}
}
