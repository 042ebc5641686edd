package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/outboxd/outboxd/testenv"
)

// The polling relay of the seed (testenv.Relay), run as a child process
// (`bench relay ...`) so its CPU and memory are its own. After each pass it
// prints the total published so far on stdout, for the bench. It uses
// murmur2, as outboxd's default does, so both spread keys alike.
func relayMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("relay", flag.ExitOnError)
	dsn := fs.String("dsn", "", "PostgreSQL DSN")
	brokers := fs.String("brokers", "", "Kafka brokers")
	topic := fs.String("topic", "", "topic")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, err := testenv.NewRelay(ctx, *dsn, *brokers, *topic, nil)
	if err != nil {
		return err
	}
	defer r.Close()
	out := bufio.NewWriter(os.Stdout)
	_, err = r.Run(ctx, nil, func(total int) {
		fmt.Fprintln(out, total)
		_ = out.Flush()
	})
	return err
}
