package deploy_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/config"
)

const unitFile = "systemd/outboxd.service"

// unitSettings reads KEY=VALUE lines of a unit file; a key set twice keeps
// every value.
func unitSettings(t *testing.T, data []byte) map[string][]string {
	t.Helper()
	m := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Errorf("%s: not KEY=VALUE: %q", unitFile, line)
		}
		m[k] = append(m[k], v)
	}
	return m
}

// TestSystemdUnit runs systemd-analyze verify (unknown keys, bad values, a
// command that is not executable) and systemd-analyze security on the unit,
// then checks what they cannot: the stop timeout against outboxd's
// shutdown_timeout and the hardening this project promises.
func TestSystemdUnit(t *testing.T) {
	data, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	set := unitSettings(t, data)
	one := func(k string) string {
		if len(set[k]) != 1 {
			t.Errorf("%s=%q: want it set once", k, set[k])
			return ""
		}
		return set[k][0]
	}
	const installed = "/usr/local/bin/outboxd"
	if exec := one("ExecStart"); exec != installed+" run -c /etc/outboxd/outboxd.yaml" {
		t.Errorf("ExecStart=%s", exec)
	}
	stop, err := time.ParseDuration(one("TimeoutStopSec"))
	if shutdown := config.Default().Pipeline.ShutdownTimeout; err != nil || stop <= shutdown {
		t.Errorf("TimeoutStopSec=%s (%v) must exceed pipeline.shutdown_timeout %s: systemd sends SIGKILL when it ends", set["TimeoutStopSec"], err, shutdown)
	}
	// Secrets come through LoadCredential=: under DynamicUser= a file
	// outboxd read itself would have to be world-readable.
	if cred := one("LoadCredential"); !strings.HasPrefix(cred, "pg-password:/") {
		t.Errorf("LoadCredential=%s: want pg-password:PATH (password_file: ${CREDENTIALS_DIRECTORY}/pg-password)", cred)
	}
	for k, want := range map[string]string{
		"DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
		"PrivateTmp": "yes", "CapabilityBoundingSet": "", "KillSignal": "SIGTERM", "RestartPreventExitStatus": "2 3",
	} {
		if got := one(k); got != want {
			t.Errorf("%s=%s, want %s", k, got, want)
		}
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("SKIPPED: systemd-analyze is not installed, so the unit is NOT verified by systemd (apt-get install systemd)")
	}
	// verify wants ExecStart to name an executable file: point it at one
	// (this test's own binary stands in for the installed outboxd).
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(t.TempDir(), "outboxd.service")
	if err := os.WriteFile(unit, bytes.ReplaceAll(data, []byte(installed), []byte(self)), 0o644); err != nil {
		t.Fatal(err)
	}
	// It exits 0 after "Unknown key ..., ignoring": any output is a failure.
	out, err := exec.Command(analyze, "verify", unit).CombinedOutput()
	if err != nil || len(out) != 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// Exposure on systemd's 0-10 scale (1.2 when written); --threshold is in
	// tenths: more than 1.5 fails.
	out, err = exec.Command(analyze, "security", "--offline=yes", "--threshold=15", unit).CombinedOutput()
	overall := ""
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "Overall exposure level") {
			overall = strings.TrimSpace(line)
		}
	}
	if err != nil || overall == "" {
		t.Errorf("systemd-analyze security --threshold=15: %v\n%s", err, out)
	}
	t.Log(overall)
}
