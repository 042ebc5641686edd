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
	"github.com/outboxd/outboxd/catalog"
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
	relations map[uint32][]*envelope.Binding // each relation's routes
	// partitions: each partition of a routed partitioned table, and that
	// table (catalog.Partitions).
	partitions map[catalog.Table]catalog.Table

	txn      *Txn          // open transaction
	index    uint32        // changes received in txn so far
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
const statusEvery = 500

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
	if len(wal) > 0 {
		switch wal[0] {
		case 'I':
			return s.handleInsert(wal)
		case 'M':
			return s.handleLogicalMessage(wal)
		}
	}
	msg, err := pglogrepl.Parse(wal)
	if err != nil {
		return Fatal(fmt.Errorf("decode pgoutput message %q: %w", wal[:1], err))
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		// With publish_via_partition_root pgoutput sends a partition's
		// Relation beside its table's; its rows come under its own name
		// only when committed while that was off.
		part := catalog.Table{Schema: m.Namespace, Name: m.RelationName}
		if root, ok := s.partitions[part]; ok {
			s.r.log.Debug("a partition's relation: its rows route as its table's", "partition", part.String(), "table", root.String())
			rel := *m
			rel.Namespace, rel.RelationName = root.Schema, root.Name
			m = &rel
		}
		s.relations[m.RelationID] = s.r.router.Bind(m)
	case *pglogrepl.BeginMessage:
		if s.txn != nil {
			return errors.New("pgoutput: Begin inside an open transaction")
		}
		s.txn = s.tracker.Begin(m.CommitTime, m.FinalLSN)
		s.index = 0
	case *pglogrepl.CommitMessage:
		if s.txn == nil {
			return errors.New("pgoutput: Commit outside a transaction")
		}
		if s.txn.Pending() {
			// With no request in flight its records go out now, not
			// after the linger; while one is, they batch up
			// (sink.Producer.Flush).
			s.prod.Flush()
		}
		s.tracker.Commit(s.txn, m.TransactionEndLSN)
		s.txn = nil
		s.r.txns.Add(1)
	default:
		// Origins, types; updates, deletes and truncates (an insert-only
		// publication sends none) are ignored.
	}
	return nil
}

// handleInsert turns one inserted row into the records of its table's
// routes (or dead-letter records) and hands them to the producer, which
// copies each: the row and the records reference the message buffer,
// valid until the next receive.
func (s *stream) handleInsert(wal []byte) error {
	if s.txn == nil {
		return errors.New("pgoutput: Insert outside a transaction")
	}
	relID, row, err := parseInsert(wal, s.row)
	s.row = row
	if err != nil {
		return Fatal(fmt.Errorf("decode pgoutput message 'I': %w", err))
	}
	bs := s.relations[relID]
	if bs == nil {
		return fmt.Errorf("pgoutput: Insert for relation %d before its Relation message", relID)
	}
	return s.publish(bs, row)
}

// handleLogicalMessage publishes a logical message whose prefix has routes;
// one without is ignored (other software emits them too). A transactional
// message is a change of its transaction, in commit order with its rows. A
// non-transactional one is not an outbox event: it is sent even when its
// transaction rolls back, so a routed one stops outboxd, or is
// dead-lettered on its own, confirmed only once Kafka has it.
func (s *stream) handleLogicalMessage(wal []byte) error {
	m, err := parseMessage(wal)
	if err != nil {
		return Fatal(fmt.Errorf("decode pgoutput message 'M': %w", err))
	}
	bs := s.r.router.BindMessage(m.prefix)
	if len(bs) == 0 {
		if m.transactional && s.txn != nil {
			s.index++ // the index counts every change the transaction sends
		}
		return nil
	}
	s.row = append(s.row[:0], envelope.Column{Kind: pglogrepl.TupleDataTypeText, Data: m.content})
	if m.transactional {
		if s.txn == nil {
			return errors.New("pgoutput: a transactional logical message outside a transaction")
		}
		return s.publish(bs, s.row)
	}
	if s.txn != nil {
		return errors.New("pgoutput: a non-transactional logical message inside a transaction")
	}
	// A transaction of its own, ending at the message's LSN: the server
	// sends again, after a restart, only what is at or after the confirmed
	// position, and the message's record starts before its LSN.
	err = fmt.Errorf("a non-transactional logical message (prefix %q, at %s): outboxd publishes only transactional messages, written with pg_logical_emit_message(true, ...); a non-transactional one is sent even when its transaction rolls back", m.prefix, m.lsn)
	for _, b := range bs {
		if b.Route.DeadLetterTopic == "" {
			return Fatal(fmt.Errorf("%w. To move past it, set on_error: dead_letter and a dead_letter_topic on the route of %s and start outboxd again", err, b.Name))
		}
	}
	s.txn = s.tracker.Begin(time.Now(), m.lsn)
	defer func() {
		s.prod.Flush()
		s.tracker.Commit(s.txn, m.lsn)
		s.txn = nil
	}()
	for _, b := range bs {
		if err := s.deadLetter(b, s.row, err); err != nil {
			return err
		}
	}
	return nil
}

// publish makes the records of one change, one per route that takes it.
func (s *stream) publish(bs []*envelope.Binding, row []envelope.Column) error {
	pos := envelope.Position{CommitLSN: uint64(s.txn.CommitLSN()), Index: s.index, CommitTime: s.txn.commitTime.UnixMicro()}
	s.index++
	for _, b := range bs {
		rec := &s.rec
		var verdict envelope.Verdict
		var err error
		*rec, verdict, err = s.r.router.Build(b, row, pos, &s.scratch)
		switch {
		case err != nil:
			if b.Route == nil || b.Route.DeadLetterTopic == "" {
				return Fatal(badRowError(b, s.txn.CommitLSN(), err))
			}
			if err := s.deadLetter(b, row, err); err != nil {
				return err
			}
			continue
		case verdict == envelope.Dropped:
			s.r.dropped.Add(1)
			continue
		case verdict == envelope.Filtered:
			continue
		}
		var route *envelope.Binding
		if rec.Refusable {
			route = b
		}
		rec.Ack = s.tracker.Track(s.txn, rec.Size(), route)
		if mark := s.r.cfg.Mark; mark != nil {
			// postgres.mark_published: publicat_en is set before the
			// acknowledgement counts (a message has no row: not marked).
			rec.Ack = mark(b.Name, rec.RowID, rec.Ack)
		}
		if err := s.produce(rec); err != nil {
			return err
		}
	}
	return nil
}

// deadLetter produces the dead-letter record of a change in the open
// transaction: the slot passes the change only once Kafka acknowledged it.
func (s *stream) deadLetter(b *envelope.Binding, row []envelope.Column, reason error) error {
	lsn := s.txn.CommitLSN()
	rec := &s.rec
	*rec = s.r.router.DeadLetter(b, row, reason, lsn.String(), time.Now())
	s.r.log.Warn("row dead-lettered", "table", b.Name, "topic", rec.Topic, "lsn", lsn.String(), "reason", reason.Error())
	s.r.deadLettered.Add(1)
	rec.Ack = s.tracker.Track(s.txn, rec.Size(), nil)
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
