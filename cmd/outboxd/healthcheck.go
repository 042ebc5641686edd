package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// healthCheck asks a running instance's /healthz (or /readyz when ready) and
// returns nil only on 200. It is the container HEALTHCHECK of images without
// curl (scratch, distroless), so every failure, a configuration problem
// included, is exit status 1 and one line that says why.
func healthCheck(ctx context.Context, path, url string, ready bool, timeout time.Duration, stdout io.Writer) error {
	base, err := instanceURL(path, url)
	if err != nil {
		var u usageError
		if errors.As(err, &u) {
			return u.error // exit 1, not 2: Docker reserves 2 in a health check
		}
		return err
	}
	endpoint := "/healthz"
	if ready {
		endpoint = "/readyz"
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+endpoint, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("no outboxd answers at %s (%v): is it running, and is health.listen (or --url) right?", base+endpoint, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	// /healthz says {"state", "reason"}, /readyz {"state", "ready", "reasons"}.
	var doc struct {
		State   string   `json:"state"`
		Reason  string   `json:"reason"`
		Reasons []string `json:"reasons"`
	}
	if json.Unmarshal(body, &doc) != nil {
		doc.Reason = strings.TrimSpace(string(body))
	}
	if resp.StatusCode == http.StatusOK {
		fmt.Fprintf(stdout, "%s %s: %s\n", strings.TrimPrefix(endpoint, "/"), resp.Status, doc.State)
		return nil
	}
	reasons := doc.Reasons
	if doc.Reason != "" {
		reasons = append(reasons, doc.Reason)
	}
	what := "not live"
	if ready {
		what = "not ready"
	}
	msg := fmt.Sprintf("%s (GET %s: %s", what, base+endpoint, resp.Status)
	if doc.State != "" {
		msg += ", state " + doc.State
	}
	msg += ")"
	if len(reasons) > 0 {
		msg += ": " + strings.Join(reasons, "; ")
	}
	return errors.New(msg)
}
