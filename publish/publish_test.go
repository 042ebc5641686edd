package publish_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/clock/clocktest"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/publish"
	"github.com/outboxd/outboxd/publish/publishtest"
)

// refuse is the producer's outcome of a Refusable record the broker
// refused for its content.
func refuse(r outboxd.Record) error {
	return &outboxd.RefusedError{Topic: r.Topic, Key: r.Key, Headers: r.Headers, Size: 2 << 20, Err: errors.New("MESSAGE_TOO_LARGE")}
}

// unit is a Unit that remembers the fewest records it held once it had
// held one, before it completed.
type unit struct {
	mu       sync.Mutex
	held     int
	seen     bool
	emptied  int // times held went back to 0
	failures []error
}

func (u *unit) Hold() {
	u.mu.Lock()
	u.held++
	u.seen = true
	u.mu.Unlock()
}

func (u *unit) Release(err error) {
	u.mu.Lock()
	u.held--
	if u.held == 0 {
		u.emptied++
	}
	if err != nil {
		u.failures = append(u.failures, err)
	}
	u.mu.Unlock()
}

func (u *unit) state() (held, emptied int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.held, u.emptied
}

func newPublisher(router *envelope.Router, prod publish.Producer, c clock.Clock, timeout time.Duration) *publish.Publisher {
	return publish.New(publish.Config{Router: router, Producer: prod, MaxEvents: 100, MaxBytes: 1 << 20,
		DeliveryTimeout: timeout, Source: "snapshot 0/1", Again: "start again", Clock: c})
}

// TestRefusedRecordHoldsItsUnit: a record the broker refused keeps its
// unit held, and so does its dead-letter record: the unit never completes
// (never holds nothing) until Kafka acknowledged the replacement. A
// replacement released before it is held, or a refusal that released its
// unit, would let the unit, a transaction, be confirmed with the row in no
// topic.
func TestRefusedRecordHoldsItsUnit(t *testing.T) {
	router, bs := publishtest.Outbox(t, "comandes.dlq")
	prod := &publishtest.Producer{}
	p := newPublisher(router, prod, clocktest.New(), 0)
	u := &unit{}
	if err := p.Change(u, bs, publishtest.Row(1, "1"), envelope.Position{CommitLSN: 0x2000}); err != nil {
		t.Fatal(err)
	}
	rec := prod.Record(t, 0)
	if !rec.Refusable {
		t.Fatal("a record of a route with a dead-letter topic must be Refusable")
	}
	rec.Ack.Ack(refuse(rec))
	if held, emptied := u.state(); held != 1 || emptied != 0 {
		t.Fatalf("after the refusal the unit holds %d (emptied %d times): it must stay held", held, emptied)
	}
	if st := p.State(); st.Refused != 1 || st.Events != 0 || st.Err != nil {
		t.Fatalf("after the refusal: %+v", st)
	}
	if err := p.ReplaceRefused(); err != nil {
		t.Fatal(err)
	}
	dl := prod.Record(t, 1)
	if dl.Topic != "comandes.dlq" || string(dl.Key) != "P-1" || dl.Refusable ||
		string(dl.Header(envelope.HeaderLSN)) != "0/2000" || !strings.Contains(string(dl.Header(envelope.HeaderError)), "MESSAGE_TOO_LARGE") {
		t.Fatalf("dead-letter record: topic %s key %s refusable %v headers %q", dl.Topic, dl.Key, dl.Refusable, dl.Headers)
	}
	if held, emptied := u.state(); held != 1 || emptied != 0 {
		t.Fatalf("with the replacement in flight the unit holds %d (emptied %d times)", held, emptied)
	}
	if st := p.State(); st.Refused != 0 || st.Events != 1 {
		t.Fatalf("after the replacement: %+v", st)
	}
	dl.Ack.Ack(nil)
	if held, emptied := u.state(); held != 0 || emptied != 1 || len(u.failures) != 0 {
		t.Fatalf("once the replacement is acknowledged: held %d, emptied %d times, failures %v", held, emptied, u.failures)
	}
	if c := p.Counts(); c.Records != 1 || c.DeadLettered != 1 || c.Acked != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// TestDrainWaitsForReplacements: a snapshot or a replay is one unit, the
// publication itself: Drain returns only once a refused record's
// replacement is acknowledged, not when the refused record leaves the
// flight.
func TestDrainWaitsForReplacements(t *testing.T) {
	router, bs := publishtest.Outbox(t, "comandes.dlq")
	prod := &publishtest.Producer{}
	c := clocktest.New()
	p := newPublisher(router, prod, c, 0)
	if err := p.Change(nil, bs, publishtest.Row(1, "1"), envelope.Position{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Drain(context.Background()) }()
	<-c.Waiting // Drain found the record in flight and waits
	rec := prod.Record(t, 0)
	rec.Ack.Ack(refuse(rec))
	<-c.Waiting // it replaced the refused record, and waits for that one
	select {
	case err := <-done:
		t.Fatalf("Drain returned (%v) with the dead-letter record of a refused one unacknowledged", err)
	default:
	}
	dl := prod.Record(t, 1)
	if dl.Topic != "comandes.dlq" || string(dl.Header(envelope.HeaderLSN)) != "snapshot 0/1" {
		t.Fatalf("dead-letter record to %s, lsn header %q", dl.Topic, dl.Header(envelope.HeaderLSN))
	}
	dl.Ack.Ack(nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestDeliveryTimeoutWaitsForSilence: the delivery timeout fires only once
// Kafka has acknowledged nothing for that long while records wait; records
// acknowledged one by one, each within the timeout, never fire it however
// long the publication lasts, nor does a long wait with nothing in flight.
func TestDeliveryTimeoutWaitsForSilence(t *testing.T) {
	const timeout = 30 * time.Second
	router, bs := publishtest.Outbox(t, "")
	prod := &publishtest.Producer{}
	c := clocktest.New()
	p := newPublisher(router, prod, c, timeout)
	if err := p.Check(c.Now()); err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Hour) // nothing in flight: no timeout
	if err := p.Check(c.Now()); err != nil {
		t.Fatalf("nothing in flight: %v", err)
	}
	for i := 0; i < 3; i++ {
		if err := p.Change(nil, bs, publishtest.Row(i, "1"), envelope.Position{}); err != nil {
			t.Fatal(err)
		}
	}
	// Ten minutes, an acknowledgement every 20 s, new records meanwhile.
	for i := 0; i < 30; i++ {
		c.Advance(20 * time.Second)
		prod.Record(t, i).Ack.Ack(nil)
		if err := p.Check(c.Now()); err != nil {
			t.Fatalf("after %d acknowledgements, each within the timeout: %v", i+1, err)
		}
		if err := p.Change(nil, bs, publishtest.Row(100+i, "1"), envelope.Position{}); err != nil {
			t.Fatal(err)
		}
	}
	c.Advance(timeout - time.Second)
	if err := p.Check(c.Now()); err != nil {
		t.Fatalf("silent for less than the timeout: %v", err)
	}
	c.Advance(time.Second)
	err := p.Check(c.Now())
	if err == nil || err.Error() != "kafka acknowledged nothing for 30s with 3 records in flight: broker presumed unreachable" {
		t.Fatalf("silent for the timeout: %v", err)
	}
}

// TestWaitEndsOnDeliveryTimeout: a snapshot waiting for room fails once
// the broker has been silent for the timeout, instead of waiting for ever.
func TestWaitEndsOnDeliveryTimeout(t *testing.T) {
	router, bs := publishtest.Outbox(t, "")
	c := clocktest.New()
	p := publish.New(publish.Config{Router: router, Producer: &publishtest.Producer{}, MaxEvents: 1, DeliveryTimeout: time.Minute, Clock: c})
	if err := p.Change(nil, bs, publishtest.Row(1, "1"), envelope.Position{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Wait(context.Background()) }()
	<-c.Waiting
	c.Advance(time.Minute)
	if err := <-done; err == nil || !strings.Contains(err.Error(), "broker presumed unreachable") {
		t.Fatalf("Wait with a silent broker: %v", err)
	}
}

// TestPublisherBounds: records and bytes in flight are bounded; a record
// larger than the byte bound goes alone; an outcome wakes the waiter.
func TestPublisherBounds(t *testing.T) {
	router, bs := publishtest.Outbox(t, "")
	prod := &publishtest.Producer{}
	p := publish.New(publish.Config{Router: router, Producer: prod, MaxEvents: 2, MaxBytes: 300})
	if p.Full(1000) {
		t.Fatal("an oversize record must pass when nothing is in flight")
	}
	if err := p.Change(nil, bs, publishtest.Row(1, "1"), envelope.Position{}); err != nil {
		t.Fatal(err)
	}
	first := prod.Record(t, 0)
	size := first.Size()
	if !p.Full(301-size) || p.Full(300-size) {
		t.Fatalf("%d bytes in flight, bound 300: Full(%d) %v, Full(%d) %v", size, 301-size, p.Full(301-size), 300-size, p.Full(300-size))
	}
	if err := p.Change(nil, bs, publishtest.Row(2, "1"), envelope.Position{}); err != nil {
		t.Fatal(err)
	}
	if !p.Full(0) {
		t.Fatal("2 records is the bound")
	}
	prod.Record(t, 0).Ack.Ack(nil)
	select {
	case <-p.Wake():
	default:
		t.Fatal("an acknowledgement must wake the publishing goroutine")
	}
	if p.Full(1) {
		t.Fatal("after one acknowledgement there is room")
	}
	prod.Record(t, 1).Ack.Ack(nil)
	if st, c := p.State(), p.Counts(); st.Events != 0 || st.Bytes != 0 || c.Acked != 2 || c.AckedBytes != 2*size {
		t.Fatalf("state %+v, counts %+v", st, c)
	}
}

// TestBadRowsAndFailures: a bad row stops the publication on a route
// without a dead-letter topic, with the way out, and becomes a dead-letter
// record with the reason on a route with one; a failed record fails its
// unit, and the producer's error is the delivery failure that fenced it.
func TestBadRowsAndFailures(t *testing.T) {
	router, bs := publishtest.Outbox(t, "")
	prod := &publishtest.Producer{}
	p := newPublisher(router, prod, clocktest.New(), 0)
	err := p.Change(&unit{}, bs, publishtest.Row(1, "dos"), envelope.Position{CommitLSN: 0x16B3748})
	var bad *publish.BadRowError
	if !errors.As(err, &bad) || prod.Len() != 0 ||
		!strings.HasPrefix(err.Error(), "transaction committed at 0/16B3748: ") ||
		!strings.HasSuffix(err.Error(), ". A committed row cannot be changed: to move past it, set on_error: dead_letter and a dead_letter_topic on the route of public.outbox (the row then goes to that topic with the reason) and start again") {
		t.Fatalf("bad row on a stop route: %v, produced %d", err, prod.Len())
	}

	// On that route a record the broker refuses is not Refusable: its
	// refusal is a failure (the sink has fenced the producer on it).
	stopped := &unit{}
	if err := p.Change(stopped, bs, publishtest.Row(2, "1"), envelope.Position{}); err != nil {
		t.Fatal(err)
	}
	rec := prod.Record(t, 0)
	rec.Ack.Ack(refuse(rec))
	if held, _ := stopped.state(); rec.Refusable || held != 0 || len(stopped.failures) != 1 || p.State().Err == nil || p.State().Refused != 0 {
		t.Fatalf("a refusal on a stop route: refusable %v, unit held %d, failures %v, %+v", rec.Refusable, held, stopped.failures, p.State())
	}

	router, bs = publishtest.Outbox(t, "comandes.dlq")
	prod = &publishtest.Producer{}
	p = newPublisher(router, prod, clocktest.New(), 0)
	u := &unit{}
	if err := p.Change(u, bs, publishtest.Row(1, "dos"), envelope.Position{}); err != nil {
		t.Fatal(err)
	}
	dl := prod.Record(t, 0)
	if dl.Topic != "comandes.dlq" || string(dl.Header(envelope.HeaderLSN)) != "snapshot 0/1" || dl.Header(envelope.HeaderError) == nil {
		t.Fatalf("dead-letter record to %s, headers %q", dl.Topic, dl.Headers)
	}
	if held, _ := u.state(); held != 1 {
		t.Fatalf("the dead-letter record holds its unit %d times", held)
	}
	dl.Ack.Ack(nil)
	if c := p.Counts(); c.Records != 1 || c.DeadLettered != 1 || c.Acked != 1 {
		t.Fatalf("counts %+v", c)
	}

	failure := errors.New("NOT_ENOUGH_REPLICAS")
	if err := p.Change(u, bs, publishtest.Row(2, "1"), envelope.Position{}); err != nil {
		t.Fatal(err)
	}
	prod.Record(t, 1).Ack.Ack(failure)
	prod.Fail(errors.New("produce fenced after an earlier delivery failure"))
	if err := p.Change(u, bs, publishtest.Row(3, "1"), envelope.Position{}); !errors.Is(err, failure) {
		t.Fatalf("produce on a fenced producer: %v, want the failure that fenced it", err)
	}
	if err := p.Drain(context.Background()); !errors.Is(err, failure) {
		t.Fatalf("drain after a failed delivery: %v", err)
	}
	if held, _ := u.state(); held != 0 || len(u.failures) != 2 {
		t.Fatalf("unit held %d, failures %v", held, u.failures)
	}
}

// TestEachRecordItsOwnPosition: one change on two routes to one topic (a
// filtered route beside the table's own, say) becomes two records of one
// key; their positions differ by the route, so that restart
// de-duplication (sink/dedupe.go) never takes one for the other.
func TestEachRecordItsOwnPosition(t *testing.T) {
	router, err := envelope.NewRouter("comandes", []envelope.Route{
		{Schema: "public", Table: "outbox", Topic: "comandes", Columns: publishtest.Columns},
		{Schema: "public", Table: "outbox", Topic: "comandes", Columns: publishtest.Columns},
	}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	bs := router.Bind(publishtest.Relation())
	if len(bs) != 2 {
		t.Fatalf("%d bindings for two routes", len(bs))
	}
	prod := &publishtest.Producer{}
	p := newPublisher(router, prod, clocktest.New(), 0)
	if err := p.Change(nil, bs, publishtest.Row(1, "1"), envelope.Position{CommitLSN: 100, Index: 3}); err != nil {
		t.Fatal(err)
	}
	a, b := prod.Record(t, 0), prod.Record(t, 1)
	if a.Pos == b.Pos || a.Pos.LSN != 100 || a.Pos.Index != 3 || !b.Pos.After(a.Pos) {
		t.Fatalf("positions %+v and %+v: want the change's, told apart by the route", a.Pos, b.Pos)
	}
}

// TestNoProofWhileADeadLetterIsOut (issue 32, item 3): a record handed
// over while a dead-letter record of the session is unacknowledged carries
// no stream position, so it proves nothing after a restart: were the
// session to end before Kafka had the dead-letter record, a later session
// that routes the bad row otherwise (kafka.batch_bytes raised, its
// dead-letter topic created) would take the later record as proof that
// the row was delivered and skip it: a row in no topic. Once Kafka has the
// dead-letter record, positions prove again. The same holds for the
// replacement of a record the broker refused.
func TestNoProofWhileADeadLetterIsOut(t *testing.T) {
	router, bs := publishtest.Outbox(t, "comandes.dlq")
	prod := &publishtest.Producer{}
	p := newPublisher(router, prod, clocktest.New(), 0)
	u := &unit{}
	change := func(i int, versio string, lsn uint64) {
		t.Helper()
		if err := p.Change(u, bs, publishtest.Row(i, versio), envelope.Position{CommitLSN: pglogrepl.LSN(lsn)}); err != nil {
			t.Fatal(err)
		}
	}
	change(1, "1", 0x100)   // 0: proves
	change(2, "dos", 0x200) // 1: the dead-letter record, out
	change(3, "1", 0x300)   // 2: proves nothing
	if got := prod.Record(t, 0).Pos.LSN; got != 0x100 {
		t.Errorf("a record before any dead letter has position %#x, want 0x100", got)
	}
	if dl := prod.Record(t, 1); dl.Topic != "comandes.dlq" || dl.Pos.LSN != 0 {
		t.Fatalf("record 1 is to %s with position %#x, want the dead-letter record, without one", dl.Topic, dl.Pos.LSN)
	}
	if got := prod.Record(t, 2).Pos.LSN; got != 0 {
		t.Errorf("a record handed over while the dead-letter record is out has position %#x, want none", got)
	}
	prod.Record(t, 1).Ack.Ack(nil)
	change(4, "1", 0x400) // 3: proves again
	if got := prod.Record(t, 3).Pos.LSN; got != 0x400 {
		t.Errorf("a record after the dead-letter record's acknowledgement has position %#x, want 0x400", got)
	}

	refused := prod.Record(t, 3)
	refused.Ack.Ack(refuse(refused))
	if err := p.ReplaceRefused(); err != nil {
		t.Fatal(err)
	}
	change(5, "1", 0x500) // 5: its replacement (4) is out
	if got := prod.Record(t, 5).Pos.LSN; got != 0 {
		t.Errorf("a record handed over while a refused record's replacement is out has position %#x, want none", got)
	}
}
