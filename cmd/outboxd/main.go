// Command outboxd streams outbox inserts from PostgreSQL's WAL to Kafka.
//
//	outboxd run    -c outboxd.yaml   the daemon
//	outboxd check  -c outboxd.yaml   validate the configuration
//	outboxd status -c outboxd.yaml   what a running instance reports
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage: outboxd <command> -c FILE

commands:
  run      stream outbox inserts to Kafka until SIGTERM/SIGINT
  check    validate the configuration file
  status   print the /status of a running instance (-c FILE or --url URL)
`

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("outboxd "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("c", "outboxd.yaml", "configuration file")
	url := fs.String("url", "", "status: base URL of a running instance (instead of -c)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var err error
	switch cmd {
	case "run":
		err = run(ctx, *path, stderr)
	case "check":
		err = check(*path, stdout)
	case "status":
		err = status(ctx, *path, *url, stdout)
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintln(stderr, "outboxd:", err)
			return 2
		}
		fmt.Fprintln(stderr, "outboxd:", err)
		return 1
	}
	return 0
}

// usageError is a configuration or command-line problem (exit status 2).
type usageError struct{ error }
