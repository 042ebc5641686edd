// Command outboxd streams outbox inserts from PostgreSQL's WAL to Kafka.
//
//	outboxd run       -c outboxd.yaml          the daemon
//	outboxd check     -c outboxd.yaml          preflight checklist
//	outboxd status    -c outboxd.yaml          what a running instance reports
//	outboxd slot drop -c outboxd.yaml --yes    drop the replication slot
//	outboxd slot forget -c outboxd.yaml --gap-from LSN   let the next start create a slot outboxd had seen
//	outboxd replay    -c outboxd.yaml --from T  republish outbox rows from the table
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
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxd/outboxd/replication"
)

const usage = `usage: outboxd <command> [flags]

commands:
  run        -c FILE                          stream outbox inserts to Kafka until SIGTERM, SIGINT or SIGHUP (a second one: exit at once)
  check      -c FILE                          preflight checklist of PostgreSQL and Kafka (exit 0 only if all pass)
  status     [-c FILE | --url URL] [--json]   print the /status of a running instance
  slot drop  -c FILE --yes                    drop the replication slot (undelivered events are lost with it)
  slot forget -c FILE --gap-from LSN          accept that events committed after LSN (the position the error of a dropped slot names)
                                              are in no slot: the next start may create the slot again
  replay     -c FILE --from TIME [--to TIME] [--route R] | --id ID[,ID...] [--wait 1m]
                                              republish outbox rows from the table by creat_en (or by id), as the stream would,
                                              once the slot has passed them;
                                              TIME: RFC 3339, a timestamptz as psql prints it, a UTC "2026-12-03 10:00", a date, or a duration ago ("90m")
  health     [-c FILE | --url URL] [--ready]  exit 0 when a running instance's /healthz (--ready: /readyz) answers 200, else 1 with the reason
  version                                     print the version, the Go version and the commit (also --version)

-c defaults to outboxd.yaml. Exit status: 0 success, 1 failure, 2 configuration or usage error,
3 a replication slot outboxd had seen is missing (the operator's to resolve: slot forget).
`

func main() {
	oneProcessor()
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

// oneProcessor runs outboxd's goroutines on one processor unless the
// environment's GOMAXPROCS says otherwise. outboxd is one stream: a
// walsender decodes its transactions one after the other, and one core
// keeps up with it (a drain at the decode limit takes 4 µs of CPU per
// event, 0.7 of a core). With a second processor, every goroutine one of
// them readies wakes a thread for the other, and on the virtual machines
// sidecars run on, a wake-up costs more CPU than a transaction's work:
// at steady rates a second processor made outboxd's CPU per event 1.3-1.5x
// (docs/reports/PERFORMANCE.md, issue 36).
func oneProcessor() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, args := args[0], args[1:]
	if cmd == "slot" && len(args) > 0 && (args[0] == "drop" || args[0] == "forget") {
		cmd, args = "slot "+args[0], args[1:]
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
	var gapFrom string
	var timeout time.Duration
	var ra replayArgs
	switch cmd {
	case "run", "check":
	case "replay":
		fs.StringVar(&ra.from, "from", "", "republish rows with creat_en at or after TIME")
		fs.StringVar(&ra.to, "to", "", "and before TIME")
		fs.StringVar(&ra.route, "route", "", "only the route of this table (schema.table) or topic")
		fs.Var(&ra.ids, "id", "republish the rows with this id (repeatable, or comma-separated)")
		fs.DurationVar(&ra.wait, "wait", time.Minute, "wait at most this long for the slot to pass the rows read, then refuse")
	case "status":
		fs.StringVar(&url, "url", "", "base URL of a running instance, instead of health.listen from -c")
		fs.BoolVar(&asJSON, "json", false, "print the raw JSON")
	case "slot drop":
		fs.BoolVar(&yes, "yes", false, "really drop the slot")
	case "slot forget":
		fs.StringVar(&gapFrom, "gap-from", "", "the position the slot had confirmed when outboxd last found it, as its error names it")
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
	proc := &process{stderr: stderr}
	ctx, stop := proc.notify(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()

	var err error
	switch cmd {
	case "run":
		err = run(ctx, *path, proc)
	case "check":
		err = check(ctx, *path, stdout)
	case "status":
		err = status(ctx, *path, url, asJSON, stdout)
	case "slot drop":
		err = slotDrop(ctx, *path, yes, stdout)
	case "slot forget":
		err = slotForget(ctx, *path, gapFrom, stdout)
	case "replay":
		err = replay(ctx, *path, ra, stdout, stderr)
	case "health":
		err = healthCheck(ctx, *path, url, ready, timeout, stdout)
	}
	if err == nil {
		return 0
	}
	proc.fatal(err.Error())
	return exitStatus(err)
}

// exitStatus is the exit status of a command that failed with err: 2 for
// a configuration or usage error, 3 for a slot outboxd had seen and found
// missing (the operator's: supervisors do not restart it), else 1.
func exitStatus(err error) int {
	switch {
	case errors.As(err, new(usageError)):
		return 2
	case errors.As(err, new(*replication.SlotGoneError)):
		return 3
	}
	return 1
}

// usageError is a configuration or command-line problem (exit status 2).
type usageError struct{ error }

// process is what every command shares: its signals, and how its last line
// is printed (through the daemon's logger once it has one, so that under
// log.format: json even the fatal line is JSON).
type process struct {
	stderr io.Writer
	exit   func(code int) // os.Exit; replaced in tests

	mu  sync.Mutex
	log hclog.Logger
}

// useLogger makes the fatal lines go through log.
func (p *process) useLogger(log hclog.Logger) {
	p.mu.Lock()
	p.log = log
	p.mu.Unlock()
}

// fatal prints the line a command ends with on an error.
func (p *process) fatal(msg string) {
	p.mu.Lock()
	log := p.log
	p.mu.Unlock()
	if log != nil {
		log.Error(msg)
		return
	}
	fmt.Fprintln(p.stderr, "outboxd: "+msg)
}

// notify returns a context cancelled by the first of sigs: a clean stop
// (SIGHUP included: outboxd has nothing to reload, and a terminal hanging
// up must not kill it uncleanly). A second signal during the clean stop
// exits at once with status 1, saying so: the events after the last
// confirmed position will be produced again on restart.
func (p *process) notify(sigs ...os.Signal) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, sigs...)
	done := make(chan struct{})
	go func() {
		select {
		case <-ch:
			cancel()
		case <-done:
			return
		}
		select {
		case sig := <-ch:
			p.fatal(fmt.Sprintf("second signal (%s) during the clean stop: exiting at once, without waiting for acknowledgements; events after the last confirmed position will be produced again on restart", sig))
			exit := p.exit
			if exit == nil {
				exit = os.Exit
			}
			exit(1)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(done)
		cancel()
	}
}
