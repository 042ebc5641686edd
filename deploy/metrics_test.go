package deploy_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// knownMetrics is every metric name outboxd's /metrics can carry: its own,
// read from the health package's source (so a rename there fails the
// dashboard and the rules here), the Go and process collectors' it
// registers, and Prometheus's own `up`.
func knownMetrics(t *testing.T) map[string]bool {
	t.Helper()
	known := map[string]bool{"up": true}
	files, err := filepath.Glob(filepath.Join(root, "health", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`"(outboxd_[a-z0-9_]+)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range name.FindAllStringSubmatch(string(src), -1) {
			known[m[1]] = true
		}
	}
	if len(known) < 20 {
		t.Fatalf("found only %d outboxd metric names in health/*.go: has the way they are declared changed?", len(known))
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		known[mf.GetName()] = true
	}
	return known
}

var metricRef = regexp.MustCompile(`\b(?:outboxd_|go_|process_|up\b)[a-z0-9_]*`)

// unknownMetrics returns the metric names expr uses that outboxd does not
// expose (a histogram's _bucket, _sum and _count count as the histogram).
func unknownMetrics(known map[string]bool, expr string) []string {
	var out []string
	for _, ref := range metricRef.FindAllString(expr, -1) {
		base := ref
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(ref, s); ok && known[b] {
				base = b
			}
		}
		if !known[base] {
			out = append(out, ref)
		}
	}
	return out
}
