package replication

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// fatalSettleTimeout bounds how long a stream that stops on an error waits
// for the acknowledgements of the transactions before the failure.
const fatalSettleTimeout = 10 * time.Second

// settlePoll is how often a stream that is ending looks at the tracker while
// it waits on the connection.
const settlePoll = 50 * time.Millisecond

// sendStatus reports the confirmed position: every interval while it moves,
// at least every idle interval, and whenever the server asks. ask requests
// an immediate reply (a keepalive), to prove the connection alive.
func (s *stream) sendStatus(now time.Time, ask bool) error {
	st, acked := s.tracker.State(), s.pub.Acked()
	if !ask && !s.reply && st.Confirmed == s.sentFlush && now.Sub(s.sentAt) < s.cfg.idleStatusInterval {
		// Nothing new to confirm (acknowledgements inside a transaction
		// still open): not due again until as many more.
		s.ackedAtStatus = acked
		return nil
	}
	write, flush := standbyPositions(s.received, st)
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write,
		WALFlushPosition: flush,
		WALApplyPosition: flush,
		ClientTime:       now,
		ReplyRequested:   ask,
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	if st.Moved {
		s.sentFlush = flush
	}
	s.sentAt, s.reply, s.ackedAtStatus = now, false, acked
	s.events.statusSent(now)
	return nil
}

// standbyPositions is what a standby status reports: as flush (and apply)
// position the acknowledged one, never the received one. Until this stream
// has moved it, nothing: all zero, which the walsender ignores (pglogrepl
// substitutes the write position for a zero flush, so write is zero too).
// The position the tracker started from was read from pg_replication_slots
// before START_REPLICATION, and another instance's final status may have
// moved the slot past it since.
func standbyPositions(received pglogrepl.LSN, st State) (write, flush pglogrepl.LSN) {
	if !st.Moved {
		return 0, 0
	}
	return max(received, st.Confirmed), st.Confirmed
}

// stop ends a stream on request (SIGTERM) once its open transaction is read
// or the deadline has passed.
func (s *stream) stop(deadline time.Time) error {
	if s.txn != nil {
		// The deadline passed inside a transaction: it cannot be confirmed.
		s.log.Warn("shutdown timeout inside a transaction; it will be produced again on restart", "transaction", s.txn.CommitLSN().String())
	}
	s.end(deadline, true)
	return nil
}

// failed ends the stream on err. Before outboxd stops on a fatal error, the
// transactions before the failure that Kafka acknowledges are confirmed, so
// a restart does not produce them again.
func (s *stream) failed(err error) error {
	if !IsFatal(err) {
		// A replay from the slot follows: tell the server where it stands.
		_ = s.sendStatus(s.clock.Now(), false)
		return err
	}
	s.end(s.clock.Now().Add(min(s.cfg.shutdownTimeout, fatalSettleTimeout)), false)
	return err
}

// end finishes a stream that stops: it waits, until deadline, for the
// acknowledgements that can still move the confirmed position (keeping the
// connection alive meanwhile), gives up on the records that cannot be
// confirmed, sends the final position and ends the COPY so the server has
// applied it. The log says what the server was told.
func (s *stream) end(deadline time.Time, requested bool) {
	settled, err := s.settle(deadline)
	inFlight := s.pub.State().Events
	if inFlight > 0 {
		// Past the deadline, or in an open or failed transaction: these
		// records cannot be confirmed now, and flushing them would only
		// make duplicates.
		abandon, cancel := context.WithCancel(context.Background())
		cancel()
		_ = s.prod.Close(abandon)
	}
	if err == nil {
		s.reply = true // force the final status out
		err = s.sendStatus(s.clock.Now(), false)
	}
	if err == nil {
		err = s.endCopy()
	}
	confirmed := s.sentFlush.String()
	switch {
	case err != nil:
		s.log.Warn("stopped, but the final position may not have reached PostgreSQL: events after it will be produced again on restart",
			"confirmed", confirmed, "error", err)
	case !settled:
		s.log.Warn("stopped before every acknowledgement arrived (pipeline.shutdown_timeout): unacknowledged events will be produced again on restart",
			"confirmed", confirmed, "in_flight", inFlight)
	case requested && s.txn == nil:
		s.log.Info("stopped cleanly", "confirmed", confirmed)
	default:
		s.log.Info("stopped after confirming the acknowledged transactions", "confirmed", confirmed)
	}
}

// settle waits until no acknowledgement still to come can move the
// confirmed position, or until deadline (then it returns false). Meanwhile
// it keeps the connection alive: it sends status on the interval and
// whenever the server asks, and reads what the server sends. The WAL data
// that still arrives is not processed (the next stream gets it again), and
// so keepalives do not move the position either.
func (s *stream) settle(deadline time.Time) (bool, error) {
	next := s.clock.Now()
	for {
		// A failed produce fails its record, which settles its transaction.
		_ = s.pub.ReplaceRefused()
		if s.tracker.State().Settled && s.pub.State().Refused == 0 {
			return true, nil
		}
		now := s.clock.Now()
		if !now.Before(deadline) {
			return false, nil
		}
		if s.reply || !now.Before(next) {
			if err := s.sendStatus(now, false); err != nil {
				return false, err
			}
			next = now.Add(s.cfg.statusInterval)
		}
		_ = s.conn.Conn().SetReadDeadline(earliest(deadline, next, now.Add(settlePoll)))
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) {
				continue
			}
			return false, fmt.Errorf("receive from PostgreSQL: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if len(m.Data) > 0 && m.Data[0] == pglogrepl.PrimaryKeepaliveMessageByteID {
				if k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:]); err == nil && k.ReplyRequested {
					s.reply = true
				}
			}
		default:
			if err := serverMessage(msg); err != nil {
				return false, err
			}
		}
	}
}

// endCopy sends CopyDone and reads until the server finishes the COPY: the
// walsender handles our messages in order, so the final status was applied.
func (s *stream) endCopy() error {
	s.conn.Frontend().Send(&pgproto3.CopyDone{})
	if err := s.conn.Frontend().Flush(); err != nil {
		return err
	}
	_ = s.conn.Conn().SetReadDeadline(s.clock.Now().Add(5 * time.Second))
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

func earliest(t time.Time, more ...time.Time) time.Time {
	for _, u := range more {
		if u.Before(t) {
			t = u
		}
	}
	return t
}
