package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/publish"
)

// stream is the state of one streaming session. Only its goroutine touches
// it. It reads pgoutput messages, hands each change to its publisher in its
// transaction (changes.go), and confirms what its tracker says is safe
// (status.go). What it needs comes in as values; it tells its runner what
// happens through events.
type stream struct {
	cfg     streamConfig
	log     hclog.Logger
	clock   clock.Clock
	events  events
	router  *envelope.Router // binds relations and message prefixes to routes
	pub     *publish.Publisher
	tracker *Tracker
	conn    *pgconn.PgConn
	prod    Producer // the publisher's: flushed at a commit, abandoned at an end

	relations map[uint32][]*envelope.Binding // each relation's routes
	// partitions: each partition of a routed partitioned table, and that
	// table (catalog.Partitions).
	partitions map[catalog.Table]catalog.Table

	// streamed: the transactions the server streams before their commit
	// (protocol version 2, streamed.go); nil with protocol version 1.
	streamed *streamedTxns

	txn      *Txn          // open transaction
	index    uint32        // changes received in txn so far
	received pglogrepl.LSN // newest WAL position received

	// row holds the decoded columns, reused from row to row: they
	// reference the message buffer, valid until the next receive.
	row []envelope.Column

	sentFlush pglogrepl.LSN // flush position last sent
	sentAt    time.Time
	reply     bool // the server asked for a reply

	lastRecv time.Time // last message from the server (or end of a backpressure pause)
	pinged   bool      // a status asking for a reply went out since lastRecv

	ackedAtStatus uint64 // acknowledged count when the last status went out
}

// streamConfig is what a stream reads of the configuration (Config).
type streamConfig struct {
	statusInterval     time.Duration
	idleStatusInterval time.Duration
	shutdownTimeout    time.Duration
	receiveTimeout     time.Duration // 0: none
}

// events is what a stream tells its runner.
type events interface {
	stopping()                    // a stop was requested: the stream finishes and drains
	statusSent(at time.Time)      // a standby status went to the server
	committed()                   // a transaction was received
	streamed()                    // a streamed transaction began
	spilled(bytes int64)          // bytes of streamed transactions went to a spill file
	wholeUntil(end pglogrepl.LSN) // a transaction ending at end must come whole (not streamed)
}

// statusEvery is how many acknowledgements make a status due before
// postgres.status_interval: at a full drain (100,000+ events/s) the interval
// alone would leave ~10,000 acknowledged events unconfirmed, all produced
// again after a kill -9.
const statusEvery = 500

// farAhead reports whether enough was acknowledged since the last status to
// send one now.
func (s *stream) farAhead() bool {
	return s.pub.Acked()-s.ackedAtStatus >= statusEvery
}

// statusLate: a status due goes out with the first message the server
// sends after it, and the read waits for one at most 1/statusLate of
// postgres.status_interval longer before it wakes to send it alone. Data
// flowing, the status then costs no wake-up of its own: a status on its
// own timer woke outboxd ten times a second, twice each (Go's poller
// sleeps in whole milliseconds, so a timer wakes it just before it is
// due, then again), a fifth of its wake-ups at 200 events/s (issue 36).
// Only its timing changes: what it confirms is what the tracker says.
const statusLate = 2

func (s *stream) run(ctx context.Context) error {
	now := s.clock.Now()
	nextStatus := now.Add(s.cfg.statusInterval)
	var stopDeadline time.Time // set once ctx is cancelled
	var readDeadline time.Time // the connection's, as last set here
	s.lastRecv, s.ackedAtStatus = now, s.pub.Acked()
	for {
		if s.reply || !now.Before(nextStatus) || s.farAhead() {
			if err := s.sendStatus(now, false); err != nil {
				return err
			}
			nextStatus = now.Add(s.cfg.statusInterval)
		}
		if err := s.check(now); err != nil {
			return err
		}
		if ctx.Err() != nil {
			if stopDeadline.IsZero() {
				stopDeadline = now.Add(s.cfg.shutdownTimeout)
				s.events.stopping()
				s.log.Info("stopping: finishing the open transaction and waiting for acknowledgements", "in_flight", s.pub.State().Events)
			}
			if s.txn == nil || now.After(stopDeadline) {
				return s.stop(stopDeadline)
			}
		}
		if s.pub.Full(0) {
			s.pause(nextStatus)
			// Silence from the server while we did not read proves nothing.
			now = s.clock.Now()
			s.lastRecv, s.pinged = now, false
			continue
		}
		if s.streamed != nil && s.streamed.replay != nil {
			// A committed streamed transaction is published before
			// anything more is read.
			if err := s.replayStep(); err != nil {
				return s.failed(err)
			}
			now = s.clock.Now()
			s.lastRecv, s.pinged = now, false
			continue
		}
		// A plain read deadline instead of a per-message context: pgconn
		// treats a timeout as recoverable and keeps the connection.
		if deadline := s.readDeadline(now, nextStatus, stopDeadline); !deadline.Equal(readDeadline) {
			_ = s.conn.Conn().SetReadDeadline(deadline)
			readDeadline = deadline
		}
		msg, err := s.conn.ReceiveMessage(context.Background())
		now = s.clock.Now()
		if err != nil {
			if pgconn.Timeout(err) {
				// Set it again next time: a stop request moves it too.
				readDeadline = time.Time{}
				continue
			}
			return fmt.Errorf("receive from PostgreSQL: %w", err)
		}
		s.lastRecv, s.pinged = now, false
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.handleCopyData(m.Data); err != nil {
				return s.failed(err)
			}
		default:
			if err := serverMessage(msg); err != nil {
				return err
			}
		}
	}
}

// check looks at what came back since it last looked: a refused record is
// replaced by its dead-letter record; a delivery failure, or a peer silent
// for too long, ends the session.
func (s *stream) check(now time.Time) error {
	if err := s.pub.ReplaceRefused(); err != nil {
		return s.failed(s.deliveryError(err))
	}
	if err := s.checkPeers(now); err != nil {
		return err
	}
	if err := s.pub.State().Err; err != nil {
		return s.failed(s.deliveryError(err))
	}
	return nil
}

// pause waits, reading nothing, until an outcome may have made room or a
// status is due at until: standby status still goes out on time.
func (s *stream) pause(until time.Time) {
	select {
	case <-s.pub.Wake():
	case <-s.clock.After(until.Sub(s.clock.Now())):
	}
}

// readDeadline is how long the next read may wait: until half a status
// interval past the next status (statusLate); when nothing waits to be
// confirmed, until the next thing due without a message (the idle status,
// the ping of a silent server or giving up on it: checkPeers), as no
// acknowledgement can come to confirm meanwhile and a message wakes the
// read anyway (an idle outboxd woke every second for nothing: issue 36);
// and never past the deadline of a stop.
func (s *stream) readDeadline(now, nextStatus, stopDeadline time.Time) time.Time {
	deadline := nextStatus.Add(s.cfg.statusInterval / statusLate)
	if st := s.tracker.State(); st.Open == 0 && st.Confirmed == s.sentFlush {
		idle := s.sentAt.Add(s.cfg.idleStatusInterval)
		if t := s.cfg.receiveTimeout; t > 0 {
			peer := s.lastRecv.Add(t / 2)
			if s.pinged {
				peer = s.lastRecv.Add(t)
			}
			// checkPeers acts once the silence is longer, not as long.
			idle = earliest(idle, peer.Add(time.Millisecond))
		}
		if idle.After(deadline) {
			deadline = idle
		}
	}
	if !stopDeadline.IsZero() && stopDeadline.Before(deadline) {
		deadline = stopDeadline
	}
	return deadline
}

// serverMessage is the session's end for a message other than CopyData,
// or nil for one that needs no action (notices, parameter changes).
func serverMessage(msg pgproto3.BackendMessage) error {
	switch m := msg.(type) {
	case *pgproto3.ErrorResponse:
		err := pgconn.ErrorResponseToPgError(m)
		if hasCode(err, "42704") || hasCode(err, "55000") {
			// Slot or publication gone, or decoding impossible.
			return Fatal(fmt.Errorf("replication stream: %w", err))
		}
		return fmt.Errorf("replication stream: %w", err)
	case *pgproto3.NoticeResponse:
		if m.Code == "55000" && strings.Contains(m.Message, "publication") {
			// PostgreSQL 18 skips a publication missing at a change's
			// WAL position with this warning ('skipped loading
			// publication "name"', 55000) and streams on (before 18 it
			// is the ERROR above): the rows it then leaves out would be
			// confirmed as passed. The warning comes before any keepalive
			// past that change: stopping here confirms nothing beyond it.
			return Fatal(fmt.Errorf("replication stream: %s: %s", m.Message, m.Detail))
		}
	case *pgproto3.CopyDone:
		return errors.New("the server ended the replication stream")
	}
	return nil
}

func (s *stream) handleCopyData(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		// Everything before the server's WAL end has been sent to us, so
		// when nothing is in flight the slot can follow it.
		s.tracker.Keepalive(k.ServerWALEnd)
		if k.ServerWALEnd > s.received && s.txn == nil {
			s.received = k.ServerWALEnd
		}
		if k.ReplyRequested {
			s.reply = true
		}
		return nil
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse XLogData: %w", err)
		}
		if x.WALStart > s.received {
			s.received = x.WALStart
		}
		return s.handleMessage(x.WALData)
	}
	return nil
}

// deliveryError is the session's end after Kafka failed a record: fatal when
// no retry can fix it, a replay from the slot otherwise.
func (s *stream) deliveryError(err error) error {
	if isPermanent(err) {
		return Fatal(fmt.Errorf("kafka: %w", err))
	}
	return fmt.Errorf("kafka delivery: %w", err)
}

// checkPeers ends the session when Kafka has acknowledged nothing for the
// delivery timeout while records wait (publish.Publisher.Check), or when
// the server has been silent for longer than the receive timeout (after
// asking it for a reply at half of it): a connection that died without a
// reset is detected within those bounds instead of the operating system's
// TCP timeouts.
func (s *stream) checkPeers(now time.Time) error {
	if err := s.pub.Check(now); err != nil {
		return err
	}
	if s.cfg.receiveTimeout <= 0 {
		return nil
	}
	silent := now.Sub(s.lastRecv)
	if silent > s.cfg.receiveTimeout {
		return fmt.Errorf("nothing received from PostgreSQL for %s: connection presumed dead", silent.Round(time.Millisecond))
	}
	if silent > s.cfg.receiveTimeout/2 && !s.pinged {
		s.pinged = true
		return s.sendStatus(now, true)
	}
	return nil
}
