package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// deathChild names, in a child's environment, the state folder the child
// of TestServicesDieWithTheTestProcess starts its services in.
const deathChild = "OUTBOXD_TESTENV_DEATH_CHILD"

// TestServicesDieWithTheTestProcess: a test process that is killed with
// SIGKILL, no Cleanup run, leaves no PostgreSQL, Kafka or outboxd running.
// The test runs itself as a child that starts them and kills itself.
func TestServicesDieWithTheTestProcess(t *testing.T) {
	if dir := os.Getenv(deathChild); dir != "" {
		startAndDie(t, dir)
		return
	}
	if testing.Short() {
		t.Skip("SKIPPED: -short: TestServicesDieWithTheTestProcess starts a real PostgreSQL, Kafka and outboxd")
	}
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(RemoveBinary)
	dir, err := os.MkdirTemp("", "outboxd-death-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // what the watchdog did not stop, if the test fails
		if _, err := runScript(context.Background(), nil, "services.sh", "down", dir); err != nil {
			t.Log(err)
		}
		_ = os.RemoveAll(dir)
	})

	cmd := exec.Command(os.Args[0], "-test.run=^TestServicesDieWithTheTestProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), deathChild+"="+dir, "OUTBOXD_BIN="+bin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child did not die of SIGKILL (%v):\n%s\n%s", err, out, stderr.String())
	}
	// The child's last words: "service NAME PID PORT" (PORT 0: none).
	type service struct {
		name      string
		pid, port int
	}
	var services []service
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var s service
		if n, _ := fmt.Sscanf(sc.Text(), "service %s %d %d", &s.name, &s.pid, &s.port); n == 3 {
			services = append(services, s)
		}
	}
	if len(services) != 3 {
		t.Fatalf("the child named %d services, want PostgreSQL, Kafka and outboxd:\n%s\n%s", len(services), out, stderr.String())
	}
	t.Logf("the child died of SIGKILL; its services: %+v", services)

	start := time.Now()
	deadline := start.Add(60 * time.Second)
	for {
		var running []string
		for _, s := range services {
			if processAlive(s.pid, dir) {
				running = append(running, fmt.Sprintf("%s (pid %d)", s.name, s.pid))
			}
			if s.port != 0 {
				if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.port), time.Second); err == nil {
					c.Close()
					running = append(running, fmt.Sprintf("%s's port %d", s.name, s.port))
				}
			}
		}
		if len(running) == 0 {
			t.Logf("all gone %s after the child's death", time.Since(start).Round(100*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after the test process died of SIGKILL, still running: %s", time.Since(start).Round(time.Second), strings.Join(running, ", "))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startAndDie is the child: it starts PostgreSQL, Kafka and an outboxd
// in dir, names them on its standard output and kills itself with SIGKILL.
func startAndDie(t *testing.T, dir string) {
	e, err := Start(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	seed, err := SeedSchema()
	if err != nil {
		t.Fatal(err)
	}
	dsn, err := e.CreateDatabase("death", seed)
	if err != nil {
		t.Fatal(err)
	}
	ddir := filepath.Join(dir, "outboxd") // its command line names dir
	if err := os.Mkdir(ddir, 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := StartDaemon(ddir, Config{DSN: dsn, Brokers: e.KafkaBrokers, Slot: "death",
		Routes: []Route{{Table: "public.outbox", Topic: "death"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.WaitReady(context.Background(), 60*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, d.Log())
	}
	pidFile, err := os.ReadFile(filepath.Join(dir, "pg", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pgPID, _ := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	kafkaPID, err := e.KafkaPID()
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(e.PGDSN)
	if err != nil {
		t.Fatal(err)
	}
	_, kafkaPort, _ := net.SplitHostPort(e.KafkaBrokers)
	fmt.Printf("service postgres %d %s\n", pgPID, u.Port())
	fmt.Printf("service kafka %d %s\n", kafkaPID, kafkaPort)
	fmt.Printf("service outboxd %d 0\n", d.PID())
	_ = os.Stdout.Sync()
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	time.Sleep(time.Minute)
	t.Fatal("still alive after SIGKILL")
}

// processAlive: pid runs, is no zombie, and its command line names dir
// (not a recycled pid).
func processAlive(pid int, dir string) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && bytes.HasPrefix(stat[i+1:], []byte(" Z")) {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(cmdline, []byte(dir))
}
