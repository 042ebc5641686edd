package integration_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/outboxd/outboxd/testenv"
)

// These tests run the real outboxd binary against a real PostgreSQL (15, or
// the major version OUTBOXD_PG_VERSION names: 14 to 18) and a real Apache
// Kafka broker, both started by the test environment (testenv), and assert
// on what a consumer reads.

var (
	env        *testenv.Env
	seedSchema string // sql/001_outbox.sql
	// secondPass: OUTBOXD_PG_VERSION names a version (make test's
	// PostgreSQL 18 pass, make matrix): kafkaOnly tests are skipped.
	secondPass = os.Getenv("OUTBOXD_PG_VERSION") != ""
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		fmt.Println("integration: -short given, SKIPPING the tests against real PostgreSQL and Kafka")
		return m.Run()
	}
	defer testenv.RemoveBinary()
	built := make(chan error, 1)
	go func() { _, err := testenv.Binary(); built <- err }() // while the services start
	var err error
	env, err = testenv.Start(testenv.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start services:", err)
		<-built
		return 1
	}
	defer env.Cleanup()
	defer stopSecured()
	if flag.Lookup("test.run").Value.String() == "" {
		// The whole suite: the secured services start while the first
		// tests run.
		go startSecured()
	}
	if err := <-built; err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	major, err := env.PGMajor()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kafkaVersion, err := env.KafkaVersion()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("integration: PostgreSQL %d (OUTBOXD_PG_VERSION=%q), Kafka %s (OUTBOXD_KAFKA_VERSION=%q) at %s\n",
		major, os.Getenv("OUTBOXD_PG_VERSION"), kafkaVersion, os.Getenv("OUTBOXD_KAFKA_VERSION"), env.KafkaBrokers)
	if seedSchema, err = testenv.SeedSchema(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func needEnv(t *testing.T) {
	t.Helper()
	if env == nil {
		t.Skip("SKIPPED: -short: no real PostgreSQL/Kafka started")
	}
}

// startEnv starts services of a test's own (what names them in the error)
// and stops them when the test ends.
func startEnv(t *testing.T, what string, o testenv.Options) *testenv.Env {
	t.Helper()
	e, err := testenv.Start(o)
	if err != nil {
		t.Fatalf("start %s: %v", what, err)
	}
	t.Cleanup(e.Cleanup)
	return e
}

// kafkaOnly marks a test whose subject is Kafka or the process around
// outboxd (a broker's answers, secured listeners, the container, the
// health server, the consumer package), in which the PostgreSQL version
// plays no part: it runs in the suite's first pass (PostgreSQL 15) and is
// skipped, saying so, in a pass on another version (OUTBOXD_PG_VERSION:
// make test's PostgreSQL 18 pass, make matrix), which keeps make test
// within its time.
func kafkaOnly(t *testing.T) {
	t.Helper()
	if secondPass {
		t.Skipf("SKIPPED in the OUTBOXD_PG_VERSION=%s pass: a Kafka-side test (the PostgreSQL version plays no part in it); it runs in the default PostgreSQL pass of make test", os.Getenv("OUTBOXD_PG_VERSION"))
	}
}
