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

// CloudEvent is one record as the official CloudEvents SDK (Python,
// python/read_cloudevents.py) read it: its attributes and its data, or the
// SDK's refusal.
type CloudEvent struct {
	Partition  int             `json:"partition"`
	Offset     int64           `json:"offset"`
	Attributes map[string]any  `json:"attributes"`
	Data       json.RawMessage `json:"data"`
	Error      string          `json:"error"`
}

// ReadCloudEvents reads n records of topic from its beginning with the
// CloudEvents SDK's Kafka protocol binding (binary or structured, as each
// record says), in a virtual environment py-fetch.sh makes once.
func ReadCloudEvents(ctx context.Context, brokers, topic string, n int) ([]CloudEvent, error) {
	_, here, _, _ := runtime.Caller(0)
	dir := filepath.Dir(here)
	py, err := exec.CommandContext(ctx, "bash", filepath.Join(dir, "py-fetch.sh")).Output()
	if err != nil {
		return nil, fmt.Errorf("py-fetch.sh: %w", err)
	}
	cmd := exec.CommandContext(ctx, strings.TrimSpace(string(py)), filepath.Join(dir, "python", "read_cloudevents.py"), brokers, topic, strconv.Itoa(n))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	var events []CloudEvent
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		var e CloudEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return nil, fmt.Errorf("read_cloudevents.py printed %q: %w", line, err)
		}
		events = append(events, e)
	}
	if runErr != nil && len(events) < n {
		return events, fmt.Errorf("read_cloudevents.py: %w\n%s", runErr, stderr.String())
	}
	return events, nil
}
