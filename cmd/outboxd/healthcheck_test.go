package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHealthCommand runs `outboxd health` against a stand-in for a running
// instance's endpoints (their bodies are those health.Server writes).
func TestHealthCommand(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/healthz":
			w.WriteHeader(http.StatusOK)
			w.Write([]byte(`{"state":"backoff"}`))
		case "/readyz":
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"state":"backoff","ready":false,"reasons":["state is backoff","no Kafka broker is reachable"]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	wedged := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"state":"streaming","reason":"no standby status sent for 2m0s (wal_sender_timeout 1m0s)"}`))
	}))
	defer wedged.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()

	// Configurations naming the instance by health.listen, as the image's
	// HEALTHCHECK does.
	writeConfig := func(listen string) string {
		path := filepath.Join(t.TempDir(), "outboxd.yaml")
		cfg := `origen: t
postgres: {dsn: "postgres://u@127.0.0.1:1/db", slot: s, publication: p}
kafka: {brokers: ["127.0.0.1:9"]}
routes: [{table: public.outbox, topic: t}]
health: {listen: "` + listen + `"}
`
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cfgPath := writeConfig("0.0.0.0:" + srv.URL[strings.LastIndex(srv.URL, ":")+1:])
	noListen := writeConfig("")

	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr []string
	}{
		{"live by URL", []string{"health", "--url", srv.URL}, 0, "healthz 200 OK: backoff", nil},
		{"live by config (0.0.0.0 dialled as loopback)", []string{"health", "-c", cfgPath}, 0, "healthz 200 OK: backoff", nil},
		{"not ready, with the reasons", []string{"health", "--url", strings.TrimPrefix(srv.URL, "http://"), "--ready"}, 1, "",
			[]string{"not ready", "503", "state backoff", "state is backoff; no Kafka broker is reachable"}},
		{"wedged", []string{"health", "--url", wedged.URL}, 1, "", []string{"not live", "no standby status sent"}},
		{"nothing listening", []string{"health", "--url", deadURL}, 1, "", []string{"no outboxd answers at " + deadURL + "/healthz"}},
		{"no health.listen is 1, not 2", []string{"health", "-c", noListen}, 1, "", []string{"health.listen is empty"}},
		{"a missing config is 1, not 2", []string{"health", "-c", filepath.Join(t.TempDir(), "absent.yaml")}, 1, "", []string{"absent.yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := realMain(tt.args, &stdout, &stderr)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout.String(), stderr.String())
			}
			if strings.TrimSpace(stdout.String()) != tt.stdout {
				t.Errorf("stdout %q, want %q", stdout.String(), tt.stdout)
			}
			for _, w := range tt.stderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr %q lacks %q", stderr.String(), w)
				}
			}
		})
	}
}

func TestVersionCommand(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		var stdout, stderr bytes.Buffer
		if code := realMain([]string{arg}, &stdout, &stderr); code != 0 {
			t.Fatalf("%s: exit %d: %s", arg, code, stderr.String())
		}
		if !strings.HasPrefix(stdout.String(), "outboxd dev (go1.") {
			t.Errorf("%s printed %q, want \"outboxd dev (go1....\"", arg, stdout.String())
		}
	}
}
