package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Build compiles outboxd into dir and returns the binary's path.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "outboxd")
	// Static, as `make build` ships it: its memory is measured. (`-s -w`
	// only drop sections that are never mapped: the same RSS.)
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/outboxd/outboxd/cmd/outboxd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build outboxd: %w\n%s", err, out)
	}
	return bin, nil
}

// DaemonConfig is one scenario's outboxd: product defaults except the
// addresses and what Extra adds.
type DaemonConfig struct {
	Bin, Dir      string
	DSN           string // through the PostgreSQL proxy
	Brokers       string // the Kafka proxy
	Slot, Topic   string
	PostgresExtra string // more lines under postgres:, indented by 2
	KafkaExtra    string // more lines under kafka:
	PipelineExtra string // more lines under pipeline:
	HealthExtra   string // more lines under health:
}

// Daemon runs outboxd processes one after the other for a scenario, with
// one log file, and tracks their peak memory.
type Daemon struct {
	cfg    DaemonConfig
	path   string
	log    *os.File
	health string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan error
	peakRSS int64 // kB, the highest VmHWM/VmRSS seen over all processes
	starts  int
	rss     []int64 // VmRSS samples of the current process, kB
}

// NewDaemon writes the configuration; Start runs a process.
func NewDaemon(cfg DaemonConfig) (*Daemon, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	health := ln.Addr().String()
	ln.Close()
	yaml := fmt.Sprintf(`origen: comandes
postgres:
  dsn: %q
  slot: %s
  publication: %s
%skafka:
  brokers: [%q]
%sroutes:
  - table: public.outbox
    topic: %s
pipeline:
  shutdown_timeout: 30s
%shealth:
  listen: %q
%slog:
  level: info
`, cfg.DSN, cfg.Slot, cfg.Slot, cfg.PostgresExtra, cfg.Brokers, cfg.KafkaExtra, cfg.Topic, cfg.PipelineExtra, health, cfg.HealthExtra)
	path := filepath.Join(cfg.Dir, cfg.Slot+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	lf, err := os.Create(filepath.Join(cfg.Dir, cfg.Slot+".log"))
	if err != nil {
		return nil, err
	}
	return &Daemon{cfg: cfg, path: path, log: lf, health: health}, nil
}

// LogPath is the file every process of this daemon logs to.
func (d *Daemon) LogPath() string { return d.log.Name() }

// Start runs a new outboxd process.
func (d *Daemon) Start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.starts++
	fmt.Fprintf(d.log, "==== chaos: start #%d at %s\n", d.starts, time.Now().Format("15:04:05.000"))
	cmd := exec.Command(d.cfg.Bin, "run", "-c", d.path)
	cmd.Stdout, cmd.Stderr = d.log, d.log
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	d.cmd, d.done = cmd, done
	d.rss = nil
	go d.watchMemory(cmd.Process.Pid, done)
	return nil
}

func (d *Daemon) watchMemory(pid int, done chan error) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		rss, hwm := procMem(pid)
		d.mu.Lock()
		if d.cmd == nil || d.cmd.Process.Pid != pid {
			d.mu.Unlock()
			return
		}
		if rss > 0 {
			d.rss = append(d.rss, rss)
		}
		d.peakRSS = max(d.peakRSS, rss, hwm)
		d.mu.Unlock()
		select {
		case <-t.C:
		}
		if len(done) > 0 {
			return
		}
	}
}

// procMem reads VmRSS and VmHWM (kB) of pid.
func procMem(pid int) (rss, hwm int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = n
		case "VmHWM":
			hwm = n
		}
	}
	return rss, hwm
}

// PeakRSSKB is the highest resident set seen over all processes.
func (d *Daemon) PeakRSSKB() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		rss, hwm := procMem(d.cmd.Process.Pid)
		d.peakRSS = max(d.peakRSS, rss, hwm)
	}
	return d.peakRSS
}

// RSSSamples returns the current process's VmRSS samples (kB).
func (d *Daemon) RSSSamples() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int64(nil), d.rss...)
}

func (d *Daemon) current() (*exec.Cmd, chan error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cmd, d.done
}

// Kill is kill -9.
func (d *Daemon) Kill() {
	cmd, done := d.current()
	if cmd == nil {
		return
	}
	d.PeakRSSKB()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
	d.mu.Lock()
	fmt.Fprintf(d.log, "==== chaos: kill -9 at %s\n", time.Now().Format("15:04:05.000"))
	d.cmd = nil
	d.mu.Unlock()
}

// Term sends SIGTERM and returns the exit error (nil: status 0).
func (d *Daemon) Term(timeout time.Duration) error {
	cmd, done := d.current()
	if cmd == nil {
		return nil
	}
	d.PeakRSSKB()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case err = <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		err = fmt.Errorf("did not exit within %s of SIGTERM", timeout)
	}
	d.mu.Lock()
	d.cmd = nil
	d.mu.Unlock()
	return err
}

// Exited waits up to timeout for the process to end by itself.
func (d *Daemon) Exited(timeout time.Duration) (exited bool, err error) {
	cmd, done := d.current()
	if cmd == nil {
		return true, nil
	}
	select {
	case err = <-done:
		done <- err
		return true, err
	case <-time.After(timeout):
		return false, nil
	}
}

// Running reports whether a process runs.
func (d *Daemon) Running() bool {
	cmd, done := d.current()
	return cmd != nil && len(done) == 0
}

// Close ends any process and closes the log.
func (d *Daemon) Close() {
	if d.Running() {
		_ = d.Term(40 * time.Second)
	}
	d.log.Close()
}

// Get fetches a path of the health server (e.g. a pprof page).
func (d *Daemon) Get(path string) (string, error) {
	resp, err := http.Get("http://" + d.health + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// Status is the part of /status the harness reads.
type Status struct {
	State     string `json:"state"`
	LastError string `json:"last_error"`
	Counters  struct {
		Events uint64 `json:"events"`
	} `json:"counters"`
	InFlight struct {
		Events int `json:"events"`
	} `json:"in_flight"`
}

// Status reads /status.
func (d *Daemon) Status(ctx context.Context) (Status, error) {
	var st Status
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.health+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&st)
	return st, err
}

// WaitState waits until /status says state (or the process exits).
func (d *Daemon) WaitState(ctx context.Context, state string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if st, err := d.Status(ctx); err == nil && st.State == state {
			return nil
		}
		if !d.Running() {
			return fmt.Errorf("outboxd exited while waiting for state %s", state)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("outboxd not %s after %s", state, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
