package republish

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/envelope"
)

// Snapshotter publishes, when outboxd creates its slot, the rows the slot's
// exported snapshot sees as pending: publicat_en NULL, in commit order (rowOrder),
// through the stream's own producer and envelope, before the stream starts
// from the slot's consistent point. Those rows were committed before that
// point, so the slot is already past them: nothing but this publication
// delivers them, and the replication package confirms nothing on the slot
// until Publish has returned (see replication/cutover.go).
type Snapshotter struct {
	Conn        *pgconn.Config
	Router      *envelope.Router
	Tables      []Table
	Marker      *Marker // nil: publicat_en is left as it is
	MaxInFlight int
	// DeliveryTimeout: Kafka acknowledging nothing for this long fails the
	// publication (kafka.delivery_timeout); the next session does the
	// cut-over again.
	DeliveryTimeout time.Duration
	Log             hclog.Logger
	// ProgressEvery is how often a long publication logs its progress.
	ProgressEvery time.Duration
}

// Publish imports the exported snapshot (it must run before the exporting
// replication connection runs another command), publishes every pending
// row of every table that has a publicat_en column, and returns once Kafka
// acknowledged them all (and, with a Marker, their marks committed).
// consistentPoint only labels the log and the dead-letter records.
func (s *Snapshotter) Publish(ctx context.Context, snapshot, consistentPoint string, prod Producer) error {
	started := time.Now()
	conn, err := connect(ctx, s.Conn, "outboxd-snapshot")
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if err := exec(ctx, conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT "+catalog.QuoteLiteral(snapshot)); err != nil {
		return fmt.Errorf("import the slot's snapshot %s: %w", snapshot, err)
	}
	var sels []selection
	total := 0
	for _, t := range s.Tables {
		if t.PublicatEn == "" {
			s.Log.Info("snapshot: the table has no publicat_en column; nothing of it is pending", "table", t.Name())
			continue
		}
		sel := selection{t: t, where: fmt.Sprintf(" FROM %s WHERE %s IS NULL", t.quoted(), catalog.QuoteIdent(t.PublicatEn))}
		n, err := count(ctx, conn, "SELECT count(*)"+sel.where, nil)
		if err != nil {
			err = missingColumn(fmt.Errorf("count the pending rows of %s: %w", t.Name(), err), t, "publicat_en", t.PublicatEn,
				`, the column the polling relay sets ("-" if no relay served the table), or postgres.snapshot: none`)
			return privilege(err, "outboxd's role needs SELECT on the outbox table")
		}
		s.Log.Info("snapshot: pending rows as of the slot's consistent point", "table", t.Name(), "rows", n, "consistent_point", consistentPoint)
		total += n
		sels = append(sels, sel)
	}

	p := newPublisher(s.Router, prod, limits{s.MaxInFlight, s.DeliveryTimeout}, s.Marker, "snapshot "+consistentPoint, s.Log)
	p.progress.Total = total
	stopReport := every(s.ProgressEvery, 5*time.Second, func() {
		st := p.state()
		s.Log.Info("snapshot: publishing", "table", st.Table, "read", st.Read, "of", st.Total, "records", st.Records, "acknowledged", st.Acked)
	})
	defer stopReport()
	if _, err := publishAll(ctx, conn, s.Router, sels, p); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	st := p.state()
	s.Log.Info("snapshot published: every pending row acknowledged by Kafka", "rows", st.Read, "dead_lettered", st.Dead,
		"consistent_point", consistentPoint, "took", time.Since(started).Round(time.Millisecond))
	return nil
}
