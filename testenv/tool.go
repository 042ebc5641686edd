package testenv

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Tool is what a measuring tool (tools/membench, tools/migrationbench; not
// a test) runs on: a PostgreSQL and a Kafka of its own, a folder for
// outboxd's configurations and logs, and outboxd built from the working
// tree unless the tool was given a binary.
type Tool struct {
	*Env
	Dir     string
	cleanup []func()
}

// StartTool starts it, logging each step with logf. An interrupt stops
// the services and exits; Close does the same without exiting.
func StartTool(name, bin string, logf func(format string, args ...any)) (*Tool, error) {
	dir, err := os.MkdirTemp("", "outboxd-"+name+"-")
	if err != nil {
		return nil, err
	}
	t := &Tool{Dir: dir, cleanup: []func(){func() { os.RemoveAll(dir) }}}
	if bin == "" && os.Getenv("OUTBOXD_BIN") == "" {
		logf("building outboxd")
		t.cleanup = append(t.cleanup, RemoveBinary)
		if _, err := Binary(); err != nil {
			t.Close()
			return nil, err
		}
	}
	logf("starting PostgreSQL and Kafka")
	if t.Env, err = Start(Options{}); err != nil {
		t.Close()
		return nil, fmt.Errorf("start the services: %w", err)
	}
	t.cleanup = append(t.cleanup, t.Env.Cleanup)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		logf("interrupted: stopping the services")
		t.Close()
		os.Exit(130)
	}()
	return t, nil
}

// Close stops the services and removes what the tool made.
func (t *Tool) Close() {
	for i := len(t.cleanup) - 1; i >= 0; i-- {
		t.cleanup[i]()
	}
	t.cleanup = nil
}
