// Command inventari is the course's idempotent inventory consumer in Go: it
// decrements the stock of every line of each comanda.creada event, once per
// event, with the consumer package (missatges_processats in the same
// transaction as the UPDATE, the offset committed after it, insufficient
// stock and malformed orders to the dead-letter topic, database failures
// retried with backoff).
//
//	inventari -dsn postgres://.../km0_inventari -brokers 127.0.0.1:9092 \
//	    [-topic comandes.esdeveniments] [-group inventari] [-dlq comandes.esdeveniments.dlq]
//
// The database needs examples/inventari/schema.sql. It prints one line per
// event, as the course's consumer does:
//
//	[inventari] 6f1c9e2a comanda P-2026-000123: processat
//
// -crash-after N kills the process (SIGKILL) right after the database
// transaction of its Nth applied event, before that event's offset is
// committed: the crash the idempotence is for (the tests and the demo use
// it; Kafka delivers the event again and it is found processed).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/consumer"
)

// Consumidor is this effect's name in missatges_processats.
const Consumidor = "inventari.descompte_estoc"

// comanda is what inventari reads of a comanda.creada event's dades.
type comanda struct {
	ID     string `json:"id"`
	Linies []struct {
		Producte  string `json:"producte"`
		Quantitat int    `json:"quantitat"`
	} `json:"linies"`
}

// descompteEstoc decrements the stock of each line; a line without enough
// stock undoes the whole order (the transaction rolls back) and sends it to
// the dead-letter topic: a business problem no retry fixes.
func descompteEstoc(ctx context.Context, tx pgx.Tx, ev *consumer.Event) error {
	var c comanda
	if err := json.Unmarshal(ev.Dades, &c); err != nil {
		return consumer.Permanent(fmt.Errorf("dades is not an order: %w", err))
	}
	if len(c.Linies) == 0 {
		return consumer.Permanent(fmt.Errorf("comanda %s has no linies", c.ID))
	}
	for _, l := range c.Linies {
		if l.Quantitat <= 0 {
			return consumer.Permanent(fmt.Errorf("comanda %s: quantitat %d of %s", c.ID, l.Quantitat, l.Producte))
		}
		tag, err := tx.Exec(ctx, "UPDATE estoc SET unitats = unitats - $1 WHERE producte = $2 AND unitats >= $1", l.Quantitat, l.Producte)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return consumer.Permanent(fmt.Errorf("estoc insuficient de %s per a la comanda %s", l.Producte, c.ID))
		}
	}
	return nil
}

func main() {
	dsn := flag.String("dsn", os.Getenv("INVENTARI_DSN"), "the inventari database (default $INVENTARI_DSN)")
	brokers := flag.String("brokers", os.Getenv("KAFKA_BROKERS"), "Kafka brokers, host:port[,host:port] (default $KAFKA_BROKERS)")
	topic := flag.String("topic", "comandes.esdeveniments", "the orders' topic")
	group := flag.String("group", "inventari", "consumer group")
	dlq := flag.String("dlq", "comandes.esdeveniments.dlq", "dead-letter topic")
	crashAfter := flag.Int("crash-after", 0, "SIGKILL itself after the database commit of the Nth applied event, before its offset commit (fault injection)")
	session := flag.Duration("session-timeout", 10*time.Second, "consumer group session: how long a crashed consumer keeps its partitions")
	verbose := flag.Bool("v", false, "log Kafka's errors too")
	flag.Parse()
	if *dsn == "" || *brokers == "" {
		fmt.Fprintln(os.Stderr, "inventari: -dsn and -brokers are required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	level := hclog.Warn
	if *verbose {
		level = hclog.Debug
	}
	applied := 0
	c, err := consumer.New(consumer.Config{
		Brokers: strings.Split(*brokers, ","), Topic: *topic, Group: *group, DeadLetterTopic: *dlq,
		Consumer: Consumidor, SessionTimeout: *session,
		Handlers: map[string]consumer.Handler{"comanda.creada": descompteEstoc},
		Connect:  func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, *dsn) },
		OnOutcome: func(ev *consumer.Event, o consumer.Outcome) {
			if o == consumer.Skipped {
				return
			}
			var c comanda
			_ = json.Unmarshal(ev.Dades, &c)
			fmt.Printf("[inventari] %.8s comanda %s: %s\n", ev.ID, c.ID, o)
			if o == consumer.Applied {
				applied++
				if applied == *crashAfter {
					fmt.Printf("[inventari] -crash-after %d: SIGKILL after the database commit, before the offset commit\n", applied)
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {}
				}
			}
		},
		Log: hclog.New(&hclog.LoggerOptions{Name: "inventari", Level: level, Output: os.Stderr}),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "inventari:", err)
		os.Exit(2)
	}
	if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "inventari:", err)
		os.Exit(1)
	}
}
