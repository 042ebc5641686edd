package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

var binary struct {
	once sync.Once
	mu   sync.Mutex
	dir  string
	path string
	err  error
}

// Binary builds this tree's outboxd once per process and returns its path.
// It is built as `make build` ships it (static, CGO_ENABLED=0, -trimpath),
// since the chaos suite and the bench measure its memory, but keeps its
// symbol table for perf (`-s -w` only drop sections that are never mapped:
// the same RSS). RemoveBinary deletes it. OUTBOXD_BIN names another binary
// to use instead: the same tests against an older build (does a new test
// fail there?) or a release.
func Binary() (string, error) {
	binary.once.Do(func() {
		if bin := os.Getenv("OUTBOXD_BIN"); bin != "" {
			binary.path = bin
			return
		}
		root, err := Root()
		if err != nil {
			binary.err = err
			return
		}
		dir, err := os.MkdirTemp("", "outboxd-bin-")
		if err != nil {
			binary.err = err
			return
		}
		path := filepath.Join(dir, "outboxd")
		cmd := exec.Command("go", "build", "-trimpath", "-o", path, "./cmd/outboxd")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			_ = os.RemoveAll(dir)
			binary.err = fmt.Errorf("testenv: build outboxd: %w\n%s", err, out)
			return
		}
		binary.mu.Lock()
		binary.dir, binary.path = dir, path
		binary.mu.Unlock()
	})
	return binary.path, binary.err
}

// RemoveBinary deletes what Binary built; call it once the process is done
// with outboxd.
func RemoveBinary() {
	binary.mu.Lock()
	defer binary.mu.Unlock()
	if binary.dir != "" {
		_ = os.RemoveAll(binary.dir)
	}
}

// Command is outboxd with args (e.g. "check", "-c", path), with dsn in its
// environment for the configuration files Config writes.
func Command(dsn string, args ...string) (*exec.Cmd, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), dsnVar+"="+dsn)
	return cmd, nil
}
