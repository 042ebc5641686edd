package replication

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/publish/publishtest"
)

// fakeWalsender is the server side of a replication connection in COPY
// BOTH mode: the test sends it pgoutput messages and keepalives, and it
// records every standby status the stream sends until the stream's
// CopyDone, which it answers as a walsender does.
type fakeWalsender struct {
	t       testing.TB
	backend *pgproto3.Backend
	wmu     sync.Mutex

	mu       sync.Mutex
	flush    []pglogrepl.LSN     // the flush position of every standby status
	changes  publishtest.Changes // at every status
	copyDone bool
}

// newWalsenderStream connects a stream to a fake walsender over loopback
// TCP (so that neither side blocks on the other's reading).
func newWalsenderStream(t *testing.T, cfg Config, routes []envelope.Route, start pglogrepl.LSN) (*stream, *fakeWalsender, *publishtest.Producer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc := <-accepted
	if sc == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { cc.Close(); sc.Close() })
	pcfg, err := pgconn.ParseConfig("postgres://outboxd@127.0.0.1:5432/km0")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgconn.Construct(&pgconn.HijackedConn{Conn: cc, Frontend: pgproto3.NewFrontend(cc, cc), Config: pcfg,
		ParameterStatuses: map[string]string{}, TxStatus: 'I'})
	if err != nil {
		t.Fatal(err)
	}
	w := &fakeWalsender{t: t, backend: pgproto3.NewBackend(sc, sc)}
	go w.serve()

	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = 50 * time.Millisecond
	}
	if cfg.IdleStatusInterval == 0 {
		cfg.IdleStatusInterval = time.Second
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	if cfg.MaxInFlightEvents == 0 {
		cfg.MaxInFlightEvents, cfg.MaxInFlightBytes = 1000, 1<<20
	}
	r := &Runner{cfg: cfg, router: mustRouter(t, routes), log: hclog.NewNullLogger(), clock: clock.System}
	prod := &publishtest.Producer{}
	return r.newStream(conn, prod, start, nil), w, prod
}

func (w *fakeWalsender) serve() {
	for {
		msg, err := w.backend.Receive()
		if err != nil {
			return
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if len(m.Data) == 34 && m.Data[0] == pglogrepl.StandbyStatusUpdateByteID {
				w.mu.Lock()
				w.flush = append(w.flush, pglogrepl.LSN(binary.BigEndian.Uint64(m.Data[9:])))
				w.mu.Unlock()
				w.changes.Changed()
			}
		case *pgproto3.CopyDone:
			w.mu.Lock()
			w.copyDone = true
			w.mu.Unlock()
			w.wmu.Lock()
			w.backend.Send(&pgproto3.CopyDone{})
			w.backend.Send(&pgproto3.CommandComplete{CommandTag: []byte("COPY 0")})
			_ = w.backend.Flush()
			w.wmu.Unlock()
			return
		}
	}
}

func (w *fakeWalsender) send(data []byte) {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	w.backend.Send(&pgproto3.CopyData{Data: data})
	if err := w.backend.Flush(); err != nil {
		w.t.Errorf("walsender: %v", err)
	}
}

// xlog sends one pgoutput message at lsn.
func (w *fakeWalsender) xlog(lsn pglogrepl.LSN, msg []byte) {
	b := []byte{pglogrepl.XLogDataByteID}
	b = binary.BigEndian.AppendUint64(b, uint64(lsn))
	b = binary.BigEndian.AppendUint64(b, uint64(lsn))
	b = binary.BigEndian.AppendUint64(b, 0)
	w.send(append(b, msg...))
}

// keepalive sends a primary keepalive with the server's WAL end.
func (w *fakeWalsender) keepalive(walEnd pglogrepl.LSN, reply bool) {
	b := []byte{pglogrepl.PrimaryKeepaliveMessageByteID}
	b = binary.BigEndian.AppendUint64(b, uint64(walEnd))
	b = binary.BigEndian.AppendUint64(b, 0)
	r := byte(0)
	if reply {
		r = 1
	}
	w.send(append(b, r))
}

// txn sends one committed transaction of outbox rows (keys), at commit LSN
// commit, ending at end.
func (w *fakeWalsender) txn(commit, end pglogrepl.LSN, keys ...string) {
	w.xlog(commit, beginMsg(commit))
	for _, k := range keys {
		w.xlog(commit, insertMsg(k))
	}
	w.xlog(commit, commitMsg(commit, end))
}

func (w *fakeWalsender) flushes() []pglogrepl.LSN {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]pglogrepl.LSN(nil), w.flush...)
}

// waitFlushes waits, at most 10 s, until the stream has sent n standby
// statuses, and returns their flush positions.
func (w *fakeWalsender) waitFlushes(n int) []pglogrepl.LSN {
	w.t.Helper()
	if !w.changes.Wait(func() bool { return len(w.flushes()) >= n }) {
		w.t.Fatalf("the stream sent %d standby statuses, want %d", len(w.flushes()), n)
	}
	return w.flushes()
}

// stopSignal passes a stream's events on to its runner, and closes stopped
// when the stream starts to stop.
type stopSignal struct {
	events
	stopped chan struct{}
}

func (e *stopSignal) stopping() {
	e.events.stopping()
	close(e.stopped)
}

func (w *fakeWalsender) ended() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.copyDone
}

// runStream runs s until it returns; the error arrives on the channel.
func runStream(ctx context.Context, s *stream) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.run(ctx) }()
	return done
}

func waitErr(t *testing.T, done <-chan error, d time.Duration) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatal("the stream did not return")
		return nil
	}
}
