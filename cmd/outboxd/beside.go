package main

import (
	"context"
	"fmt"
	"sync"
)

// part is a part of the daemon that runs beside the replication runner:
// the health server, its monitor, the marker, the retention job.
type part struct {
	name string
	// run runs the part until ctx ends. An error it returns before then is
	// fatal: the daemon stops with it.
	run func(ctx context.Context) error
	// stop, when set, makes run return (a server's Shutdown, for a run that
	// does not watch ctx).
	stop func()
}

// runBeside runs the runner and the parts beside it and owns every
// goroutine, returning only once all have returned:
//
//   - the parts run until the runner has returned, not until ctx ends: the
//     runner's last acknowledgements wait for the marker's marks, and the
//     health server answers while it drains;
//   - a part's fatal error stops the runner as a signal does (it drains
//     and confirms what Kafka acknowledged), then every part;
//   - the runner's return, a fatal error or a clean stop, stops every part
//     at once, whatever it is doing (a retention batch waiting for the
//     slot included).
//
// The error is the first fatal one, the runner's or a part's (named).
func runBeside(ctx context.Context, runner func(context.Context) error, parts []part) error {
	rctx, stopRunner := context.WithCancel(ctx)
	defer stopRunner()
	pctx, stopParts := context.WithCancel(context.WithoutCancel(ctx))
	defer stopParts()
	var (
		mu    sync.Mutex
		first error
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.run(pctx); err != nil && pctx.Err() == nil {
				fail(fmt.Errorf("%s: %w", p.name, err))
				stopRunner()
			}
		}()
	}
	if err := runner(rctx); err != nil {
		fail(err)
	}
	stopParts()
	for _, p := range parts {
		if p.stop != nil {
			p.stop()
		}
	}
	wg.Wait()
	return first
}
