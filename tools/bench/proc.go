package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// clockTicks is USER_HZ (testenv.CPUSeconds reads the same ticks).
const clockTicks = 100

// cpuSeconds is user+sys CPU time of pid so far, from /proc/PID/stat.
func cpuSeconds(pid int) (float64, error) { return testenv.CPUSeconds(pid) }

// peakRSSMB is VmHWM of pid in MiB, from /proc/PID/status.
func peakRSSMB(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				return 0, err
			}
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmHWM for pid %d", pid)
}

// cpuWatch follows one process's CPU time, keeping the last reading so the
// total survives the process's exit (to within one sampling period).
type cpuWatch struct {
	pid        int
	start, cur float64
	hwm        float64
}

func newCPUWatch(pid int) *cpuWatch {
	w := &cpuWatch{pid: pid}
	w.start, _ = cpuSeconds(pid)
	w.cur = w.start
	w.sample()
	return w
}

func (w *cpuWatch) sample() {
	if w == nil || w.pid == 0 {
		return
	}
	if c, err := cpuSeconds(w.pid); err == nil {
		w.cur = c
	}
	if h, err := peakRSSMB(w.pid); err == nil && h > w.hwm {
		w.hwm = h
	}
}

func (w *cpuWatch) used() float64 {
	if w == nil {
		return 0
	}
	return w.cur - w.start
}

func (w *cpuWatch) peak() float64 {
	if w == nil {
		return 0
	}
	return w.hwm
}

// machine describes the host for the report.
func machine(pgVersion, kafkaVersion string) string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				mem = fmt.Sprintf("%.1f GiB", kb/(1<<20))
			}
		}
	}
	kernel := ""
	if out, err := exec.Command("uname", "-r").Output(); err == nil {
		kernel = strings.TrimSpace(string(out))
	}
	load := ""
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return fmt.Sprintf("%d CPUs (%s), %s RAM, Linux %s, %s, PostgreSQL %s (fsync=off), Kafka %s (KRaft, 1 broker, RF 1), load avg at start %s, %s",
		runtime.NumCPU(), model, mem, kernel, runtime.Version(), pgVersion, kafkaVersion, load, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
}

// machineBusy is the CPU seconds all cores spent not idle, from /proc/stat.
func machineBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy float64
	for i, v := range f[1:] {
		n, _ := strconv.ParseFloat(v, 64)
		if i == 3 || i == 4 || i >= 7 { // idle, iowait; guest time is already in user
			continue
		}
		busy += n
	}
	return busy / clockTicks
}
