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
}

// ReadServer reads the server's version and replication settings.
func ReadServer(ctx context.Context, conn *pgconn.PgConn) (Server, error) {
	rows, err := query(ctx, conn, `SELECT current_setting('server_version_num'), current_setting('wal_level'),
		(SELECT setting FROM pg_catalog.pg_settings WHERE name = 'wal_sender_timeout')`)
	if err != nil {
		return Server{}, err
	}
	if len(rows) != 1 {
		return Server{}, errors.New("read server settings: no row")
	}
	var s Server
	s.Version, _ = strconv.Atoi(str(rows[0][0]))
	s.WALLevel = str(rows[0][1])
	ms, _ := strconv.ParseInt(str(rows[0][2]), 10, 64)
	s.WALSenderTimeout = time.Duration(ms) * time.Millisecond
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

// ReadSlot returns the slot called name, or nil when there is none.
func ReadSlot(ctx context.Context, conn *pgconn.PgConn, name string) (*Slot, error) {
	rows, err := query(ctx, conn, `SELECT s.plugin, s.slot_type, s.database, s.database = current_database(), s.active, s.active_pid,
			r.application_name, host(r.client_addr), s.confirmed_flush_lsn, s.restart_lsn, s.wal_status, s.safe_wal_size,
			CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() ELSE pg_catalog.pg_current_wal_lsn() END
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
		Holder: str(r[6]), HolderAddr: str(r[7]), ConfirmedFlush: lsn(r[8]), Restart: lsn(r[9]), WALStatus: str(r[10]), CurrentWAL: lsn(r[12])}
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
