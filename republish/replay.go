package republish

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/publish"
)

// ReplayRequest says which rows a replay republishes: those of Tables
// whose creat_en is in [From, To), or those whose id is in IDs.
type ReplayRequest struct {
	Tables []envelope.Table
	// From and To are timestamps as PostgreSQL reads a timestamptz
	// ("2026-12-03T10:00:00Z"); an empty one leaves that end open.
	From, To string
	IDs      []string // instead of a time range
}

// TableCount is how many rows of one table a replay published.
type TableCount struct {
	Table, Topic string
	Rows         int
}

// Replayer republishes outbox rows from the table, by creat_en or by id,
// with the stream's envelope, key and headers: the recovery after a lost or
// dropped slot, or a backfill for a new consumer. It only reads, in one
// REPEATABLE READ transaction, and publishes the rows only once the slot has
// passed them (catalog.ReadDelivery), so it is safe while the daemon
// streams: every copy comes after the first delivery of its event and of
// the events before it (the consumers are idempotent: a replayed event is a
// duplicate to them).
type Replayer struct {
	Conn   *pgconn.Config
	Router *envelope.Router
	// Slot is the daemon's replication slot. When it does not exist nothing
	// streams from it: the rows go at once (the recovery after a lost slot).
	Slot string
	// Wait bounds how long the replay waits for the slot to pass the rows
	// it read; then it refuses, having published nothing.
	Wait time.Duration
	// OnWait, when set, is told why the replay waits, at once and then
	// every few seconds while it does.
	OnWait      func(Waiting)
	MaxInFlight int
	Trace       publish.Tracer // nil: no spans
	// DeliveryTimeout: Kafka acknowledging nothing for this long fails the
	// replay (kafka.delivery_timeout).
	DeliveryTimeout time.Duration
	Log             hclog.Logger
	// Every is how often progress is called while rows are published.
	Every time.Duration
	// Clock times the wait for the slot and paces progress (nil: the
	// system's).
	Clock clock.Clock
}

// Replay publishes the rows through prod, each table in commit order (rowOrder; so
// each aggregate's events go in their order), and returns once Kafka
// acknowledged every one. progress, when set, is told how far it has got
// every Every and at the end.
func (r *Replayer) Replay(ctx context.Context, req ReplayRequest, prod publish.Producer, progress func(Progress)) ([]TableCount, error) {
	if (len(req.IDs) > 0) == (req.From != "" || req.To != "") {
		return nil, errors.New("replay: give a creat_en range or ids, not both and not neither")
	}
	conn, err := connect(ctx, r.Conn, "outboxd-replay", nil)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	at, err := catalog.BeginDelivery(ctx, conn, true)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	var sels []selection
	total := 0
	for _, t := range req.Tables {
		sel := selection{t: t}
		sel.where, sel.params = replayWhere(t, req)
		n, err := count(ctx, conn, "SELECT count(*)"+sel.where, sel.params)
		if err != nil {
			return nil, privilege(fmt.Errorf("replay: count the rows of %s: %w", t.String(), err), "the role needs SELECT on the outbox table")
		}
		total += n
		sels = append(sels, sel)
	}
	if err := r.waitPassed(ctx, conn, at, total); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}

	c := clock.Or(r.Clock)
	p := newPublication(publish.Config{Router: r.Router, Producer: prod, Trace: r.Trace, MaxEvents: r.MaxInFlight, DeliveryTimeout: r.DeliveryTimeout,
		Source: "replay", Clock: c, Log: r.Log}, nil)
	p.total = total
	stop := func() {}
	if progress != nil {
		stop = every(c, r.Every, time.Second, func() { progress(p.state()) })
	}
	counts, err := publishAll(ctx, conn, r.Router, sels, p)
	stop()
	if progress != nil {
		progress(p.state())
	}
	if err != nil {
		return counts, fmt.Errorf("replay: %w", err)
	}
	return counts, nil
}

// Waiting is why a replay does not publish yet.
type Waiting struct {
	Rows          int    // rows counted, to publish
	Reason        string // what the slot, or a cut-over, has not done yet
	Waited, Limit time.Duration
}

// waitPassed waits, at most Wait, until Kafka has every row the replay's
// transaction (begun at at) sees, or the slot does not exist.
func (r *Replayer) waitPassed(ctx context.Context, conn *pgconn.PgConn, at pglogrepl.LSN, rows int) error {
	const poll, tell = 200 * time.Millisecond, 5 * time.Second
	c := clock.Or(r.Clock)
	started := c.Now()
	var told time.Time
	for {
		d, err := catalog.ReadDelivery(ctx, conn, r.Slot, at)
		switch {
		case err != nil:
			return err
		case d.Delivered():
			return nil
		case d.Cutover == "" && d.Slot == nil:
			r.Log.Warn("replication slot does not exist: nothing streams from it, so the rows go at once (the recovery after a lost slot); replay each aggregate's undelivered events together, from the oldest, to keep their order", "slot", r.Slot)
			return nil
		}
		why := d.Cutover
		if why == "" {
			why = fmt.Sprintf("replication slot %q has confirmed %s, and the rows read were committed before %s", r.Slot, d.Slot.ConfirmedFlush, at)
		}
		waited := clock.Since(c, started)
		if waited >= r.Wait {
			return fmt.Errorf("refused, nothing published: %s, still after %s. A copy published now could reach a consumer before an earlier event of its aggregate that the stream has not delivered yet. Start outboxd (or let it catch up: outboxd status shows the slot moving) and replay again, or give --wait more time", why, r.Wait)
		}
		if r.OnWait != nil && (told.IsZero() || clock.Since(c, told) >= tell) {
			r.OnWait(Waiting{Rows: rows, Reason: why, Waited: waited, Limit: r.Wait})
			told = c.Now()
		}
		if !clock.Sleep(ctx, c, poll) {
			return ctx.Err()
		}
	}
}

// replayWhere is the FROM ... WHERE clause of a request for one table and
// its parameters (text).
func replayWhere(t envelope.Table, req ReplayRequest) (string, [][]byte) {
	where := " FROM " + t.Quoted()
	if len(req.IDs) > 0 {
		ids := make([][]byte, len(req.IDs))
		for i, id := range req.IDs {
			ids[i] = []byte(id)
		}
		return where + " WHERE " + catalog.QuoteIdent(t.Route.Columns.ID) + " = ANY($1)", [][]byte{textArray(ids)}
	}
	creat := catalog.QuoteIdent(t.Route.Columns.CreatEn)
	var cond []string
	var params [][]byte
	if req.From != "" {
		params = append(params, []byte(req.From))
		cond = append(cond, fmt.Sprintf("%s >= $%d::timestamptz", creat, len(params)))
	}
	if req.To != "" {
		params = append(params, []byte(req.To))
		cond = append(cond, fmt.Sprintf("%s < $%d::timestamptz", creat, len(params)))
	}
	for i, c := range cond {
		if i == 0 {
			where += " WHERE " + c
		} else {
			where += " AND " + c
		}
	}
	return where, params
}
