// Command chaos runs outboxd's fault-injection scenarios (issue 4) against
// a PostgreSQL 15 and a Kafka 4.1 it starts itself, and prints the table:
// scenario, runs, events, lost, duplicated, max recovery seconds, peak RSS.
// `make chaos` runs it; see docs/reports/CHAOS.md.
//
//	go run ./tools/chaos [-short] [-only 1,4c,7]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/outboxd/outboxd/chaos"
	"github.com/outboxd/outboxd/testenv"
)

func main() {
	os.Exit(run())
}

func run() int {
	short := flag.Bool("short", false, "the CI sizes (fewer faults, fewer events, shorter outages)")
	only := flag.String("only", "", "comma-separated scenario ids to run (default: all)")
	keep := flag.Bool("keep-logs", false, "keep outboxd's logs and configs (their folder is printed)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s chaos: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	dir, err := os.MkdirTemp("", "outboxd-chaos-run-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if *keep {
		logf("outboxd logs and configs in %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	defer testenv.RemoveBinary()
	built := make(chan error, 1)
	go func() { _, err := testenv.Binary(); built <- err }() // while the services start
	logf("starting PostgreSQL and Kafka, building outboxd")
	env, err := chaos.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer env.Close()
	if err := <-built; err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	h := &chaos.Harness{Env: env, Dir: dir, Short: *short, Logf: logf}
	defer h.Close()
	var results []chaos.Result
	failed := false
	start := time.Now()
	for _, s := range chaos.Scenarios() {
		if *only != "" && !strings.Contains(","+*only+",", ","+s.ID+",") {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		r := h.RunScenario(ctx, s)
		results = append(results, r)
		failed = failed || r.Failed()
	}
	fmt.Printf("\noutboxd chaos run, %s, %s sizes\n\n", time.Since(start).Round(time.Second), map[bool]string{true: "short", false: "full"}[*short])
	chaos.WriteTable(os.Stdout, results)
	if failed {
		return 1
	}
	return 0
}
