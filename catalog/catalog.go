// Package catalog reads what PostgreSQL's catalogs say about outboxd's
// replication objects: the server's settings, the replication slot and the
// publication's coverage of the routed tables. The replication session, the
// health monitor, `outboxd check` and `outboxd slot drop` all read them
// here, and each keeps only its own verdict (stop, not ready, FAIL, refuse).
//
// Every query uses the simple protocol with quoted literals, so it runs on
// a replication connection (replication=database) as well as on a normal
// one.
package catalog

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// Table is a routed table, by its exact (case-sensitive) names.
type Table struct{ Schema, Name string }

// String is schema.table as a reader writes it: each name double-quoted only
// when it needs quoting.
func (t Table) String() string { return displayIdent(t.Schema) + "." + displayIdent(t.Name) }

// Quoted is the table as an SQL identifier: "schema"."table".
func (t Table) Quoted() string { return QuoteIdent(t.Schema) + "." + QuoteIdent(t.Name) }

// QuoteIdent quotes s as an SQL identifier.
func QuoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// QuoteLiteral quotes s as an SQL string literal (standard_conforming_strings
// is on in every supported version).
func QuoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// displayIdent leaves a name that PostgreSQL would fold to itself unquoted.
func displayIdent(s string) string {
	if s == "" {
		return QuoteIdent(s)
	}
	for i, c := range s {
		lower := c >= 'a' && c <= 'z' || c == '_'
		if !(lower || i > 0 && (c >= '0' && c <= '9' || c == '$')) {
			return QuoteIdent(s)
		}
	}
	return s
}

// query runs one statement and returns its rows as text; a NULL is nil.
func query(ctx context.Context, conn *pgconn.PgConn, sql string) ([][]*string, error) {
	results, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, err
	}
	var rows [][]*string
	for _, r := range results {
		if r.Err != nil {
			return nil, r.Err
		}
		for _, row := range r.Rows {
			vals := make([]*string, len(row))
			for i, v := range row {
				if v != nil {
					s := string(v)
					vals[i] = &s
				}
			}
			rows = append(rows, vals)
		}
	}
	return rows, nil
}

func str(v *string) string {
	if v == nil {
		return ""
	}
	return *v
}

func lsn(v *string) pglogrepl.LSN {
	if v == nil {
		return 0
	}
	l, _ := pglogrepl.ParseLSN(*v)
	return l
}

// Server is what outboxd needs to know of the server.
type Server struct {
	Version          int // server_version_num, e.g. 150018
	WALLevel         string
	WALSenderTimeout time.Duration // 0: none
	InRecovery       bool          // a standby (pg_is_in_recovery())

	// High availability. SynchronizedStandbySlots (a primary's, PostgreSQL
	// 17+) are the physical slots of the standbys that a logical walsender
	// waits for before it sends a change: a failover slot never gets ahead
	// of them. The others are a standby's: SyncReplicationSlots (17+: it
	// synchronises the primary's failover slots), HotStandbyFeedback and
	// PrimarySlotName (the physical slot it streams from). Before 17 the
	// 17-only ones are unset.
	SynchronizedStandbySlots []string
	SyncReplicationSlots     bool
	HotStandbyFeedback       bool
	PrimarySlotName          string
}

// FailoverSlots reports whether the server can synchronise a logical slot
// to its standbys (PostgreSQL 17: CREATE_REPLICATION_SLOT ... FAILOVER).
func (s Server) FailoverSlots() bool { return s.Version >= 170000 }

// Major is the major version, e.g. 15.
func (s Server) Major() int { return s.Version / 10000 }

// ReadServer reads the server's version and replication settings.
func ReadServer(ctx context.Context, conn *pgconn.PgConn) (Server, error) {
	// current_setting(name, true) is NULL for a setting this version lacks.
	rows, err := query(ctx, conn, `SELECT current_setting('server_version_num'), current_setting('wal_level'),
		(SELECT setting FROM pg_catalog.pg_settings WHERE name = 'wal_sender_timeout'), pg_catalog.pg_is_in_recovery(),
		current_setting('synchronized_standby_slots', true), current_setting('sync_replication_slots', true),
		current_setting('hot_standby_feedback', true), current_setting('primary_slot_name', true)`)
	if err != nil {
		return Server{}, err
	}
	if len(rows) != 1 {
		return Server{}, errors.New("read server settings: no row")
	}
	r := rows[0]
	var s Server
	s.Version, _ = strconv.Atoi(str(r[0]))
	s.WALLevel = str(r[1])
	ms, _ := strconv.ParseInt(str(r[2]), 10, 64)
	s.WALSenderTimeout = time.Duration(ms) * time.Millisecond
	s.InRecovery = str(r[3]) == "t"
	for _, name := range strings.Split(str(r[4]), ",") {
		if name = strings.TrimSpace(name); name != "" {
			s.SynchronizedStandbySlots = append(s.SynchronizedStandbySlots, name)
		}
	}
	s.SyncReplicationSlots = str(r[5]) == "on"
	s.HotStandbyFeedback = str(r[6]) == "on"
	s.PrimarySlotName = str(r[7])
	return s, nil
}

// Slot is a replication slot as pg_replication_slots shows it, with the
// server's current WAL position read in the same statement.
type Slot struct {
	Name, Plugin, Type string
	Database           string // "" for a physical slot
	SameDatabase       bool   // the slot belongs to the connection's database
	Active             bool
	ActivePID          int32 // 0 when inactive
	// Holder is the application_name of the connection holding the slot
	// (from pg_stat_replication) and HolderAddr its client address; empty
	// when inactive or not visible to this role.
	Holder, HolderAddr string
	ConfirmedFlush     pglogrepl.LSN // 0 when the slot has none
	Restart            pglogrepl.LSN
	WALStatus          string // reserved, extended, unreserved, lost
	SafeWALSize        *int64 // nil when max_slot_wal_keep_size is unset
	CurrentWAL         pglogrepl.LSN
	// Failover: the slot is synchronised to standbys that ask for it
	// (PostgreSQL 17+). Synced: this server is a standby's copy of a
	// primary's failover slot (on a promoted standby it stays set).
	Failover, Synced bool
	// Invalidated is why PostgreSQL invalidated the slot
	// (invalidation_reason, 17+: wal_removed, rows_removed,
	// wal_level_insufficient; 18: idle_timeout), "" when it did not.
	Invalidated string
}

// Unusable says why the slot can no longer be streamed from, "" when it
// can: PostgreSQL invalidated it, or (before 17, which names no reason)
// its wal_status is lost. The one judgement of it: the session, check,
// readiness and the cut-over ask it.
func (s *Slot) Unusable() string {
	switch s.Invalidated {
	case "":
		if s.WALStatus == "lost" {
			return "wal_status lost: the WAL it needed was removed (max_slot_wal_keep_size)"
		}
		return ""
	case "idle_timeout":
		return "PostgreSQL invalidated it (idle_timeout): it went unused for longer than idle_replication_slot_timeout"
	case "wal_removed":
		return "PostgreSQL invalidated it (wal_removed), wal_status lost: the WAL it needed was removed (max_slot_wal_keep_size)"
	}
	return "PostgreSQL invalidated it (" + s.Invalidated + ")"
}

// RetainedBytes is the WAL the slot makes the server keep: current − restart.
func (s *Slot) RetainedBytes() int64 { return diff(s.CurrentWAL, s.Restart) }

// UnconfirmedBytes is the WAL written after the confirmed position: it holds
// every event committed and not yet delivered.
func (s *Slot) UnconfirmedBytes() int64 { return diff(s.CurrentWAL, s.ConfirmedFlush) }

func diff(cur, l pglogrepl.LSN) int64 {
	if l == 0 || cur < l {
		return 0
	}
	return int64(cur - l)
}

// ReadSlot returns the slot called name, or nil when there is none. The
// columns of later versions (failover, synced, invalidation_reason: 17)
// are read through
// to_jsonb, so one query serves every version: absent, they are false.
func ReadSlot(ctx context.Context, conn *pgconn.PgConn, name string) (*Slot, error) {
	rows, err := query(ctx, conn, `SELECT s.plugin, s.slot_type, s.database, s.database = current_database(), s.active, s.active_pid,
			r.application_name, host(r.client_addr), s.confirmed_flush_lsn, s.restart_lsn, s.wal_status, s.safe_wal_size,
			CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() ELSE pg_catalog.pg_current_wal_lsn() END,
			to_jsonb(s) ->> 'failover', to_jsonb(s) ->> 'synced', to_jsonb(s) ->> 'invalidation_reason'
		FROM pg_catalog.pg_replication_slots s LEFT JOIN pg_catalog.pg_stat_replication r ON r.pid = s.active_pid
		WHERE s.slot_name = `+QuoteLiteral(name))
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, nil
	}
	r := rows[0]
	s := &Slot{Name: name, Plugin: str(r[0]), Type: str(r[1]), Database: str(r[2]), SameDatabase: str(r[3]) == "t", Active: str(r[4]) == "t",
		Holder: str(r[6]), HolderAddr: str(r[7]), ConfirmedFlush: lsn(r[8]), Restart: lsn(r[9]), WALStatus: str(r[10]), CurrentWAL: lsn(r[12]),
		Failover: str(r[13]) == "true", Synced: str(r[14]) == "true", Invalidated: str(r[15])}
	if pid, err := strconv.ParseInt(str(r[5]), 10, 32); err == nil {
		s.ActivePID = int32(pid)
	}
	if r[11] != nil {
		if n, err := strconv.ParseInt(*r[11], 10, 64); err == nil {
			s.SafeWALSize = &n
		}
	}
	return s, nil
}

// CreateSlotCommand is the replication command that creates the logical
// pgoutput slot name without exporting a snapshot; with failover (only on
// a server where FailoverSlots is true) it is a failover slot.
func CreateSlotCommand(name string, export, failover bool) string {
	if failover {
		// The option list (PostgreSQL 15+) is the only syntax with FAILOVER.
		snapshot := "'nothing'"
		if export {
			snapshot = "'export'"
		}
		return "CREATE_REPLICATION_SLOT " + QuoteIdent(name) + " LOGICAL pgoutput (SNAPSHOT " + snapshot + ", FAILOVER true)"
	}
	// The old syntax, which PostgreSQL 14 needs and later versions keep.
	snapshot := "NOEXPORT_SNAPSHOT"
	if export {
		snapshot = "EXPORT_SNAPSHOT"
	}
	return "CREATE_REPLICATION_SLOT " + QuoteIdent(name) + " LOGICAL pgoutput " + snapshot
}

// AlterSlotFailoverCommand makes an existing slot a failover slot or not
// (PostgreSQL 17+; the slot must not be in use).
func AlterSlotFailoverCommand(name string, failover bool) string {
	return "ALTER_REPLICATION_SLOT " + QuoteIdent(name) + " (FAILOVER " + strconv.FormatBool(failover) + ")"
}

// StandbySlot is a physical slot on a primary, through which a standby
// streams (its primary_slot_name).
type StandbySlot struct {
	Name           string
	Exists, Active bool
	Physical       bool
	// Holder is the standby's application_name, when it streams.
	Holder string
}

// ReadStandbySlots reads the physical slots called names (as
// synchronized_standby_slots lists them), in that order.
func ReadStandbySlots(ctx context.Context, conn *pgconn.PgConn, names []string) ([]StandbySlot, error) {
	out := make([]StandbySlot, len(names))
	for i, name := range names {
		out[i].Name = name
		rows, err := query(ctx, conn, `SELECT s.slot_type = 'physical', s.active, r.application_name
			FROM pg_catalog.pg_replication_slots s LEFT JOIN pg_catalog.pg_stat_replication r ON r.pid = s.active_pid
			WHERE s.slot_name = `+QuoteLiteral(name))
		if err != nil {
			return nil, err
		}
		if len(rows) == 0 {
			continue
		}
		out[i].Exists, out[i].Physical, out[i].Active, out[i].Holder = true, str(rows[0][0]) == "t", str(rows[0][1]) == "t", str(rows[0][2])
	}
	return out, nil
}

// Standby is a physical replication client of this server, as
// pg_stat_replication shows it: a standby (or pg_basebackup,
// pg_receivewal).
type Standby struct {
	Name  string // application_name
	Addr  string // client address, "" for a Unix socket
	Slot  string // the physical slot it streams from, "" when none
	State string // streaming, catchup, backup...
}

// ReadStandbys lists the physical replication clients streaming from this
// server (logical walsenders, outboxd's included, are left out).
func ReadStandbys(ctx context.Context, conn *pgconn.PgConn) ([]Standby, error) {
	rows, err := query(ctx, conn, `SELECT r.application_name, host(r.client_addr), s.slot_name, r.state
		FROM pg_catalog.pg_stat_replication r LEFT JOIN pg_catalog.pg_replication_slots s ON s.active_pid = r.pid
		WHERE s.slot_type IS DISTINCT FROM 'logical' ORDER BY r.application_name`)
	if err != nil {
		return nil, err
	}
	out := make([]Standby, len(rows))
	for i, r := range rows {
		out[i] = Standby{Name: str(r[0]), Addr: str(r[1]), Slot: str(r[2]), State: str(r[3])}
	}
	return out, nil
}
