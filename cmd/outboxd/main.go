// Command outboxd streams outbox inserts from PostgreSQL's WAL to Kafka.
//
//	outboxd run       -c outboxd.yaml          the daemon
//	outboxd check     -c outboxd.yaml          preflight checklist
//	outboxd status    -c outboxd.yaml          what a running instance reports
//	outboxd slot drop -c outboxd.yaml --yes    drop the replication slot
//	outboxd health    -c outboxd.yaml          exit 0 when /healthz (--ready: /readyz) says 200
//	outboxd version                            the version it was built as
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
	"time"
)

const usage = `usage: outboxd <command> [flags]

commands:
  run        -c FILE                          stream outbox inserts to Kafka until SIGTERM/SIGINT
  check      -c FILE                          preflight checklist of PostgreSQL and Kafka (exit 0 only if all pass)
  status     [-c FILE | --url URL] [--json]   print the /status of a running instance
  slot drop  -c FILE --yes                    drop the replication slot (undelivered events are lost with it)
  health     [-c FILE | --url URL] [--ready]  exit 0 when a running instance's /healthz (--ready: /readyz) answers 200, else 1 with the reason
  version                                     print the version, the Go version and the commit (also --version)

-c defaults to outboxd.yaml. Exit status: 0 success, 1 failure, 2 configuration or usage error.
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
	if cmd == "slot" && len(args) > 0 && args[0] == "drop" {
		cmd, args = "slot drop", args[1:]
	}
	if cmd == "help" || cmd == "-h" || cmd == "--help" {
		fmt.Fprint(stdout, usage)
		return 0
	}
	if cmd == "version" || cmd == "--version" {
		printVersion(stdout)
		return 0
	}
	fs := flag.NewFlagSet("outboxd "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("c", "outboxd.yaml", "configuration file")
	var url string
	var asJSON, yes, ready bool
	var timeout time.Duration
	switch cmd {
	case "run", "check":
	case "status":
		fs.StringVar(&url, "url", "", "base URL of a running instance, instead of health.listen from -c")
		fs.BoolVar(&asJSON, "json", false, "print the raw JSON")
	case "slot drop":
		fs.BoolVar(&yes, "yes", false, "really drop the slot")
	case "health":
		fs.StringVar(&url, "url", "", "base URL of a running instance, instead of health.listen from -c")
		fs.BoolVar(&ready, "ready", false, "ask /readyz instead of /healthz")
		fs.DurationVar(&timeout, "timeout", 5*time.Second, "give up after this long")
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "outboxd %s: unexpected argument %q\n", cmd, fs.Arg(0))
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var err error
	switch cmd {
	case "run":
		err = run(ctx, *path, stderr)
	case "check":
		err = check(ctx, *path, stdout)
	case "status":
		err = status(ctx, *path, url, asJSON, stdout)
	case "slot drop":
		err = slotDrop(ctx, *path, yes, stdout)
	case "health":
		err = healthCheck(ctx, *path, url, ready, timeout, stdout)
	}
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "outboxd:", err)
	if errors.As(err, new(usageError)) {
		return 2
	}
	return 1
}

// usageError is a configuration or command-line problem (exit status 2).
type usageError struct{ error }
