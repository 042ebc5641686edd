package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/clock"
)

// The seed's polling relay (outbox_relay.py), in Go: what outboxd replaces.
// One pass: BEGIN; SELECT the 100 oldest unpublished rows FOR UPDATE SKIP
// LOCKED; produce each with acks=all; flush (wait for every
// acknowledgement); UPDATE publicat_en; COMMIT. A pass that found nothing
// sleeps 200 ms. The benchmarks run it against outboxd; the cut-over tests
// run it before outboxd, to leave rows pending the way a real switch does.

// Relay timings, as in the seed.
const (
	RelayBatch = 100
	RelayIdle  = 200 * time.Millisecond
	// RelayGiveUp: how long passes may fail in a row before Run ends.
	RelayGiveUp = 30 * time.Second
)

// Relay is one running polling relay on the seed's outbox table.
type Relay struct {
	conn *pgx.Conn
	w    *kafka.Writer
	// Failed, when set, is called with the error of each failed pass (Run
	// retries it), for a test to show why the relay makes no progress.
	Failed func(error)
}

// NewRelay connects to dsn and produces to topic through brokers. balancer
// picks the partition: the seed's librdkafka client is
// &kafka.CRC32Balancer{Consistent: true}; nil means murmur2, as the Java
// client and outboxd's default.
func NewRelay(ctx context.Context, dsn, brokers, topic string, balancer kafka.Balancer) (*Relay, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("relay: connect: %w", err)
	}
	if balancer == nil {
		balancer = &kafka.Murmur2Balancer{Consistent: true}
	}
	w := &kafka.Writer{
		Addr:         kafka.TCP(splitBrokers(brokers)...),
		Topic:        topic,
		Balancer:     balancer,
		RequiredAcks: kafka.RequireAll,
		BatchSize:    RelayBatch,
		BatchTimeout: time.Millisecond, // librdkafka's linger.ms default is 5 ms; the flush() does not wait for it
	}
	return &Relay{conn: conn, w: w}, nil
}

// Close closes the connection and the producer.
func (r *Relay) Close() {
	_ = r.w.Close()
	_ = r.conn.Close(context.Background())
}

// Run makes passes until stop is closed (it finishes the pass under way, so
// every row it produced is marked published) or ctx ends (at once). After
// each pass it calls progress, when set, with the total published so far.
// A failed pass rolls back (its rows stay pending: the next pass produces
// them again, the relay's duplicates) and is retried after RelayIdle; Run
// ends when passes have failed for RelayGiveUp in a row. (A count of
// failures is not enough: a topic created a moment ago is refused with
// UNKNOWN_TOPIC_OR_PARTITION for a second or two after its metadata names
// the leaders, and kafka-go's Writer returns that at once; ten passes in two
// seconds failed a CI run.)
func (r *Relay) Run(ctx context.Context, stop <-chan struct{}, progress func(total int)) (int, error) {
	total := 0
	var failingSince time.Time
	for {
		select {
		case <-stop:
			return total, nil
		default:
		}
		n, err := r.Pass(ctx)
		if err != nil {
			if r.Failed != nil {
				r.Failed(err)
			}
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			if time.Since(failingSince) >= RelayGiveUp || ctx.Err() != nil {
				return total, err
			}
			if !clock.Sleep(ctx, clock.System, RelayIdle) {
				return total, ctx.Err()
			}
			continue
		}
		failingSince = time.Time{}
		total += n
		if progress != nil {
			progress(total)
		}
		if n == 0 {
			select {
			case <-ctx.Done():
				return total, ctx.Err()
			case <-stop:
				return total, nil
			case <-time.After(RelayIdle):
			}
		}
	}
}

type relayEnvelope struct {
	ID     string          `json:"id_esdeveniment"`
	Tipus  string          `json:"tipus"`
	Versio int32           `json:"versio"`
	DataMS int64           `json:"data_ms"`
	Origen string          `json:"origen"`
	Dades  json.RawMessage `json:"dades"`
}

// Pass is one pass of the relay; it returns how many rows it published.
func (r *Relay) Pass(ctx context.Context) (int, error) {
	tx, err := r.conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.Background())
	rows, err := tx.Query(ctx, `SELECT id::text, agregat_id, tipus, versio, carrega::text, creat_en FROM outbox
		WHERE publicat_en IS NULL ORDER BY creat_en LIMIT $1 FOR UPDATE SKIP LOCKED`, RelayBatch)
	if err != nil {
		return 0, err
	}
	var ids []string
	var msgs []kafka.Message
	for rows.Next() {
		var e relayEnvelope
		var agregatID, carrega string
		var creatEn time.Time
		if err := rows.Scan(&e.ID, &agregatID, &e.Tipus, &e.Versio, &carrega, &creatEn); err != nil {
			rows.Close()
			return 0, err
		}
		e.DataMS = creatEn.UnixMicro() / 1000
		e.Origen = "comandes"
		e.Dades = json.RawMessage(carrega)
		v, err := json.Marshal(&e)
		if err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, e.ID)
		msgs = append(msgs, kafka.Message{Key: []byte(agregatID), Value: v,
			Headers: []kafka.Header{{Key: "tipus", Value: []byte(e.Tipus)}, {Key: "id_esdeveniment", Value: []byte(e.ID)}}})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(msgs) == 0 {
		return 0, tx.Commit(ctx)
	}
	// Synchronous: returns once every record is acknowledged (flush()).
	if err := r.w.WriteMessages(ctx, msgs...); err != nil {
		return 0, fmt.Errorf("relay: produce: %w", err)
	}
	if _, err := tx.Exec(ctx, "UPDATE outbox SET publicat_en = now() WHERE id = ANY($1::uuid[])", ids); err != nil {
		return 0, err
	}
	return len(msgs), tx.Commit(ctx)
}
