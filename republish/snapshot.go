package republish

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/publish"
)

// Snapshotter publishes, when outboxd creates its slot, the rows the slot's
// exported snapshot sees as pending: publicat_en NULL, in commit order (rowOrder),
// through the stream's own producer and envelope, before the stream starts
// from the slot's consistent point. Those rows were committed before that
// point, so the slot is already past them: nothing but this publication
// delivers them, and the replication package confirms nothing on the slot
// until Publish has returned (see replication/cutover.go). After a
// cut-over that did not finish, the slot is kept and Publish reads the rows
// pending now instead.
type Snapshotter struct {
	Conn        *pgconn.Config
	Router      *envelope.Router
	Tables      []envelope.Table
	Marker      *Marker        // nil: publicat_en is left as it is
	Trace       publish.Tracer // nil: no spans
	MaxInFlight int
	// DeliveryTimeout: Kafka acknowledging nothing for this long fails the
	// publication (kafka.delivery_timeout); the next session does the
	// cut-over again.
	DeliveryTimeout time.Duration
	Log             hclog.Logger
	// ProgressEvery is how often a long publication logs its progress.
	ProgressEvery time.Duration
	// Clock times the publication and paces its progress (nil: the
	// system's).
	Clock clock.Clock
}

// Publish publishes every pending row of every table that has a
// publicat_en column, and returns once Kafka acknowledged them all (and,
// with a Marker, their marks committed). snapshot is the slot's exported
// snapshot, imported first (before the exporting replication connection
// runs another command): the rows pending as of the consistent point. ""
// reads them in a snapshot taken now, for the slot of an unfinished
// cut-over, still at its consistent point: the rows committed before it
// and still pending are all there, and those committed after it too,
// which its stream delivers again after them. consistentPoint only labels
// the log and the dead-letter records.
func (s *Snapshotter) Publish(ctx context.Context, snapshot, consistentPoint string, prod publish.Producer) error {
	c := clock.Or(s.Clock)
	started := c.Now()
	conn, err := connect(ctx, s.Conn, "outboxd-snapshot", nil)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	begin, asOf := "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "the slot's consistent point"
	if snapshot != "" {
		begin += "; SET TRANSACTION SNAPSHOT " + catalog.QuoteLiteral(snapshot)
	} else {
		asOf = "now (the slot streams from its consistent point: the rows committed since come again after these)"
	}
	if err := exec(ctx, conn, begin); err != nil {
		if snapshot == "" {
			return fmt.Errorf("begin the snapshot: %w", err)
		}
		return fmt.Errorf("import the slot's snapshot %s: %w", snapshot, err)
	}
	var sels []selection
	total := 0
	for _, t := range s.Tables {
		if t.Route.Columns.PublicatEn == "" {
			s.Log.Info("snapshot: the table has no publicat_en column; nothing of it is pending", "table", t.String())
			continue
		}
		sel, n, err := pending(ctx, conn, t)
		if err != nil {
			return err
		}
		s.Log.Info("snapshot: pending rows as of "+asOf, "table", t.String(), "rows", n, "consistent_point", consistentPoint)
		total += n
		sels = append(sels, sel)
	}

	p := newPublication(publish.Config{Router: s.Router, Producer: prod, Trace: s.Trace, MaxEvents: s.MaxInFlight, DeliveryTimeout: s.DeliveryTimeout,
		Source: "snapshot " + consistentPoint, Clock: c, Log: s.Log}, s.Marker)
	p.total = total
	stopReport := every(c, s.ProgressEvery, 5*time.Second, func() {
		st := p.state()
		s.Log.Info("snapshot: publishing", "table", st.Table, "read", st.Read, "of", st.Total, "records", st.Records, "acknowledged", st.Acked)
	})
	defer stopReport()
	if _, err := publishAll(ctx, conn, s.Router, sels, p); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	st := p.state()
	s.Log.Info("snapshot published: every pending row acknowledged by Kafka", "rows", st.Read, "dead_lettered", st.Dead,
		"consistent_point", consistentPoint, "took", clock.Since(c, started).Round(time.Millisecond))
	return nil
}

// CountPending is how many rows of t, a table with a publicat_en column, a
// cut-over snapshot would publish if it began now, once it is sure that it
// could read them in their order: what outboxd check says of a cut-over to
// come. Its errors are the snapshot's own.
func CountPending(ctx context.Context, conn *pgconn.PgConn, t envelope.Table) (int, error) {
	_, n, err := pending(ctx, conn, t)
	return n, err
}

// pending selects the rows of t the snapshot publishes (publicat_en NULL)
// and counts them, after making sure they can be read in rowOrder: a
// cut-over that cannot order them must fail before it begins, with the
// fix, not once the slot exists. A column the configuration names wrong is
// a *ColumnError.
func pending(ctx context.Context, conn *pgconn.PgConn, t envelope.Table) (selection, int, error) {
	sel := selection{t: t, where: fmt.Sprintf(" FROM %s WHERE %s IS NULL", t.Quoted(), catalog.QuoteIdent(t.Route.Columns.PublicatEn))}
	const noOrder = `the column that orders its rows as they were written (a timestamptz such as the relay's creat_en, or Debezium's optional timestamp column: add it if the table lacks it), or postgres.snapshot: none if nothing of the table is pending`
	if t.Route.Columns.CreatEn == "" {
		return sel, 0, &ColumnError{Table: t.String(), Key: "creat_en", Problem: `has no creat_en column ("-"), so the cut-over snapshot cannot publish its pending rows in order`, Fix: "set routes[].columns.creat_en to " + noOrder}
	}
	n, err := count(ctx, conn, "SELECT count(*)"+sel.where, nil)
	if err != nil {
		err = columnError(fmt.Errorf("count the pending rows of %s: %w", t.String(), err), t, "publicat_en", t.Route.Columns.PublicatEn,
			`the column the polling relay sets ("-" if no relay served the table), or postgres.snapshot: none`)
		return sel, 0, privilege(err, "outboxd's role needs SELECT on the outbox table")
	}
	// What publishAll will ask of the server, without reading a row.
	if err := exec(ctx, conn, "SELECT 1"+sel.where+" ORDER BY "+rowOrder(t, false)+" LIMIT 0"); err != nil {
		return sel, 0, columnError(fmt.Errorf("order the pending rows of %s: %w", t.String(), err), t, "creat_en", t.Route.Columns.CreatEn, noOrder)
	}
	return sel, n, nil
}
