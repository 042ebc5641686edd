package integration_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/outboxd/outboxd/testenv"
)

// These tests run the real outboxd binary against a real PostgreSQL (15, or
// the major version OUTBOXD_PG_VERSION names: 14 to 17) and a real Apache
// Kafka broker, both started by the test environment (testenv), and assert
// on what a consumer reads.

var (
	env        *testenv.Env
	seedSchema string // sql/001_outbox.sql
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
	fmt.Printf("integration: PostgreSQL %d (OUTBOXD_PG_VERSION=%q), Kafka at %s\n", major, os.Getenv("OUTBOXD_PG_VERSION"), env.KafkaBrokers)
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
