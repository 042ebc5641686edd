package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"runtime"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/postgres"
	"github.com/outboxd/outboxd/quietconn"
)

// The Go floor (issue 36), run as a child process (`bench floor ...`)
// beside outboxd in the steady phase: the least a Go program does to relay
// a logical replication stream to Kafka one transaction at a time, so that
// outboxd's CPU per event can be read against what the same two wake-ups
// per transaction cost on the same machine at the same moment (a wake-up's
// cost here moves with the host, by 3× in a day).
//
// One goroutine on one processor reads a pgoutput stream from its own slot
// with pglogrepl, on a connection made as outboxd makes its own
// (postgres.Connect: its read buffer, a socket that does not wake the
// runtime's monitor); its Kafka connection is quiet too (quietconn). With
// -brokers it writes each transaction's inserted tuples, concatenated, to
// one partition of a topic with kafka-go's Conn (acks=all, no compression,
// no envelope, no key) and waits for the answer before it reads on;
// without it, it discards them, as pg_recvlogical into /dev/null does. It confirms what it read every
// 10 s. It is a measuring instrument, not a relay: nothing reads its topic.
func floorMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("floor", flag.ExitOnError)
	dsn := fs.String("dsn", "", "the database's connection string (the connection is made a walsender)")
	slot := fs.String("slot", "", "logical slot (pgoutput), created before")
	pub := fs.String("publication", "", "publication to read")
	brokers := fs.String("brokers", "", "a broker's address; empty: discard the rows")
	topic := fs.String("topic", "", "topic for -brokers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	runtime.GOMAXPROCS(1)
	return floor(ctx, *dsn, *slot, *pub, *brokers, *topic)
}

func floor(ctx context.Context, dsn, slot, pub, brokers, topic string) error {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return err
	}
	// outboxd's own connection: walsender, its read buffer, quiet sockets.
	conn, err := postgres.Connect(ctx, cfg, postgres.Session{App: "bench_floor", Replication: true})
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var kc *kafka.Conn
	if brokers != "" {
		if kc, err = floorKafka(ctx, brokers, topic); err != nil {
			return err
		}
		defer kc.Close()
	}
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + pub + "'"}})
	if err != nil {
		return fmt.Errorf("start replication: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Conn().SetReadDeadline(time.Now()) })
	defer stop()
	var (
		read    pglogrepl.LSN
		pending []kafka.Message
		next    = time.Now().Add(10 * time.Second)
	)
	for ctx.Err() == nil {
		if time.Now().After(next) {
			err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: read})
			if err != nil {
				return err
			}
			next = time.Now().Add(10 * time.Second)
		}
		// A deadline rather than a context: pgconn watches a context
		// with a goroutine of its own.
		if err := conn.Conn().SetReadDeadline(next); err != nil {
			return err
		}
		msg, err := conn.ReceiveMessage(context.Background())
		if pgconn.Timeout(err) {
			continue
		}
		if err != nil {
			return err
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 || cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		x, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			return err
		}
		m, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			return err
		}
		switch m := m.(type) {
		case *pglogrepl.InsertMessage:
			if kc != nil {
				var value []byte
				for _, col := range m.Tuple.Columns {
					value = append(value, col.Data...)
				}
				pending = append(pending, kafka.Message{Value: value})
			}
		case *pglogrepl.CommitMessage:
			read = m.TransactionEndLSN
			if len(pending) > 0 {
				if _, err := kc.WriteMessages(pending...); err != nil {
					return fmt.Errorf("produce: %w", err)
				}
				pending = pending[:0]
			}
		}
	}
	return nil
}

// floorKafka is a connection to the leader of topic's partition 0, over a
// quiet socket; a topic just created may take a moment to have a leader.
func floorKafka(ctx context.Context, broker, topic string) (*kafka.Conn, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		kc, err := kafka.DialLeader(ctx, "tcp", broker, topic, 0)
		if err == nil {
			addr := kc.RemoteAddr().String()
			kc.Close()
			nc, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			return kafka.NewConn(quietconn.Wrap(nc), topic, 0), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("floor: the leader of %s: %w", topic, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
