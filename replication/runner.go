// Package replication streams outbox inserts from a PostgreSQL logical
// replication slot (pgoutput) to a Producer, and confirms WAL positions to
// the server only once the Producer reports them acknowledged.
package replication

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/envelope"
)

// readBufferSize is the replication connection's read buffer.
const readBufferSize = 256 << 10

// Config is what the stream needs; durations are positive.
type Config struct {
	DSN                string
	Slot               string
	Publication        string
	CreateSlot         bool
	CreatePublication  bool
	Tables             []Table
	StatusInterval     time.Duration
	IdleStatusInterval time.Duration
	ConnectTimeout     time.Duration
	MaxInFlightEvents  int
	MaxInFlightBytes   int64
	ShutdownTimeout    time.Duration
	BackoffMin         time.Duration
	BackoffMax         time.Duration
	StandbyRetry       time.Duration // retry interval while another instance holds the slot
	// MaxRecordBytes is the largest record the producer takes (its batch
	// limit); a larger one is bad input. 0: no limit.
	MaxRecordBytes int64
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
}

// Producer publishes records asynchronously: every record's Acker is told
// its outcome later. A Producer serves one session.
type Producer interface {
	Produce(r *outboxd.Record) error
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

// Runner owns the replication sessions of one slot.
type Runner struct {
	cfg         Config
	conn        *pgconn.Config
	router      *envelope.Router
	newProducer func() (Producer, error)
	log         hclog.Logger

	mu      sync.Mutex
	status  Status
	tracker *Tracker // the current session's, for live figures
	// baseEvents and baseBytes count what earlier sessions acknowledged.
	baseEvents uint64
	baseBytes  int64
}

// Status is what the runner reports about itself.
type Status struct {
	State     string    // starting, streaming, backoff, standby, stopping, stopped
	Since     time.Time // when State was entered
	LastError string
	Tracker   State
	Events    uint64 // records acknowledged since start (replays included)
	Bytes     int64  // their bytes
	Txns      uint64 // transactions received since start (replays included)
	// DeadLettered counts rows sent to a dead-letter topic (replays included).
	DeadLettered uint64
	// LastStatusSent is when the last standby status went to the server;
	// WALSenderTimeout is the server's wal_sender_timeout (0: none).
	LastStatusSent   time.Time
	WALSenderTimeout time.Duration
}

// NewRunner checks the connection string; it does not connect.
func NewRunner(cfg Config, router *envelope.Router, newProducer func() (Producer, error), log hclog.Logger) (*Runner, error) {
	pc, err := pgconn.ParseConfig(cfg.DSN)
	if err != nil {
		// The parse error can quote the DSN; do not pass it on.
		return nil, Fatal(errors.New("postgres.dsn is not a valid connection string"))
	}
	pc.RuntimeParams["replication"] = "database"
	pc.RuntimeParams["application_name"] = "outboxd"
	// Text output of timestamptz in a fixed, parseable form.
	pc.RuntimeParams["datestyle"] = "ISO, YMD"
	pc.RuntimeParams["timezone"] = "UTC"
	pc.ConnectTimeout = cfg.ConnectTimeout
	// pgproto3 reads the socket in 8 KiB chunks: a drain then costs a
	// read(2) (and often a wake-up) per ~20 rows. A larger buffer under it
	// takes whatever the walsender has written in one call.
	pc.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		return pgproto3.NewFrontend(bufio.NewReaderSize(r, readBufferSize), w)
	}
	return &Runner{cfg: cfg, conn: pc, router: router, newProducer: newProducer, log: log, status: Status{State: "starting"}}, nil
}

// Status returns a snapshot for health reporting.
func (r *Runner) Status() Status {
	r.mu.Lock()
	st, tr, base, baseBytes := r.status, r.tracker, r.baseEvents, r.baseBytes
	r.mu.Unlock()
	st.Events, st.Bytes = base, baseBytes
	if tr != nil {
		st.Tracker = tr.State()
		st.Events += st.Tracker.Acked
		st.Bytes += st.Tracker.AckedBytes
	}
	return st
}

// useTracker makes tr the source of live figures; earlier sessions'
// acknowledgements stay counted.
func (r *Runner) useTracker(tr *Tracker) {
	r.mu.Lock()
	if r.tracker != nil {
		st := r.tracker.State()
		r.baseEvents += st.Acked
		r.baseBytes += st.AckedBytes
	}
	r.tracker = tr
	r.mu.Unlock()
}

func (r *Runner) setState(state string, err error) {
	r.mu.Lock()
	if r.status.State != state {
		r.status.State, r.status.Since = state, time.Now()
	}
	if err != nil {
		r.status.LastError = err.Error()
	}
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
	first := true
	for {
		started := time.Now()
		progressed, err := r.session(ctx, first)
		if progressed {
			first = false
		}
		if ctx.Err() != nil {
			r.setState("stopped", nil)
			if err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		}
		if err == nil {
			err = errors.New("replication stream ended")
		}
		if IsFatal(err) {
			r.setState("stopped", err)
			return err
		}
		var standby *standbyError
		if errors.As(err, &standby) {
			// Not a failure: wait on a fixed interval and take over as
			// soon as the other instance lets go of the slot.
			if r.Status().State != "standby" {
				r.log.Info("standing by: another instance holds the slot", "slot", r.cfg.Slot, "detail", err, "retry", r.cfg.StandbyRetry)
				lastErr = ""
			}
			r.setState("standby", err)
			attempt = 0
			select {
			case <-ctx.Done():
				r.setState("stopped", nil)
				return nil
			case <-time.After(r.cfg.StandbyRetry):
			}
			continue
		}
		// Only a session that ran for a while resets the backoff: one that
		// streams and fails at once (the broker is down) keeps backing off.
		if time.Since(started) > r.cfg.BackoffMax {
			attempt = 0
		}
		delay := backoff(attempt, r.cfg.BackoffMin, r.cfg.BackoffMax)
		attempt++
		r.setState("backoff", err)
		// Log once per change of error, not on every retry.
		if msg := err.Error(); msg != lastErr {
			r.log.Warn("replication interrupted; retrying with backoff", "error", err, "delay", delay.Round(time.Millisecond))
			lastErr = msg
		} else {
			r.log.Debug("retrying", "error", err, "delay", delay.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			r.setState("stopped", nil)
			return nil
		case <-time.After(delay):
		}
	}
}

// backoff is min·2^attempt capped at max, with full jitter over its upper half.
func backoff(attempt int, min, max time.Duration) time.Duration {
	d := min
	for i := 0; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d/2 + rand.N(d/2+1)
}

// classify marks connection errors that no retry can fix as fatal.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "28"): // invalid authorization
			return Fatal(fmt.Errorf("connect to PostgreSQL: %w: check postgres.dsn's user and password", err))
		case pgErr.Code == "3D000": // database does not exist
			return Fatal(fmt.Errorf("connect to PostgreSQL: %w", err))
		case pgErr.Code == "42501":
			return Fatal(fmt.Errorf("connect to PostgreSQL: %w: the role needs LOGIN and REPLICATION (see sql/003_role.sql)", err))
		}
	}
	return fmt.Errorf("connect to PostgreSQL: %w", err)
}

// recordError is what a producer returns for a record the broker can never
// take (bad input, not an outage).
type recordError interface{ RecordProblem() string }

func isRecordError(err error) bool {
	var re recordError
	return errors.As(err, &re)
}
