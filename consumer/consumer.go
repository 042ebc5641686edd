// Package consumer is the km0 consumers' side of the outbox contract, the
// course's idempotent consumer (section 2) with retries and a dead-letter
// topic (section 6): it reads a topic in a Kafka consumer group (kafka-go's
// Reader), and for each event
//
//  1. in ONE database transaction, records the event's id_esdeveniment in
//     missatges_processats (INSERT ... ON CONFLICT DO NOTHING RETURNING: no
//     row means a duplicate, already applied: nothing else is done) and
//     applies the event's effect through its Handler;
//  2. only after that transaction committed, commits the event's offset.
//
// A crash between the two redelivers the event, and step 1 turns it into a
// no-op: the effect happens once per event however often Kafka delivers it
// (outboxd delivers at least once). A Handler error rolls the transaction
// back, the record of the id with it. A transient error (the database
// restarting, a lock or serialization conflict) is retried in place with
// exponential backoff, so the partition keeps its order; a permanent one
// (bad data, a business rule: Permanent) goes to the dead-letter topic at
// once, with the reason, and the partition moves on.
package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/backoff"
	"github.com/outboxd/outboxd/clock"
)

// Event is one outbox event as outboxd (or the polling relay) writes it.
type Event struct {
	ID     string          `json:"id_esdeveniment"`
	Tipus  string          `json:"tipus"`
	Versio int             `json:"versio"`
	DataMS int64           `json:"data_ms"`
	Origen string          `json:"origen"`
	Dades  json.RawMessage `json:"dades"`
	// Where it was read.
	Key       []byte `json:"-"`
	Partition int    `json:"-"`
	Offset    int64  `json:"-"`
}

// Handler applies one event's effect inside tx, the transaction that also
// records the event as processed. It returns an error wrapped by Permanent
// for an event that can never be applied, Transient for one worth retrying;
// other errors are classified by IsTransient.
type Handler func(ctx context.Context, tx pgx.Tx, ev *Event) error

// Outcome is what became of one event.
type Outcome string

const (
	Applied      Outcome = "processat"      // its effect committed
	Duplicate    Outcome = "duplicat"       // already applied: nothing done
	Skipped      Outcome = "ignorat"        // no Handler for its tipus
	DeadLettered Outcome = "a la cua morta" // written to the dead-letter topic
)

// Config is one consumer.
type Config struct {
	Brokers []string
	Topic   string
	Group   string // the Kafka consumer group
	// Consumer is missatges_processats.consumidor: one name per effect, so
	// two effects of one event are each applied once.
	Consumer        string
	DeadLetterTopic string
	Handlers        map[string]Handler // by tipus; other tipus are skipped
	// Connect opens the database connection; the consumer reconnects
	// through it after a connection error.
	Connect func(ctx context.Context) (*pgx.Conn, error)
	// BackoffMin and BackoffMax pace the retries of a transient error
	// (exponential, jittered); defaults 200ms and 30s. MaxAttempts > 0
	// sends an event to the dead-letter topic after that many transient
	// failures; 0 retries it until it succeeds.
	BackoffMin, BackoffMax time.Duration
	MaxAttempts            int
	// SessionTimeout is the consumer group's session (default 10s): how
	// long a consumer that died keeps its partitions.
	SessionTimeout time.Duration
	// OnOutcome, when set, is told each event's outcome after its database
	// transaction and before its offset is committed.
	OnOutcome func(ev *Event, o Outcome)
	Log       hclog.Logger
	// Clock is what the retries wait on (nil: the system's).
	Clock clock.Clock
}

// Consumer applies a topic's events once each.
type Consumer struct {
	cfg  Config
	conn *pgx.Conn
	dlq  *kafka.Writer
	log  hclog.Logger
}

// New checks cfg and fills in its defaults.
func New(cfg Config) (*Consumer, error) {
	switch {
	case len(cfg.Brokers) == 0 || cfg.Topic == "" || cfg.Group == "":
		return nil, errors.New("consumer: Brokers, Topic and Group are required")
	case cfg.Consumer == "" || cfg.DeadLetterTopic == "" || cfg.Connect == nil:
		return nil, errors.New("consumer: Consumer, DeadLetterTopic and Connect are required")
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = 200 * time.Millisecond
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = max(30*time.Second, cfg.BackoffMin)
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	cfg.Clock = clock.Or(cfg.Clock)
	return &Consumer{cfg: cfg, log: cfg.Log, dlq: &kafka.Writer{Addr: kafka.TCP(cfg.Brokers...), Topic: cfg.DeadLetterTopic,
		RequiredAcks: kafka.RequireAll, Balancer: &kafka.Hash{}, BatchTimeout: time.Millisecond}}, nil
}

// Run consumes until ctx ends (then it returns nil) or Kafka fails for good.
func (c *Consumer) Run(ctx context.Context) error {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: c.cfg.Brokers, GroupID: c.cfg.Group, Topic: c.cfg.Topic,
		StartOffset: kafka.FirstOffset, MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 500 * time.Millisecond,
		CommitInterval: 0, // CommitMessages commits at once, synchronously
		SessionTimeout: c.cfg.SessionTimeout, HeartbeatInterval: c.cfg.SessionTimeout / 4, RebalanceTimeout: c.cfg.SessionTimeout,
		ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) { c.log.Debug("kafka: " + fmt.Sprintf(msg, args...)) }),
	})
	defer func() {
		_ = r.Close()
		_ = c.dlq.Close()
		if c.conn != nil {
			_ = c.conn.Close(context.Background())
		}
	}()
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read %s: %w", c.cfg.Topic, err)
		}
		if err := c.process(ctx, m); err != nil {
			return nil // only ctx ends processing
		}
		// The database transaction is committed: now the offset.
		if err := r.CommitMessages(ctx, m); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// A rebalance, say: whoever gets the partition reads the
			// event again and finds it processed.
			c.log.Warn("offset commit failed; the event will be read again and found processed", "partition", m.Partition, "offset", m.Offset, "error", err)
		}
	}
}

// process takes one message to its outcome; it fails only when ctx ends.
func (c *Consumer) process(ctx context.Context, m kafka.Message) error {
	ev := &Event{Key: m.Key, Partition: m.Partition, Offset: m.Offset}
	if err := json.Unmarshal(m.Value, ev); err != nil || ev.ID == "" {
		if err == nil {
			err = errors.New("no id_esdeveniment")
		}
		return c.finish(ev)(c.deadLetter(ctx, m, 1, fmt.Sprintf("permanent: the value is not an event envelope: %v", err)))
	}
	h, ok := c.cfg.Handlers[ev.Tipus]
	if !ok {
		return c.finish(ev)(Skipped, nil)
	}
	for attempt := 1; ; attempt++ {
		o, err := c.apply(ctx, h, ev)
		if err == nil {
			return c.finish(ev)(o, nil)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !IsTransient(err) {
			c.log.Warn("permanent error: to the dead-letter topic", "id", ev.ID, "tipus", ev.Tipus, "error", err)
			return c.finish(ev)(c.deadLetter(ctx, m, attempt, "permanent: "+err.Error()))
		}
		if c.cfg.MaxAttempts > 0 && attempt >= c.cfg.MaxAttempts {
			c.log.Warn("transient error, attempts exhausted: to the dead-letter topic", "id", ev.ID, "attempts", attempt, "error", err)
			return c.finish(ev)(c.deadLetter(ctx, m, attempt, "transient, attempts exhausted: "+err.Error()))
		}
		delay := backoff.Delay(attempt-1, c.cfg.BackoffMin, c.cfg.BackoffMax)
		c.log.Warn("transient error; retrying", "id", ev.ID, "attempt", attempt, "in", delay.Round(time.Millisecond), "error", err)
		if !clock.Sleep(ctx, c.cfg.Clock, delay) {
			return ctx.Err()
		}
	}
}

// finish returns what reports ev's outcome (unless getting there failed).
func (c *Consumer) finish(ev *Event) func(Outcome, error) error {
	return func(o Outcome, err error) error {
		if err == nil && c.cfg.OnOutcome != nil {
			c.cfg.OnOutcome(ev, o)
		}
		return err
	}
}

// apply runs one attempt: the id recorded and the effect applied in one
// transaction.
func (c *Consumer) apply(ctx context.Context, h Handler, ev *Event) (Outcome, error) {
	if c.conn == nil || c.conn.IsClosed() {
		conn, err := c.cfg.Connect(ctx)
		if err != nil {
			return "", Transient(fmt.Errorf("connect to the database: %w", err))
		}
		c.conn = conn
	}
	o, err := c.transaction(ctx, h, ev)
	if err != nil && brokenConnection(err) {
		_ = c.conn.Close(context.Background())
		c.conn = nil
	}
	return o, err
}

func (c *Consumer) transaction(ctx context.Context, h Handler, ev *Event) (Outcome, error) {
	tx, err := c.conn.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(context.Background())
	var id string
	err = tx.QueryRow(ctx, `INSERT INTO missatges_processats (id_missatge, consumidor) VALUES ($1, $2)
		ON CONFLICT DO NOTHING RETURNING id_missatge`, ev.ID, c.cfg.Consumer).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Duplicate, nil
	}
	if err != nil {
		return "", fmt.Errorf("record %s in missatges_processats: %w", ev.ID, err)
	}
	if err := h(ctx, tx, ev); err != nil {
		return "", err
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("commit: %w", err)
	}
	return Applied, nil
}

// deadLetter writes the message to the dead-letter topic, as it came (key,
// value, headers) plus why, retrying until Kafka acknowledges it.
func (c *Consumer) deadLetter(ctx context.Context, m kafka.Message, attempts int, reason string) (Outcome, error) {
	dl := kafka.Message{Key: m.Key, Value: m.Value, Headers: append(append([]kafka.Header(nil), m.Headers...),
		kafka.Header{Key: HeaderReason, Value: []byte(reason)},
		kafka.Header{Key: HeaderAttempts, Value: []byte(strconv.Itoa(attempts))},
		kafka.Header{Key: HeaderConsumer, Value: []byte(c.cfg.Consumer)},
		kafka.Header{Key: HeaderTopic, Value: []byte(m.Topic)},
		kafka.Header{Key: HeaderPartition, Value: []byte(strconv.Itoa(m.Partition))},
		kafka.Header{Key: HeaderOffset, Value: []byte(strconv.FormatInt(m.Offset, 10))},
	)}
	for attempt := 1; ; attempt++ {
		err := c.dlq.WriteMessages(ctx, dl)
		if err == nil {
			return DeadLettered, nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		delay := backoff.Delay(attempt-1, c.cfg.BackoffMin, c.cfg.BackoffMax)
		c.log.Warn("dead-letter write failed; retrying", "topic", c.cfg.DeadLetterTopic, "in", delay.Round(time.Millisecond), "error", err)
		if !clock.Sleep(ctx, c.cfg.Clock, delay) {
			return "", ctx.Err()
		}
	}
}

// Headers a dead-letter record carries besides the original ones (the
// course's names: motiu, intents).
const (
	HeaderReason    = "motiu"
	HeaderAttempts  = "intents"
	HeaderConsumer  = "consumidor"
	HeaderTopic     = "topic_original"
	HeaderPartition = "particio_original"
	HeaderOffset    = "offset_original"
)
