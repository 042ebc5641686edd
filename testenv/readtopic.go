package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Read is one record a consumer read.
type Read struct {
	Partition int
	Offset    int64
	ID        string // its id_esdeveniment header, "-" without one
}

// ReadTopic reads topic from its beginning to its end with the Apache
// Kafka Java consumer at isolation (read_committed or read_uncommitted;
// java/ReadTopic.java, run from source with the broker's jars): the
// records it read, in each partition's order. kafka-go's reader, which the
// Verifier uses, returns a transaction's markers as records.
func ReadTopic(ctx context.Context, brokers, topic, isolation string) ([]Read, error) {
	out, err := runJava(ctx, "ReadTopic.java", brokers, topic, isolation)
	if err != nil {
		return nil, fmt.Errorf("%s consumer: %w", isolation, err)
	}
	var reads []Read
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r Read
		if _, err := fmt.Sscan(line, &r.Partition, &r.Offset, &r.ID); err != nil {
			continue
		}
		reads = append(reads, r)
	}
	return reads, nil
}

// runJava runs one of the Java programs of java/ from source with the
// broker's jars on the class path and returns what it printed; its error
// carries what it said on standard error.
func runJava(ctx context.Context, program string, args ...string) (string, error) {
	_, here, _, _ := runtime.Caller(0)
	lib, err := runScript(ctx, nil, "kafka-fetch.sh")
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "java", append([]string{"-cp", strings.TrimSpace(lib) + "/*",
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", filepath.Join(filepath.Dir(here), "java", program)}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w\n%s", program, err, stderr.String())
	}
	return string(out), nil
}
