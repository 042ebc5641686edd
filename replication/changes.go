package replication

import (
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/publish"
)

// handleMessage takes one pgoutput message: a transaction's bounds go to
// the tracker, a change goes to the publisher in its transaction.
func (s *stream) handleMessage(wal []byte) error {
	if len(wal) > 0 && s.streamed != nil {
		if handled, err := s.handleStreamed(wal); handled {
			return err
		}
	}
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
		relID, bs := s.bind(m)
		s.relations[relID] = bs
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
		s.commit(m.TransactionEndLSN)
	default:
		// Origins, types; updates, deletes and truncates (an insert-only
		// publication sends none) are ignored.
	}
	return nil
}

// bind is a Relation message's routes. With publish_via_partition_root
// pgoutput sends a partition's Relation beside its table's; its rows come
// under its own name only when committed while that was off.
func (s *stream) bind(m *pglogrepl.RelationMessage) (uint32, []*envelope.Binding) {
	part := catalog.Table{Schema: m.Namespace, Name: m.RelationName}
	if root, ok := s.partitions[part]; ok {
		s.log.Debug("a partition's relation: its rows route as its table's", "partition", part.String(), "table", root.String())
		rel := *m
		rel.Namespace, rel.RelationName = root.Schema, root.Name
		m = &rel
	}
	return m.RelationID, s.router.Bind(m)
}

// commit ends the open transaction at its end LSN: the tracker confirms
// it once Kafka acknowledged all its records.
func (s *stream) commit(end pglogrepl.LSN) {
	if s.txn.Carried() {
		// With no request in flight its records go out now, not after
		// the linger; while one is, they batch up (sink.Producer.Flush).
		s.prod.Flush()
	}
	s.tracker.Commit(s.txn, end)
	s.txn = nil
	s.events.committed()
}

// handleInsert publishes one inserted row: the publisher hands its records
// (or dead-letter records) to the producer, which copies each: the row
// references the message buffer, valid until the next receive.
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
	bs := s.router.BindMessage(m.prefix)
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
		if !publish.DeadLetters(b) {
			return Fatal(fmt.Errorf("%w. To move past it, set on_error: dead_letter and a dead_letter_topic on the route of %s and start outboxd again", err, b.Name))
		}
	}
	s.txn = s.tracker.Begin(s.clock.Now(), m.lsn)
	defer func() {
		s.prod.Flush()
		s.tracker.Commit(s.txn, m.lsn)
		s.txn = nil
	}()
	for _, b := range bs {
		if err := s.pub.DeadLetter(s.txn, b, s.row, err, envelope.Position{CommitLSN: m.lsn}); err != nil {
			return s.deliveryError(err)
		}
	}
	return nil
}

// publish hands one change of the open transaction to the publisher: its
// records count toward the transaction, whose end the tracker confirms
// only once Kafka acknowledged every one of them.
func (s *stream) publish(bs []*envelope.Binding, row []envelope.Column) error {
	pos := envelope.Position{CommitLSN: s.txn.CommitLSN(), Index: s.index, CommitTime: s.txn.commitTime.UnixMicro()}
	s.index++
	if err := s.pub.Change(s.txn, bs, row, pos); err != nil {
		return s.changeError(err)
	}
	return nil
}

// changeError is the session's end on a change the publisher did not take:
// a bad row stops outboxd (its error says how to move past it); a delivery
// failure is the broker's. Kept apart from publish so that the pointer
// errors.As needs escapes only on this path.
func (s *stream) changeError(err error) error {
	var bad *publish.BadRowError
	if errors.As(err, &bad) {
		return Fatal(err)
	}
	return s.deliveryError(err)
}
