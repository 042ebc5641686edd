package postgres

import (
	"context"
	"errors"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// TestWithSession: a session's settings are laid over the parsed
// connection, which stays as it was; an application_name of the DSN wins
// only where the session says so.
func TestWithSession(t *testing.T) {
	parse := func(dsn string) *pgconn.Config {
		pc, err := pgconn.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return pc
	}
	for _, tc := range []struct {
		name    string
		dsn     string
		s       Session
		app     string // "" : none set
		walsend bool
	}{
		{"nothing", "host=h", Session{}, "", false},
		{"named", "host=h", Session{App: "outboxd-retention"}, "outboxd-retention", false},
		{"named over the DSN", "host=h application_name=mine", Session{App: "outboxd-retention"}, "outboxd-retention", false},
		{"the DSN's name wins", "host=h application_name=mine", Session{App: "outboxd", DSNApp: true, Replication: true}, "mine", true},
		{"named when the DSN is not", "host=h", Session{App: "outboxd", DSNApp: true, Replication: true}, "outboxd", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := parse(tc.dsn)
			before, frontend := len(base.RuntimeParams), reflect.ValueOf(base.BuildFrontend).Pointer()
			tc.s.Params = map[string]string{"lock_timeout": "5000"}
			pc := withSession(base, tc.s)
			if got := pc.RuntimeParams["application_name"]; got != tc.app {
				t.Errorf("application_name %q, want %q", got, tc.app)
			}
			if got := pc.RuntimeParams["replication"] == "database"; got != tc.walsend {
				t.Errorf("replication connection: %v, want %v", got, tc.walsend)
			}
			if got := reflect.ValueOf(pc.BuildFrontend).Pointer() != frontend; got != tc.walsend {
				t.Errorf("large read buffer: %v, want %v", got, tc.walsend)
			}
			if pc.RuntimeParams["lock_timeout"] != "5000" {
				t.Errorf("settings not applied: %v", pc.RuntimeParams)
			}
			if len(base.RuntimeParams) != before || reflect.ValueOf(base.BuildFrontend).Pointer() != frontend {
				t.Errorf("the parsed connection changed: %v", base.RuntimeParams)
			}
		})
	}
}

// TestConnectErrorHasNoPassword: a connection failure whose text would
// hold the password (here a server that quotes it back) reaches the caller
// without it, and still says what it is (its SQLSTATE), through either
// opener.
func TestConnectErrorHasNoPassword(t *testing.T) {
	const password = "s3cr3t-Pa55"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			be := pgproto3.NewBackend(c, c)
			if _, err := be.ReceiveStartupMessage(); err == nil {
				be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "28P01",
					Message: "password authentication failed: got " + password})
				_ = be.Flush()
			}
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	base, err := pgconn.ParseConfig("host=127.0.0.1 sslmode=disable user=u dbname=d port=" + port + " password=" + password)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, open := range map[string]func() error{
		"Connect":    func() error { _, err := Connect(ctx, base, Session{}); return err },
		"ConnectPgx": func() error { _, err := ConnectPgx(ctx, base, Session{}); return err },
	} {
		t.Run(name, func(t *testing.T) {
			err := open()
			if err == nil {
				t.Fatal("connected to a server that refuses every login")
			}
			if strings.Contains(err.Error(), password) || !strings.Contains(err.Error(), "xxxxx") {
				t.Errorf("error text %q: want the password replaced", err)
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
				t.Errorf("error %v does not unwrap to the server's 28P01", err)
			}
		})
	}
}
