// Package republish publishes outbox rows read from the table itself rather
// than from the WAL: the rows a new slot's exported snapshot sees as
// pending when outboxd takes over from the polling relay (snapshot.go), and
// the rows `outboxd replay` republishes by creat_en or by id (replay.go).
// Each row goes to Kafka through a publish.Publisher, exactly as a streamed
// row does (its records, on_error, refusals, the in-flight bound and the
// delivery timeout are that package's), over the same producer. mark.go
// sets publicat_en once Kafka acknowledged a row, for the stream and the
// snapshot alike.
package republish

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/postgres"
	"github.com/outboxd/outboxd/publish"
)

// Progress is how far a publication has got.
type Progress struct {
	Table    string // schema.table being read
	Total    int    // rows it will publish, counted beforehand (all tables)
	Read     int    // rows read so far
	Records  int    // records they made (one per route that takes a row) handed to the producer
	Acked    int    // of them, acknowledged by Kafka (and marked, when marking)
	Dead     int    // of them, dead-lettered (their route's on_error)
	Finished bool
}

// PermanentError is a failure no retry can fix: a missing privilege. (A
// row that cannot become a record on a route that stops on it is a
// publish.BadRowError; a column the configuration names and the table lacks
// a ColumnError.) The replication stream stops on it rather than retrying.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string     { return e.Err.Error() }
func (e *PermanentError) Unwrap() error     { return e.Err }
func (e *PermanentError) Permanent() string { return e.Err.Error() }

// publication is one snapshot's or replay's rows on their way to Kafka:
// each goes through a publish.Publisher, as a streamed row does, and counts
// toward the publication as a whole (a nil publish.Unit): it is done when
// drain returns.
type publication struct {
	pub    *publish.Publisher
	source string
	log    hclog.Logger

	mu       sync.Mutex
	table    string
	total    int
	read     int
	finished bool
}

// newPublication publishes as cfg says (its router, producer, in-flight
// bound, delivery timeout, clock and log); mark, when not nil, marks each
// row published before its acknowledgement counts. cfg.Source goes into a
// dead-letter record's outboxd.lsn header: where the row came from, since
// no commit LSN is known.
func newPublication(cfg publish.Config, mark *Marker) *publication {
	p := &publication{source: cfg.Source, log: cfg.Log}
	cfg.Again = "start again"
	if mark != nil {
		cfg.Mark = mark.Wrap
	}
	p.pub = publish.New(cfg)
	return p
}

// row publishes one row read from a table, once per route that takes it
// (bs: the table's bindings, in the configuration's order), as the stream
// does, once fewer than the bound are in flight. A row read from the table
// has no WAL position: position headers are left out (a consumer
// deduplicates such a copy by its event id).
func (p *publication) row(ctx context.Context, bs []*envelope.Binding, row []envelope.Column) error {
	p.mu.Lock()
	p.read++
	p.mu.Unlock()
	if err := p.pub.Wait(ctx); err != nil {
		return err
	}
	return p.pub.Change(nil, bs, row, envelope.Position{})
}

// drain waits until Kafka acknowledged every record handed over.
func (p *publication) drain(ctx context.Context) error {
	if err := p.pub.Drain(ctx); err != nil {
		return err
	}
	p.mu.Lock()
	p.finished = true
	p.mu.Unlock()
	return nil
}

func (p *publication) state() Progress {
	c := p.pub.Counts()
	p.mu.Lock()
	defer p.mu.Unlock()
	return Progress{Table: p.table, Total: p.total, Read: p.read, Records: int(c.Records), Acked: int(c.Acked), Dead: int(c.DeadLettered), Finished: p.finished}
}

// selection is the rows of one table to publish: " FROM ... WHERE ..."
// and its parameters (text).
type selection struct {
	t      envelope.Table
	where  string
	params [][]byte
}

// publishAll publishes the rows of every selection, each table in commit
// order as far as the server can tell (rowOrder), inside the transaction
// open on conn (so that the counts taken before and the rows agree), ends
// the transaction once everything is read rather than keep its snapshot
// (holding back vacuum) while Kafka answers, and waits until Kafka
// acknowledged every record. It returns how many rows of each table it
// handed over.
func publishAll(ctx context.Context, conn *pgconn.PgConn, router *envelope.Router, sels []selection, p *publication) ([]TableCount, error) {
	byCommit, err := commitTimestamps(ctx, conn)
	if err != nil {
		return nil, err
	}
	if byCommit {
		p.log.Info("rows in commit order: track_commit_timestamp is on", "source", p.source)
	} else {
		p.log.Info("rows in creat_en order (the relay's): track_commit_timestamp is off, so the commit order of concurrent transactions of one aggregate is not known (docs/guarantees.md, Order)", "source", p.source)
	}
	counts := make([]TableCount, 0, len(sels))
	for _, s := range sels {
		p.mu.Lock()
		p.table = s.t.String()
		before := p.read
		p.mu.Unlock()
		err := scan(ctx, conn, router, s.t, "SELECT *"+s.where+" ORDER BY "+rowOrder(s.t, byCommit), s.params,
			func(bs []*envelope.Binding, row []envelope.Column) error { return p.row(ctx, bs, row) })
		if err != nil {
			return counts, columnError(fmt.Errorf("%s: %w", s.t.String(), err), s.t, "creat_en", s.t.Route.Columns.CreatEn, "its name")
		}
		counts = append(counts, TableCount{Table: s.t.String(), Topic: s.t.Route.Topic, Rows: p.state().Read - before})
	}
	if err := exec(ctx, conn, "COMMIT"); err != nil {
		return counts, fmt.Errorf("end the transaction: %w", err)
	}
	return counts, p.drain(ctx)
}

// every calls fn every d on c (def when d is not positive) until stop
// returns.
func every(c clock.Clock, d, def time.Duration, fn func()) (stop func()) {
	if d <= 0 {
		d = def
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			case <-c.After(d):
				fn()
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// connect opens a connection named app whose text output is what
// envelope.Build parses (envelope.SessionParams), with further settings.
func connect(ctx context.Context, cfg *pgconn.Config, app string, settings map[string]string) (*pgconn.PgConn, error) {
	params := maps.Clone(envelope.SessionParams)
	maps.Copy(params, settings)
	conn, err := postgres.Connect(ctx, cfg, postgres.Session{App: app, Params: params})
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return conn, nil
}

// commitTimestamps says whether the server records commit timestamps
// (track_commit_timestamp).
func commitTimestamps(ctx context.Context, conn *pgconn.PgConn) (bool, error) {
	res := conn.ExecParams(ctx, "SELECT current_setting('track_commit_timestamp')", nil, nil, nil, nil).Read()
	if res.Err != nil {
		return false, fmt.Errorf("read track_commit_timestamp: %w", res.Err)
	}
	return len(res.Rows) == 1 && string(res.Rows[0][0]) == "on", nil
}

// rowOrder is the ORDER BY that publishes t's rows in their commit order
// as nearly as the server can tell. creat_en (the relay's order) is the
// insert's transaction start (DEFAULT now()): of two transactions that
// lock the same aggregate, the one that started first may commit second,
// and its row then goes first. With track_commit_timestamp on, the
// commit time of the row's inserting transaction orders them as they
// committed (the second took the aggregate's lock after the first had
// committed, so its commit time is later); rows older than the setting
// have none and go first, by creat_en.
//
// Within one transaction (same commit time, same creat_en) the rows go in
// the order of the statements that inserted them: cmin, the inserting
// command's number (cid has no ordering operator, hence the cast). ctid is
// not that order: once the page a backend inserts into is full, the free
// space map may give it an earlier page, so a transaction's later row can
// sit before its earlier one (TestSnapshotKeepsStatementOrder makes it
// happen; a failover test under load met it). ctid only breaks the ties
// left: the rows of one multi-row statement, within one partition (a ctid
// is a place in one table: through a partitioned table, tableoid first).
func rowOrder(t envelope.Table, byCommit bool) string {
	creat := catalog.QuoteIdent(t.Route.Columns.CreatEn) + ", cmin::text::bigint, tableoid, ctid"
	if byCommit {
		return "pg_xact_commit_timestamp(xmin) NULLS FIRST, " + creat
	}
	return creat
}

// exec runs statements (simple protocol) and returns the first error.
func exec(ctx context.Context, conn *pgconn.PgConn, sql string) error {
	_, err := conn.Exec(ctx, sql).ReadAll()
	return err
}

// count runs a SELECT count(*) and returns its value.
func count(ctx context.Context, conn *pgconn.PgConn, sql string, params [][]byte) (int, error) {
	res := conn.ExecParams(ctx, sql, params, nil, nil, nil).Read()
	if res.Err != nil {
		return 0, res.Err
	}
	if len(res.Rows) != 1 || len(res.Rows[0]) != 1 {
		return 0, errors.New("count: no row")
	}
	var n int
	_, err := fmt.Sscan(string(res.Rows[0][0]), &n)
	return n, err
}

// scan runs a SELECT * of t's table, in text format, and hands each row to
// fn decoded as pgoutput sends it, with the binding a Relation message for
// the table would give: what Build gets from the stream. A row and its
// values are valid until fn returns. After an error the connection is in
// an unknown state: close it.
func scan(ctx context.Context, conn *pgconn.PgConn, router *envelope.Router, t envelope.Table, sql string, params [][]byte,
	fn func(bs []*envelope.Binding, row []envelope.Column) error) error {
	rr := conn.ExecParams(ctx, sql, params, nil, nil, nil)
	fields := rr.FieldDescriptions()
	rel := &pglogrepl.RelationMessage{Namespace: t.Route.Schema, RelationName: t.Route.Table, ColumnNum: uint16(len(fields))}
	for _, f := range fields {
		rel.Columns = append(rel.Columns, &pglogrepl.RelationMessageColumn{Name: f.Name, DataType: f.DataTypeOID})
	}
	bs := router.Bind(rel)
	row := make([]envelope.Column, len(fields))
	for rr.NextRow() {
		for i, v := range rr.Values() {
			if v == nil {
				row[i] = envelope.Column{Kind: pglogrepl.TupleDataTypeNull}
			} else {
				row[i] = envelope.Column{Kind: pglogrepl.TupleDataTypeText, Data: v}
			}
		}
		if err := fn(bs, row); err != nil {
			return err
		}
	}
	_, err := rr.Close()
	return err
}

// textArray is ids as the text form of an SQL array, for a parameter whose
// type the server infers (uuid[], text[]...).
func textArray(ids [][]byte) []byte {
	out := []byte{'{'}
	for i, id := range ids {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, '"')
		for _, c := range id {
			if c == '"' || c == '\\' {
				out = append(out, '\\')
			}
			out = append(out, c)
		}
		out = append(out, '"')
	}
	return append(out, '}')
}

// ColumnError is a column the configuration names that the table lacks, or
// that cannot serve its use: a configuration fix, never a retry.
type ColumnError struct {
	Table   string // schema.table
	Key     string // its routes[].columns key: "creat_en"
	Problem string // what is wrong, after the table's name
	Fix     string
	Err     error // the server's error, if any
}

func (e *ColumnError) Error() string {
	msg := fmt.Sprintf("%s %s: %s", e.Table, e.Problem, e.Fix)
	if e.Err != nil {
		msg += " (" + e.Err.Error() + ")"
	}
	return msg
}

func (e *ColumnError) Unwrap() error     { return e.Err }
func (e *ColumnError) Permanent() string { return e.Error() }

// columnError turns the server's "column does not exist" (or "no ordering
// operator" for a column that must order rows) into a *ColumnError whose fix
// is to set routes[].columns.key to fix.
func columnError(err error, t envelope.Table, key, column, fix string) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "42703":
		return &ColumnError{Table: t.String(), Key: key, Problem: fmt.Sprintf("has no column %q (routes[].columns.%s)", column, key),
			Fix: fmt.Sprintf("set routes[].columns.%s to %s", key, fix), Err: err}
	case "42883":
		return &ColumnError{Table: t.String(), Key: key, Problem: fmt.Sprintf("cannot order its rows by column %q (routes[].columns.%s)", column, key),
			Fix: fmt.Sprintf("set routes[].columns.%s to %s", key, fix), Err: err}
	}
	return err
}

// privilege marks a refused privilege as permanent, with what to grant.
func privilege(err error, grant string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return &PermanentError{fmt.Errorf("%w: %s", err, grant)}
	}
	return err
}
