package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/preflight"
)

// slotDrop drops the configured replication slot over a normal connection.
// Without yes it only warns what would be lost.
func slotDrop(ctx context.Context, path string, yes bool, stdout io.Writer) error {
	cfg, conn, s, err := openSlot(ctx, path)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	name := cfg.Postgres.Slot
	switch {
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
	// Dropped on purpose, with --yes: the next start may create it.
	if _, err := catalog.ForgetSlot(ctx, conn.PgConn(), slotTable(cfg.Postgres), name); err != nil {
		fmt.Fprintf(stdout, "WARNING: could not delete its row of the slot record %s (%v): the next start will refuse to create the slot until outboxd slot forget\n", cfg.Postgres.SlotTable, err)
	}
	return nil
}

// slotForget deletes the configured slot's row of the slot record, so that
// the next start may create the slot again, once the operator named the
// gap: the position the slot had confirmed when outboxd last found it,
// after which events may be in no slot.
func slotForget(ctx context.Context, path, gapFrom string, stdout io.Writer) error {
	if gapFrom == "" {
		return usageError{errors.New("--gap-from is required: the position the error of the missing slot names")}
	}
	from, err := pglogrepl.ParseLSN(gapFrom)
	if err != nil {
		return usageError{fmt.Errorf("--gap-from %q: %w", gapFrom, err)}
	}
	cfg, conn, s, err := openSlot(ctx, path)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	name, t := cfg.Postgres.Slot, slotTable(cfg.Postgres)
	if s != nil {
		return fmt.Errorf("replication slot %q exists: there is nothing to forget", name)
	}
	rec, err := catalog.ReadSlotRecord(ctx, conn.PgConn(), t, name)
	switch {
	case err != nil:
		return fmt.Errorf("read the slot record %s: %w", t, err)
	case rec == nil:
		return fmt.Errorf("%s holds no row of replication slot %q: the next start may create it already", t, name)
	case rec.Seen != from:
		return usageError{fmt.Errorf("--gap-from %s is not where the gap begins: replication slot %q had confirmed %s when outboxd last found it (%s)", from, name, rec.Seen, rec.SeenAt.UTC().Format(time.RFC3339))}
	}
	if _, err := catalog.ForgetSlot(ctx, conn.PgConn(), t, name); err != nil {
		return fmt.Errorf("delete the row of replication slot %q from %s: %w", name, t, err)
	}
	fmt.Fprintf(stdout, "forgot replication slot %s: events committed after %s (confirmed at %s) and before the next start creates the slot are in no slot; replay them (outboxd replay --from %s) if you have not\n",
		name, rec.Seen, rec.SeenAt.UTC().Format(time.RFC3339), rec.SeenAt.UTC().Format(time.RFC3339))
	return nil
}

// openSlot loads the configuration at path, connects to its database and
// reads its slot (nil: none). The caller closes the connection.
func openSlot(ctx context.Context, path string) (config.Config, *pgx.Conn, *catalog.Slot, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return cfg, nil, nil, usageError{err}
	}
	conn, err := preflight.Connect(ctx, cfg.Postgres)
	if err != nil {
		return cfg, nil, nil, fmt.Errorf("connect to %s: %w", cfg.Postgres.RedactedDSN(), err)
	}
	s, err := catalog.ReadSlot(ctx, conn.PgConn(), cfg.Postgres.Slot)
	if err != nil {
		conn.Close(context.Background())
		return cfg, nil, nil, fmt.Errorf("read replication slot %q: %w", cfg.Postgres.Slot, err)
	}
	return cfg, conn, s, nil
}
