// Package publishtest holds what the tests of publish, replication and
// republish share: a producer that keeps what it is given and acknowledges
// nothing by itself, a clock the test moves, an outbox route and its rows.
package publishtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/envelope"
)

// Producer keeps a copy of every record it is given, with its Acker, as the
// sink copies it (a record references memory its caller reuses). It
// acknowledges nothing by itself; after Fail it fails every record, as a
// fenced producer does.
type Producer struct {
	mu      sync.Mutex
	recs    []outboxd.Record
	fail    error
	flushes int
	changes Changes // at every record
}

// Produce keeps a copy of r.
func (p *Producer) Produce(r *outboxd.Record) error {
	p.mu.Lock()
	fail := p.fail
	c := *r
	c.Key = clone(r.Key)
	c.Value = clone(r.Value)
	c.RowID = clone(r.RowID)
	c.Headers = nil
	for _, h := range r.Headers {
		c.Headers = append(c.Headers, outboxd.Header{Key: h.Key, Value: clone(h.Value)})
	}
	p.recs = append(p.recs, c)
	p.mu.Unlock()
	p.changes.Changed()
	if fail != nil {
		r.Ack.Ack(fail)
		return fail
	}
	return nil
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

// Flush counts the calls (one per committed transaction with records).
func (p *Producer) Flush() {
	p.mu.Lock()
	p.flushes++
	p.mu.Unlock()
}

// Close does nothing.
func (p *Producer) Close(context.Context) error { return nil }

// Fail makes every later record fail with err, through its Acker and
// Produce's error.
func (p *Producer) Fail(err error) {
	p.mu.Lock()
	p.fail = err
	p.mu.Unlock()
}

// Len is how many records were produced.
func (p *Producer) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.recs)
}

// Flushes is how many times Flush was called.
func (p *Producer) Flushes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.flushes
}

// Record is the i-th record produced (from 0), waiting for it at most
// 10 s: another goroutine may produce it.
func (p *Producer) Record(t testing.TB, i int) outboxd.Record {
	t.Helper()
	if !p.changes.Wait(func() bool { return p.Len() > i }) {
		t.Fatalf("no record %d produced (%d were)", i, p.Len())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.recs[i]
}

// Changes lets a test wait, without sleeping, for a condition that another
// goroutine makes true and then calls Changed.
type Changes struct {
	mu   sync.Mutex
	more chan struct{} // closed at the next Changed
}

// Changed wakes every Wait to look at its condition again.
func (c *Changes) Changed() {
	c.mu.Lock()
	if c.more != nil {
		close(c.more)
		c.more = nil
	}
	c.mu.Unlock()
}

// Wait reports whether cond holds, looking again at every Changed for at
// most 10 s.
func (c *Changes) Wait(cond func() bool) bool {
	deadline := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		if c.more == nil {
			c.more = make(chan struct{})
		}
		more := c.more
		c.mu.Unlock()
		if cond() {
			return true
		}
		select {
		case <-more:
		case <-deadline:
			return false
		}
	}
}

// Columns are the outbox's columns, as the relay named them.
var Columns = envelope.Columns{ID: "id", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "carrega", CreatEn: "creat_en"}

// Outbox is the router of one route, public.outbox to the topic comandes
// (with dlq as its dead-letter topic when set), and the table's bindings.
func Outbox(t testing.TB, dlq string) (*envelope.Router, []*envelope.Binding) {
	t.Helper()
	router, err := envelope.NewRouter("comandes", []envelope.Route{{Schema: "public", Table: "outbox", Topic: "comandes",
		DeadLetterTopic: dlq, Columns: Columns}}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return router, router.Bind(Relation())
}

// Relation is public.outbox as pgoutput describes it: Columns, with their
// types' OIDs.
func Relation() *pglogrepl.RelationMessage {
	rel := &pglogrepl.RelationMessage{Namespace: "public", RelationName: "outbox"}
	for _, c := range []struct {
		name string
		oid  uint32
	}{{"id", 2950}, {"agregat_id", 25}, {"tipus", 25}, {"versio", 23}, {"carrega", 3802}, {"creat_en", 1184}} {
		rel.Columns = append(rel.Columns, &pglogrepl.RelationMessageColumn{Name: c.name, DataType: c.oid})
	}
	return rel
}

// Row is outbox row i of the aggregate P-1, as its table holds it: a
// versio that is not a number makes it a row that cannot become a record.
func Row(i int, versio string) []envelope.Column {
	text := func(s string) envelope.Column {
		return envelope.Column{Kind: pglogrepl.TupleDataTypeText, Data: []byte(s)}
	}
	return []envelope.Column{text(fmt.Sprintf("00000000-0000-4000-8000-%012d", i)), text("P-1"), text("comanda.creada"),
		text(versio), text(`{"n": 1}`), text("2026-12-03 10:00:00.123456+00")}
}
