package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxd/outboxd/config"
)

// TestWarnInsecure (issue 35, item 5): basic authentication to a schema
// registry, and headers to a tracing endpoint, over http:// get the
// warning SASL PLAIN without TLS gets, at every start; over https://
// none.
func TestWarnInsecure(t *testing.T) {
	warnings := func(cfg config.Config) string {
		var out bytes.Buffer
		warnInsecure(cfg, hclog.New(&hclog.LoggerOptions{Output: &out}))
		return out.String()
	}
	cfg := config.Default()
	cfg.Postgres.DSN = "postgres://outboxd@127.0.0.1/km0?sslmode=verify-full"
	cfg.Routes = []config.Route{{Registry: config.SchemaRegistry{URL: "http://registry:8081", Username: "u", Password: "p"}}}
	cfg.Tracing.Endpoint, cfg.Tracing.Headers = "http://collector:4318", map[string]string{"authorization": "Bearer t"}
	got := warnings(cfg)
	for _, want := range []string{"routes[0].schema: basic authentication over http://", "tracing.headers go to an http:// endpoint"} {
		if !strings.Contains(got, want) {
			t.Errorf("no warning %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "Bearer t") || strings.Contains(got, `"p"`) {
		t.Errorf("a warning quotes a secret:\n%s", got)
	}
	cfg.Routes[0].Registry.URL, cfg.Tracing.Endpoint = "https://registry:8081", "https://collector:4318"
	if got := warnings(cfg); strings.Contains(got, "http://") {
		t.Errorf("https endpoints warned:\n%s", got)
	}
}
