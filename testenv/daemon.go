package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Daemon is one outboxd configuration, run as a process and run again after
// that one ended: every process of a Daemon reads the same file, serves
// health on the same address and logs to the same file.
type Daemon struct {
	bin, path, addr string
	env             []string
	log             *os.File

	mu     sync.Mutex
	p      *process // the latest process, nil before Start
	starts int
	peak   Memory // the highest of each seen over all processes
}

// Memory is a process's resident memory in kB: RSS, and its two parts,
// anonymous (the Go heap, stacks, the runtime's own) and file-backed (the
// binary's pages mapped from the page cache, which other processes of the
// same binary share and the kernel may drop).
type Memory struct{ RSS, Anon, File int64 }

// process is one run of the binary.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once Wait returned
	err    error         // Wait's answer, once exited is closed
	rss    []int64       // VmRSS samples, kB, every 100 ms
}

// NewDaemon writes cfg into dir (picking a free health.listen unless cfg
// sets one) and opens its log there. Start runs a process.
func NewDaemon(dir string, cfg Config) (*Daemon, error) {
	bin := cfg.Bin
	if bin == "" {
		var err error
		if bin, err = Binary(); err != nil {
			return nil, err
		}
	}
	health := Section{}
	for k, v := range cfg.Health {
		health[k] = v
	}
	if health["listen"] == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		health["listen"] = fmt.Sprintf("%q", ln.Addr().String())
		ln.Close()
	}
	cfg.Health = health
	addr, err := strconv.Unquote(health["listen"])
	if err != nil {
		addr = health["listen"]
	}
	f, err := os.CreateTemp(dir, cfg.Slot+"-*.yaml")
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString(cfg.YAML())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	log, err := os.Create(strings.TrimSuffix(f.Name(), ".yaml") + ".log")
	if err != nil {
		return nil, err
	}
	env := append(os.Environ(), dsnVar+"="+cfg.DSN)
	return &Daemon{bin: bin, path: f.Name(), addr: addr, env: append(env, cfg.Env...), log: log}, nil
}

// StartDaemon is NewDaemon and Start.
func StartDaemon(dir string, cfg Config) (*Daemon, error) {
	d, err := NewDaemon(dir, cfg)
	if err != nil {
		return nil, err
	}
	if err := d.Start(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Addr is the health server's "127.0.0.1:port".
func (d *Daemon) Addr() string { return d.addr }

// ConfigPath is the configuration file.
func (d *Daemon) ConfigPath() string { return d.path }

// LogPath is the file every process of this Daemon logs to.
func (d *Daemon) LogPath() string { return d.log.Name() }

// Log is everything the processes logged so far.
func (d *Daemon) Log() string {
	b, _ := os.ReadFile(d.log.Name())
	return string(b)
}

// Start runs a new process; the previous one must have ended.
func (d *Daemon) Start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.p != nil && !d.p.done() {
		return errors.New("testenv: outboxd is still running")
	}
	d.starts++
	fmt.Fprintf(d.log, "==== testenv: start #%d at %s\n", d.starts, time.Now().Format("15:04:05.000"))
	cmd := exec.Command(d.bin, "run", "-c", d.path)
	cmd.Env = d.env
	// It dies with this process, however that dies (the services do too:
	// watchdog.go). The signal comes when the thread that started it ends,
	// which in Go is the process: only a goroutine that locked its thread
	// and returned ends one, and no test starts outboxd from such.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stdout, cmd.Stderr = d.log, d.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testenv: start outboxd: %w", err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	d.p = p
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	go d.watchMemory(p)
	return nil
}

func (p *process) done() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// watchMemory samples the process's memory until it exits.
func (d *Daemon) watchMemory(p *process) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		d.sampleMemory(p)
		select {
		case <-p.exited:
			return
		case <-t.C:
		}
	}
}

func (d *Daemon) sampleMemory(p *process) {
	m, hwm := procMem(p.cmd.Process.Pid)
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.done() {
		return // the pid may belong to another process by now
	}
	if m.RSS > 0 {
		p.rss = append(p.rss, m.RSS)
	}
	d.peak = Memory{RSS: max(d.peak.RSS, m.RSS, hwm), Anon: max(d.peak.Anon, m.Anon), File: max(d.peak.File, m.File)}
}

// procMem reads pid's resident memory and VmHWM (kB).
func procMem(pid int) (m Memory, hwm int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, 0
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
			m.RSS = n
		case "VmHWM":
			hwm = n
		case "RssAnon":
			m.Anon = n
		case "RssFile":
			m.File = n
		}
	}
	return m, hwm
}

// current is the latest process, nil before Start.
func (d *Daemon) current() *process {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.p
}

// PID is the running process's id, 0 when none runs.
func (d *Daemon) PID() int {
	if p := d.current(); p != nil && !p.done() {
		return p.cmd.Process.Pid
	}
	return 0
}

// Running reports whether a process runs.
func (d *Daemon) Running() bool { return d.PID() != 0 }

// PeakRSSKB is the highest resident set seen over all processes, in kB.
func (d *Daemon) PeakRSSKB() int64 { return d.PeakMemory().RSS }

// PeakMemory is the highest resident set (VmRSS or VmHWM) and the highest
// anonymous and file-backed parts seen over all processes, each sampled
// every 100 ms (the parts' peaks may fall between two samples, and need
// not be at the same moment as the RSS's).
func (d *Daemon) PeakMemory() Memory {
	if p := d.current(); p != nil {
		d.sampleMemory(p)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.peak
}

// RSSSamples are the latest process's VmRSS samples (kB, every 100 ms).
func (d *Daemon) RSSSamples() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.p == nil {
		return nil
	}
	return append([]int64(nil), d.p.rss...)
}

// Signal sends sig to the running process.
func (d *Daemon) Signal(sig os.Signal) error {
	p := d.current()
	if p == nil || p.done() {
		return errors.New("testenv: outboxd is not running")
	}
	return p.cmd.Process.Signal(sig)
}

// Metric reads one sample of outboxd's /metrics, name{topic="topic"}; 0
// when absent or unreadable.
func (d *Daemon) Metric(ctx context.Context, name, topic string) float64 {
	return d.MetricBy(ctx, name, "topic", topic)
}

// MetricBy reads one sample of outboxd's /metrics, name{label="value"}; 0
// when absent or unreadable.
func (d *Daemon) MetricBy(ctx context.Context, name, label, value string) float64 {
	code, body, err := d.Get(ctx, "/metrics")
	if err != nil || code != http.StatusOK {
		return 0
	}
	want := fmt.Sprintf("%s{%s=%q} ", name, label, value)
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), want); ok {
			n, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return n
		}
	}
	return 0
}

// DumpHung writes what diagnoses a hung outboxd into its log: its /status
// and /metrics, then its goroutines (SIGQUIT, which ends it).
func (d *Daemon) DumpHung(ctx context.Context) error {
	for _, path := range []string{"/status", "/metrics"} {
		_, body, err := d.Get(ctx, path)
		fmt.Fprintf(d.log, "==== testenv: GET %s at %s (error %v)\n%s\n", path, time.Now().Format("15:04:05.000"), err, body)
	}
	return d.Signal(syscall.SIGQUIT)
}

// Kill is kill -9; it returns once the process is gone.
func (d *Daemon) Kill() {
	p := d.current()
	if p == nil || p.done() {
		return
	}
	d.PeakRSSKB()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	fmt.Fprintf(d.log, "==== testenv: kill -9 at %s\n", time.Now().Format("15:04:05.000"))
}

// Term sends SIGTERM and waits for the exit: nil is exit status 0, an
// *exec.ExitError another one. After timeout it kills the process and says so.
func (d *Daemon) Term(timeout time.Duration) error {
	p := d.current()
	if p == nil || p.done() {
		return errors.New("testenv: outboxd is not running")
	}
	d.PeakRSSKB()
	_ = d.Signal(syscall.SIGTERM)
	if exited, err := d.Exited(timeout); exited {
		return err
	}
	d.Kill()
	return fmt.Errorf("testenv: outboxd did not exit within %s of SIGTERM; killed", timeout)
}

// Exited waits up to timeout for the process to end by itself; it reports
// whether it ended and, if so, its exit (nil: status 0).
func (d *Daemon) Exited(timeout time.Duration) (exited bool, err error) {
	p := d.current()
	if p == nil {
		return true, nil
	}
	if p.done() {
		return true, p.err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.exited:
		return true, p.err
	case <-t.C:
		return false, nil
	}
}

// Close stops a running process (SIGTERM, then kill -9 after 40 s) and
// closes the log.
func (d *Daemon) Close() {
	if d.Running() {
		_ = d.Term(40 * time.Second)
	}
	d.log.Close()
}

// Get fetches a path of the health server: its status code and body.
func (d *Daemon) Get(ctx context.Context, path string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.addr+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// Status is the part of /status the tests, chaos and bench read.
type Status struct {
	State     string    `json:"state"`
	Since     time.Time `json:"since"`
	Ready     bool      `json:"ready"`
	LastError string    `json:"last_error"`
	NotReady  []string  `json:"not_ready_reasons"`
	Slot      *struct {
		Name              string `json:"name"`
		Plugin            string `json:"plugin"`
		Active            bool   `json:"active"`
		ActivePID         *int32 `json:"active_pid"`
		ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
		RestartLSN        string `json:"restart_lsn"`
		WALStatus         string `json:"wal_status"`
		// Stats is pg_stat_replication_slots (nil: not read).
		Stats *struct {
			SpillTxns   int64      `json:"spill_txns"`
			SpillCount  int64      `json:"spill_count"`
			SpillBytes  int64      `json:"spill_bytes"`
			StreamTxns  int64      `json:"stream_txns"`
			StreamBytes int64      `json:"stream_bytes"`
			TotalTxns   int64      `json:"total_txns"`
			StatsReset  *time.Time `json:"stats_reset"`
		} `json:"stats"`
	} `json:"slot"`
	ServerWALLSN     string  `json:"server_wal_lsn"`
	RetainedWALBytes int64   `json:"retained_wal_bytes"`
	UnconfirmedBytes int64   `json:"unconfirmed_bytes"`
	LagSeconds       float64 `json:"lag_seconds"`
	InFlight         struct {
		Events int `json:"events"`
	} `json:"in_flight"`
	Counters struct {
		Events       uint64 `json:"events"`
		DeadLettered uint64 `json:"dead_lettered"`
	} `json:"counters"`
	Kafka struct {
		Brokers          int `json:"brokers"`
		BrokersReachable int `json:"brokers_reachable"`
	} `json:"kafka"`
}

// Status reads /status.
func (d *Daemon) Status(ctx context.Context) (Status, error) {
	var st Status
	code, b, err := d.Get(ctx, "/status")
	if err != nil {
		return st, err
	}
	if code != http.StatusOK {
		return st, fmt.Errorf("testenv: /status answered %d: %s", code, b)
	}
	err = json.Unmarshal(b, &st)
	return st, err
}

// WaitReady waits until /readyz answers 200; it fails at once when the
// process exits first, with the end of its log.
func (d *Daemon) WaitReady(ctx context.Context, timeout time.Duration) error {
	return d.wait(ctx, "ready", timeout, func() bool {
		code, _, err := d.Get(ctx, "/readyz")
		return err == nil && code == http.StatusOK
	})
}

// WaitState waits until /status says state ("streaming", "standby"...).
func (d *Daemon) WaitState(ctx context.Context, state string, timeout time.Duration) error {
	return d.wait(ctx, state, timeout, func() bool {
		st, err := d.Status(ctx)
		return err == nil && st.State == state
	})
}

func (d *Daemon) wait(ctx context.Context, what string, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if !d.Running() {
			_, err := d.Exited(0)
			return fmt.Errorf("testenv: outboxd exited (%v) before it was %s; log %s:\n%s", err, what, d.LogPath(), tail(d.Log(), 4000))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("testenv: outboxd not %s after %s; log %s:\n%s", what, timeout, d.LogPath(), tail(d.Log(), 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// tail is the end of s, at most n bytes.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
