package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// Registry is an Apicurio Registry that registry.sh started on loopback.
type Registry struct {
	URL string // its Confluent-compatible API (…/apis/ccompat/v7)
	dir string
}

// StartRegistry starts a schema registry with its state in dir.
func StartRegistry(dir string) (*Registry, error) {
	if err := guard("registry.sh", "stop", dir); err != nil {
		return nil, err
	}
	out, err := runScript(context.Background(), nil, "registry.sh", "start", dir)
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "OUTBOXD_REGISTRY_URL="); ok {
			return &Registry{URL: v, dir: dir}, nil
		}
	}
	return nil, fmt.Errorf("registry.sh start printed no OUTBOXD_REGISTRY_URL:\n%s", out)
}

// Stop stops it; its schemas go with it (in-memory storage).
func (r *Registry) Stop() error {
	_, err := runScript(context.Background(), nil, "registry.sh", "stop", r.dir)
	if err == nil {
		unguard("registry.sh", "stop", r.dir)
	}
	return err
}

// Registered is one record as confluent-kafka's deserializer read it
// (python/read_registry.py): the schema id after the magic byte and the
// value, or the deserializer's refusal.
type Registered struct {
	Partition int             `json:"partition"`
	Offset    int64           `json:"offset"`
	SchemaID  int             `json:"schema_id"`
	Key       json.RawMessage `json:"key"`
	Value     json.RawMessage `json:"value"`
	Error     string          `json:"error"`
}

// ReadRegistered reads n records of topic from its beginning with
// confluent-kafka's deserializer of format (json_schema, avro, protobuf:
// then into the first message of protoFile) against the registry at url.
func ReadRegistered(ctx context.Context, brokers, url, topic, format string, n int, protoFile ...string) ([]Registered, error) {
	out, err := python(ctx, "read_registry.py", append([]string{brokers, url, topic, strconv.Itoa(n), format}, protoFile...)...)
	return jsonLines[Registered](out, err, n, "read_registry.py")
}

// jsonLines decodes the JSON lines a python/ script printed; its error
// counts only when it printed fewer than n.
func jsonLines[T any](out string, runErr error, n int, name string) ([]T, error) {
	var recs []T
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var r T
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return nil, fmt.Errorf("%s printed %q: %w", name, line, err)
		}
		recs = append(recs, r)
	}
	if runErr != nil && len(recs) < n {
		return recs, runErr
	}
	return recs, nil
}

// python runs one of python/'s scripts in the virtual environment that
// py-fetch.sh makes once; its standard output, and its error with its
// standard error.
func python(ctx context.Context, name string, args ...string) (string, error) {
	py, err := runScript(ctx, nil, "py-fetch.sh")
	if err != nil {
		return "", err
	}
	_, here, _, _ := runtime.Caller(0)
	cmd := exec.CommandContext(ctx, strings.TrimSpace(py), append([]string{filepath.Join(filepath.Dir(here), "python", name)}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w\n%s", name, err, stderr.String())
	}
	return string(out), nil
}
