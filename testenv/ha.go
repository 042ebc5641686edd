package testenv

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PGMajor is the major version of the Env's PostgreSQL (14 to 18), read
// from its data directory.
func (e *Env) PGMajor() (int, error) {
	return pgMajor(e.Dir)
}

func pgMajor(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "pg", "PG_VERSION"))
	if err != nil {
		return 0, fmt.Errorf("testenv: PostgreSQL version: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// KillPG kills the PostgreSQL server with SIGKILL, its postmaster and every
// backend at once (pg.sh kill), as a machine failure would: no shutdown
// checkpoint, no goodbye to clients or standbys.
func (e *Env) KillPG() error { return e.control("pg.sh", "kill", e.Dir) }

// Standby is a physical streaming standby of an Env's PostgreSQL, made
// from a base backup by pg.sh standby: WAL through a physical slot on the
// primary, hot_standby_feedback on and, on PostgreSQL 17, the primary's
// failover slots synchronised (sync_replication_slots) with the primary
// waiting for it (synchronized_standby_slots).
type Standby struct {
	Dir string // its state folder
	DSN string // postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable
	// Slot is the physical slot on the primary that the standby streams
	// from (primary_slot_name).
	Slot string
	env  *Env
}

// StartStandby makes a standby of the Env's PostgreSQL and waits until it
// streams; Cleanup removes it.
func (e *Env) StartStandby() (*Standby, error) {
	e.mu.Lock()
	dir := filepath.Join(e.Dir, fmt.Sprintf("standby%d", len(e.extra)+1))
	e.extra = append(e.extra, dir)
	e.mu.Unlock()
	if err := guard("pg.sh", "destroy", dir); err != nil {
		return nil, err
	}
	if err := e.control("pg.sh", "standby", dir, e.Dir); err != nil {
		return nil, err
	}
	m, err := readEnvFile(filepath.Join(dir, "pg.env"))
	if err != nil {
		return nil, err
	}
	return &Standby{Dir: dir, DSN: m["OUTBOXD_PG_DSN"], Slot: "outboxd_standby_" + m["PGPORT"], env: e}, nil
}

// Promote promotes the standby (pg_ctl promote) and returns once it
// accepts writes.
func (s *Standby) Promote() error { return s.env.control("pg.sh", "promote", s.Dir) }

// DatabaseDSN is dsn with its database replaced by db.
func DatabaseDSN(dsn, db string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("testenv: parse DSN: %w", err)
	}
	u.Path, u.RawPath = "/"+db, ""
	return u.String(), nil
}

// MultiHostDSN is one libpq URL over the servers of dsns (in that order),
// for database db, with target_session_attrs=read-write: a client tries
// each host in turn and keeps the first that accepts writes, the primary.
func MultiHostDSN(db string, dsns ...string) (string, error) {
	var hosts []string
	var first *url.URL
	for _, d := range dsns {
		u, err := url.Parse(d)
		if err != nil {
			return "", fmt.Errorf("testenv: parse DSN: %w", err)
		}
		if first == nil {
			first = u
		}
		hosts = append(hosts, u.Host)
	}
	if first == nil {
		return "", fmt.Errorf("testenv: no DSN")
	}
	q := first.Query()
	q.Set("target_session_attrs", "read-write")
	u := *first
	u.Host = strings.Join(hosts, ",")
	u.Path, u.RawPath = "/"+db, ""
	u.RawQuery = q.Encode()
	return u.String(), nil
}
