package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// The polling relay of the seed (outbox_relay.py), in Go, run as a child
// process (`bench relay ...`) so its CPU and memory are its own. One pass:
// BEGIN; SELECT the 100 oldest unpublished rows FOR UPDATE SKIP LOCKED;
// produce each with acks=all; flush (wait for every acknowledgement); UPDATE
// publicat_en; COMMIT. A pass that found nothing sleeps 200 ms. After each
// pass it prints the total published so far on stdout, for the bench.

const (
	relayBatch = 100
	relayIdle  = 200 * time.Millisecond
)

type relayEnvelope struct {
	ID     string          `json:"id_esdeveniment"`
	Tipus  string          `json:"tipus"`
	Versio int32           `json:"versio"`
	DataMS int64           `json:"data_ms"`
	Origen string          `json:"origen"`
	Dades  json.RawMessage `json:"dades"`
}

func relayMain(args []string) error {
	fs := flag.NewFlagSet("relay", flag.ExitOnError)
	dsn := fs.String("dsn", "", "PostgreSQL DSN")
	brokers := fs.String("brokers", "", "Kafka brokers")
	topic := fs.String("topic", "", "topic")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	conn, err := pgx.Connect(ctx, *dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	w := &kafka.Writer{
		Addr:         kafka.TCP(strings.Split(*brokers, ",")...),
		Topic:        *topic,
		Balancer:     &kafka.Murmur2Balancer{Consistent: true},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    relayBatch,
		BatchTimeout: time.Millisecond, // librdkafka's linger.ms default is 5 ms; the flush() does not wait for it
	}
	defer w.Close()
	out := bufio.NewWriter(os.Stdout)
	total := 0
	for ctx.Err() == nil {
		n, err := relayPass(ctx, conn, w)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		total += n
		fmt.Fprintln(out, total)
		_ = out.Flush()
		if n == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(relayIdle):
			}
		}
	}
	return nil
}

func relayPass(ctx context.Context, conn *pgx.Conn, w *kafka.Writer) (int, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.Background())
	rows, err := tx.Query(ctx, `SELECT id::text, agregat_id, tipus, versio, carrega::text, creat_en FROM outbox
		WHERE publicat_en IS NULL ORDER BY creat_en LIMIT $1 FOR UPDATE SKIP LOCKED`, relayBatch)
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
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return 0, fmt.Errorf("produce: %w", err)
	}
	if _, err := tx.Exec(ctx, "UPDATE outbox SET publicat_en = now() WHERE id = ANY($1::uuid[])", ids); err != nil {
		return 0, err
	}
	return len(msgs), tx.Commit(ctx)
}
