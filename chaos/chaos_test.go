package chaos

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// TestChaosShort runs the CI subset of the fault-injection scenarios (the
// ones marked CI, with short sizes) against a real PostgreSQL 15 and Kafka
// 4.1. `make chaos` runs all of them at full size.
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED: -short: the chaos scenarios need a real PostgreSQL and Kafka")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	defer testenv.RemoveBinary()
	built := make(chan error, 1)
	go func() { _, err := testenv.Binary(); built <- err }() // while the services start
	env, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	h := &Harness{Env: env, Dir: t.TempDir(), Short: true, Logf: t.Logf}
	defer h.Close()
	only := os.Getenv("CHAOS_SCENARIOS") // e.g. "1,7"
	var results []Result
	for _, s := range Scenarios() {
		if only != "" {
			if !strings.Contains(","+only+",", ","+s.ID+",") {
				continue
			}
		} else if !s.CI {
			continue
		}
		r := h.RunScenario(ctx, s)
		results = append(results, r)
		if r.Failed() {
			log, _ := os.ReadFile(r.Log)
			if len(log) > 6000 {
				log = log[len(log)-6000:]
			}
			t.Errorf("scenario %s failed: %v\n%s\noutboxd log (tail):\n%s", r.Name, r.Err, strings.Join(r.Report.Examples, "\n"), log)
		}
	}
	var b strings.Builder
	WriteTable(&b, results)
	t.Log("\n" + b.String())
}
