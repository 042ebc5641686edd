package replication

import (
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/publish/publishtest"
)

var seedColumns = envelope.Columns{ID: "id", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "carrega", CreatEn: "creat_en"}

// routedStream is a stream over the recorded fixture's routes: the outbox
// to comandes, its comanda.creada rows to analitica as well, and the
// logical messages of prefix comandes, all with position headers.
func routedStream(t *testing.T, messageDLQ string) (*stream, *publishtest.Producer, *Tracker) {
	t.Helper()
	router, err := envelope.NewRouter("comandes", []envelope.Route{
		{Schema: "public", Table: "outbox", Topic: "comandes", Columns: seedColumns, Position: true},
		{Schema: "public", Table: "outbox", Topic: "analitica", Columns: seedColumns, Position: true,
			Filter: []envelope.Condition{{Column: "tipus", Values: []string{"comanda.creada"}}}},
		{Prefix: "comandes", Topic: "missatges", Position: true, DeadLetterTopic: messageDLQ,
			Columns: envelope.Columns{ID: "id_esdeveniment", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "dades"}},
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	prod := &publishtest.Producer{}
	s := newTestStream(router, prod, 0x100, Config{})
	return s, prod, s.tracker
}

// mustRouter is the router of routes for the service comandes.
func mustRouter(t testing.TB, routes []envelope.Route) *envelope.Router {
	t.Helper()
	r, err := envelope.NewRouter("comandes", routes, 0)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func headerOf(r outboxd.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestRoutesAndMessagesAckDiscipline: one row published to two routes and
// a logical message interleaved with the rows of its transaction are all
// records of that transaction, in commit order: the slot passes the
// transaction only when Kafka acknowledged every one of them. A routed
// non-transactional message is dead-lettered as a transaction of its own,
// confirmed only once acknowledged too.
func TestRoutesAndMessagesAckDiscipline(t *testing.T) {
	s, prod, tracker := routedStream(t, "missatges.dlq")
	commits := feedFixture(t, s)
	type want struct{ topic, id, index string }
	wants := []want{
		{"missatges.dlq", "not-transactional", ""},
		{"comandes", "6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70", "0"},
		{"analitica", "6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70", "0"},
		{"missatges", "9c4f2b5d-3d7e-4fb0-8a4c-5e6f708192a3", "2"}, // after the unrouted km0 message, index 1
		{"comandes", "7a2d0f3b-1b5c-4d9f-8e2a-3c4d5e6f7081", "3"},
		{"comandes", "8b3e1a4c-2c6d-4eaf-9f3b-4d5e6f708192", "0"},
		{"analitica", "8b3e1a4c-2c6d-4eaf-9f3b-4d5e6f708192", "0"},
	}
	if prod.Len() != len(wants) {
		t.Fatalf("got %d records, want %d", prod.Len(), len(wants))
	}
	var lastLSN, lastIndex uint64
	for i, w := range wants {
		r := prod.Record(t, i)
		if r.Topic != w.topic || headerOf(r, envelope.HeaderID) != w.id || headerOf(r, envelope.HeaderTxnIndex) != w.index {
			t.Errorf("record %d: topic %s id %s index %s, want %+v", i, r.Topic, headerOf(r, envelope.HeaderID), headerOf(r, envelope.HeaderTxnIndex), w)
		}
		if i == 0 {
			if !strings.Contains(headerOf(r, envelope.HeaderError), "non-transactional") {
				t.Errorf("dead letter reason %q", headerOf(r, envelope.HeaderError))
			}
			continue
		}
		// (commit LSN, index) never goes back in commit order; equal only
		// for the records of one row.
		lsn, _ := strconv.ParseUint(headerOf(r, envelope.HeaderCommitLSN), 10, 64)
		index, _ := strconv.ParseUint(w.index, 10, 64)
		if lsn < lastLSN || lsn == lastLSN && index < lastIndex {
			t.Errorf("record %d: position (%d, %d) before (%d, %d)", i, lsn, index, lastLSN, lastIndex)
		}
		lastLSN, lastIndex = lsn, index
	}
	if msg := prod.Record(t, 3); string(msg.Key) != "P-2026-000123" || !strings.Contains(string(msg.Value), `"dades":{"canal": "sms"}`) {
		t.Errorf("message record: key %s value %s", msg.Key, msg.Value)
	}

	confirmed := func() pglogrepl.LSN { return tracker.State().Confirmed }
	if confirmed() != 0x100 {
		t.Fatalf("confirmed %s before any acknowledgement", confirmed())
	}
	prod.Record(t, 0).Ack.Ack(nil) // the dead-lettered non-transactional message
	nonTx := confirmed()
	if nonTx <= 0x100 || nonTx >= commits[0] {
		t.Fatalf("after the dead letter: confirmed %s, want between the start and %s", nonTx, commits[0])
	}
	// Every record of the first transaction but the message's.
	for _, i := range []int{1, 2, 4} {
		prod.Record(t, i).Ack.Ack(nil)
	}
	if confirmed() != nonTx {
		t.Fatalf("confirmed %s with the transaction's message unacknowledged", confirmed())
	}
	prod.Record(t, 3).Ack.Ack(nil)
	if confirmed() != commits[0] {
		t.Fatalf("confirmed %s, want the first commit %s", confirmed(), commits[0])
	}
	// One route of a row acknowledged, not the other.
	prod.Record(t, 5).Ack.Ack(nil)
	if confirmed() != commits[0] {
		t.Fatalf("confirmed %s with the row's second route unacknowledged", confirmed())
	}
	prod.Record(t, 6).Ack.Ack(nil)
	if confirmed() != commits[1] {
		t.Fatalf("confirmed %s, want the second commit %s", confirmed(), commits[1])
	}
}

// TestNonTransactionalMessageStops: without a dead-letter topic, a routed
// non-transactional message stops the stream with an error that says what
// it is and the way out; nothing is produced for it.
func TestNonTransactionalMessageStops(t *testing.T) {
	s, prod, _ := routedStream(t, "")
	msgs := readFixture(t, "testdata/outbox.pgoutput")
	err := s.handleMessage(append([]byte(nil), msgs[0]...))
	if err == nil || !IsFatal(err) || !strings.Contains(err.Error(), `non-transactional logical message (prefix "comandes"`) ||
		!strings.Contains(err.Error(), "pg_logical_emit_message(true, ...)") || !strings.Contains(err.Error(), "on_error: dead_letter") {
		t.Fatalf("got %v", err)
	}
	if prod.Len() != 0 || s.txn != nil {
		t.Fatalf("%d records, open transaction %v", prod.Len(), s.txn)
	}
}

func TestParseMessage(t *testing.T) {
	msgs := readFixture(t, "testdata/outbox.pgoutput")
	m, err := parseMessage(msgs[0])
	if err != nil || m.transactional || string(m.prefix) != "comandes" || string(m.content) != `{"id_esdeveniment": "not-transactional"}` {
		t.Fatalf("%+v %v", m, err)
	}
	for _, bad := range [][]byte{msgs[0][:9], msgs[0][:14], msgs[0][:len(msgs[0])-1], append(append([]byte(nil), msgs[0]...), 'x')} {
		if _, err := parseMessage(bad); err == nil {
			t.Errorf("%x: no error", bad)
		}
	}
}
