package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/envelope"
)

// stream is the state of one streaming session. Only its goroutine touches
// it; acknowledgements reach it through the tracker, and it tells its
// runner what happens through the runner's event methods.
type stream struct {
	r         *Runner
	conn      *pgconn.PgConn
	prod      Producer
	tracker   *Tracker
	relations map[uint32]*envelope.Binding

	txn      *Txn          // open transaction
	received pglogrepl.LSN // newest WAL position received

	// Reused from row to row: the decoded columns (they reference the
	// message buffer), the envelope's memory and the record handed to the
	// producer (a local would escape to the heap through the interface).
	row     []envelope.Column
	scratch envelope.Scratch
	rec     outboxd.Record

	sentFlush pglogrepl.LSN // flush position last sent
	sentAt    time.Time
	reply     bool // the server asked for a reply

	lastRecv  time.Time // last message from the server (or end of a backpressure pause)
	pinged    bool      // a status asking for a reply went out since lastRecv
	lastAcked uint64    // acknowledged count at lastAckAt
	lastAckAt time.Time // last acknowledgement progress, or when records started waiting

	ackedAtStatus uint64 // acknowledged count when the last status went out
}

// statusEvery is how many acknowledgements make a status due before
// postgres.status_interval: at a full drain (100,000+ events/s) the interval
// alone would leave ~10,000 acknowledged events unconfirmed, all produced
// again after a kill -9.
const statusEvery = 1000

// farAhead reports whether enough was acknowledged since the last status to
// send one now.
func (s *stream) farAhead() bool {
	return s.tracker.Acked()-s.ackedAtStatus >= statusEvery
}

func (s *stream) run(ctx context.Context) error {
	cfg := s.r.cfg
	nextStatus := time.Now().Add(cfg.StatusInterval)
	var stopDeadline time.Time // set once ctx is cancelled
	var readDeadline time.Time // the connection's, as last set here
	s.lastRecv, s.lastAckAt = time.Now(), time.Now()
	now := time.Now()
	for {
		if s.reply || !now.Before(nextStatus) || s.farAhead() {
			if err := s.sendStatus(now, false); err != nil {
				return err
			}
			nextStatus = now.Add(cfg.StatusInterval)
		}
		if err := s.replaceRefused(); err != nil {
			return s.failed(err)
		}
		st := s.tracker.State()
		if err := s.checkPeers(now, st); err != nil {
			return err
		}
		if st.Err != nil {
			return s.failed(s.deliveryError(st.Err))
		}

		if ctx.Err() != nil {
			if stopDeadline.IsZero() {
				stopDeadline = now.Add(cfg.ShutdownTimeout)
				s.r.stopping()
				s.r.log.Info("stopping: finishing the open transaction and waiting for acknowledgements", "in_flight", st.Events)
			}
			if s.txn == nil || now.After(stopDeadline) {
				return s.stop(stopDeadline)
			}
		}

		if s.tracker.Full(0) {
			// Reading pauses; standby status still goes out on time.
			wait := time.NewTimer(time.Until(nextStatus))
			select {
			case <-s.tracker.Wake():
			case <-wait.C:
			}
			wait.Stop()
			// Silence from the server while we did not read proves nothing.
			now = time.Now()
			s.lastRecv, s.pinged = now, false
			continue
		}

		deadline := nextStatus
		if st.Open == 0 && st.Confirmed == s.sentFlush {
			// Nothing waits to be confirmed: no reason to wake that often.
			if idle := now.Add(time.Second); idle.After(deadline) {
				deadline = idle
			}
		}
		if !stopDeadline.IsZero() && stopDeadline.Before(deadline) {
			deadline = stopDeadline
		}
		// A plain read deadline instead of a per-message context: pgconn
		// treats a timeout as recoverable and keeps the connection.
		if !deadline.Equal(readDeadline) {
			_ = s.conn.Conn().SetReadDeadline(deadline)
			readDeadline = deadline
		}
		msg, err := s.conn.ReceiveMessage(context.Background())
		now = time.Now()
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

func (s *stream) handleMessage(wal []byte) error {
	if len(wal) > 0 && wal[0] == 'I' {
		return s.handleInsert(wal)
	}
	msg, err := pglogrepl.Parse(wal)
	if err != nil {
		return Fatal(fmt.Errorf("decode pgoutput message %q: %w", wal[:1], err))
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		s.relations[m.RelationID] = s.r.router.Bind(m)
	case *pglogrepl.BeginMessage:
		if s.txn != nil {
			return errors.New("pgoutput: Begin inside an open transaction")
		}
		s.txn = s.tracker.Begin(m.CommitTime, m.FinalLSN)
	case *pglogrepl.CommitMessage:
		if s.txn == nil {
			return errors.New("pgoutput: Commit outside a transaction")
		}
		if s.txn.Pending() {
			// Its records go out now, not after the linger: batching
			// happens while a request is in flight, not before.
			s.prod.Flush()
		}
		s.tracker.Commit(s.txn, m.TransactionEndLSN)
		s.txn = nil
		s.r.txns.Add(1)
	default:
		// Logical decoding messages, origins, types; updates, deletes and
		// truncates (an insert-only publication sends none) are ignored.
	}
	return nil
}

// handleInsert turns one inserted row into a record (or a dead-letter
// record) and hands it to the producer, which copies it: the row and the
// record reference the message buffer, valid until the next receive.
func (s *stream) handleInsert(wal []byte) error {
	if s.txn == nil {
		return errors.New("pgoutput: Insert outside a transaction")
	}
	relID, row, err := parseInsert(wal, s.row)
	s.row = row
	if err != nil {
		return Fatal(fmt.Errorf("decode pgoutput message 'I': %w", err))
	}
	b := s.relations[relID]
	if b == nil {
		return fmt.Errorf("pgoutput: Insert for relation %d before its Relation message", relID)
	}
	lsn := s.txn.CommitLSN()
	rec := &s.rec
	*rec, err = s.r.router.Build(b, row, &s.scratch)
	mark := s.r.cfg.Mark
	if err != nil {
		mark = nil // a dead-lettered row was not published
		if b.Route == nil || b.Route.DeadLetterTopic == "" {
			return Fatal(badRowError(b, lsn, err))
		}
		// Dead-lettered in the same transaction: the slot passes the row
		// only once Kafka acknowledged its dead-letter record.
		*rec = s.r.router.DeadLetter(b, row, err, lsn.String(), time.Now())
		s.r.log.Warn("row dead-lettered", "table", b.Name, "topic", rec.Topic, "lsn", lsn.String(), "reason", err.Error())
		s.r.deadLettered.Add(1)
	}
	var route *envelope.Binding
	if rec.Refusable {
		route = b
	}
	rec.Ack = s.tracker.Track(s.txn, rec.Size(), route)
	if mark != nil {
		rec.Ack = mark(b.Name, rec.Header(envelope.HeaderID), rec.Ack)
	}
	return s.produce(rec)
}

// badRowError is the stop of a row that cannot become a record on a route
// without a dead-letter topic: which row, where, and the way out.
func badRowError(b *envelope.Binding, lsn pglogrepl.LSN, err error) error {
	if b.Route == nil {
		return fmt.Errorf("transaction committed at %s: %w", lsn, err)
	}
	return fmt.Errorf("transaction committed at %s: %w. A committed row cannot be changed: to move past it, set on_error: dead_letter and a dead_letter_topic on the route of %s (the row then goes to that topic with the reason) and start outboxd again; nothing after it is lost, the slot stays before it", lsn, err, b.Name)
}

// replaceRefused puts a dead-letter record in the place of every record the
// broker refused for its own content, in the refused record's transaction.
// Every refusal handed over is replaced, even after a produce failed: the
// failed produce fails its record, so each transaction ends one way or the
// other; one left out would wait for ever. It returns the first error.
func (s *stream) replaceRefused() error {
	var first error
	for _, rf := range s.tracker.Refusals() {
		lsn := rf.Txn.CommitLSN().String()
		rec := &s.rec
		*rec = s.r.router.DeadLetterRefused(rf.Route, rf.Err, lsn, time.Now())
		s.r.log.Warn("record refused by the broker dead-lettered", "table", rf.Route.Name, "topic", rec.Topic, "lsn", lsn, "reason", rf.Err.Error())
		s.r.deadLettered.Add(1)
		rec.Ack = s.tracker.Replace(rf, rec.Size())
		if err := s.produce(rec); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// produce hands rec to the producer, which copies it; rec is cleared, so
// that nothing keeps the message buffer alive.
func (s *stream) produce(rec *outboxd.Record) error {
	err := s.prod.Produce(rec)
	*rec = outboxd.Record{}
	if err == nil {
		return nil
	}
	if isPermanent(err) {
		return Fatal(fmt.Errorf("kafka: %w", err))
	}
	if first := s.tracker.State().Err; first != nil {
		// A fenced producer's error hides the delivery failure behind it.
		return s.deliveryError(first)
	}
	return err
}

// deliveryError is the session's end after Kafka failed a record: fatal when
// no retry can fix it, a replay from the slot otherwise.
func (s *stream) deliveryError(err error) error {
	if isPermanent(err) {
		return Fatal(fmt.Errorf("kafka: %w", err))
	}
	return fmt.Errorf("kafka delivery: %w", err)
}

// checkPeers ends the session when the server has been silent for longer
// than the receive timeout (after asking it for a reply at half of it), or
// when Kafka has acknowledged nothing for the delivery timeout while records
// wait: a connection that died without a reset is detected within those
// bounds instead of the operating system's TCP timeouts.
func (s *stream) checkPeers(now time.Time, st State) error {
	cfg := s.r.cfg
	if st.Events == 0 || st.Acked != s.lastAcked {
		s.lastAcked, s.lastAckAt = st.Acked, now
	} else if cfg.DeliveryTimeout > 0 && now.Sub(s.lastAckAt) > cfg.DeliveryTimeout {
		return fmt.Errorf("kafka acknowledged nothing for %s with %d records in flight: broker presumed unreachable", cfg.DeliveryTimeout, st.Events)
	}
	if cfg.ReceiveTimeout <= 0 {
		return nil
	}
	silent := now.Sub(s.lastRecv)
	if silent > cfg.ReceiveTimeout {
		return fmt.Errorf("nothing received from PostgreSQL for %s: connection presumed dead", silent.Round(time.Millisecond))
	}
	if silent > cfg.ReceiveTimeout/2 && !s.pinged {
		s.pinged = true
		return s.sendStatus(now, true)
	}
	return nil
}
