package consumer

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Permanent marks err as one no retry can fix: the event goes to the
// dead-letter topic at once (bad data, a business rule such as
// insufficient stock, a bug).
func Permanent(err error) error { return &classified{err, permanent} }

// Transient marks err as one worth retrying after a pause.
func Transient(err error) error { return &classified{err, transient} }

type class int

const (
	permanent class = iota
	transient
)

type classified struct {
	err   error
	class class
}

func (e *classified) Error() string { return e.err.Error() }
func (e *classified) Unwrap() error { return e.err }

// IsTransient says whether err is worth retrying: marked Transient, a lost
// or refused database connection, a timeout, or a PostgreSQL error that
// says "try again" (a serialization failure, a deadlock, a lock or
// statement timeout, too many connections, the server shutting down).
// Anything else is permanent: retrying a constraint violation or bad data
// changes nothing, and blocks the partition while it tries.
func IsTransient(err error) bool {
	var c *classified
	if errors.As(err, &c) {
		return c.class == transient
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 {
		switch pgErr.Code[:2] {
		case "08", "53": // connection exception, insufficient resources
			return true
		}
		switch pgErr.Code {
		case "40001", "40P01", // serialization failure, deadlock
			"55P03", "57014", // lock not available, statement timeout
			"57P01", "57P02", "57P03": // shutdown, crash, cannot connect now
			return true
		}
		return false
	}
	return brokenConnection(err)
}

// brokenConnection: the connection itself failed (not a statement on it).
func brokenConnection(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")
	}
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	return errors.As(err, &netErr) || errors.As(err, &connectErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		pgconn.Timeout(err) || pgconn.SafeToRetry(err) || strings.Contains(err.Error(), "conn closed")
}
