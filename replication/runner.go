// Package replication streams outbox inserts from a PostgreSQL logical
// replication slot (pgoutput) to a Producer, and confirms WAL positions to
// the server only once the Producer reports them acknowledged.
//
// A Runner owns the sessions of one slot and its state machine (runner.go);
// a session connects, prepares the slot and the publication and starts
// streaming (session.go, setup.go); its stream turns messages into records
// hands each change to its publisher (changes.go, package publish) and
// confirms what its Tracker says is acknowledged (tracker.go); standby
// status and the end of a stream are in status.go.
package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/backoff"
	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/postgres"
	"github.com/outboxd/outboxd/publish"
)

// Config is what the stream needs; durations are positive.
type Config struct {
	// Conn is the parsed connection (postgres.dsn and password); each
	// session opens a replication connection with it (replicationSession).
	Conn        *pgconn.Config
	Slot        string
	Publication string
	// SlotTable is where the slot record is kept (catalog.SlotRecord):
	// that outboxd has seen the slot, beyond this process's life, and
	// which rows it vouches for (the retention job reads it).
	SlotTable         catalog.Table
	CreateSlot        bool
	CreatePublication bool
	// FailoverSlot: on a server with failover slots (PostgreSQL 17+) the
	// slot is created as one, and an existing slot is altered to match.
	FailoverSlot       bool
	Tables             []catalog.RoutedTable // what the publication must publish (envelope.Routing.Publication)
	StatusInterval     time.Duration
	IdleStatusInterval time.Duration
	MaxInFlightEvents  int
	MaxInFlightBytes   int64
	ShutdownTimeout    time.Duration
	BackoffMin         time.Duration
	BackoffMax         time.Duration
	StandbyRetry       time.Duration // retry interval while another instance holds the slot
	// ReceiveTimeout: nothing from the server for this long while reading
	// means a dead connection. DeliveryTimeout: no acknowledgement from
	// Kafka for this long with records in flight means an unreachable
	// broker. Either ends the session (replaying from the slot).
	ReceiveTimeout  time.Duration
	DeliveryTimeout time.Duration
	// OnConfirm, when set, is told the commit time of every confirmed
	// transaction that carried records. It must be cheap and safe for
	// concurrent use.
	OnConfirm func(commitTime time.Time)
	// Snapshot, when set, is how a slot that outboxd creates starts: with
	// an exported snapshot whose pending rows Snapshot publishes through
	// prod, returning once Kafka acknowledged them all, before anything
	// is streamed (cutover.go). snapshot "": the slot was kept from a
	// cut-over that did not finish, and Snapshot reads the rows pending
	// now. Nil: the slot is created without one.
	Snapshot func(ctx context.Context, snapshot, consistentPoint string, prod Producer) error
	// SnapshotTables are the tables whose pending rows Snapshot publishes
	// (those with publicat_en): the slot record says the slot vouches for
	// all their rows once the snapshot is in Kafka.
	SnapshotTables []catalog.Table
	// Mark, when set, wraps the Acker of the record of a row of table
	// whose id is id (postgres.mark_published): next learns the outcome
	// only once the row is marked published.
	Mark func(table string, id []byte, next outboxd.Acker) outboxd.Acker
	// Trace, when set, makes a span of every record (tracing.Tracer).
	Trace publish.Tracer
	// OnStreaming, when set, is called when a stream begins: the slot and
	// the publication exist from then on (the health monitor reads them
	// again at once).
	OnStreaming func()
	// Clock is the time the runner and its streams read and wait on (nil:
	// the system's).
	Clock clock.Clock
	// Streaming asks a server that can (PostgreSQL 14+) to stream large
	// transactions before their commit (protocol version 2, streamed.go);
	// their changes wait in SpillDir ("": os.TempDir()) until then.
	Streaming bool
	SpillDir  string
}

// Producer publishes records asynchronously: every accepted record's Acker
// is told its outcome later. A Producer serves one session.
type Producer interface {
	// Produce copies the record and hands it on; an error means the
	// producer takes nothing more (the record's Acker has been told).
	Produce(r *outboxd.Record) error
	// Flush asks for what was produced to go out without lingering (a
	// transaction ended); it does not wait.
	Flush()
	Close(ctx context.Context) error
}

// fatalError marks an error that retrying cannot fix.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// Fatal marks err as one the daemon must stop on.
func Fatal(err error) error { return &fatalError{err} }

// IsFatal reports whether err was marked by Fatal.
func IsFatal(err error) bool {
	var f *fatalError
	return errors.As(err, &f)
}

// The runner's states.
const (
	StateStarting  = "starting"
	StateStreaming = "streaming"
	StateBackoff   = "backoff"
	StateStandby   = "standby"
	StateStopping  = "stopping"
	StateStopped   = "stopped"
)

// States lists every state, in the order of the life of a runner.
var States = []string{StateStarting, StateStreaming, StateBackoff, StateStandby, StateStopping, StateStopped}

// Runner owns the replication sessions of one slot and its state: Run's
// loop and the events its streams report (streaming, stopping) are the only
// places the state changes.
type Runner struct {
	cfg         Config
	router      *envelope.Router
	newProducer func(Source) (Producer, error)
	log         hclog.Logger
	clock       clock.Clock

	mu        sync.Mutex
	state     string
	since     time.Time
	lastError string
	walSender time.Duration // the server's wal_sender_timeout
	// serverVersion is the server's server_version_num, as the session's
	// prepare last read it.
	serverVersion int
	// whole: until the slot has confirmed this position, sessions do not
	// ask for streaming (a streamed transaction's positions were not
	// certain: streamCommit).
	whole       pglogrepl.LSN
	resumedFrom pglogrepl.LSN // the slot's position when the current stream began
	// The current stream's tracker and publisher, for Status only, and
	// what the publishers of the sessions before it did.
	tracker *Tracker
	pub     *publish.Publisher
	done    publish.Counts

	// slotSeen: a session of this process found the slot (streaming, in
	// use by another instance, or in a cut-over) or created it. From then
	// on a missing slot is never created again (ensureSlot): it existed,
	// so events committed since it went are in no slot, and re-creating it
	// is the operator's decision. Read and written on Run's goroutine only
	// (readSlot, createSlot).
	slotSeen bool
	// record is the slot's row of Config.SlotTable when a session read
	// one (it sets slotSeen); noRecord, that the table could not be
	// written (said once).
	record   *catalog.SlotRecord
	noRecord bool

	// What the streams of every session add to as they go.
	txns         atomic.Uint64
	streamedTxns atomic.Uint64
	spilledBytes atomic.Uint64
	statusSentAt atomic.Int64 // unix nanoseconds of the last standby status
}

// Status is what the runner reports about itself.
type Status struct {
	State     string    // one of States
	Since     time.Time // when State was entered
	LastError string
	// Tracker is the current stream's position; InFlight what its
	// publisher has in flight, and its first delivery failure.
	Tracker  State
	InFlight publish.State
	// Confirmed is the position outboxd last confirmed, or the slot's
	// position when the stream began until it moves.
	Confirmed pglogrepl.LSN
	Events    uint64 // records acknowledged since start (replays included)
	Bytes     int64  // their bytes
	Txns      uint64 // transactions received since start (replays included)
	// DeadLettered counts rows sent to a dead-letter topic (replays included).
	DeadLettered uint64
	// Dropped counts changes a route's override dropped on purpose
	// (replays included).
	Dropped uint64
	// StreamedTxns counts the transactions the server streamed before
	// their commit; SpilledBytes what outboxd wrote of them to spill files
	// (replays included).
	StreamedTxns uint64
	SpilledBytes uint64
	// LastStatusSent is when the last standby status went to the server;
	// WALSenderTimeout is the server's wal_sender_timeout (0: none).
	LastStatusSent   time.Time
	WALSenderTimeout time.Duration
}

// NewRunner prepares a runner; it does not connect.
// newProducer makes a session's producer for the records of src (restart
// de-duplication: sink.Config.Stream).
func NewRunner(cfg Config, router *envelope.Router, newProducer func(Source) (Producer, error), log hclog.Logger) *Runner {
	r := &Runner{cfg: cfg, router: router, newProducer: newProducer, log: log, clock: clock.Or(cfg.Clock), state: StateStarting}
	r.since = r.clock.Now()
	return r
}

// Status returns a snapshot for health reporting.
func (r *Runner) Status() Status {
	r.mu.Lock()
	st := Status{State: r.state, Since: r.since, LastError: r.lastError, WALSenderTimeout: r.walSender, Confirmed: r.resumedFrom}
	tr, pub, c := r.tracker, r.pub, r.done
	r.mu.Unlock()
	if tr != nil {
		st.Tracker, st.InFlight = tr.State(), pub.State()
		if st.Tracker.Moved {
			st.Confirmed = st.Tracker.Confirmed
		}
		c = c.Plus(pub.Counts())
	}
	st.Events, st.Bytes, st.DeadLettered, st.Dropped = c.Acked, c.AckedBytes, c.DeadLettered, c.Dropped
	st.Txns, st.StreamedTxns, st.SpilledBytes = r.txns.Load(), r.streamedTxns.Load(), r.spilledBytes.Load()
	if ns := r.statusSentAt.Load(); ns != 0 {
		st.LastStatusSent = time.Unix(0, ns)
	}
	return st
}

// enter moves the state machine; it reports whether the state changed
// (Since moves only then). err, when set, becomes LastError.
func (r *Runner) enter(state string, err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.lastError = err.Error()
	}
	if r.state == state {
		return false
	}
	r.state, r.since = state, r.clock.Now()
	return true
}

// streaming: a session's stream starts from the slot's position from.
func (r *Runner) streaming(tr *Tracker, pub *publish.Publisher, from pglogrepl.LSN) {
	r.mu.Lock()
	if r.pub != nil {
		r.done = r.done.Plus(r.pub.Counts())
	}
	r.tracker, r.pub, r.resumedFrom = tr, pub, from
	r.mu.Unlock()
	r.statusSent(r.clock.Now()) // the wedge clock starts with the stream
	r.enter(StateStreaming, nil)
	if r.cfg.OnStreaming != nil {
		r.cfg.OnStreaming()
	}
}

// The events a stream reports to its runner (events).

func (r *Runner) stopping()               { r.enter(StateStopping, nil) }
func (r *Runner) statusSent(at time.Time) { r.statusSentAt.Store(at.UnixNano()) }
func (r *Runner) committed()              { r.txns.Add(1) }
func (r *Runner) streamed()               { r.streamedTxns.Add(1) }
func (r *Runner) spilled(bytes int64)     { r.spilledBytes.Add(uint64(bytes)) }

func (r *Runner) wholeUntil(end pglogrepl.LSN) {
	r.mu.Lock()
	r.whole = max(r.whole, end)
	r.mu.Unlock()
}

func (r *Runner) serverSettings(s catalog.Server) {
	r.mu.Lock()
	r.walSender, r.serverVersion = s.WALSenderTimeout, s.Version
	r.mu.Unlock()
}

// standbyError: another instance streams from the slot.
type standbyError struct{ err error }

func (e *standbyError) Error() string { return e.err.Error() }
func (e *standbyError) Unwrap() error { return e.err }

// Run streams until ctx is cancelled (a clean stop returns nil) or a fatal
// error. Lost connections to PostgreSQL or Kafka and delivery failures are
// retried with exponential backoff and jitter; confirmation never passes an
// unacknowledged record, so a retry replays from the slot.
func (r *Runner) Run(ctx context.Context) error {
	attempt := 0
	lastErr := ""
	for {
		started := r.clock.Now()
		err := r.session(ctx)
		if IsFatal(err) {
			r.enter(StateStopped, err)
			return err
		}
		if ctx.Err() != nil {
			r.enter(StateStopped, nil)
			if err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		}
		if err == nil {
			err = errors.New("replication stream ended")
		}
		var standby *standbyError
		if errors.As(err, &standby) {
			// Not a failure: wait on a fixed interval and take over as
			// soon as the other instance lets go of the slot.
			if r.enter(StateStandby, err) {
				r.log.Info("standing by: another instance holds the slot", "slot", r.cfg.Slot, "detail", err, "retry", r.cfg.StandbyRetry)
				lastErr = ""
			}
			attempt = 0
			if !clock.Sleep(ctx, r.clock, r.cfg.StandbyRetry) {
				r.enter(StateStopped, nil)
				return nil
			}
			continue
		}
		// Only a session that ran for a while resets the backoff: one that
		// streams and fails at once (the broker is down) keeps backing off.
		if clock.Since(r.clock, started) > r.cfg.BackoffMax {
			attempt = 0
		}
		delay := backoff.Delay(attempt, r.cfg.BackoffMin, r.cfg.BackoffMax)
		attempt++
		r.enter(StateBackoff, err)
		// Log once per change of error, not on every retry.
		if msg := err.Error(); msg != lastErr {
			r.log.Warn("replication interrupted; retrying with backoff", "error", err, "delay", delay.Round(time.Millisecond))
			lastErr = msg
		} else {
			r.log.Debug("retrying", "error", err, "delay", delay.Round(time.Millisecond))
		}
		if !clock.Sleep(ctx, r.clock, delay) {
			r.enter(StateStopped, nil)
			return nil
		}
	}
}

// classify marks connection errors that no retry can fix as fatal.
func classify(err error) error {
	if why := postgres.Explain(err); why != "" {
		return Fatal(fmt.Errorf("connect to PostgreSQL: %w: %s", err, why))
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "28"): // invalid authorization
			return Fatal(fmt.Errorf("connect to PostgreSQL: %w: check postgres.dsn's user and postgres.password", err))
		case pgErr.Code == "3D000": // database does not exist
			return Fatal(fmt.Errorf("connect to PostgreSQL: %w", err))
		case pgErr.Code == "42501":
			return Fatal(fmt.Errorf("connect to PostgreSQL: %w: the role needs LOGIN and the right to replicate: %s", err, postgres.ReplicationFix("<role>")))
		}
	}
	return fmt.Errorf("connect to PostgreSQL: %w", err)
}

// permanentError is what a producer returns for a failure no retry or
// replay can fix: a record the broker can never take, a broker that refuses
// outboxd's credentials or certificate.
type permanentError interface{ Permanent() string }

func isPermanent(err error) bool {
	var pe permanentError
	return errors.As(err, &pe)
}
