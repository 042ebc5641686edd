package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/preflight"
)

// check prints the preflight checklist, one line per check.
func check(ctx context.Context, path string, stdout io.Writer) error {
	cfg, err := config.Load(path)
	if err != nil {
		printResults(stdout, preflight.ConfigInvalid(err))
		return usageError{errors.New("the configuration is not valid")}
	}
	kc, err := kafkaConfig(ctx, cfg)
	if err != nil {
		printResults(stdout, preflight.ConfigInvalid(err))
		return usageError{errors.New("the configuration is not valid")}
	}
	results := preflight.Run(ctx, cfg, kc)
	printResults(stdout, results)
	failed := 0
	for _, r := range results {
		if r.Status == preflight.Fail {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d checks failed", failed, len(results))
	}
	return nil
}

func printResults(w io.Writer, results []preflight.Result) {
	for _, r := range results {
		fmt.Fprintln(w, r)
	}
}

// status prints the /status of a running instance, flattened to one
// "key: value" line per field, or the raw JSON.
func status(ctx context.Context, path, url string, asJSON bool, stdout io.Writer) error {
	url, err := instanceURL(path, url)
	if err != nil {
		return err
	}
	url += "/status"
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return usageError{err}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("no outboxd answers at %s (%v): is it running, and is health.listen (or --url) right?", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	if asJSON {
		_, err := stdout.Write(body)
		return err
	}
	return formatStatus(stdout, body)
}

// instanceURL is the base URL of a running instance: url as given (http://
// added when it has no scheme), else health.listen from the file at path.
func instanceURL(path, url string) (string, error) {
	if url == "" {
		cfg, err := config.Load(path)
		if err != nil {
			return "", usageError{err}
		}
		if cfg.Health.Listen == "" {
			return "", usageError{errors.New("health.listen is empty: the instance serves no health endpoints; pass --url")}
		}
		url = "http://" + dialable(cfg.Health.Listen)
	}
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	return strings.TrimRight(url, "/"), nil
}

// dialable turns a listen address into one to connect to: an empty or
// unspecified host (":9597", "0.0.0.0:9597", "[::]:9597") becomes loopback.
func dialable(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
