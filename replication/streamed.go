package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/envelope"
)

// Streamed transactions (protocol version 2, streaming 'on', PostgreSQL
// 14+): the server sends a large transaction's changes before it commits,
// in segments between Stream Start and Stream Stop, each change prefixed
// with the xid of its (sub)transaction; transactions that are not streamed
// still come whole between Begin and Commit, also between two segments of
// a streamed one. A streamed transaction ends with a Stream Commit, or a
// Stream Abort of its xid; a Stream Abort of a subtransaction's xid drops
// that subtransaction's changes.
//
// outboxd publishes nothing of a streamed transaction before its commit:
// its changes wait in a spill (spill.go), and at the Stream Commit they
// are replayed, in arrival order, through the path a transaction sent
// whole takes, one step of the run loop at a time (replayStep), so that
// its records are positioned as they would have been and standby status
// keeps going out during a long replay. Its end is confirmed, as any
// transaction's, once Kafka acknowledged all its records.

// streamedTxns is a stream's state of the streamed transactions: nil with
// protocol version 1.
type streamedTxns struct {
	dir, slot string
	open      map[uint32]*spill // streamed transactions not yet ended, by xid
	cur       *spill            // the one whose segment is open (Stream Start to Stop)
	replay    *replaying        // the one committed and being published
	scratch   []byte            // a streamed change as protocol 1 sends it
}

// replaying is a committed streamed transaction being published.
type replaying struct {
	sp  *spill
	r   *spillReader
	end pglogrepl.LSN // the transaction's end LSN, confirmed once all is acknowledged
}

func newStreamedTxns(dir, slot string) *streamedTxns {
	return &streamedTxns{dir: dir, slot: slot, open: map[uint32]*spill{}}
}

// close removes what the session's streamed transactions spilled.
func (st *streamedTxns) close() {
	for _, sp := range st.open {
		sp.close()
	}
	clear(st.open)
	if st.replay != nil {
		st.replay.sp.close()
		st.replay = nil
	}
}

// Protocol version 2's messages of streaming.
const (
	msgStreamStart  = 'S'
	msgStreamStop   = 'E'
	msgStreamCommit = 'c'
	msgStreamAbort  = 'A'
)

// handleStreamed takes the messages of streaming, and every change inside
// a segment; it reports false for a message it leaves to handleMessage.
func (s *stream) handleStreamed(wal []byte) (bool, error) {
	st := s.streamed
	switch wal[0] {
	case msgStreamStart:
		if len(wal) < 6 {
			return true, Fatal(fmt.Errorf("decode pgoutput message 'S': %d bytes", len(wal)))
		}
		if st.cur != nil || s.txn != nil {
			return true, errors.New("pgoutput: Stream Start inside a transaction or a stream")
		}
		xid, first := binary.BigEndian.Uint32(wal[1:]), wal[5] == 1
		sp := st.open[xid]
		switch {
		case sp == nil && !first:
			// Its earlier segments are not here: publishing the rest at
			// its commit would publish a part of it.
			return true, fmt.Errorf("pgoutput: a later segment of streamed transaction %d, whose first this session did not receive", xid)
		case sp != nil && first:
			return true, fmt.Errorf("pgoutput: a first segment of streamed transaction %d, already open", xid)
		case sp == nil:
			sp = newSpill(st.dir, st.slot, xid)
			st.open[xid] = sp
			s.events.streamed()
		}
		st.cur = sp
		return true, nil
	case msgStreamStop:
		if st.cur == nil {
			return true, errors.New("pgoutput: Stream Stop outside a stream")
		}
		st.cur = nil
		return true, nil
	case msgStreamCommit:
		return true, s.streamCommit(wal)
	case msgStreamAbort:
		if len(wal) < 9 {
			return true, Fatal(fmt.Errorf("decode pgoutput message 'A': %d bytes", len(wal)))
		}
		if st.cur != nil {
			return true, errors.New("pgoutput: Stream Abort inside a stream")
		}
		xid, sub := binary.BigEndian.Uint32(wal[1:]), binary.BigEndian.Uint32(wal[5:])
		sp := st.open[xid]
		if sp == nil {
			return true, nil // nothing of it was streamed to this session
		}
		if sub == xid {
			sp.close()
			delete(st.open, xid)
			return true, nil
		}
		sp.aborted[sub] = true
		return true, nil
	}
	if st.cur == nil {
		return false, nil
	}
	return true, s.streamedChange(wal)
}

// streamedChange keeps one change of the open segment for the commit.
// Relation messages bind at once, for this transaction's changes (and for
// everything after its commit: the server counts its schema as sent then).
func (s *stream) streamedChange(wal []byte) error {
	st, sp := s.streamed, s.streamed.cur
	if len(wal) < 5 {
		return Fatal(fmt.Errorf("decode pgoutput message %q: %d bytes, no xid", wal[:1], len(wal)))
	}
	xid := binary.BigEndian.Uint32(wal[1:])
	// The change as protocol 1 sends it: what parseInsert and parseMessage
	// read, and what is spilled.
	st.scratch = append(append(st.scratch[:0], wal[0]), wal[5:]...)
	v1 := st.scratch
	var n int64
	var err error
	switch wal[0] {
	case 'I':
		if len(v1) < 5 {
			return Fatal(fmt.Errorf("decode pgoutput message 'I': %d bytes", len(wal)))
		}
		relID := binary.BigEndian.Uint32(v1[1:])
		bs := sp.relations[relID]
		if bs == nil {
			bs = s.relations[relID]
		}
		if bs == nil {
			return fmt.Errorf("pgoutput: Insert for relation %d before its Relation message", relID)
		}
		n, err = sp.add(changeInsert, xid, bs, v1[0], v1[1:])
	case 'M':
		m, perr := parseMessage(v1)
		if perr != nil {
			return Fatal(fmt.Errorf("decode pgoutput message 'M': %w", perr))
		}
		if !m.transactional {
			return errors.New("pgoutput: a non-transactional logical message inside a stream")
		}
		bs := s.router.BindMessage(m.prefix)
		kind := byte(changeMessage)
		if len(bs) == 0 {
			// It counts in the index (handleLogicalMessage). pgoutput
			// streams a message under the top-level xid (PostgreSQL
			// through 18), so one of a savepoint rolled back after it was
			// streamed counts here and not in the transaction sent whole:
			// the positions after it would differ by one (routed
			// messages turn streaming off; streamCommit ends the session
			// on such a transaction, which the next takes whole).
			kind = changeNone
		}
		n, err = sp.add(kind, xid, bs, v1[0], v1[1:])
	case 'R':
		msg, perr := pglogrepl.ParseV2(wal, true)
		if perr != nil {
			return Fatal(fmt.Errorf("decode pgoutput message 'R': %w", perr))
		}
		if m, ok := msg.(*pglogrepl.RelationMessageV2); ok {
			relID, bs := s.bind(&m.RelationMessage)
			sp.relations[relID] = bs
		}
		return nil
	case 'Y', 'O', 'U', 'D', 'T':
		// Types, origins; updates, deletes, truncates: ignored as in a
		// transaction sent whole.
		return nil
	default:
		return Fatal(fmt.Errorf("pgoutput: message %q inside a stream", wal[:1]))
	}
	if err != nil {
		return err
	}
	if n > 0 {
		s.events.spilled(n)
	}
	return nil
}

// streamCommit begins the replay of a committed streamed transaction: the
// run loop publishes its changes (replayStep) before it reads anything
// more from the server.
func (s *stream) streamCommit(wal []byte) error {
	st := s.streamed
	msg, err := pglogrepl.ParseV2(wal, false)
	if err != nil {
		return Fatal(fmt.Errorf("decode pgoutput message 'c': %w", err))
	}
	m := msg.(*pglogrepl.StreamCommitMessageV2)
	if st.cur != nil || s.txn != nil {
		return errors.New("pgoutput: Stream Commit inside a transaction or a stream")
	}
	sp := st.open[m.Xid]
	if sp == nil {
		return fmt.Errorf("pgoutput: Stream Commit of transaction %d, never streamed", m.Xid)
	}
	delete(st.open, m.Xid)
	if sp.unrouted && len(sp.aborted) > 0 {
		// A message without a route may have been the rolled-back
		// savepoint's (pgoutput streams it under the top-level xid): the
		// index of the changes after it is not known for sure, and the
		// restart de-duplication needs the one the transaction sent whole
		// gets. Nothing of it went out: the next session takes it whole.
		sp.close()
		s.events.wholeUntil(m.TransactionEndLSN)
		return fmt.Errorf("streamed transaction %d (commit %s) holds a logical message without a route and a rolled-back subtransaction: its positions are certain only when it comes whole; reconnecting without streaming until it is confirmed", m.Xid, m.CommitLSN)
	}
	r, err := sp.replay()
	if err != nil {
		sp.close()
		return err
	}
	// A Relation of the transaction is the relation's from its commit on.
	for id, bs := range sp.relations {
		s.relations[id] = bs
	}
	s.log.Info("a streamed transaction committed: publishing its changes", "xid", m.Xid, "commit", m.CommitLSN.String(),
		"changes", sp.n, "subtransactions_rolled_back", len(sp.aborted), "bytes", sp.size, "on_disk", sp.f != nil)
	s.txn = s.tracker.Begin(m.CommitTime, m.CommitLSN)
	s.index = 0
	st.replay = &replaying{sp: sp, r: r, end: m.TransactionEndLSN}
	return nil
}

// replayBatch bounds the changes one replayStep publishes: the run loop
// looks at Kafka's outcomes and the status due between two steps.
const replayBatch = 64

// replayStep publishes the next changes of the transaction being replayed,
// until the publisher is full or replayBatch went out, and commits the
// transaction after its last change. The positions are what the
// transaction sent whole would have had: the index counts the surviving
// changes as handleMessage counts them.
func (s *stream) replayStep() error {
	rp := s.streamed.replay
	for i := 0; i < replayBatch && (i == 0 || !s.pub.Full(0)); i++ {
		c, err := rp.r.next()
		if errors.Is(err, io.EOF) {
			s.streamed.replay = nil
			rp.sp.close()
			s.commit(rp.end)
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.replayChange(c); err != nil {
			return err
		}
	}
	return nil
}

func (s *stream) replayChange(c spilledChange) error {
	switch c.kind {
	case changeNone:
		s.index++
		return nil
	case changeInsert:
		_, row, err := parseInsert(c.msg, s.row)
		s.row = row
		if err != nil {
			return Fatal(fmt.Errorf("decode pgoutput message 'I': %w", err))
		}
		return s.publish(c.bs, row)
	case changeMessage:
		m, err := parseMessage(c.msg)
		if err != nil {
			return Fatal(fmt.Errorf("decode pgoutput message 'M': %w", err))
		}
		s.row = append(s.row[:0], envelope.Column{Kind: pglogrepl.TupleDataTypeText, Data: m.content})
		return s.publish(c.bs, s.row)
	}
	return fmt.Errorf("spill file: unknown change kind %q", c.kind)
}
