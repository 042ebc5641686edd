package testenv

import (
	"context"
	"encoding/json"
	"strconv"
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
// record says), in a virtual environment py-fetch.sh makes once. With
// registry (its URL, the format, and for protobuf the .proto file) the
// data is read by confluent-kafka's deserializer of that format.
func ReadCloudEvents(ctx context.Context, brokers, topic string, n int, registry ...string) ([]CloudEvent, error) {
	out, err := python(ctx, "read_cloudevents.py", append([]string{brokers, topic, strconv.Itoa(n)}, registry...)...)
	return jsonLines[CloudEvent](out, err, n, "read_cloudevents.py")
}
