package replication

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/postgres"
	"github.com/outboxd/outboxd/publish"
)

// failedCloseTimeout bounds how long a failed session waits for its
// producer to close.
const failedCloseTimeout = 2 * time.Second

// replicationSession is what a session's connection is: a walsender
// connection named outboxd unless the DSN names it (pg_stat_replication
// tells instances apart by it), whose text output of timestamptz is what
// envelope parses.
var replicationSession = postgres.Session{App: "outboxd", DSNApp: true, Replication: true, Params: envelope.SessionParams}

// session runs one replication connection: prepare, stream, and on ctx
// cancellation a clean stop. It reports to the runner through its events
// and its return value only.
func (r *Runner) session(ctx context.Context) (err error) {
	conn, err := postgres.Connect(ctx, r.cfg.Conn, replicationSession)
	if err != nil {
		return classify(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()

	// Before prepare: the slot it may create exports a snapshot, which
	// the next command on this connection would end before the cut-over
	// reads it.
	src, err := r.readSource(ctx, conn)
	if err != nil {
		return err
	}
	start, cut, err := r.prepare(ctx, conn)
	if err != nil {
		return err
	}
	prod, err := r.newProducer(src)
	if err != nil {
		return Fatal(fmt.Errorf("kafka producer: %w", err))
	}
	defer func() {
		// After a clean stop every record was acknowledged and Close only
		// flushes. After a failure the outstanding records are abandoned:
		// their positions were never confirmed, the next session replays
		// them, so waiting for batches to a dead broker would only delay
		// the reconnection.
		timeout := r.cfg.ShutdownTimeout
		if err != nil {
			timeout = failedCloseTimeout
		}
		cctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if cerr := prod.Close(cctx); cerr != nil {
			r.log.Debug("close producer", "error", cerr)
		}
	}()

	if cut != nil {
		if err := r.publishSnapshot(ctx, conn, cut, prod); err != nil {
			return err
		}
	}

	// pgoutput decodes a change with the catalogs of its time: rows
	// committed while publish_via_partition_root was off reach the slot
	// under their partition's name, and route as its table's.
	tables := make([]catalog.Table, len(r.cfg.Tables))
	for i, t := range r.cfg.Tables {
		tables[i] = t.Table
	}
	partitions, err := catalog.Partitions(ctx, conn, tables)
	if err != nil {
		return err
	}

	args, streaming := r.protocol(start)
	// Start at 0/0: the server resumes from the slot's confirmed_flush_lsn.
	if err := pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		if hasCode(err, "42704") {
			return Fatal(fmt.Errorf("start replication: %w", err))
		}
		if hasCode(err, "55006") { // replication slot is active for PID n
			return &standbyError{err}
		}
		return fmt.Errorf("start replication: %w", err)
	}
	r.log.Info("streaming", "slot", r.cfg.Slot, "from", start.String())
	s := r.newStream(conn, prod, start, partitions)
	// The slot is ours now: no other instance's session spills for it, and
	// an earlier session's files (a killed process's) are stale, whether
	// this one streams or not. A session that streams needs the directory.
	dir := SpillDir(r.cfg.SpillDir)
	n, err := cleanSpills(dir, r.cfg.Slot)
	switch {
	case err != nil && streaming:
		return Fatal(fmt.Errorf("pipeline.spill_dir %s: %w", dir, err))
	case err != nil:
		r.log.Debug("pipeline.spill_dir cannot be cleaned (this session does not stream)", "dir", dir, "error", err)
	case n > 0:
		r.log.Info("removed the spill files of an earlier session: the server sends their transactions again", "dir", dir, "files", n)
	}
	if streaming {
		s.streamed = newStreamedTxns(dir, r.cfg.Slot)
		defer s.streamed.close()
	}

	// Wake a blocked read at once when a stop is requested.
	stopWake := context.AfterFunc(ctx, func() { _ = conn.Conn().SetReadDeadline(r.clock.Now()) })
	defer stopWake()
	return s.run(ctx)
}

// protocol is what START_REPLICATION asks pgoutput for, from the slot's
// position start: protocol version 2 with streaming 'on' where
// DecideStreaming says so, version 1 otherwise. The log says which, and
// why.
func (r *Runner) protocol(start pglogrepl.LSN) (args []string, streaming bool) {
	r.mu.Lock()
	version, whole := r.serverVersion, r.whole
	r.mu.Unlock()
	args = []string{"proto_version '1'", "publication_names " + catalog.QuoteLiteral(r.cfg.Publication), "messages 'true'"}
	d := DecideStreaming(r.cfg.Streaming, r.router != nil && r.router.RoutesMessages(), version, r.cfg.SpillDir)
	switch {
	case d.DirErr != nil:
		// Streaming is a matter of latency, never of delivery: without
		// a directory for the spill files the server holds each
		// transaction until its commit, as before.
		r.log.Warn("streaming large transactions: off: pipeline.spill_dir cannot take spill files; give outboxd a writable directory there (a container: an emptyDir or tmpfs volume) to stream", "dir", d.Dir, "error", d.DirErr)
	case d.Off != "":
		r.log.Info("streaming large transactions: off ("+d.Off+")", "server_version_num", version)
	case start < whole:
		r.log.Info("streaming large transactions: off until the slot passes a transaction that must come whole", "until", whole.String())
	default:
		r.log.Info("streaming large transactions: on (PostgreSQL 14+, postgres.streaming): their changes wait in spill files until the commit", "server_version_num", version)
		args[0] = "proto_version '2'"
		return append(args, "streaming 'on'"), true
	}
	return args, false
}

// SpillDir is where a streamed transaction's outbox changes wait for its
// commit: pipeline.spill_dir (configured), or the system's temporary
// directory when unset.
func SpillDir(configured string) string {
	if configured != "" {
		return configured
	}
	return os.TempDir()
}

// Streaming is whether sessions ask the server to stream large
// transactions (DecideStreaming), for the session and for outboxd check.
type Streaming struct {
	Dir    string // SpillDir: where their outbox changes would wait
	Off    string // why not, "" when they do
	DirErr error  // Dir refused a file: the reason Off is set
}

// DecideStreaming decides whether a session asks PostgreSQL to stream
// large transactions: postgres.streaming (streaming) asks for it, the
// server can (14+), no route takes logical messages, and pipeline.spill_dir
// (spillDir) takes files.
func DecideStreaming(streaming, routesMessages bool, serverVersion int, spillDir string) Streaming {
	d := Streaming{Dir: SpillDir(spillDir)}
	switch {
	case !streaming:
		d.Off = "postgres.streaming is false: the server holds each transaction until its commit"
	case routesMessages:
		// pgoutput sends a streamed transaction's logical message under the
		// top-level xid, not its subtransaction's (PostgreSQL through 18):
		// a Stream Abort of a rolled-back savepoint could not drop it.
		d.Off = "a route takes logical messages: the server would send one of a rolled-back savepoint of a streamed transaction as its top-level transaction's"
	case serverVersion < 140000:
		d.Off = "the server is older than PostgreSQL 14, which streams none"
	default:
		if d.DirErr = WritableDir(d.Dir); d.DirErr != nil {
			d.Off = fmt.Sprintf("pipeline.spill_dir %s cannot take the changes of a streamed transaction (%v)", d.Dir, d.DirErr)
		}
	}
	return d
}

// newStream makes a session's stream from the slot's position start, with
// what it needs: its own tracker, a publisher over prod, and the runner as
// the one told of its events.
func (r *Runner) newStream(conn *pgconn.PgConn, prod Producer, start pglogrepl.LSN, partitions map[catalog.Table]catalog.Table) *stream {
	tracker := NewTracker(start, r.cfg.OnConfirm)
	pub := publish.New(publish.Config{Router: r.router, Producer: prod, Mark: r.cfg.Mark, Trace: r.cfg.Trace,
		MaxEvents: r.cfg.MaxInFlightEvents, MaxBytes: r.cfg.MaxInFlightBytes, DeliveryTimeout: r.cfg.DeliveryTimeout,
		Again: "start outboxd again; nothing after it is lost, the slot stays before it", Clock: r.clock, Log: r.log})
	r.streaming(tracker, pub, start)
	return &stream{cfg: streamConfig{statusInterval: r.cfg.StatusInterval, idleStatusInterval: r.cfg.IdleStatusInterval,
		shutdownTimeout: r.cfg.ShutdownTimeout, receiveTimeout: r.cfg.ReceiveTimeout},
		log: r.log, clock: r.clock, events: r, router: r.router, pub: pub, tracker: tracker, conn: conn, prod: prod,
		relations: map[uint32][]*envelope.Binding{}, partitions: partitions, sentFlush: start}
}
