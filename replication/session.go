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

// failedCloseTimeout bounds how long a failed session waits for its
// producer to close.
const failedCloseTimeout = 2 * time.Second

// session runs one replication connection: prepare, stream, and on ctx
// cancellation a clean stop. progressed reports whether streaming started.
func (r *Runner) session(ctx context.Context, first bool) (progressed bool, err error) {
	conn, err := pgconn.ConnectConfig(ctx, r.conn)
	if err != nil {
		return false, classify(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()

	slot, err := r.prepare(ctx, conn, first && r.cfg.CreateSlot)
	if err != nil {
		return false, err
	}
	prod, err := r.newProducer()
	if err != nil {
		return false, Fatal(fmt.Errorf("kafka producer: %w", err))
	}
	tracker := NewTracker(slot.confirmed, r.cfg.MaxInFlightEvents, r.cfg.MaxInFlightBytes)
	if r.cfg.OnConfirm != nil {
		tracker.OnConfirm(r.cfg.OnConfirm)
	}
	defer func() {
		// After a clean stop every record was acknowledged and Close only
		// flushes. After a failure the outstanding records are abandoned:
		// their positions were never confirmed, the next session replays
		// them, so waiting for batches to a dead broker would only delay
		// the reconnection (and starve the server of status updates).
		timeout := r.cfg.ShutdownTimeout
		if err != nil {
			r.setState("backoff", err)
			timeout = failedCloseTimeout
		}
		cctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if cerr := prod.Close(cctx); cerr != nil {
			r.log.Debug("close producer", "error", cerr)
		}
	}()

	args := []string{"proto_version '1'", "publication_names " + quoteLiteral(r.cfg.Publication), "messages 'true'"}
	// Start at 0/0: the server resumes from the slot's confirmed_flush_lsn.
	if err := pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		if hasCode(err, "42704") {
			return false, Fatal(fmt.Errorf("start replication: %w", err))
		}
		if hasCode(err, "55006") { // replication slot is active for PID n
			return false, &standbyError{err}
		}
		return false, fmt.Errorf("start replication: %w", err)
	}
	r.log.Info("streaming", "slot", r.cfg.Slot, "from", slot.confirmed.String())
	r.setState("streaming", nil)
	r.mu.Lock()
	r.status.LastStatusSent = time.Now()
	r.mu.Unlock()

	r.useTracker(tracker)
	// Wake a blocked read at once when a stop is requested.
	stopWake := context.AfterFunc(ctx, func() { _ = conn.Conn().SetReadDeadline(time.Now()) })
	defer stopWake()
	// sentFlush starts at the slot's position, so nothing is sent until this
	// stream has moved it.
	s := &stream{r: r, conn: conn, prod: prod, tracker: tracker, relations: map[uint32]*envelope.Binding{}, sentFlush: slot.confirmed}
	return true, s.run(ctx)
}

// stream is the state of one streaming session. Only its goroutine touches
// it; acknowledgements reach it through the tracker.
type stream struct {
	r         *Runner
	conn      *pgconn.PgConn
	prod      Producer
	tracker   *Tracker
	relations map[uint32]*envelope.Binding

	txn      *Txn          // open transaction
	txnLSN   string        // its final LSN, for error messages
	received pglogrepl.LSN // newest WAL position received

	// Reused from row to row: the decoded columns (they reference the
	// message buffer), the envelope's memory, and the record handed to the
	// producer (a local would escape to the heap: one allocation per row).
	row     []envelope.Column
	scratch envelope.Scratch
	rec     outboxd.Record

	sentFlush pglogrepl.LSN // flush position last sent
	sentAt    time.Time
	reply     bool // the server asked for a reply
	// positioned is set once the server has told this stream a position
	// (a keepalive or a commit). Before that, the slot position read at
	// session start may be older than the server's (another instance's
	// final status may have landed in between), so no position is sent.
	positioned bool

	lastRecv  time.Time // last message from the server (or end of a backpressure pause)
	pinged    bool      // a status asking for a reply went out since lastRecv
	lastAcked uint64    // acknowledged count at lastAckAt
	lastAckAt time.Time // last acknowledgement progress, or when records started waiting
}

func (s *stream) run(ctx context.Context) error {
	cfg := s.r.cfg
	// Records are handed to Kafka under a context that a stop request does
	// not cancel: a clean stop still finishes the open transaction.
	pctx, pcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer pcancel()
	nextStatus := time.Now().Add(cfg.StatusInterval)
	var stopDeadline time.Time // set once ctx is cancelled
	var readDeadline time.Time // the connection's, as last set here
	s.lastRecv, s.lastAckAt = time.Now(), time.Now()
	now := time.Now()
	for {
		if s.reply || !now.Before(nextStatus) {
			if err := s.sendStatus(now, false); err != nil {
				return err
			}
			nextStatus = now.Add(cfg.StatusInterval)
		}
		st := s.tracker.State()
		if err := s.checkPeers(now, st); err != nil {
			return err
		}
		if st.Err != nil {
			// Confirmation is frozen below the failed record; tell the
			// server where it stands and replay from the slot.
			_ = s.sendStatus(now, false)
			return s.deliveryError(st.Err)
		}

		if ctx.Err() != nil {
			if stopDeadline.IsZero() {
				stopDeadline = now.Add(cfg.ShutdownTimeout)
				s.r.setState("stopping", nil)
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
			if err := s.handleCopyData(pctx, m.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			err := pgconn.ErrorResponseToPgError(m)
			if hasCode(err, "42704") || hasCode(err, "55000") {
				// Slot or publication gone, or decoding impossible.
				return Fatal(fmt.Errorf("replication stream: %w", err))
			}
			return fmt.Errorf("replication stream: %w", err)
		case *pgproto3.CopyDone:
			return errors.New("the server ended the replication stream")
		default:
			// Notices and parameter status changes need no action.
		}
	}
}

func (s *stream) handleCopyData(ctx context.Context, data []byte) error {
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
		s.positioned = true
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
		return s.handleMessage(ctx, x.WALData)
	}
	return nil
}

func (s *stream) handleMessage(ctx context.Context, wal []byte) error {
	if len(wal) > 0 && wal[0] == 'I' {
		return s.handleInsert(ctx, wal)
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
		s.txn = s.tracker.Begin(m.CommitTime)
		s.txnLSN = m.FinalLSN.String()
	case *pglogrepl.CommitMessage:
		if s.txn == nil {
			return errors.New("pgoutput: Commit outside a transaction")
		}
		s.tracker.Commit(s.txn, m.TransactionEndLSN)
		s.txn = nil
		s.positioned = true
		s.r.mu.Lock()
		s.r.status.Txns++
		s.r.mu.Unlock()
	default:
		// Logical decoding messages, origins, types; updates, deletes and
		// truncates (an insert-only publication sends none) are ignored.
	}
	return nil
}

// handleInsert turns one inserted row into a record (or a dead-letter
// record) and hands it to the producer, which copies it: the row and the
// record reference the message buffer, valid until the next receive.
func (s *stream) handleInsert(ctx context.Context, wal []byte) error {
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
	rec, err := s.r.router.Build(b, row, &s.scratch)
	keepRow := true
	if err == nil && s.tooLarge(&rec) {
		err = &envelope.RowError{Table: b.Name, Reason: fmt.Sprintf("the record is %d bytes, over kafka.batch_bytes (%d): raise it together with the broker's and the topic's max.message.bytes, or make the row smaller", rec.Size(), s.r.cfg.MaxRecordBytes)}
		keepRow = false
	}
	if err != nil {
		if b.Route == nil || b.Route.DeadLetterTopic == "" {
			return Fatal(fmt.Errorf("transaction committed at %s: %w", s.txnLSN, err))
		}
		// Dead-lettered in the same transaction: the slot passes the row
		// only once Kafka acknowledged its dead-letter record.
		rec = s.r.router.DeadLetter(b, row, err, s.txnLSN, time.Now(), keepRow)
		if s.tooLarge(&rec) {
			rec = s.r.router.DeadLetter(b, row, err, s.txnLSN, time.Now(), false)
		}
		s.r.log.Warn("row dead-lettered", "table", b.Name, "topic", rec.Topic, "lsn", s.txnLSN, "reason", err.Error())
		s.r.mu.Lock()
		s.r.status.DeadLettered++
		s.r.mu.Unlock()
	}
	rec.Ack = s.tracker.Track(s.txn, rec.Size())
	s.rec = rec
	err = s.prod.Produce(&s.rec)
	s.rec = outboxd.Record{}
	if err != nil {
		if isRecordError(err) {
			return Fatal(fmt.Errorf("transaction committed at %s: %w", s.txnLSN, err))
		}
		if first := s.tracker.State().Err; first != nil {
			// A fenced producer's error hides the delivery failure behind it.
			return s.deliveryError(first)
		}
		return err
	}
	return nil
}

// recordOverhead covers what Kafka's record format adds to key, value and
// headers (lengths, offsets, timestamps as varints).
const recordOverhead = 128

// tooLarge reports whether the producer would refuse rec for its size.
func (s *stream) tooLarge(rec *outboxd.Record) bool {
	return s.r.cfg.MaxRecordBytes > 0 && rec.Size()+recordOverhead > s.r.cfg.MaxRecordBytes
}

// deliveryError is the session's end after Kafka failed a record: fatal when
// the broker will never take it, a replay from the slot otherwise.
func (s *stream) deliveryError(err error) error {
	if isRecordError(err) {
		return Fatal(fmt.Errorf("kafka refused a record: %w", err))
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

// sendStatus reports the confirmed position: every interval while it moves,
// at least every idle interval, and whenever the server asks. ask requests
// an immediate reply (a keepalive), to prove the connection alive.
func (s *stream) sendStatus(now time.Time, ask bool) error {
	st := s.tracker.State()
	if st.Confirmed == 0 {
		// Never send 0: pglogrepl would replace it with the write position.
		return nil
	}
	if !ask && !s.reply && st.Confirmed == s.sentFlush && now.Sub(s.sentAt) < s.r.cfg.IdleStatusInterval {
		return nil
	}
	write, flush := s.received, st.Confirmed
	if write < flush {
		write = flush
	}
	if !s.positioned {
		// All zero: the walsender ignores an invalid flush position (and
		// pglogrepl substitutes the write position for a zero flush, so
		// write must be zero too). This still answers a reply request.
		write, flush = 0, 0
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write,
		WALFlushPosition: flush, // the acknowledged position, never the received one
		WALApplyPosition: flush,
		ClientTime:       now,
		ReplyRequested:   ask,
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	if s.positioned {
		s.sentFlush = flush
	}
	s.sentAt, s.reply = now, false
	s.r.mu.Lock()
	s.r.status.LastStatusSent = now
	s.r.mu.Unlock()
	return nil
}

// stop ends a session on request: wait (until the deadline) for the records
// in flight, send the final status, then end the COPY so the server has
// processed that status before the connection closes.
func (s *stream) stop(deadline time.Time) error {
	if s.txn != nil {
		// The deadline passed inside a transaction: it cannot be confirmed.
		s.r.log.Warn("shutdown timeout inside a transaction; it will be produced again on restart", "transaction", s.txnLSN)
	}
	for {
		st := s.tracker.State()
		if st.Open == 0 || st.Err != nil || time.Now().After(deadline) {
			if st.Open > 0 {
				s.r.log.Warn("stopped with unacknowledged records; they will be produced again on restart", "in_flight", st.Events, "error", st.Err)
				// Give up on them now: flushing them would only make
				// duplicates, and the grace period is spent.
				abandon, cancel := context.WithCancel(context.Background())
				cancel()
				_ = s.prod.Close(abandon)
			}
			break
		}
		wait := time.NewTimer(50 * time.Millisecond)
		select {
		case <-s.tracker.Wake():
		case <-wait.C:
		}
		wait.Stop()
	}
	s.reply = true // force the final status out
	if err := s.sendStatus(time.Now(), false); err != nil {
		return err
	}
	final := s.tracker.State().Confirmed
	if err := s.endCopy(); err != nil {
		s.r.log.Debug("end replication copy", "error", err)
	}
	s.r.log.Info("stopped cleanly", "confirmed", final.String())
	return nil
}

// endCopy sends CopyDone and reads until the server finishes the COPY: the
// walsender handles our messages in order, so the final status was applied.
func (s *stream) endCopy() error {
	s.conn.Frontend().Send(&pgproto3.CopyDone{})
	if err := s.conn.Frontend().Flush(); err != nil {
		return err
	}
	_ = s.conn.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.CopyDone, *pgproto3.CommandComplete, *pgproto3.ReadyForQuery:
			return nil
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		}
	}
}
