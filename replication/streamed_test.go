package replication

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/publish/publishtest"
)

// Protocol version 2's streaming messages, as pgoutput writes them
// (PostgreSQL's "Logical Replication Message Formats").

func streamStartMsg(xid uint32, first bool) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'S'}, xid)
	if first {
		return append(b, 1)
	}
	return append(b, 0)
}

func streamStopMsg() []byte { return []byte{'E'} }

func streamCommitMsg(xid uint32, commit, end pglogrepl.LSN) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'c'}, xid)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint64(b, uint64(commit))
	b = binary.BigEndian.AppendUint64(b, uint64(end))
	return binary.BigEndian.AppendUint64(b, 0)
}

func streamAbortMsg(xid, subxid uint32) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'A'}, xid)
	return binary.BigEndian.AppendUint32(b, subxid)
}

// inStream is a change as pgoutput sends it inside a stream: the xid of
// its (sub)transaction after the type byte.
func inStream(xid uint32, msg []byte) []byte {
	b := binary.BigEndian.AppendUint32([]byte{msg[0]}, xid)
	return append(b, msg[1:]...)
}

// logicalMsg is a transactional logical message of prefix.
func logicalMsg(prefix, content string) []byte {
	b := []byte{'M', 1}
	b = binary.BigEndian.AppendUint64(b, 0x1234)
	b = append(append(b, prefix...), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(content)))
	return append(b, content...)
}

// newStreamingStream is a test stream with protocol version 2's streamed
// transactions, spilling to a test directory.
func newStreamingStream(t *testing.T) (*stream, *publishtest.Producer, string) {
	t.Helper()
	prod := &publishtest.Producer{}
	s := newTestStream(mustRouter(t, outboxRoute("")), prod, 0x100, Config{MaxInFlightEvents: 1 << 20, MaxInFlightBytes: 1 << 40})
	dir := t.TempDir()
	s.streamed = newStreamedTxns(dir, "outboxd_test")
	t.Cleanup(s.streamed.close)
	return s, prod, dir
}

// feed hands msgs to the stream, and publishes a committed streamed
// transaction as the run loop does.
func feed(t *testing.T, s *stream, msgs ...[]byte) {
	t.Helper()
	for _, m := range msgs {
		if err := s.handleMessage(m); err != nil {
			t.Fatalf("message %q: %v", m[:1], err)
		}
		for s.streamed != nil && s.streamed.replay != nil {
			if err := s.replayStep(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

type keyPos struct {
	key   string
	lsn   uint64
	index uint32
}

func produced(t *testing.T, prod *publishtest.Producer) []keyPos {
	t.Helper()
	var out []keyPos
	for i := 0; i < prod.Len(); i++ {
		r := prod.Record(t, i)
		out = append(out, keyPos{string(r.Key), r.Pos.LSN, r.Pos.Index})
	}
	return out
}

func equalKeyPos(a, b []keyPos) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestStreamedTransactionAtItsCommit: a streamed transaction's rows are
// published only at its Stream Commit, in arrival order, without the rows
// of its rolled-back subtransaction, at the positions the same
// transaction sent whole (protocol 1) gets: the index counts the surviving
// changes. A transaction sent whole between two segments is published at
// once.
func TestStreamedTransactionAtItsCommit(t *testing.T) {
	const xid, sub, kept = 700, 701, 702
	s, prod, _ := newStreamingStream(t)
	feed(t, s, relationMsg(),
		streamStartMsg(xid, true),
		inStream(xid, insertMsg("A-1")),
		inStream(sub, insertMsg("A-rolled-back")),
		streamStopMsg(),
		beginMsg(0x2000), insertMsg("P-1"), commitMsg(0x2000, 0x2010),
		streamStartMsg(xid, false),
		inStream(sub, insertMsg("A-rolled-back-2")),
		inStream(kept, insertMsg("A-2")),
		inStream(xid, insertMsg("A-3")),
		streamStopMsg(),
		streamAbortMsg(xid, sub))
	if got := produced(t, prod); !equalKeyPos(got, []keyPos{{"P-1", 0x2000, 0}}) {
		t.Fatalf("before the Stream Commit: %v, want only the transaction sent whole", got)
	}
	feed(t, s, streamCommitMsg(xid, 0x3000, 0x3010))

	// The same transaction sent whole, as protocol 1 would.
	whole, wprod, _ := newStreamingStream(t)
	feed(t, whole, relationMsg(), beginMsg(0x3000), insertMsg("A-1"), insertMsg("A-2"), insertMsg("A-3"), commitMsg(0x3000, 0x3010))
	want := append([]keyPos{{"P-1", 0x2000, 0}}, produced(t, wprod)...)
	if got := produced(t, prod); !equalKeyPos(got, want) {
		t.Fatalf("after the Stream Commit: %v\nwant %v", got, want)
	}
	if len(s.streamed.open) != 0 || s.txn != nil {
		t.Fatalf("transactions left open: %d streamed, txn %v", len(s.streamed.open), s.txn)
	}
}

// TestStreamedUnroutedMessageCounts: a transactional logical message
// without a route counts in a streamed transaction's index as in the
// transaction sent whole.
func TestStreamedUnroutedMessageCounts(t *testing.T) {
	const xid = 750
	s, prod, _ := newStreamingStream(t)
	feed(t, s, relationMsg(), streamStartMsg(xid, true), inStream(xid, insertMsg("A-1")), inStream(xid, logicalMsg("altres", "x")),
		streamStopMsg(), streamStartMsg(xid, false), inStream(xid+1, insertMsg("A-2")), streamStopMsg(), streamCommitMsg(xid, 0x3000, 0x3010))
	whole, wprod, _ := newStreamingStream(t)
	feed(t, whole, relationMsg(), beginMsg(0x3000), insertMsg("A-1"), logicalMsg("altres", "x"), insertMsg("A-2"), commitMsg(0x3000, 0x3010))
	if got, want := produced(t, prod), produced(t, wprod); !equalKeyPos(got, want) || want[1].index != 2 {
		t.Fatalf("streamed %v, whole %v", got, want)
	}
}

// TestStreamAbortPublishesNothing: a streamed transaction aborted whole
// (Stream Abort of its own xid) publishes nothing, confirms nothing of it,
// and leaves no spill file.
func TestStreamAbortPublishesNothing(t *testing.T) {
	const xid = 900
	s, prod, dir := newStreamingStream(t)
	msgs := [][]byte{relationMsg(), streamStartMsg(xid, true)}
	for i := 0; i < 5000; i++ { // past spillMemory: a file
		msgs = append(msgs, inStream(xid, insertMsg("R-"+strconv.Itoa(i))))
	}
	feed(t, s, append(msgs, streamStopMsg())...)
	if files := spillFiles(t, dir); len(files) != 1 {
		t.Fatalf("spill files while streaming: %v, want one", files)
	}
	feed(t, s, streamAbortMsg(xid, xid), beginMsg(0x5000), insertMsg("P-1"), commitMsg(0x5000, 0x5010))
	if got := produced(t, prod); !equalKeyPos(got, []keyPos{{"P-1", 0x5000, 0}}) {
		t.Fatalf("produced %v, want only P-1", got)
	}
	if files := spillFiles(t, dir); len(files) != 0 {
		t.Fatalf("spill files after the abort: %v", files)
	}
}

// TestStreamedTransactionSpills: a transaction larger than the memory
// buffer goes through its spill file whole and in order, the file is
// counted and removed at the commit.
func TestStreamedTransactionSpills(t *testing.T) {
	const xid, n = 1000, 20000
	s, prod, dir := newStreamingStream(t)
	r := s.events.(*Runner)
	feed(t, s, relationMsg())
	for seg := 0; seg < 4; seg++ {
		msgs := [][]byte{streamStartMsg(xid, seg == 0)}
		for i := seg * n / 4; i < (seg+1)*n/4; i++ {
			msgs = append(msgs, inStream(xid, insertMsg("R-"+strconv.Itoa(i))))
		}
		feed(t, s, append(msgs, streamStopMsg())...)
	}
	if files := spillFiles(t, dir); len(files) != 1 || prod.Len() != 0 {
		t.Fatalf("before the commit: files %v, %d records", files, prod.Len())
	}
	feed(t, s, streamCommitMsg(xid, 0x9000, 0x9010))
	got := produced(t, prod)
	if len(got) != n {
		t.Fatalf("%d records, want %d", len(got), n)
	}
	for i, g := range got {
		if g != (keyPos{"R-" + strconv.Itoa(i), 0x9000, uint32(i)}) {
			t.Fatalf("record %d: %+v", i, g)
		}
	}
	if files := spillFiles(t, dir); len(files) != 0 {
		t.Fatalf("spill files after the commit: %v", files)
	}
	if st := r.Status(); st.StreamedTxns != 1 || st.SpilledBytes < spillMemory {
		t.Fatalf("counted %d streamed transactions, %d bytes spilled", st.StreamedTxns, st.SpilledBytes)
	}
}

// TestStreamedTransactionConfirmedOnlyOnceAcknowledged: the slot may
// follow the small transactions committed while a streamed one is open,
// but never passes the streamed one's end before Kafka acknowledged every
// record of its replay, keepalives included.
func TestStreamedTransactionConfirmedOnlyOnceAcknowledged(t *testing.T) {
	const xid = 1200
	s, prod, _ := newStreamingStream(t)
	feed(t, s, relationMsg(), streamStartMsg(xid, true), inStream(xid, insertMsg("A-1")), streamStopMsg(),
		beginMsg(0x2000), insertMsg("P-1"), commitMsg(0x2000, 0x2010))
	prod.Record(t, 0).Ack.Ack(nil)
	if c := s.tracker.State().Confirmed; c != 0x2010 {
		t.Fatalf("the small transaction acknowledged: confirmed %s, want 0/2010", c)
	}
	feed(t, s, streamStartMsg(xid, false), inStream(xid, insertMsg("A-2")), streamStopMsg(),
		streamCommitMsg(xid, 0x3000, 0x3010))
	if prod.Len() != 3 {
		t.Fatalf("%d records, want 3", prod.Len())
	}
	prod.Record(t, 1).Ack.Ack(nil)
	s.tracker.Keepalive(0x4000)
	if c := s.tracker.State().Confirmed; c != 0x2010 {
		t.Fatalf("one record of the streamed transaction unacknowledged: confirmed %s, want 0/2010", c)
	}
	prod.Record(t, 2).Ack.Ack(nil)
	if c := s.tracker.State().Confirmed; c != 0x3010 {
		t.Fatalf("every record acknowledged: confirmed %s, want 0/3010", c)
	}
}

// TestCleanSpillsOnlyTheSlots: a start removes its slot's stale spill
// files, never another slot's; a spill directory outboxd cannot write
// turns streaming off.
func TestCleanSpillsOnlyTheSlots(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"outboxd-km0-12-1.spill", "outboxd-km0-13-2.spill", "outboxd-km0_b-12-3.spill", "other.spill"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := cleanSpills(dir, "km0"); err != nil || n != 2 {
		t.Fatalf("cleanSpills: %d, %v", n, err)
	}
	left := spillFiles(t, dir)
	if len(left) != 2 || left[0] != "other.spill" || left[1] != "outboxd-km0_b-12-3.spill" {
		t.Fatalf("left %v", left)
	}
	// A directory that is not there: nothing to clean, and no streaming
	// (DecideStreaming's probe, before any session streams).
	missing := filepath.Join(dir, "missing")
	if n, err := cleanSpills(missing, "km0"); err != nil || n != 0 {
		t.Fatalf("cleanSpills of a missing directory: %d, %v", n, err)
	}
	if d := DecideStreaming(true, false, 150000, missing); d.DirErr == nil || d.Off == "" || d.Dir != missing {
		t.Fatalf("a spill directory that does not exist: %+v", d)
	}
}

// TestProtocol: protocol version 2 with streaming on PostgreSQL 14+ unless
// postgres.streaming is false; version 1 otherwise.
func TestProtocol(t *testing.T) {
	for _, c := range []struct {
		streaming bool
		version   int
		want      string
	}{{true, 150010, "proto_version '2'"}, {true, 130000, "proto_version '1'"}, {false, 170000, "proto_version '1'"}} {
		r := newTestRunner(Config{Streaming: c.streaming, Publication: "p"}, mustRouter(t, outboxRoute("")))
		r.serverVersion = c.version
		args, on := r.protocol(0)
		if args[0] != c.want || on != (c.want == "proto_version '2'") || on != (args[len(args)-1] == "streaming 'on'") {
			t.Errorf("%+v: %v %v", c, args, on)
		}
	}
	// A message route: a streamed transaction's messages come under its
	// top-level xid, those of a rolled-back savepoint included.
	withMessages := mustRouter(t, append(outboxRoute(""), envelope.Route{Prefix: "comandes", Topic: "missatges", Columns: seedColumns}))
	r := newTestRunner(Config{Streaming: true, Publication: "p"}, withMessages)
	r.serverVersion = 170000
	if args, on := r.protocol(0); on || args[0] != "proto_version '1'" {
		t.Errorf("with a message route: %v %v", args, on)
	}
	// A transaction that must come whole, until the slot passes it.
	r = newTestRunner(Config{Streaming: true, Publication: "p"}, mustRouter(t, outboxRoute("")))
	r.serverVersion = 170000
	r.wholeUntil(0x5000)
	if _, on := r.protocol(0x4fff); on {
		t.Error("streaming before the slot passed the transaction that must come whole")
	}
	if _, on := r.protocol(0x5000); !on {
		t.Error("no streaming once the slot passed the transaction that must come whole")
	}
}

// TestUncertainPositionsComeWhole: a streamed transaction with a logical
// message without a route and a rolled-back subtransaction has positions
// that depend on whether the message was the subtransaction's, which
// pgoutput does not say (it streams messages under the top-level xid). Its
// Stream Commit publishes nothing and ends the session; the next sessions
// ask for the transaction whole until the slot passes it.
func TestUncertainPositionsComeWhole(t *testing.T) {
	const xid, sub = 800, 801
	s, prod, dir := newStreamingStream(t)
	r := s.events.(*Runner)
	r.serverVersion, r.cfg.Streaming = 150000, true
	feed(t, s, relationMsg(), streamStartMsg(xid, true), inStream(xid, insertMsg("A-1")), inStream(xid, logicalMsg("altres", "x")),
		inStream(sub, insertMsg("A-2")), inStream(xid, insertMsg("A-3")), streamStopMsg(), streamAbortMsg(xid, sub))
	err := s.handleMessage(streamCommitMsg(xid, 0x3000, 0x3010))
	if err == nil || IsFatal(err) {
		t.Fatalf("Stream Commit: %v, want an error that reconnects", err)
	}
	if prod.Len() != 0 || s.txn != nil || len(spillFiles(t, dir)) != 0 {
		t.Fatalf("after the Stream Commit: %d records, txn %v, files %v", prod.Len(), s.txn, spillFiles(t, dir))
	}
	if _, on := r.protocol(0x2000); on {
		t.Fatal("the next session streams before the slot passed the transaction")
	}
}

func spillFiles(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// TestStatusGoesOutDuringAReplay: while a committed streamed transaction
// is replayed and the in-flight bound holds it back, standby status keeps
// going out (the server's wal_sender_timeout), confirming what Kafka
// acknowledged before it and nothing of it; once every record of it is
// acknowledged, its end.
func TestStatusGoesOutDuringAReplay(t *testing.T) {
	s, w, prod := newWalsenderStream(t, Config{MaxInFlightEvents: 10, MaxInFlightBytes: 1 << 20}, outboxRoute(""), 0x100)
	s.streamed = newStreamedTxns(t.TempDir(), "outboxd_test")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := runStream(ctx, s)
	const xid, rows = 7, 100
	w.xlog(0x100, relationMsg())
	w.xlog(0x1000, streamStartMsg(xid, true))
	for i := 0; i < rows; i++ {
		w.xlog(0x1000, inStream(xid, insertMsg("S-"+strconv.Itoa(i))))
	}
	w.xlog(0x1000, streamStopMsg())
	w.txn(0x2000, 0x2010, "P-1")
	prod.Record(t, 0).Ack.Ack(nil)
	w.xlog(0x3000, streamCommitMsg(xid, 0x3000, 0x3010))
	prod.Record(t, 10) // the replay is at the in-flight bound
	before := len(w.flushes())
	flushes := w.waitFlushes(before + 2)
	if last := flushes[len(flushes)-1]; last != 0x2010 {
		t.Fatalf("statuses during the replay: %v, want the last at 0/2010", flushes)
	}
	if n := prod.Len(); n != 11 {
		t.Fatalf("%d records produced while nothing of the replay was acknowledged, want 11", n)
	}
	for i := 1; i <= rows; i++ {
		prod.Record(t, i).Ack.Ack(nil)
	}
	if !w.changes.Wait(func() bool { fl := w.flushes(); return fl[len(fl)-1] == 0x3010 }) {
		t.Fatalf("statuses after every record was acknowledged: %v, want 0/3010 at last", w.flushes())
	}
	for _, f := range w.flushes() {
		if f > 0x2010 && f != 0x3010 {
			t.Fatalf("flush %s confirmed inside the streamed transaction", f)
		}
	}
	cancel()
	if err := waitErr(t, done, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestStreamSegmentsMustStartFirst: a later segment of a transaction whose
// first this session did not receive, or a second first segment, ends the
// session rather than publish a part of the transaction at its commit
// (PostgreSQL sends neither; a slip would lose the part not received).
func TestStreamSegmentsMustStartFirst(t *testing.T) {
	s, prod, _ := newStreamingStream(t)
	feed(t, s, relationMsg())
	if err := s.handleMessage(streamStartMsg(42, false)); err == nil {
		t.Fatal("a later segment of an unknown transaction was taken")
	}
	s, prod, _ = newStreamingStream(t)
	feed(t, s, relationMsg(), streamStartMsg(43, true), inStream(43, insertMsg("P-1")), streamStopMsg())
	if err := s.handleMessage(streamStartMsg(43, true)); err == nil {
		t.Fatal("a second first segment of an open transaction was taken")
	}
	if prod.Len() != 0 {
		t.Fatalf("%d records published", prod.Len())
	}
}

// TestCutShortSpillStops: a spill file that ends early, at a change's
// boundary, is an error at the commit, not a shorter transaction.
func TestCutShortSpillStops(t *testing.T) {
	const xid = 901
	s, prod, dir := newStreamingStream(t)
	msgs := [][]byte{relationMsg(), streamStartMsg(xid, true)}
	for i := 0; i < 5000; i++ { // past spillMemory: a file
		msgs = append(msgs, inStream(xid, insertMsg("R-"+strconv.Itoa(i))))
	}
	feed(t, s, append(msgs, streamStopMsg())...)
	files := spillFiles(t, dir)
	if len(files) != 1 {
		t.Fatalf("spill files: %v", files)
	}
	sp := s.streamed.open[xid]
	if err := sp.w.Flush(); err != nil {
		t.Fatal(err)
	}
	// Drop the file's last change: its header and its message.
	path := filepath.Join(dir, files[0])
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	last := int64(spillHeader + len(insertMsg("R-4999")))
	if err := os.Truncate(path, fi.Size()-last); err != nil {
		t.Fatal(err)
	}
	err = s.handleMessage(streamCommitMsg(xid, 0x6000, 0x6010))
	for err == nil && s.streamed.replay != nil {
		err = s.replayStep()
	}
	if err == nil || !strings.Contains(err.Error(), "4999 changes of 5000") {
		t.Fatalf("a spill file cut short at a change's end: %v (%d records), want the count's error", err, prod.Len())
	}
	t.Logf("cut short: %v (%d records handed over before it, none confirmed)", err, prod.Len())
}
