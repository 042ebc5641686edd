package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// 1b: kill -9 in the middle of a full-speed drain. A backlog of 10-row
// transactions is written while outboxd is stopped; outboxd drains it as
// fast as it can and is killed half-way; its restart produces again what
// Kafka acknowledged after the last standby status: the duplicates a crash
// costs at full speed, which the status cadence (every status_interval, and
// every 1,000 acknowledgements) bounds.
func drainKillScenario(ctx context.Context, h *Harness, res *Result) error {
	rows, kills := 200000, 3
	if h.Short {
		rows, kills = 40000, 1
	}
	f, err := h.setupDrain(ctx, "drainkill", res)
	if err != nil {
		return err
	}
	defer f.daemon.Close()
	var txns []testenv.Txn
	for k := 0; k < kills; k++ {
		// The backlog, written with outboxd stopped.
		load := &Load{DSN: f.dsn, Writers: 4, Aggregates: 300, Total: rows, TxnRows: 10, Prefix: fmt.Sprintf("D%d-", k)}
		if err := load.Run(ctx); err != nil {
			return fmt.Errorf("backlog %d: %w", k+1, err)
		}
		txns = append(txns, load.Txns()...)
		if err := f.startDaemon(ctx); err != nil {
			return err
		}
		// Half-way through the drain, by outboxd's own count (the
		// verifier reads behind it).
		if err := f.waitDelivered(ctx, rows/2); err != nil {
			return err
		}
		killedAt := time.Now()
		f.daemon.Kill()
		res.Runs++
		dups := f.ver.Dups()
		if err := f.startDaemon(ctx); err != nil {
			return err
		}
		at, err := f.ver.WaitSeen(ctx, ids(load.Txns()), 3*time.Minute)
		if err != nil {
			return fmt.Errorf("kill %d: %w", k+1, err)
		}
		f.res.recovery(at.Sub(killedAt))
		// The replay from the slot delivers its duplicates before the rows
		// that were never acknowledged: every one of them is in by now.
		f.res.note("kill %d at %d of %d rows delivered: %d duplicates", k+1, int64(rows/2), rows, f.ver.Dups()-dups)
		if k < kills-1 {
			if err := f.daemon.Term(40 * time.Second); err != nil {
				return fmt.Errorf("stop before backlog %d: %w", k+2, err)
			}
		}
	}
	return f.check(ctx, txns, true)
}

// 1c: ten kill -9 through one full-speed drain (issue 21: 0 duplicates, 0
// lost, order kept, for a read_uncommitted consumer, default settings). A
// 200,000-row backlog of 10-row transactions is written while outboxd is
// stopped; each session is killed once it has delivered another fifteenth
// of it, so every kill lands mid-drain and the drain still advances; the
// eleventh session drains the rest.
func drainKillsScenario(ctx context.Context, h *Harness, res *Result) error {
	rows, kills := 200000, 10
	if h.Short {
		rows, kills = 40000, 2
	}
	f, err := h.setupDrain(ctx, "drainkills", res)
	if err != nil {
		return err
	}
	defer f.daemon.Close()
	load := &Load{DSN: f.dsn, Writers: 4, Aggregates: 300, Total: rows, TxnRows: 10, Prefix: "K-"}
	if err := load.Run(ctx); err != nil {
		return fmt.Errorf("backlog: %w", err)
	}
	var killedAt time.Time
	for k := 0; k < kills; k++ {
		if err := f.startDaemon(ctx); err != nil {
			return err
		}
		// A session's own count: what it delivered since its start.
		if err := f.waitDelivered(ctx, rows/15); err != nil {
			return err
		}
		killedAt = time.Now()
		f.daemon.Kill()
		res.Runs++
	}
	if err := f.startDaemon(ctx); err != nil {
		return err
	}
	at, err := f.ver.WaitSeen(ctx, ids(load.Txns()), 3*time.Minute)
	if err != nil {
		return err
	}
	f.res.recovery(at.Sub(killedAt))
	f.res.note("%d kill -9 through one %d-row drain: %d duplicates", kills, rows, f.ver.Dups())
	return f.check(ctx, load.Txns(), true)
}

// setupDrain is setup for a drain scenario: outboxd started once and
// stopped, so that the slot exists before the backlog (a backlog written
// before it is the cut-over snapshot's, published from the table, not a
// drain of the slot). The caller closes f.daemon.
func (h *Harness) setupDrain(ctx context.Context, id string, res *Result) (*fixture, error) {
	f, err := h.setup(ctx, id, res)
	if err != nil {
		return nil, err
	}
	if err := f.startDaemon(ctx); err != nil {
		f.daemon.Close()
		return nil, err
	}
	if err := f.daemon.Term(40 * time.Second); err != nil {
		f.daemon.Close()
		return nil, fmt.Errorf("stop after creating the slot: %w", err)
	}
	return f, nil
}

// waitDelivered waits until the running outboxd has delivered n events
// since its start, by its own count.
func (f *fixture) waitDelivered(ctx context.Context, n int) error {
	for {
		if st, err := f.daemon.Status(ctx); err == nil && st.Counters.Events >= uint64(n) {
			return nil
		}
		if err := sleepCtx(ctx, 2*time.Millisecond); err != nil {
			return err
		}
	}
}
