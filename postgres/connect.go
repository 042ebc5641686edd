// Package postgres opens outboxd's connections to PostgreSQL: every one
// from the parsed configuration (config.Postgres.ConnConfig), with the
// settings its caller names (Session), and one account of a failure (its
// text never holds the password; Explain names a TLS failure with its
// fix). What a connection is for, its application_name and its settings,
// stays with its caller.
package postgres

import (
	"bufio"
	"context"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/outboxd/outboxd/quietconn"
)

// Session is what a connection is opened as.
type Session struct {
	// App is its application_name, what pg_stat_activity and
	// pg_stat_replication show ("outboxd-retention"); "" keeps the DSN's.
	App string
	// DSNApp: an application_name the DSN sets wins over App (the
	// replication connection, whose name tells instances apart).
	DSNApp bool
	// Replication makes it a walsender connection (replication=database)
	// with a large read buffer.
	Replication bool
	// Params are further session settings (envelope.SessionParams, a
	// lock_timeout).
	Params map[string]string
}

// readBufferSize is a replication connection's read buffer: pgproto3 reads
// the socket in 8 KiB chunks, so a drain would cost a read(2) (and often a
// wake-up) per ~20 rows; a larger buffer under it takes whatever the
// walsender has written in one call.
const readBufferSize = 256 << 10

// withSession is base (which it does not change) with s's settings.
func withSession(base *pgconn.Config, s Session) *pgconn.Config {
	pc := base.Copy()
	if pc.RuntimeParams == nil {
		pc.RuntimeParams = map[string]string{}
	}
	if _, set := pc.RuntimeParams["application_name"]; s.App != "" && !(set && s.DSNApp) {
		pc.RuntimeParams["application_name"] = s.App
	}
	if s.Replication {
		pc.RuntimeParams["replication"] = "database"
		pc.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
			return pgproto3.NewFrontend(bufio.NewReaderSize(r, readBufferSize), w)
		}
	}
	for k, v := range s.Params {
		pc.RuntimeParams[k] = v
	}
	// Reads and writes (the stream's several per transaction, the
	// monitor's polls) must not wake the runtime's monitor (quietconn).
	dial := pc.DialFunc
	pc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return quietconn.Wrap(c), nil
	}
	return pc
}

// Connect opens a connection to base's server as s. Its error is pgconn's
// (errors.As finds its *pgconn.PgError), with no password in its text;
// the caller says what it was connecting for.
func Connect(ctx context.Context, base *pgconn.Config, s Session) (*pgconn.PgConn, error) {
	pc := withSession(base, s)
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, scrubbed(err, pc.Password)
	}
	return conn, nil
}

// ConnectPgx is Connect for a caller that scans typed rows (pgx).
func ConnectPgx(ctx context.Context, base *pgconn.Config, s Session) (*pgx.Conn, error) {
	// pgx takes only a configuration it parsed itself: parse an empty one
	// (no DSN, so nothing to fail on) and put ours in it.
	pcfg, err := pgx.ParseConfig("")
	if err != nil {
		return nil, err
	}
	pcfg.Config = *withSession(base, s)
	conn, err := pgx.ConnectConfig(ctx, pcfg)
	if err != nil {
		return nil, scrubbed(err, pcfg.Password)
	}
	return conn, nil
}

// scrubbedError is a connection error whose text holds no password; it
// still unwraps to pgconn's error, so that what it is (a TLS failure, an
// SQLSTATE) can be told.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

func scrubbed(err error, password string) error {
	msg := err.Error()
	if password != "" {
		msg = strings.ReplaceAll(msg, password, "xxxxx")
	}
	return &scrubbedError{msg: msg, err: err}
}
