// Command matrix runs the integration suite, and the chaos suite's
// PostgreSQL restart scenario, on each supported PostgreSQL version
// (testenv/pg-fetch.sh), then the Kafka-side integration tests on each
// supported Apache Kafka version (testenv/kafka-fetch.sh, kafka.sh), and
// writes what it found to docs/reports/MATRIX.md: `make matrix`. An axis
// not run (-versions "" or -kafka "") keeps its part of the file as it was.
//
//	go run ./tools/matrix [-versions 14,15,16,17,18] [-chaos 3] [-kafka 2.8.2,3.6.2,3.9.1,4.1.1,4.4.0] [-out docs/reports/MATRIX.md]
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"
)

// kafkaTests are the integration tests whose subject is what the broker
// does, run on each Kafka version: delivery through a broker's kill and
// outage, idempotence (a lost acknowledgement, a leader's kill, a principal
// without IdempotentWrite), restart de-duplication's tail reads (after
// outboxd's kill -9 and past retention), transactions with a read_committed
// consumer, topic creation, check, and the secured listeners (SASL_SSL,
// mTLS, ACLs).
const kafkaTests = "^(TestEndToEnd|TestSlotHoldsWhileBrokerDown|TestRestartKill9|TestKill9DrainNoDuplicates|" +
	"TestLostAcknowledgementIsNotDuplicated|TestLeaderKillNoDuplicates|TestIdempotenceNeedsAProducerID|" +
	"TestDedupeAfterKafkaRetention|TestTransactionsFenceAFrozenInstance|TestTransactionsKill9|" +
	"TestMissingTopicAutoCreated|TestBrokerRestartBeforeNewTopic|TestMissingTopicWithoutAutoCreationStops|" +
	"TestControllerDownBeforeNewTopic|TestCheckPassesOnAGoodSetup|TestCheckFails|" +
	"TestSecuredKafkaDelivers|TestKafkaSecurityFailuresLoseNothing|TestSASLClosedIsNotAWrongPassword)$"

// kafkaHeading starts the Kafka axis's part of the output file.
const kafkaHeading = "# Kafka version matrix"

func main() {
	os.Exit(run())
}

// result is one version's run.
type result struct {
	version           string
	pass, fail, skip  []string
	skipWhy           map[string]string
	failOut           map[string][]string // the end of a failed test's output
	elapsed, chaosDur time.Duration
	failover          []string // the failover test's FAILOVER lines
	chaos             []string // the chaos scenarios' table rows and notes
	chaosOK           bool
	err               string
}

func run() int {
	versions := flag.String("versions", "14,15,16,17,18", "PostgreSQL major versions; empty: none")
	scenarios := flag.String("chaos", "3", "chaos scenarios to run on each version (CHAOS_SCENARIOS); empty: none")
	kafkaVersions := flag.String("kafka", "2.8.2,3.6.2,3.9.1,4.1.1,4.4.0", "Apache Kafka versions for the Kafka-side tests; empty: none")
	kafkaRun := flag.String("kafka-run", kafkaTests, "the Kafka-side tests (go test -run)")
	kafkaParallel := flag.Int("kafka-parallel", 1, "Kafka versions run at once (each a go test process with its own services)")
	out := flag.String("out", "docs/reports/MATRIX.md", "where the results go")
	flag.Parse()
	old, err := os.ReadFile(*out)
	if err != nil && !os.IsNotExist(err) {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var results []result
	failed := false
	start := time.Now()
	for _, v := range list(*versions) {
		fmt.Fprintf(os.Stderr, "%s matrix: PostgreSQL %s: integration suite\n", time.Now().Format("15:04:05"), v)
		r := integration(v, []string{"OUTBOXD_PG_VERSION=" + v}, "./integration/")
		if *scenarios != "" {
			fmt.Fprintf(os.Stderr, "%s matrix: PostgreSQL %s: chaos %s\n", time.Now().Format("15:04:05"), v, *scenarios)
			chaos(v, *scenarios, &r)
		}
		failed = failed || len(r.fail) > 0 || r.err != "" || (*scenarios != "" && !r.chaosOK)
		fmt.Fprintf(os.Stderr, "%s matrix: PostgreSQL %s: %d passed, %d failed, %d skipped %s\n", time.Now().Format("15:04:05"), v, len(r.pass), len(r.fail), len(r.skip), r.err)
		results = append(results, r)
	}
	pgTook, kstart := time.Since(start), time.Now()
	kv := list(*kafkaVersions)
	kafka := make([]result, len(kv))
	lanes := make(chan struct{}, max(1, *kafkaParallel))
	var wg sync.WaitGroup
	for i, v := range kv {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lanes <- struct{}{}
			defer func() { <-lanes }()
			fmt.Fprintf(os.Stderr, "%s matrix: Kafka %s: Kafka-side integration tests\n", time.Now().Format("15:04:05"), v)
			r := integration(v, []string{"OUTBOXD_KAFKA_VERSION=" + v}, "-run", *kafkaRun, "./integration/")
			fmt.Fprintf(os.Stderr, "%s matrix: Kafka %s: %d passed, %d failed, %d skipped %s\n", time.Now().Format("15:04:05"), v, len(r.pass), len(r.fail), len(r.skip), r.err)
			kafka[i] = r
		}()
	}
	wg.Wait()
	for _, r := range kafka {
		failed = failed || len(r.fail) > 0 || r.err != ""
	}
	var pg, kf strings.Builder
	if len(results) > 0 {
		write(&pg, results, *scenarios, pgTook)
	}
	if len(kafka) > 0 {
		writeKafka(&kf, kafka, *kafkaRun, *kafkaParallel, time.Since(kstart))
	}
	if err := os.WriteFile(*out, []byte(compose(string(old), pg.String(), kf.String())), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "matrix: wrote %s\n", *out)
	if failed {
		return 1
	}
	return 0
}

// compose is the output file: the PostgreSQL part, then the Kafka part
// (from kafkaHeading on), each the one just written or, for an axis not
// run ("" here), the one old has.
func compose(old, pg, kafka string) string {
	oldPG, oldKafka := old, ""
	if i := strings.Index(old, kafkaHeading); i >= 0 && (i == 0 || old[i-1] == '\n') {
		oldPG, oldKafka = old[:i], old[i:]
	}
	if pg == "" {
		pg = oldPG
	}
	if kafka == "" {
		kafka = oldKafka
	}
	var parts []string
	for _, p := range []string{pg, kafka} {
		if p = strings.TrimSpace(p); p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "\n\n") + "\n"
}

// list is a comma-separated flag's items.
func list(s string) []string {
	var items []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			items = append(items, v)
		}
	}
	return items
}

// event is one line of go test -json.
type event struct {
	Action, Test, Output string
	Elapsed              float64
}

func gotest(env []string, args ...string) (*exec.Cmd, io.ReadCloser, error) {
	cmd := exec.Command("go", append([]string{"test", "-count=1", "-json"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	return cmd, out, cmd.Start()
}

// integration runs go test args on ./integration/ with env (the version's
// variable).
func integration(version string, env []string, args ...string) result {
	r := result{version: version, skipWhy: map[string]string{}, failOut: map[string][]string{}}
	t0 := time.Now()
	cmd, out, err := gotest(env, append([]string{"-timeout", "30m"}, args...)...)
	if err != nil {
		r.err = err.Error()
		return r
	}
	output := map[string][]string{}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		if parent, _, sub := strings.Cut(e.Test, "/"); sub { // subtests: their parents count
			if e.Action == "output" {
				output[parent] = append(output[parent], e.Output)
			}
			continue
		}
		switch e.Action {
		case "output":
			output[e.Test] = append(output[e.Test], e.Output)
			if i := strings.Index(e.Output, "FAILOVER PG"); i >= 0 {
				r.failover = append(r.failover, strings.TrimSpace(e.Output[i:]))
			}
		case "pass":
			r.pass = append(r.pass, e.Test)
		case "fail":
			r.fail = append(r.fail, e.Test)
			r.failOut[e.Test] = failureLines(output[e.Test])
		case "skip":
			r.skip = append(r.skip, e.Test)
			for _, l := range output[e.Test] {
				if i := strings.Index(l, "SKIPPED"); i >= 0 {
					r.skipWhy[e.Test] = strings.TrimSpace(l[i:])
				}
			}
		}
	}
	if err := cmd.Wait(); err != nil && len(r.fail) == 0 {
		r.err = fmt.Sprintf("go test: %v", err)
	}
	r.elapsed = time.Since(t0)
	return r
}

func chaos(version, scenarios string, r *result) {
	t0 := time.Now()
	cmd, out, err := gotest([]string{"OUTBOXD_PG_VERSION=" + version, "CHAOS_SCENARIOS=" + scenarios}, "-v", "-timeout", "30m", "-run", "^TestChaosShort$", "./chaos/")
	if err != nil {
		r.chaos = append(r.chaos, "could not run: "+err.Error())
		return
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	table := false
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Action != "output" {
			continue
		}
		l := strings.TrimRight(e.Output, "\n")
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "| scenario |") {
			table = true
		}
		if table && (strings.HasPrefix(t, "|") || strings.HasPrefix(t, "- ")) {
			r.chaos = append(r.chaos, t)
		}
	}
	r.chaosOK = cmd.Wait() == nil
	r.chaosDur = time.Since(t0)
}

func write(w io.Writer, results []result, scenarios string, took time.Duration) {
	host, _ := os.Hostname()
	fmt.Fprintf(w, "# PostgreSQL version matrix (`make matrix`)\n\n")
	fmt.Fprintf(w, "Written by `go run ./tools/matrix` on %s (%s, %d CPUs, %s; %s in all). Every figure is from that run: timings on a shared machine are upper bounds. What differs between the versions, and why, is in [postgres-versions.md](../postgres-versions.md).\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), host, runtime.NumCPU(), runtime.Version(), took.Round(time.Second))
	fmt.Fprintf(w, "| PostgreSQL | integration tests | passed | failed | skipped | took | chaos %s |\n| --- | --- | ---: | ---: | ---: | ---: | --- |\n", scenarios)
	for _, r := range results {
		verdict := "ok"
		if len(r.fail) > 0 || r.err != "" {
			verdict = "FAIL"
		}
		chaos := "–"
		if scenarios != "" {
			chaos = fmt.Sprintf("ok (%s)", r.chaosDur.Round(time.Second))
			if !r.chaosOK {
				chaos = "FAIL"
			}
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %s | %s |\n", r.version, verdict, len(r.pass), len(r.fail), len(r.skip), r.elapsed.Round(time.Second), chaos)
	}
	for _, r := range results {
		fmt.Fprintf(w, "\n## PostgreSQL %s\n\n", r.version)
		writeOutcomes(w, r)
		for _, l := range r.failover {
			fmt.Fprintf(w, "- %s\n", l)
		}
		if len(r.chaos) > 0 {
			fmt.Fprintf(w, "\nChaos (`CHAOS_SCENARIOS=%s`, short sizes):\n\n", scenarios)
			for _, l := range r.chaos {
				if strings.HasPrefix(l, "|") {
					fmt.Fprintln(w, l)
				} else {
					fmt.Fprintf(w, "\n%s", l)
				}
			}
			fmt.Fprintln(w)
		}
	}
}

// writeOutcomes lists r's error, its failed tests with what they said, and
// its skipped tests with why.
func writeOutcomes(w io.Writer, r result) {
	if r.err != "" {
		fmt.Fprintf(w, "- error: %s\n", r.err)
	}
	for _, t := range r.fail {
		fmt.Fprintf(w, "- failed: %s\n\n```\n%s```\n\n", t, strings.Join(r.failOut[t], ""))
	}
	sort.Strings(r.skip)
	for _, s := range r.skip {
		fmt.Fprintf(w, "- skipped %s: %s\n", s, r.skipWhy[s])
	}
}

// writeKafka writes the Kafka axis: one row per version, then each
// version's failures and skips.
func writeKafka(w io.Writer, results []result, run string, parallel int, took time.Duration) {
	host, _ := os.Hostname()
	fmt.Fprintf(w, "%s (`make matrix`)\n\n", kafkaHeading)
	fmt.Fprintf(w, "Written by `go run ./tools/matrix` on %s (%s, %d CPUs, %s; %s in all, %d version(s) at a time): the Kafka-side integration tests, `OUTBOXD_KAFKA_VERSION=V go test -run '%s' ./integration/`, on PostgreSQL 15, against one broker (a cluster of brokers and a KRaft controller where a test needs one) of each Apache Kafka version. What differs between the versions is in [kafka-versions.md](../kafka-versions.md).\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), host, runtime.NumCPU(), runtime.Version(), took.Round(time.Second), max(1, parallel), run)
	fmt.Fprintf(w, "| Kafka | metadata | Kafka-side tests | passed | failed | skipped | took |\n| --- | --- | --- | ---: | ---: | ---: | ---: |\n")
	for _, r := range results {
		verdict := "ok"
		if len(r.fail) > 0 || r.err != "" {
			verdict = "FAIL"
		}
		meta := "KRaft"
		if strings.HasPrefix(r.version, "2.") {
			meta = "ZooKeeper"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %d | %d | %d | %s |\n", r.version, meta, verdict, len(r.pass), len(r.fail), len(r.skip), r.elapsed.Round(time.Second))
	}
	for _, r := range results {
		fmt.Fprintf(w, "\n## Kafka %s\n\n", r.version)
		writeOutcomes(w, r)
		if r.err == "" && len(r.fail) == 0 && len(r.skip) == 0 {
			fmt.Fprintf(w, "- every test passed\n")
		}
	}
}

// testMessage is a line a test wrote (t.Error, t.Log): "    x_test.go:12: ...".
var testMessage = regexp.MustCompile(`^\s+\w+_test\.go:\d+: `)

// failureLines is what a failed test's output says: its own messages (at
// most 30: outboxd's log, which a failed test prints, would bury them),
// then its last lines.
func failureLines(out []string) []string {
	var msgs []string
	for _, l := range out {
		if testMessage.MatchString(l) && len(msgs) < 30 {
			msgs = append(msgs, l)
		}
	}
	return append(msgs, out[max(0, len(out)-10):]...)
}
