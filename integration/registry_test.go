package integration_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/schemareg"
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
			"schema": `{registry: "` + reg.URL + `", subject_strategy: record, key: registered, auto_register: ` + autoRegister + `, schemas: {comanda.creada: "` + schemaFile + `"}}`}}
		return outboxd(t, f.dsn, "check", "-c", f.configFile(f.config(route)))
	}
	wantCheckFails(t, check("false"), "schema registry routes[0]", `not registered: comanda.creada (subject "comanda.creada")`, "auto_register: true")
	wantCheckFails(t, check("false"), "schema registry routes[0] key", fmt.Sprintf(`is not registered under subject "%s-key"`, f.topic("registry")), "auto_register: true")
	r := check("true")
	if l := r.line("PASS schema registry routes[0]:"); !strings.Contains(l, `subject "comanda.creada" registrable (auto_register), compatibility`) {
		t.Fatalf("with auto_register: %q\n%s", l, r)
	}
	if l := r.line("PASS schema registry routes[0] key:"); !strings.Contains(l, fmt.Sprintf(`keys: subject "%s-key" registrable (auto_register), compatibility`, f.topic("registry"))) {
		t.Fatalf("the key with auto_register: %q\n%s", l, r)
	}
	// outboxd registers it at start.
	d := f.start(f.config(testenv.Route{Table: "public.outbox", Topic: f.topic("registry"), More: testenv.Section{"value": "payload",
		"schema": `{registry: "` + reg.URL + `", subject_strategy: record, key: registered, auto_register: true, schemas: {comanda.creada: "` + schemaFile + `"}}`}}))
	d.term()
	r = check("false")
	if l := r.line("PASS schema registry routes[0]:"); !strings.Contains(l, `comanda.creada: subject "comanda.creada" version 1 (id `) {
		t.Fatalf("once registered: %q", l)
	}
	if l := r.line("PASS schema registry routes[0] key:"); !strings.Contains(l, fmt.Sprintf(`keys written with subject "%s-key" version 1 (id `, f.topic("registry"))) {
		t.Fatalf("the key once registered: %q", l)
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
// id): every row its event, the field missing from carrega at its default,
// the key registered too (schema.key: registered, subject <topic>-key) and
// read by the same deserializer; a row the schema cannot take is
// dead-lettered with where it fails.
func TestSchemaRegistryAvro(t *testing.T) {
	kafkaOnly(t)
	w := writeRegistered(t, "avro", "comanda-creada.avsc", orderAvro, "subject_strategy: record, key: registered", `{"n": 1.5}`)
	w.eachEvent(t, "AvroDeserializer", func(value json.RawMessage) (int, bool) {
		var v struct {
			N     int
			Canal string
		}
		return v.N, json.Unmarshal(value, &v) == nil && v.Canal == "web"
	})
	dlq, d, recs := w.dlq, w.d, w.recs
	dl := consumeExactly(t, dlq, 1)
	if reason := header(dl[0], "outboxd.error"); !strings.Contains(reason, `cannot be written by the schema of subject "km0.ComandaCreada"`) || !strings.Contains(reason, "at /n: the schema wants int (an integer)") {
		t.Fatalf("dead letter reason %q", reason)
	}
	t.Logf("%d rows in Avro, keys registered too, read back by confluent-kafka's AvroDeserializer (the default filled in); 1 dead-lettered", len(recs))
	d.term()
}

const orderProto = `syntax = "proto3";
package km0;
message ComandaCreada {
  int32 n = 1;
  string canal = 2;
}
`

// TestSchemaRegistryProtobuf: format protobuf reads carrega by Protobuf's
// JSON mapping into the schema's first message (registered under the
// topic's subject) and writes it behind the schema id and the message
// indexes; read back with confluent-kafka's ProtobufDeserializer into the
// class protoc generates from the same file: every row its event, its key
// registered as the message outboxd.Key (schema.key: registered); a row
// the message cannot take (a member it does not have) is dead-lettered
// naming the member.
func TestSchemaRegistryProtobuf(t *testing.T) {
	kafkaOnly(t)
	w := writeRegistered(t, "protobuf", "comanda_creada.proto", orderProto, "key: registered", `{"n": 1, "secreta": "x"}`)
	w.eachEvent(t, "ProtobufDeserializer", func(value json.RawMessage) (int, bool) {
		var v struct {
			N     int
			Canal *string
		}
		return v.N, json.Unmarshal(value, &v) == nil && v.Canal != nil && *v.Canal == ""
	})
	topic, dlq, d, recs := w.topic, w.dlq, w.d, w.recs
	dl := consumeExactly(t, dlq, 1)
	if reason := header(dl[0], "outboxd.error"); !strings.Contains(reason, fmt.Sprintf(`cannot be written by the schema of subject "%s-value"`, topic)) || !strings.HasSuffix(reason, `unknown field "secreta"`) {
		t.Fatalf("dead letter reason %q", reason)
	}
	t.Logf("%d rows in Protobuf, keys registered as outboxd.Key, read back by confluent-kafka's ProtobufDeserializer; 1 dead-lettered", len(recs))
	d.term()
}

// registered is what writeRegistered did and read.
type registered struct {
	topic, dlq string
	d          *daemon
	rows       []outboxRow
	recs       []testenv.Registered
}

// writeRegistered runs outboxd on a route writing format (its schema the
// text, in a file named file, auto-registered, with more schema keys) to a
// real registry, with a dead-letter topic; inserts 30 good rows and one
// whose carrega is bad; and reads the good ones back with confluent-kafka's
// deserializer of format.
func writeRegistered(t *testing.T, format, file, text, more, bad string) registered {
	t.Helper()
	f := newFixture(t, seedSchema, map[string]int{format: 2, format + ".dlq": 1})
	ctx := context.Background()
	dir := t.TempDir()
	reg := startRegistry(t, filepath.Join(dir, "svc"))
	t.Cleanup(func() { _ = reg.Stop() })
	schemaFile := filepath.Join(dir, file)
	if err := os.WriteFile(schemaFile, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if more != "" {
		more += ", "
	}
	w := registered{topic: f.topic(format), dlq: f.topic(format + ".dlq")}
	w.d = f.start(f.config(testenv.Route{Table: "public.outbox", Topic: w.topic, More: testenv.Section{
		"value": "payload", "on_error": "dead_letter", "dead_letter_topic": w.dlq,
		"schema": `{registry: "` + reg.URL + `", format: ` + format + `, auto_register: true, ` + more + `schemas: {comanda.creada: "` + schemaFile + `"}}`,
	}}))
	w.rows = insertRows(t, f.db, "outbox", 30, "now()", false)
	if _, err := f.db.Exec(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega) VALUES
		('00000000-0000-4000-8000-00000000bad2', 'comanda', 'P-1', 'comanda.creada', $1)`, bad); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "every good row in the topic", func() bool { return f.topicSize(w.topic) >= int64(len(w.rows)) })
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var protoFile []string
	if format == "protobuf" {
		keyFile := filepath.Join(dir, "key.proto")
		if err := os.WriteFile(keyFile, []byte(schemareg.KeyProto), 0o600); err != nil {
			t.Fatal(err)
		}
		protoFile = append(protoFile, schemaFile, keyFile)
	}
	recs, err := testenv.ReadRegistered(cctx, env.KafkaBrokers, reg.URL, w.topic, format, len(w.rows), protoFile...)
	if err != nil {
		t.Fatal(err)
	}
	w.recs = recs
	return w
}

// eachEvent requires every record read back to be a distinct row's event,
// its value as event says (which returns the value's n), and its key, read
// by the same deserializer (schema.key: registered), the row's agregat_id
// ('P-' || n % 5).
func (w registered) eachEvent(t *testing.T, deserializer string, event func(json.RawMessage) (n int, ok bool)) {
	t.Helper()
	seen := map[int]int{}
	for _, r := range w.recs {
		n, ok := event(r.Value)
		var key string
		if r.Error != "" || !ok || json.Unmarshal(r.Key, &key) != nil {
			t.Fatalf("record %d/%d: %s %s %s", r.Partition, r.Offset, r.Key, r.Value, r.Error)
		}
		if want := fmt.Sprintf("P-%d", n%5); key != want {
			t.Errorf("record %d/%d: key %q read by the %s, want %q", r.Partition, r.Offset, key, deserializer, want)
		}
		seen[n]++
	}
	if len(w.recs) != len(w.rows) || len(seen) != len(w.rows) {
		t.Fatalf("%d records, %d distinct events, want %d", len(w.recs), len(seen), len(w.rows))
	}
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

// TestCloudEventsWithRegistry: a binary CloudEvent's data in the registry's
// wire format, for each format (three routes of one table): the CloudEvents
// SDK reads every event's attributes, ce_dataschema naming the schema by
// its id in the registry and datacontenttype the format's media type, and
// confluent-kafka's deserializer of the format reads its data back to the
// row's carrega.
func TestCloudEventsWithRegistry(t *testing.T) {
	kafkaOnly(t)
	f := newFixture(t, seedSchema, map[string]int{"ce.json": 2, "ce.avro": 2, "ce.proto": 2})
	dir := t.TempDir()
	reg := startRegistry(t, filepath.Join(dir, "svc"))
	t.Cleanup(func() { _ = reg.Stop() })
	formats := []struct{ format, file, text, filter, contentType string }{
		{"json_schema", "comanda-creada.json", orderSchema, "", "application/json"},
		{"avro", "comanda-creada.avsc", orderAvro, "{agregat: comanda}", "application/avro"},
		{"protobuf", "comanda_creada.proto", orderProto, "{tipus: comanda.creada}", "application/protobuf"},
	}
	var routes []testenv.Route
	topics := map[string]string{"json_schema": f.topic("ce.json"), "avro": f.topic("ce.avro"), "protobuf": f.topic("ce.proto")}
	files := map[string]string{}
	for _, c := range formats {
		files[c.format] = filepath.Join(dir, c.file)
		if err := os.WriteFile(files[c.format], []byte(c.text), 0o600); err != nil {
			t.Fatal(err)
		}
		more := testenv.Section{"value": "cloudevents",
			"schema": `{registry: "` + reg.URL + `", format: ` + c.format + `, auto_register: true, schemas: {comanda.creada: "` + files[c.format] + `"}}`}
		if c.filter != "" {
			more["filter"] = c.filter
		}
		routes = append(routes, testenv.Route{Table: "public.outbox", Topic: topics[c.format], More: more})
	}
	d := f.start(f.config(routes...))
	rows := insertRows(t, f.db, "outbox", 20, "now()", false)
	byID := map[string]bool{}
	for _, r := range rows {
		byID[r.id] = true
	}
	for _, c := range formats {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		args := []string{reg.URL, c.format}
		if c.format == "protobuf" {
			args = append(args, files[c.format])
		}
		events, err := testenv.ReadCloudEvents(ctx, env.KafkaBrokers, topics[c.format], len(rows), args...)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", c.format, err)
		}
		seen := map[string]bool{}
		for _, e := range events {
			if e.Error != "" {
				t.Fatalf("%s: record %d/%d refused: %s", c.format, e.Partition, e.Offset, e.Error)
			}
			id, _ := e.Attributes["id"].(string)
			schema, _ := e.Attributes["dataschema"].(string)
			var data struct{ N *int }
			if !byID[id] || seen[id] || e.Attributes["datacontenttype"] != c.contentType ||
				!strings.HasPrefix(schema, reg.URL+"/schemas/ids/") || json.Unmarshal(e.Data, &data) != nil || data.N == nil {
				t.Fatalf("%s: event %v, data %s", c.format, e.Attributes, e.Data)
			}
			seen[id] = true
		}
		if len(seen) != len(rows) {
			t.Fatalf("%s: %d events, want %d", c.format, len(seen), len(rows))
		}
		// The dataschema resolves: the registry serves the schema there.
		res, err := http.Get(events[0].Attributes["dataschema"].(string))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Errorf("%s: GET dataschema %s: %s", c.format, events[0].Attributes["dataschema"], res.Status)
		}
	}
	t.Logf("%d rows as binary CloudEvents in each of JSON Schema, Avro and Protobuf, read by the CloudEvents SDK and confluent-kafka's deserializers", len(rows))
	d.term()
}
