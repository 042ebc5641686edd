package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// debeziumRecord is one record of tools/debezium/DebeziumOutbox: what a
// Kafka Connect worker running Debezium's EventRouter would produce.
type debeziumRecord struct {
	Topic     string       `json:"topic"`
	Key       []byte       `json:"key"`   // base64 in the line
	Value     []byte       `json:"value"` // base64 in the line
	Headers   [][2]*string `json:"headers"`
	Timestamp int64        `json:"timestamp"`
}

// extendedHeaders prefixes the headers Debezium 3 adds to every record
// (extended.headers.enabled, on by default): the connector's logical name,
// task, name and run, which describe the connector, not the event; outboxd
// has none.
const extendedHeaders = "__debezium.context."

// headers is the record's headers as outboxd's are compared, name and
// value, without the extended headers.
func (r debeziumRecord) headers(t *testing.T) [][2][]byte {
	var out [][2][]byte
	for _, h := range r.Headers {
		if strings.HasPrefix(*h[0], extendedHeaders) {
			continue
		}
		var v []byte
		if h[1] != nil {
			var err error
			if v, err = base64.StdEncoding.DecodeString(*h[1]); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, [2][]byte{[]byte(*h[0]), v})
	}
	return out
}

// TestDebeziumCompare runs the real Debezium 3.6.1 (its PostgreSQL connector
// in the embedded engine, the outbox EventRouter, Kafka Connect's converters)
// and outboxd with preset: debezium on the same rows, and compares them
// record by record: topic, key, value and headers byte for byte, and the
// timestamp where the EventRouter takes it from the row. `make
// test-debezium` runs it (it fetches ~40 MB of Debezium from Maven Central
// into ~/.cache/outboxd once); `make test` skips it.
func TestDebeziumCompare(t *testing.T) {
	if os.Getenv("OUTBOXD_DEBEZIUM") == "" {
		t.Skip("SKIPPED: the comparison with a real Debezium runs with `make test-debezium` (OUTBOXD_DEBEZIUM=1): it downloads Debezium from Maven Central; envelope/debezium_test.go checks the documented shape in every run")
	}
	needEnv(t)
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", filepath.Join(root, "tools/debezium/fetch.sh")).Output()
	if err != nil {
		t.Fatalf("fetch Debezium: %v", err)
	}
	classpath := strings.TrimSpace(string(out))
	modes := []struct {
		name     string
		smt      map[string]string // EventRouter options
		key, val string            // the worker's converters
		topic    string            // outboxd's topic ("": the preset's)
		outboxd  testenv.Section
	}{
		{"StringConverter, defaults", nil, "string", "string", "", testenv.Section{}},
		{"JsonConverter, additional fields in a header and the envelope, event timestamp",
			map[string]string{"table.fields.additional.placement": "type:header:eventType,aggregatetype:envelope:kind", "table.field.event.timestamp": "timestamp"},
			"json", "json", "", testenv.Section{"key_converter": "json", "value_converter": "json", "timestamp": "timestamp",
				"fields": "[{column: type, header: eventType}, {column: aggregatetype, envelope: kind}]"}},
		{"JsonConverter, route.by.field type with a replacement", map[string]string{"route.by.field": "type", "route.topic.replacement": "events.${routedByValue}"},
			"json", "json", `"events.{type}"`, testenv.Section{"key_converter": "json", "value_converter": "json"}},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			compareWithDebezium(t, classpath, m.smt, m.key, m.val, m.topic, m.outboxd)
		})
	}
}

func compareWithDebezium(t *testing.T, classpath string, smt map[string]string, keyConv, valConv, topic string, more testenv.Section) {
	schema := `CREATE SCHEMA inventory;
CREATE TABLE inventory.outboxevent (id UUID PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL,
	type VARCHAR(255) NOT NULL, payload JSONB, timestamp TIMESTAMP NOT NULL DEFAULT now());`
	f := newFixture(t, schema, nil)
	ctx := context.Background()
	order, customer := "order_"+f.name, "customer_"+f.name
	u, err := url.Parse(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	props := map[string]string{
		"name": "outbox", "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
		"offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore", "offset.flush.interval.ms": "60000",
		"database.hostname": u.Hostname(), "database.port": u.Port(), "database.user": u.User.Username(), "database.password": pw,
		"database.dbname": strings.TrimPrefix(u.Path, "/"), "topic.prefix": "dbz", "plugin.name": "pgoutput",
		"slot.name": "dbz_" + f.name, "publication.name": "dbz_" + f.name, "publication.autocreate.mode": "filtered",
		"table.include.list": "inventory.outboxevent", "snapshot.mode": "no_data",
		"transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
		"outboxd.key.converter": keyConv, "outboxd.value.converter": valConv,
	}
	for k, v := range smt {
		props["transforms.outbox."+k] = v
	}
	var keys []string
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var cfg strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&cfg, "%s=%s\n", k, strings.ReplaceAll(props[k], `\`, `\\`))
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "debezium.properties")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}

	rows := [][]any{
		{"4d47e190-0402-4048-bc2c-89dd54343cdc", order, "1", "OrderCreated",
			`{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}], "orderDate": "2019-01-31T12:13:01", "customerId": 123}`,
			"2019-05-03 13:31:34.344"},
		{"5e58f2a1-1513-4159-9d3d-90ee65454ded", customer, "123", "CustomerCreated", `{"nom": "Anna Puig i Solà", "nota": "diu \"hola\"\nadéu \\ 😀", "buit": {}, "llista": []}`,
			"2026-09-10 07:33:20.123999"},
		{"6f69a3b2-2624-426a-ae4e-a1ff76565efe", order, "1", "OrderDeleted", nil, "2026-09-10 07:33:21"},
		{"7a7ab4c3-3735-437b-bf4f-b2aa87676f0f", order, "2", "OrderCreated", `[1, 2.5, "tres", null, true]`, "2026-09-10 07:33:22.5"},
	}
	topics := map[string]bool{}
	for _, r := range rows {
		topics[expectedTopic(smt, r[1].(string), r[3].(string))] = true
	}
	for tp := range topics {
		if err := env.CreateTopic(tp, 1); err != nil {
			t.Fatal(err)
		}
	}

	logPath := filepath.Join(dir, "debezium.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	var stdout bytes.Buffer
	cmd := exec.Command("java", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", classpath, "DebeziumOutbox", cfgPath, fmt.Sprint(len(rows)))
	cmd.Stdout, cmd.Stderr = &stdout, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("Debezium's log (%s), last 4000 bytes:\n%s", logPath, tail4000(b))
		}
	})
	// Rows count for Debezium from when its slot streams.
	eventually(t, 120*time.Second, "Debezium's slot is active", func() bool {
		var active bool
		_ = f.mon.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", "dbz_"+f.name).Scan(&active)
		return active
	})

	route := testenv.Route{Table: "inventory.outboxevent", Topic: topic, More: testenv.Section{"preset": "debezium"}}
	for k, v := range more {
		route.More[k] = v
	}
	d := f.start(f.config(route))
	for _, r := range rows {
		if _, err := f.db.Exec(ctx, "INSERT INTO inventory.outboxevent (id, aggregatetype, aggregateid, type, payload, timestamp) VALUES ($1, $2, $3, $4, $5, $6)", r...); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("Debezium: %v", err)
		}
	case <-time.After(120 * time.Second):
		t.Fatal("Debezium emitted fewer records than rows in 120 s")
	}
	var dbz []debeziumRecord
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r debeziumRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%v: %s", err, sc.Bytes())
		}
		dbz = append(dbz, r)
	}
	if len(dbz) != len(rows) {
		t.Fatalf("Debezium emitted %d records, want %d", len(dbz), len(rows))
	}
	got := map[string][]int{} // topic -> indexes into dbz, in commit order
	for i, r := range dbz {
		got[r.Topic] = append(got[r.Topic], i)
	}
	compared := 0
	for topic, idx := range got {
		if !topics[topic] {
			t.Errorf("Debezium wrote to %s, not an expected topic", topic)
			continue
		}
		msgs := consumeExactly(t, topic, len(idx))
		for k, i := range idx {
			want, m := dbz[i], msgs[k]
			if !bytes.Equal(m.Key, want.Key) {
				t.Errorf("%s record %d: key %q, Debezium's %q", topic, k, m.Key, want.Key)
			}
			if !bytes.Equal(m.Value, want.Value) || (m.Value == nil) != (want.Value == nil) {
				t.Errorf("%s record %d: value\n outboxd  %s\n debezium %s", topic, k, m.Value, want.Value)
			}
			var heads [][2][]byte
			for _, h := range m.Headers {
				heads = append(heads, [2][]byte{[]byte(h.Key), h.Value})
			}
			if fmt.Sprintf("%q", heads) != fmt.Sprintf("%q", want.headers(t)) {
				t.Errorf("%s record %d: headers %q, Debezium's %q", topic, k, heads, want.headers(t))
			}
			if smt["table.field.event.timestamp"] != "" && m.Time.UnixMilli() != want.Timestamp {
				t.Errorf("%s record %d: timestamp %d, Debezium's %d", topic, k, m.Time.UnixMilli(), want.Timestamp)
			}
			compared++
		}
	}
	var extended []string
	for _, h := range dbz[0].Headers {
		if strings.HasPrefix(*h[0], extendedHeaders) {
			extended = append(extended, *h[0])
		}
	}
	t.Logf("%d records compared with Debezium's, byte for byte; Debezium's extended headers, not compared: %s", compared, strings.Join(extended, ", "))
	d.term()
}

// expectedTopic is the EventRouter's topic for a row under smt.
func expectedTopic(smt map[string]string, aggregatetype, typ string) string {
	if smt["route.by.field"] == "type" {
		return "events." + typ
	}
	return "outbox.event." + aggregatetype
}

func tail4000(b []byte) []byte {
	if len(b) > 4000 {
		return b[len(b)-4000:]
	}
	return b
}
