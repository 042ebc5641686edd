package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxd/outboxd/config"
)

// TestStreamKey: the key file's key, made at the first start; a key of the
// process alone, with a loud WARN, when the file can be neither read nor
// made or none is configured; a file there but unusable stops the start;
// nothing without de-duplication.
func TestStreamKey(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	run := func(path string) ([]byte, string, error) {
		var out strings.Builder
		c := cfg
		c.Kafka.StreamKeyFile = path
		key, err := streamKey(c, hclog.New(&hclog.LoggerOptions{Output: &out}))
		return key, out.String(), err
	}
	made := filepath.Join(dir, "outboxd-stream.key")
	key, log, err := run(made)
	if err != nil || len(key) != 64 || !strings.Contains(log, "made the stream key") {
		t.Fatalf("first start: %d bytes, %v, log %q; want the key made and said", len(key), err, log)
	}
	if again, log, err := run(made); err != nil || !bytes.Equal(again, key) || log != "" {
		t.Errorf("second start: %v, same key %v, log %q; want the same key, quietly", err, bytes.Equal(again, key), log)
	}
	for _, path := range []string{"", filepath.Join(dir, "no such directory", "k")} {
		key, log, err := run(path)
		if err != nil || len(key) != 32 || !strings.Contains(log, "[WARN]") || !strings.Contains(log, "NO STREAM KEY") {
			t.Errorf("kafka.stream_key_file %q: %d bytes, %v, log %q; want a key of the process's own and a WARN", path, len(key), err, log)
		}
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("tiny"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := run(short); err == nil || !strings.Contains(err.Error(), "kafka.stream_key_file") {
		t.Errorf("a 4-byte key file: %v, want an error naming kafka.stream_key_file", err)
	}
	cfg.Kafka.Deduplicate = false
	if key, log, err := run(short); key != nil || err != nil || log != "" {
		t.Errorf("without kafka.deduplicate: %q, %v, %q; want nothing", key, err, log)
	}
}
