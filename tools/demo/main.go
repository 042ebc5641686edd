// Command demo-consumer is the Kafka side of the demo (tools/demo/demo.sh).
//
//	demo-consumer create-topic BROKERS TOPIC PARTITIONS
//	demo-consumer consume      BROKERS TOPIC N TIMEOUT
//
// create-topic creates TOPIC (replication factor 1) and waits until every
// partition has a leader; an existing topic is fine. consume reads TOPIC from
// the first offset of every partition (no consumer group) until N records
// arrived or TIMEOUT (a Go duration such as "15s") passed, and prints each
// record, sorted by partition then offset, as
//
//	partition=P offset=O key=K headers=[tipus=… id_esdeveniment=…]
//	{ ...the value, pretty-printed JSON... }
//
// BROKERS is "host:port[,host:port...]". Exit status 1 when fewer than N
// records were read (the ones read are still printed).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/testenv"
)

const usage = `usage:
  demo-consumer create-topic BROKERS TOPIC PARTITIONS
  demo-consumer consume      BROKERS TOPIC N TIMEOUT
`

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch cmd := args[0]; {
	case cmd == "create-topic" && len(args) == 4:
		n, err := strconv.Atoi(args[3])
		if err != nil || n <= 0 {
			fmt.Fprintf(stderr, "demo-consumer: PARTITIONS must be a positive integer, got %q\n", args[3])
			return 2
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := testenv.CreateTopic(ctx, args[1], args[2], n); err != nil {
			fmt.Fprintln(stderr, "demo-consumer:", err)
			return 1
		}
		fmt.Fprintf(stdout, "topic %s ready with %d partitions\n", args[2], n)
		return 0
	case cmd == "consume" && len(args) == 5:
		n, err := strconv.Atoi(args[3])
		if err != nil || n <= 0 {
			fmt.Fprintf(stderr, "demo-consumer: N must be a positive integer, got %q\n", args[3])
			return 2
		}
		timeout, err := time.ParseDuration(args[4])
		if err != nil || timeout <= 0 {
			fmt.Fprintf(stderr, "demo-consumer: TIMEOUT must be a duration such as 15s, got %q\n", args[4])
			return 2
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		msgs, err := testenv.Consume(ctx, args[1], args[2], n)
		for _, m := range msgs {
			printRecord(stdout, m)
		}
		if err != nil {
			fmt.Fprintln(stderr, "demo-consumer:", err)
			return 1
		}
		return 0
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
}

func printRecord(w io.Writer, m kafka.Message) {
	hs := make([]string, 0, len(m.Headers))
	for _, h := range m.Headers {
		hs = append(hs, h.Key+"="+string(h.Value))
	}
	fmt.Fprintf(w, "partition=%d offset=%d key=%s headers=[%s]\n", m.Partition, m.Offset, m.Key, strings.Join(hs, " "))
	var buf bytes.Buffer
	if err := json.Indent(&buf, m.Value, "", "  "); err != nil {
		fmt.Fprintf(w, "%s\n(value is not JSON: %v)\n\n", m.Value, err)
		return
	}
	fmt.Fprintf(w, "%s\n\n", buf.Bytes())
}
