package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// blockingPart is a part made of function fields: it hands the test its
// context and runs until that ends.
func blockingPart(name string, started chan<- context.Context) part {
	return part{name: name, run: func(ctx context.Context) error {
		started <- ctx
		<-ctx.Done()
		return nil
	}}
}

// besideResult waits for runBeside's answer; a hang fails the test (with a
// deadline far beyond anything a loaded machine needs).
func besideResult(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("runBeside did not return: a goroutine outlived the daemon")
		return nil
	}
}

// The runner's fatal error stops every part at once, the one that watches
// its context and the one that must be stopped (a server), and is the
// daemon's error.
func TestRunBesideRunnerErrorStopsParts(t *testing.T) {
	started := make(chan context.Context, 1)
	served, stopped := make(chan struct{}), make(chan struct{})
	server := part{name: "server", run: func(context.Context) error { close(served); <-stopped; return nil }, stop: func() { close(stopped) }}
	fatal := errors.New("table has no column timestamp")
	done := make(chan error, 1)
	go func() {
		done <- runBeside(context.Background(), func(context.Context) error {
			<-started
			<-served
			return fatal
		}, []part{blockingPart("retention", started), server})
	}()
	if err := besideResult(t, done); err != fatal {
		t.Fatalf("runBeside = %v, want the runner's error", err)
	}
}

// A part's fatal error stops the runner, which drains while the other
// parts still run (its last acknowledgements wait for the marker), and
// then every part; the part's error, named, is the daemon's.
func TestRunBesideFailingPartStopsRunner(t *testing.T) {
	started := make(chan context.Context, 1)
	var marker context.Context
	failing := part{name: "health server", run: func(context.Context) error {
		marker = <-started
		return errors.New("accept: use of closed network connection")
	}}
	runnerSaw := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- runBeside(context.Background(), func(ctx context.Context) error {
			<-ctx.Done()
			runnerSaw <- marker.Err() // the runner drains: the marker still runs
			return nil                // a clean stop
		}, []part{blockingPart("mark_published", started), failing})
	}()
	err := besideResult(t, done)
	if err == nil || !strings.Contains(err.Error(), "health server: accept") {
		t.Fatalf("runBeside = %v, want the failing part's error, named", err)
	}
	if e := <-runnerSaw; e != nil {
		t.Fatalf("the other parts stopped before the runner returned: %v", e)
	}
	if marker.Err() == nil {
		t.Fatal("a part still runs after runBeside returned")
	}
}

// A clean stop (ctx ends, the runner returns nil) stops every part and is
// no error, even when a part reports one as it stops.
func TestRunBesideCleanStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan context.Context, 1)
	noisy := part{name: "server", run: func(ctx context.Context) error {
		<-ctx.Done()
		return errors.New("closed while stopping")
	}}
	done := make(chan error, 1)
	go func() {
		done <- runBeside(ctx, func(ctx context.Context) error {
			<-started
			cancel()
			<-ctx.Done()
			return nil
		}, []part{blockingPart("retention", started), noisy})
	}()
	if err := besideResult(t, done); err != nil {
		t.Fatalf("runBeside = %v after a clean stop, want nil", err)
	}
}
