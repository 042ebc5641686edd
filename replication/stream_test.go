package replication

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/publish/publishtest"
)

const outboxRelID = 16385

var outboxColumns = []string{"id", "agregat_id", "tipus", "versio", "carrega", "creat_en"}

func beginMsg(final pglogrepl.LSN) []byte {
	b := []byte{'B'}
	b = binary.BigEndian.AppendUint64(b, uint64(final))
	b = binary.BigEndian.AppendUint64(b, 0)
	return binary.BigEndian.AppendUint32(b, 1234)
}

func commitMsg(commit, end pglogrepl.LSN) []byte {
	b := []byte{'C', 0}
	b = binary.BigEndian.AppendUint64(b, uint64(commit))
	b = binary.BigEndian.AppendUint64(b, uint64(end))
	return binary.BigEndian.AppendUint64(b, 0)
}

func relationMsg() []byte {
	b := []byte{'R'}
	b = binary.BigEndian.AppendUint32(b, outboxRelID)
	b = append(b, "public\x00outbox\x00"...)
	b = append(b, 'd')
	b = binary.BigEndian.AppendUint16(b, uint16(len(outboxColumns)))
	for _, c := range outboxColumns {
		b = append(b, 0)
		b = append(b, c...)
		b = append(b, 0)
		oid := uint32(25) // text
		if c == "carrega" {
			oid = 3802 // jsonb
		}
		b = binary.BigEndian.AppendUint32(b, oid)
		b = binary.BigEndian.AppendUint32(b, 0xffffffff)
	}
	return b
}

// insertMsg is an outbox row for key; a key "bad" has a NULL tipus.
func insertMsg(key string) []byte {
	vals := []string{"id-" + key, key, "comanda.creada", "1", `{"k":1}`, "2026-01-01 00:00:00+00"}
	b := []byte{'I'}
	b = binary.BigEndian.AppendUint32(b, outboxRelID)
	b = append(b, 'N')
	b = binary.BigEndian.AppendUint16(b, uint16(len(vals)))
	for i, v := range vals {
		if key == "bad" && i == 2 {
			b = append(b, 'n')
			continue
		}
		b = append(b, 't')
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b
}

func outboxRoute(deadLetter string) []envelope.Route {
	return []envelope.Route{{Schema: "public", Table: "outbox", Topic: "comandes.esdeveniments", DeadLetterTopic: deadLetter,
		Columns: envelope.Columns{ID: "id", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "carrega", CreatEn: "creat_en"}}}
}

var errInjected = errors.New("injected")

// TestReplaceRefusedFailsEveryRefusalWhenTheProducerStops: when the
// producer refuses the dead-letter record of one refused record (it was
// fenced), every other refusal handed over in the same call must still end
// in its transaction (failed, as the fenced producer fails its record), or
// that transaction waits for ever: a stop then waits out its whole timeout
// for an acknowledgement that cannot come.
func TestReplaceRefusedFailsEveryRefusalWhenTheProducerStops(t *testing.T) {
	prod := &publishtest.Producer{}
	s := newTestStream(mustRouter(t, outboxRoute("dlq")), prod, 0x100, Config{})
	if err := s.handleMessage(relationMsg()); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		commit, end pglogrepl.LSN
		key         string
	}{{0x1000, 0x1010, "P-1"}, {0x2000, 0x2010, "P-2"}} {
		for _, m := range [][]byte{beginMsg(x.commit), insertMsg(x.key), commitMsg(x.commit, x.end)} {
			if err := s.handleMessage(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	first, second := prod.Record(t, 0), prod.Record(t, 1)
	// The later transaction's refusal is heard first.
	second.Ack.Ack(&outboxd.RefusedError{Topic: second.Topic, Key: second.Key, Err: errInjected})
	first.Ack.Ack(&outboxd.RefusedError{Topic: first.Topic, Key: first.Key, Err: errInjected})
	prod.Fail(errInjected) // fenced: every record is failed through its Acker
	if err := s.pub.ReplaceRefused(); !errors.Is(err, errInjected) {
		t.Fatalf("ReplaceRefused: %v", err)
	}
	if st, fl := s.tracker.State(), s.pub.State(); !st.Settled || fl.Refused != 0 || st.Confirmed != 0x100 {
		t.Fatalf("after the producer refused the dead letters: %+v %+v (a transaction still waits for a record nobody will send)", st, fl)
	}
}

// TestMissingPublicationWarningStops: PostgreSQL 18 skips a publication
// missing at a change's WAL position with a WARNING (55000, as 18.1
// sends it) and streams
// on; the stream stops on it (fatal, as the ERROR before 18), before any
// keepalive past the change it left out could be confirmed. Other notices
// pass.
func TestMissingPublicationWarningStops(t *testing.T) {
	err := serverMessage(&pgproto3.NoticeResponse{Severity: "WARNING", Code: "55000",
		Message: `skipped loading publication "km0"`, Detail: "The publication does not exist at this point in the WAL."})
	if !IsFatal(err) || !strings.Contains(err.Error(), `publication "km0"`) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("want a fatal error naming the publication, got %v", err)
	}
	if err := serverMessage(&pgproto3.NoticeResponse{Severity: "WARNING", Code: "01000", Message: "something else"}); err != nil {
		t.Fatalf("another notice: %v", err)
	}
}

// TestIdleReadDeadline: with nothing to confirm, a read waits until the
// next thing due without a message (the idle status, the ping of a silent
// server, giving up on it), not a second at a time; with something to
// confirm, until half an interval past the next status (a message before
// then takes it along: statusLate); never past a stop's deadline.
func TestIdleReadDeadline(t *testing.T) {
	now := time.Date(2026, 12, 5, 23, 0, 0, 0, time.UTC)
	nextStatus := now.Add(100 * time.Millisecond)
	for _, tc := range []struct {
		name              string
		sentAgo, recvAgo  time.Duration
		receiveTimeout    time.Duration
		pinged, unsettled bool
		stop              time.Time
		want              time.Time
	}{
		{name: "the idle status", sentAgo: time.Second, recvAgo: time.Second, want: now.Add(9 * time.Second)},
		{name: "the ping first", sentAgo: time.Second, recvAgo: 12 * time.Second, receiveTimeout: 30 * time.Second, want: now.Add(3*time.Second + time.Millisecond)},
		{name: "giving up after the ping", sentAgo: time.Second, recvAgo: 16 * time.Second, receiveTimeout: 30 * time.Second, pinged: true, want: now.Add(9 * time.Second)},
		{name: "giving up first", sentAgo: time.Second, recvAgo: 25 * time.Second, receiveTimeout: 30 * time.Second, pinged: true, want: now.Add(5*time.Second + time.Millisecond)},
		{name: "not before the next status", sentAgo: 10 * time.Second, recvAgo: time.Second, want: nextStatus.Add(50 * time.Millisecond)},
		{name: "something to confirm", sentAgo: time.Second, recvAgo: time.Second, unsettled: true, want: nextStatus.Add(50 * time.Millisecond)},
		{name: "a stop", sentAgo: time.Second, recvAgo: time.Second, stop: now.Add(2 * time.Second), want: now.Add(2 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &stream{tracker: NewTracker(100, nil), sentFlush: 100, sentAt: now.Add(-tc.sentAgo), lastRecv: now.Add(-tc.recvAgo), pinged: tc.pinged,
				cfg: streamConfig{statusInterval: 100 * time.Millisecond, idleStatusInterval: 10 * time.Second, receiveTimeout: tc.receiveTimeout}}
			if tc.unsettled {
				s.sentFlush = 50
			}
			if got := s.readDeadline(now, nextStatus, tc.stop); !got.Equal(tc.want) {
				t.Errorf("read deadline in %s, want in %s", got.Sub(now), tc.want.Sub(now))
			}
		})
	}
}
