package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/preflight"
)

// slotDrop drops the configured replication slot over a normal connection.
// Without yes it only warns what would be lost.
func slotDrop(ctx context.Context, path string, yes bool, stdout io.Writer) error {
	cfg, err := config.Load(path)
	if err != nil {
		return usageError{err}
	}
	name := cfg.Postgres.Slot
	conn, err := preflight.Connect(ctx, cfg.Postgres)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", cfg.Postgres.RedactedDSN(), err)
	}
	defer conn.Close(context.Background())
	s, err := catalog.ReadSlot(ctx, conn.PgConn(), name)
	switch {
	case err != nil:
		return fmt.Errorf("read replication slot %q: %w", name, err)
	case s == nil:
		return fmt.Errorf("replication slot %q does not exist: nothing to drop", name)
	case !s.SameDatabase:
		return fmt.Errorf("replication slot %q belongs to database %s: point postgres.dsn at that database to drop it", name, s.Database)
	case s.Active:
		return fmt.Errorf("replication slot %q is active for PID %d: stop outboxd first", name, s.ActivePID)
	}
	after := s.UnconfirmedBytes()
	fmt.Fprintf(stdout, "replication slot %s: confirmed_flush_lsn %s, %d bytes (%s) of WAL written after it, wal_status %s\n",
		name, s.ConfirmedFlush, after, humanBytes(after), s.WALStatus)
	if !yes {
		fmt.Fprintf(stdout, "WARNING: dropping the slot loses every event committed after %s that outboxd has not delivered: "+
			"a new slot starts at the current WAL position. Reconcile those events first (they are still in the outbox table).\n", s.ConfirmedFlush)
		return usageError{errors.New("refusing to drop the slot without --yes")}
	}
	if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", name); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: became active meanwhile
			return fmt.Errorf("drop replication slot %q: %s: stop outboxd first", name, pgErr.Message)
		}
		return fmt.Errorf("drop replication slot %q: %w", name, err)
	}
	fmt.Fprintf(stdout, "dropped replication slot %s\n", name)
	return nil
}
