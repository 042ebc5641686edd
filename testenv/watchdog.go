package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// The services a process starts die with it, however it dies. PostgreSQL
// and Kafka run detached from it (pg_ctl, setsid), so a test process that
// is killed, or panics at go test -timeout, before its Cleanup would leave
// them running. watchdog.sh, started once
// per process in a session of its own, reads a pipe whose writing end only
// this process holds; when the pipe ends (the kernel closes that end
// whatever killed the process, SIGKILL included) it runs the teardowns
// still registered (services.sh down DIR, ...), newest first. A teardown is
// registered before its service starts, and forgotten once the process did
// it itself.
var watchdog struct {
	mu  sync.Mutex
	w   *os.File // the pipe's writing end: this process's life
	err error
}

// guard has the watchdog run testenv/script verb dir if this process ends
// before unguard.
func guard(script, verb, dir string) error { return tellWatchdog("+", script, verb, dir) }

// unguard forgets what guard registered.
func unguard(script, verb, dir string) { _ = tellWatchdog("-", script, verb, dir) }

func tellWatchdog(sign, script, verb, dir string) error {
	if strings.ContainsAny(dir, "\n") {
		return fmt.Errorf("testenv: a state folder with a newline: %q", dir)
	}
	watchdog.mu.Lock()
	defer watchdog.mu.Unlock()
	if watchdog.w == nil && watchdog.err == nil {
		watchdog.w, watchdog.err = startWatchdog()
	}
	if watchdog.err != nil {
		return watchdog.err
	}
	if _, err := fmt.Fprintf(watchdog.w, "%s %s %s %s\n", sign, script, verb, dir); err != nil {
		watchdog.err = fmt.Errorf("testenv: watchdog.sh is gone: %w", err)
		return watchdog.err
	}
	return nil
}

func startWatchdog() (*os.File, error) {
	root, err := Root()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe() // close-on-exec: no other child holds an end
	if err != nil {
		return nil, fmt.Errorf("testenv: watchdog pipe: %w", err)
	}
	defer r.Close()
	cmd := exec.Command("bash", filepath.Join(root, "testenv", "watchdog.sh"))
	cmd.Stdin = r
	// Its own session: a Ctrl-C to the test's process group does not end it
	// before the test process, and go test waits for no output of it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("testenv: start watchdog.sh: %w", err)
	}
	go func() { _ = cmd.Wait() }() // it ends after this process, unless killed
	return w, nil
}
