package integration_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// orderSchema is a JSON Schema of the rows' carrega ({"n": g}), registered
// under its title (subject_strategy: record).
const orderSchema = `{"$schema": "http://json-schema.org/draft-07/schema#", "title": "comanda.creada",
  "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}`

// TestSchemaRegistryJSONSchema: a route whose values go out in the Schema
// Registry wire format against a real registry (Apicurio Registry,
// Confluent-compatible API), read back with confluent-kafka's own JSON
// Schema deserializer (which fetches each record's schema by its id and
// validates the value).
//
//   - The registry is down when outboxd starts: it waits, saying so, and
//     nothing is streamed; rows committed meanwhile are delivered once the
//     registry answers (auto_register registers the schema then).
//   - A row whose carrega does not match the schema goes to the dead-letter
//     topic with the reason (where it fails, never what it holds).
//   - The registry stopped mid-stream is not on the path of a row: the
//     schema's id was found at start.
func TestSchemaRegistryJSONSchema(t *testing.T) {
	kafkaOnly(t)
	f := newFixture(t, seedSchema, map[string]int{"registry": 2, "registry.dlq": 1})
	ctx := context.Background()
	dir := t.TempDir()
	port := freePort(t)
	if i := strings.LastIndex(port, ":"); i >= 0 {
		port = port[i+1:]
	}
	t.Setenv("REGISTRY_PORT", port)
	url := "http://127.0.0.1:" + port + "/apis/ccompat/v7"
	schemaFile := filepath.Join(dir, "comanda-creada.json")
	if err := os.WriteFile(schemaFile, []byte(orderSchema), 0o600); err != nil {
		t.Fatal(err)
	}
	topic, dlq := f.topic("registry"), f.topic("registry.dlq")
	route := testenv.Route{Table: "public.outbox", Topic: topic, More: testenv.Section{
		"value":             "payload",
		"on_error":          "dead_letter",
		"dead_letter_topic": dlq,
		"schema":            `{registry: "` + url + `", subject_strategy: record, auto_register: true, schemas: {comanda.creada: "` + schemaFile + `"}}`,
	}}
	d := f.spawn(f.config(route))
	eventually(t, 30*time.Second, "outboxd waiting for the registry", func() bool {
		return strings.Contains(d.Log(), "schema registry unreachable: nothing is streamed until it answers")
	})
	early := insertRows(t, f.db, "outbox", 20, "now()", false)
	if n := f.topicSize(topic); n != 0 {
		t.Fatalf("%d records while the registry was down", n)
	}
	reg := startRegistry(t, filepath.Join(dir, "svc"))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = reg.Stop()
		}
	})
	d.waitReady(60 * time.Second)
	late := insertRows(t, f.db, "outbox", 20, "now()", false)
	// A row its schema refuses: n is a string.
	if _, err := f.db.Exec(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega) VALUES
		('00000000-0000-4000-8000-00000000bad1', 'comanda', 'P-1', 'comanda.creada', '{"n": "secret-value"}')`); err != nil {
		t.Fatal(err)
	}
	good := append(early, late...)

	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	eventually(t, 60*time.Second, "every good row in the topic", func() bool { return f.topicSize(topic) >= int64(len(good)) })
	recs, err := testenv.ReadRegistered(cctx, env.KafkaBrokers, url, topic, "json_schema", len(good))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[float64]int{}
	ids := map[int]bool{}
	for _, r := range recs {
		if r.Error != "" {
			t.Fatalf("the deserializer refused %d/%d: %s", r.Partition, r.Offset, r.Error)
		}
		var v struct{ N float64 }
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("value %s: %v", r.Value, err)
		}
		seen[v.N]++
		ids[r.SchemaID] = true
	}
	if len(recs) != len(good) || len(ids) != 1 {
		t.Fatalf("%d records (schema ids %v), want %d under one schema", len(recs), ids, len(good))
	}

	dl := consumeExactly(t, dlq, 1)
	reason := header(dl[0], "outboxd.error")
	if !strings.Contains(reason, `does not match the schema of subject "comanda.creada"`) || !strings.Contains(reason, "at /n") || strings.Contains(reason, "secret-value") {
		t.Fatalf("dead letter reason %q: want where it fails the schema, and not the value", reason)
	}

	// Off the path of a row: the registry stops, rows still go, each value
	// prefixed with the id found at start.
	if err := reg.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	more := insertRows(t, f.db, "outbox", 10, "now()", false)
	eventually(t, 60*time.Second, "rows delivered with the registry down", func() bool {
		return f.topicSize(topic) >= int64(len(good)+len(more))
	})
	var id int
	for k := range ids {
		id = k
	}
	all := f.consumeAll(topic, len(good)+len(more))
	for _, m := range all {
		if len(m.Value) < 5 || m.Value[0] != 0 || int(binary.BigEndian.Uint32(m.Value[1:5])) != id {
			t.Fatalf("a record not in the wire format of schema %d: % x", id, m.Value[:min(8, len(m.Value))])
		}
	}
	t.Logf("%d rows (20 while the registry was down at start, 10 after it stopped) in the wire format of schema %d, read back by confluent-kafka's deserializer; 1 dead-lettered: %s",
		len(all), id, reason)
	d.term()
}

// TestCheckSchemaRegistry: outboxd check's line for a route's registry:
// a schema not registered fails (outboxd would stop at start), with
// auto_register it is registrable, once registered its version and id and
// the subject's compatibility show; a registry that does not answer fails.
func TestCheckSchemaRegistry(t *testing.T) {
	kafkaOnly(t)
	f := newFixture(t, seedSchema, map[string]int{"registry": 1})
	dir := t.TempDir()
	reg := startRegistry(t, filepath.Join(dir, "svc"))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = reg.Stop()
		}
	})
	schemaFile := filepath.Join(dir, "comanda-creada.json")
	if err := os.WriteFile(schemaFile, []byte(orderSchema), 0o600); err != nil {
		t.Fatal(err)
	}
	check := func(autoRegister string) cmdResult {
		route := testenv.Route{Table: "public.outbox", Topic: f.topic("registry"), More: testenv.Section{"value": "payload",
			"schema": `{registry: "` + reg.URL + `", subject_strategy: record, auto_register: ` + autoRegister + `, schemas: {comanda.creada: "` + schemaFile + `"}}`}}
		return outboxd(t, f.dsn, "check", "-c", f.configFile(f.config(route)))
	}
	wantCheckFails(t, check("false"), "schema registry routes[0]", `not registered: comanda.creada (subject "comanda.creada")`, "auto_register: true")
	r := check("true")
	if l := r.line("PASS schema registry routes[0]:"); !strings.Contains(l, `subject "comanda.creada" registrable (auto_register), compatibility`) {
		t.Fatalf("with auto_register: %q\n%s", l, r)
	}
	// outboxd registers it at start.
	d := f.start(f.config(testenv.Route{Table: "public.outbox", Topic: f.topic("registry"), More: testenv.Section{"value": "payload",
		"schema": `{registry: "` + reg.URL + `", subject_strategy: record, auto_register: true, schemas: {comanda.creada: "` + schemaFile + `"}}`}}))
	d.term()
	if l := check("false").line("PASS schema registry routes[0]:"); !strings.Contains(l, `comanda.creada: subject "comanda.creada" version 1 (id `) {
		t.Fatalf("once registered: %q", l)
	}
	if err := reg.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	wantCheckFails(t, check("true"), "schema registry routes[0]", "connection refused", "outboxd waits at start until the registry answers")
}

// orderAvro is an Avro schema of the rows' carrega ({"n": g}).
const orderAvro = `{"type": "record", "name": "ComandaCreada", "namespace": "km0", "fields": [
  {"name": "n", "type": "int"}, {"name": "canal", "type": "string", "default": "web"}]}`

// TestSchemaRegistryAvro: format avro writes carrega in Avro's binary
// encoding by the schema (registered under its full name), read back with
// confluent-kafka's AvroDeserializer (which fetches the writer's schema by
// id): every row its event, the field missing from carrega at its default;
// a row the schema cannot take is dead-lettered with where it fails.
func TestSchemaRegistryAvro(t *testing.T) {
	kafkaOnly(t)
	f := newFixture(t, seedSchema, map[string]int{"avro": 2, "avro.dlq": 1})
	ctx := context.Background()
	dir := t.TempDir()
	reg := startRegistry(t, filepath.Join(dir, "svc"))
	t.Cleanup(func() { _ = reg.Stop() })
	schemaFile := filepath.Join(dir, "comanda-creada.avsc")
	if err := os.WriteFile(schemaFile, []byte(orderAvro), 0o600); err != nil {
		t.Fatal(err)
	}
	topic, dlq := f.topic("avro"), f.topic("avro.dlq")
	d := f.start(f.config(testenv.Route{Table: "public.outbox", Topic: topic, More: testenv.Section{
		"value": "payload", "on_error": "dead_letter", "dead_letter_topic": dlq,
		"schema": `{registry: "` + reg.URL + `", format: avro, subject_strategy: record, auto_register: true, schemas: {comanda.creada: "` + schemaFile + `"}}`,
	}}))
	rows := insertRows(t, f.db, "outbox", 30, "now()", false)
	if _, err := f.db.Exec(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega) VALUES
		('00000000-0000-4000-8000-00000000bad2', 'comanda', 'P-1', 'comanda.creada', '{"n": 1.5}')`); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "every good row in the topic", func() bool { return f.topicSize(topic) >= int64(len(rows)) })
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	recs, err := testenv.ReadRegistered(cctx, env.KafkaBrokers, reg.URL, topic, "avro", len(rows))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]int{}
	for _, r := range recs {
		var v struct {
			N     int
			Canal string
		}
		if r.Error != "" || json.Unmarshal(r.Value, &v) != nil || v.Canal != "web" {
			t.Fatalf("record %d/%d: %s %s", r.Partition, r.Offset, r.Value, r.Error)
		}
		seen[v.N]++
	}
	if len(recs) != len(rows) || len(seen) != len(rows) {
		t.Fatalf("%d records, %d distinct events, want %d", len(recs), len(seen), len(rows))
	}
	dl := consumeExactly(t, dlq, 1)
	if reason := header(dl[0], "outboxd.error"); !strings.Contains(reason, `cannot be written by the schema of subject "km0.ComandaCreada"`) || !strings.Contains(reason, "at /n: the schema wants int (an integer)") {
		t.Fatalf("dead letter reason %q", reason)
	}
	t.Logf("%d rows in Avro read back by confluent-kafka's AvroDeserializer (the default filled in); 1 dead-lettered", len(recs))
	d.term()
}

// startRegistry starts an Apicurio Registry in dir; without a Java 21 the
// test skips, saying so.
func startRegistry(t *testing.T, dir string) *testenv.Registry {
	t.Helper()
	reg, err := testenv.StartRegistry(dir)
	if err != nil && strings.Contains(err.Error(), "needs Java 21 or newer") {
		t.Skipf("SKIPPED LOUDLY: Apicurio Registry cannot run here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return reg
}
