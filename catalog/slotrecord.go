package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// The slot record: what outboxd writes down, in a table of the service's
// database (postgres.slot_table), about each slot it creates or finds. It
// lives in the database rather than in the process for two facts that must
// outlive the process that learnt them:
//
//   - outboxd has seen the slot (a row exists): a later start that finds
//     the slot missing refuses to create it again until the operator
//     forgets the row (outboxd slot forget), since events committed
//     after the old slot's position are in no new slot;
//   - which rows the slot vouches for (Since, Covers): a slot created now
//     decodes only transactions committed after its consistent point, so
//     its confirmed position says nothing about older rows. The retention
//     job deletes or drops a row only when the record covers it.
//
// The table is in the database, so a physical standby has it and a
// failover keeps it. Writing it needs INSERT, UPDATE and DELETE on it
// (sql/005_slot_record.sql); outboxd creates it when it may.

// SlotRecord is the row of one slot.
type SlotRecord struct {
	Slot string
	// Since: a row whose creat_en is at or after Since was written by a
	// transaction that began after the slot existed, so committed past its
	// consistent point, and the slot decoded it. Read from the server's
	// clock once the slot existed (its creation, or the first start that
	// found it without a row).
	Since time.Time
	// Covers: the tables (Table.String) of the cut-over the slot began
	// with, whose snapshot Kafka acknowledged: every row of theirs that
	// was committed before the slot went to Kafka, by the relay
	// (publicat_en set) or by the snapshot (NULL). Empty: no cut-over.
	Covers []string
	// Seen is the slot's confirmed position when a session last found it,
	// at SeenAt: events committed after it may not be in Kafka.
	Seen   pglogrepl.LSN
	SeenAt time.Time
	// Missing is when a start found the slot missing (zero: never since
	// the row was written). A slot found after that was made again
	// outside outboxd: it vouches for nothing older than itself.
	Missing time.Time
}

// CoversTable reports whether the slot vouches for every row of t,
// whatever its creat_en: its cut-over snapshot covered t.
func (r *SlotRecord) CoversTable(t Table) bool {
	return r != nil && slices.Contains(r.Covers, t.String())
}

// CreateSlotTableSQL creates the record's table t.
func CreateSlotTableSQL(t Table) string {
	return "CREATE TABLE " + t.Quoted() + ` (
	slot text PRIMARY KEY,          -- the replication slot's name
	since timestamptz NOT NULL,     -- rows with creat_en at or after it were committed after the slot's consistent point
	covers jsonb NOT NULL,          -- the tables whose rows before the slot its cut-over snapshot (or the relay) published
	seen_lsn pg_lsn NOT NULL,       -- the slot's confirmed position when outboxd last found it
	seen_at timestamptz NOT NULL,
	missing_since timestamptz       -- when a start found the slot missing
)`
}

// EnsureSlotTable creates t when it does not exist. It reports whether t
// exists afterwards; creating it without the privilege is not an error
// (false, nil): the caller says what is lost.
func EnsureSlotTable(ctx context.Context, conn *pgconn.PgConn, t Table) (bool, error) {
	rows, err := query(ctx, conn, "SELECT pg_catalog.to_regclass("+QuoteLiteral(t.Quoted())+") IS NOT NULL")
	if err != nil {
		return false, err
	}
	if len(rows) == 1 && str(rows[0][0]) == "t" {
		return true, nil
	}
	if _, err := conn.Exec(ctx, CreateSlotTableSQL(t)).ReadAll(); err != nil {
		if hasCode(err, "42501") || hasCode(err, "3F000") || hasCode(err, "25006") { // no privilege, no such schema, a read-only standby
			return false, nil
		}
		return false, fmt.Errorf("create %s: %w", t, err)
	}
	return true, nil
}

// ReadSlotRecord reads slot's row of t: nil when there is none.
func ReadSlotRecord(ctx context.Context, conn *pgconn.PgConn, t Table, slot string) (*SlotRecord, error) {
	rows, err := query(ctx, conn, `SELECT to_char(since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), covers, seen_lsn,
		to_char(seen_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
		to_char(missing_since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') FROM `+t.Quoted()+` WHERE slot = `+QuoteLiteral(slot))
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	r := rows[0]
	rec := &SlotRecord{Slot: slot, Seen: lsn(r[2])}
	if err := json.Unmarshal([]byte(str(r[1])), &rec.Covers); err != nil {
		return nil, fmt.Errorf("%s: covers of slot %q: %w", t, slot, err)
	}
	if rec.Since, err = time.Parse(time.RFC3339Nano, str(r[0])); err != nil {
		return nil, fmt.Errorf("%s: since of slot %q: %w", t, slot, err)
	}
	if rec.SeenAt, err = time.Parse(time.RFC3339Nano, str(r[3])); err != nil {
		return nil, fmt.Errorf("%s: seen_at of slot %q: %w", t, slot, err)
	}
	if r[4] != nil {
		if rec.Missing, err = time.Parse(time.RFC3339Nano, *r[4]); err != nil {
			return nil, fmt.Errorf("%s: missing_since of slot %q: %w", t, slot, err)
		}
	}
	return rec, nil
}

// RecordSlot writes slot's row of t: a new one (Since now, on the server's
// clock, covering the tables of its cut-over) when fresh or when there is
// none, then its position seen (the slot's confirmed position, read now).
// A slot just created is fresh: its row, if any, was an earlier slot's.
func RecordSlot(ctx context.Context, conn *pgconn.PgConn, t Table, slot string, fresh bool, covers []Table) error {
	names := []string{}
	for _, c := range covers {
		names = append(names, c.String())
	}
	js, err := json.Marshal(names)
	if err != nil {
		return err
	}
	seen := "(SELECT confirmed_flush_lsn FROM pg_catalog.pg_replication_slots WHERE slot_name = " + QuoteLiteral(slot) + ")"
	onConflict := "seen_lsn = EXCLUDED.seen_lsn, seen_at = EXCLUDED.seen_at"
	if fresh {
		onConflict = "since = EXCLUDED.since, covers = EXCLUDED.covers, missing_since = NULL, " + onConflict
	}
	sql := fmt.Sprintf(`INSERT INTO %s (slot, since, covers, seen_lsn, seen_at)
		SELECT %s, clock_timestamp(), %s::jsonb, %s, clock_timestamp() WHERE %s IS NOT NULL
		ON CONFLICT (slot) DO UPDATE SET %s`, t.Quoted(), QuoteLiteral(slot), QuoteLiteral(string(js)), seen, seen, onConflict)
	_, err = conn.Exec(ctx, sql).ReadAll()
	return err
}

// ForgetSlot deletes slot's row of t; it reports whether there was one.
func ForgetSlot(ctx context.Context, conn *pgconn.PgConn, t Table, slot string) (bool, error) {
	res, err := conn.Exec(ctx, "DELETE FROM "+t.Quoted()+" WHERE slot = "+QuoteLiteral(slot)).ReadAll()
	if err != nil {
		return false, err
	}
	return len(res) == 1 && res[0].CommandTag.RowsAffected() == 1, nil
}

func hasCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// SeeSlot moves slot's seen position in t to the slot's confirmed
// position now, when both the row and the slot exist and the slot was not
// found missing since the row was written (a slot made again by hand is
// not the one the position was seen on).
func SeeSlot(ctx context.Context, conn *pgconn.PgConn, t Table, slot string) error {
	_, err := conn.Exec(ctx, `UPDATE `+t.Quoted()+` r SET seen_lsn = s.confirmed_flush_lsn, seen_at = clock_timestamp()
		FROM pg_catalog.pg_replication_slots s
		WHERE s.slot_name = r.slot AND r.slot = `+QuoteLiteral(slot)+` AND s.confirmed_flush_lsn IS NOT NULL AND r.missing_since IS NULL`).ReadAll()
	return err
}

// MarkSlotMissing records that slot was found missing now, unless that is
// recorded already.
func MarkSlotMissing(ctx context.Context, conn *pgconn.PgConn, t Table, slot string) error {
	_, err := conn.Exec(ctx, "UPDATE "+t.Quoted()+" SET missing_since = clock_timestamp() WHERE missing_since IS NULL AND slot = "+QuoteLiteral(slot)).ReadAll()
	return err
}
