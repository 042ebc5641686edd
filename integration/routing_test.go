package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/testenv"
)

// Routing (issue 13) against the real services: every mode of a route, the
// Debezium preset, trace context, logical messages in the transactions of
// table rows, mixed-case names, and the configuration errors.

// richSchema is the seed's outbox with a market and a trace context.
const richSchema = `CREATE TABLE outbox (id UUID PRIMARY KEY, agregat TEXT NOT NULL, agregat_id TEXT NOT NULL, tipus TEXT NOT NULL,
	versio INTEGER NOT NULL DEFAULT 1, carrega JSONB NOT NULL, creat_en TIMESTAMPTZ NOT NULL DEFAULT now(),
	mercat TEXT, traceparent TEXT, tracestate TEXT, publicat_en TIMESTAMPTZ);`

const (
	tp1 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	tp2 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)

// position is a record's (commit LSN, index) from its position headers.
type position struct{ lsn, index uint64 }

func positionOf(t *testing.T, m kafka.Message) position {
	t.Helper()
	l, err1 := strconv.ParseUint(header(m, "outboxd.commit_lsn"), 10, 64)
	i, err2 := strconv.ParseUint(header(m, "outboxd.txn_index"), 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("record %s: position headers %v", m.Key, m.Headers)
	}
	return position{l, i}
}

func (p position) before(q position) bool {
	return p.lsn < q.lsn || p.lsn == q.lsn && p.index < q.index
}

// TestRoutingModes: one table with two routes and a message prefix, in one
// configuration: a topic template with a fallback, an override that drops
// and one that reroutes, a filtered second route with the raw payload,
// fields in a header and in the envelope, the trace context, position
// headers, and logical messages between the rows of a transaction.
func TestRoutingModes(t *testing.T) {
	f := newFixture(t, richSchema, map[string]int{"altres": 1, "incidencies": 1, "analitica": 1, "missatges": 1, "comanda": 1, "pagament": 1})
	ctx := context.Background()
	main := testenv.Route{Table: "public.outbox", Topic: `"` + f.name + `.{agregat}"`, More: testenv.Section{
		"topic_fallback":   f.topic("altres"),
		"overrides":        fmt.Sprintf(`[{when: {tipus: comanda.prova}, drop: true}, {when: {tipus: comanda.cancellada}, topic: %s}]`, f.topic("incidencies")),
		"fields":           "[{column: mercat, header: mercat}, {column: mercat, envelope: mercat}]",
		"trace":            "{traceparent: traceparent, tracestate: tracestate}",
		"position_headers": "true",
	}}
	second := testenv.Route{Table: "public.outbox", Topic: f.topic("analitica"), More: testenv.Section{
		"filter": "{tipus: [comanda.creada, comanda.cancellada]}", "value": "payload", "position_headers": "true"}}
	messages := testenv.Route{Message: f.name, Topic: f.topic("missatges"), More: testenv.Section{"position_headers": "true"}}
	d := f.start(f.config(main, second, messages))

	type row struct{ id, agregat, tipus, mercat, traceparent string }
	txns := [][]any{
		{row{"00000000-0000-4000-8000-000000000001", "comanda", "comanda.creada", "girona", tp1},
			`{"id_esdeveniment": "m-1", "agregat_id": "P-1", "tipus": "comanda.notificada", "dades": {"canal": "sms"}}`,
			row{"00000000-0000-4000-8000-000000000002", "pagament", "pagament.autoritzat", "girona", ""},
			row{"00000000-0000-4000-8000-000000000003", "comanda", "comanda.prova", "vic", ""}},
		{row{"00000000-0000-4000-8000-000000000004", "comanda", "comanda.cancellada", "vic", tp2},
			row{"00000000-0000-4000-8000-000000000005", "la bisbal", "comanda.creada", "", ""},
			`{"id_esdeveniment": "m-2", "agregat_id": "P-1", "tipus": "comanda.recordatori", "versio": 3, "dades": [1, 2]}`},
	}
	for _, txn := range txns {
		tx, err := f.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range txn {
			switch c := c.(type) {
			case row:
				_, err = tx.Exec(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega, mercat, traceparent, tracestate)
					VALUES ($1, $2, 'P-1', $3, '{"n": 1}', NULLIF($4, ''), NULLIF($5, ''), CASE WHEN $5 = '' THEN NULL ELSE 'congo=t61rcWkgMzE' END)`,
					c.id, c.agregat, c.tipus, c.mercat, c.traceparent)
			case string:
				_, err = tx.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2)", f.name, c)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A transaction rolled back: its message never existed.
	tx, _ := f.db.Begin(ctx)
	if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, '{\"id_esdeveniment\": \"m-rolled-back\"}')", f.name); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	end := f.walLSN()

	comanda := consumeExactly(t, f.topic("comanda"), 1)[0]
	pagament := consumeExactly(t, f.topic("pagament"), 1)[0]
	incidencia := consumeExactly(t, f.topic("incidencies"), 1)[0]
	altre := consumeExactly(t, f.topic("altres"), 1)[0]
	analitica := consumeExactly(t, f.topic("analitica"), 3)
	missatges := consumeExactly(t, f.topic("missatges"), 2)

	// The template, the fallback (a space is no topic character), the
	// override's topic; the dropped row nowhere.
	for m, id := range map[*kafka.Message]string{&comanda: "1", &pagament: "2", &incidencia: "4", &altre: "5"} {
		if want := "00000000-0000-4000-8000-00000000000" + id; header(*m, "id_esdeveniment") != want {
			t.Errorf("%s: id %s, want %s", m.Topic, header(*m, "id_esdeveniment"), want)
		}
	}
	// Fields and trace context.
	var env map[string]any
	if err := json.Unmarshal(comanda.Value, &env); err != nil || env["mercat"] != "girona" || env["tipus"] != "comanda.creada" {
		t.Errorf("envelope with a field: %s", comanda.Value)
	}
	if header(comanda, "mercat") != "girona" || header(comanda, "traceparent") != tp1 || header(comanda, "tracestate") != "congo=t61rcWkgMzE" {
		t.Errorf("headers %v", comanda.Headers)
	}
	if header(incidencia, "traceparent") != tp2 || header(pagament, "traceparent") != "" {
		t.Errorf("trace of the other rows: %v / %v", incidencia.Headers, pagament.Headers)
	}
	if err := json.Unmarshal(altre.Value, &env); err != nil || env["mercat"] != nil {
		t.Errorf("a NULL field: %s", altre.Value)
	}
	// The filtered route: raw payload, km0 headers.
	for i, id := range []string{"1", "4", "5"} {
		m := analitica[i]
		if header(m, "id_esdeveniment") != "00000000-0000-4000-8000-00000000000"+id || string(m.Value) != `{"n": 1}` || header(m, "tipus") == "" {
			t.Errorf("analitica %d: %v %s", i, m.Headers, m.Value)
		}
	}
	// The messages: the envelope from their members, data_ms their commit time.
	for i, m := range missatges {
		if err := json.Unmarshal(m.Value, &env); err != nil || env["id_esdeveniment"] != fmt.Sprintf("m-%d", i+1) || string(m.Key) != "P-1" {
			t.Errorf("message %d: %s", i, m.Value)
		}
		if ms, _ := env["data_ms"].(float64); time.Since(time.UnixMilli(int64(ms))) > 2*time.Minute {
			t.Errorf("message %d: data_ms %v is not its commit time", i, env["data_ms"])
		}
	}
	if !strings.Contains(string(missatges[1].Value), `"versio":3`) || !strings.Contains(string(missatges[1].Value), `"dades":[1, 2]`) {
		t.Errorf("second message: %s", missatges[1].Value)
	}
	// Commit order across topics: the first transaction's row 1, message,
	// row 2 (indices 0, 1, 2), then the second's; one row's two records
	// share a position.
	order := []kafka.Message{comanda, missatges[0], pagament, incidencia, altre, missatges[1]}
	for i := 1; i < len(order); i++ {
		if !positionOf(t, order[i-1]).before(positionOf(t, order[i])) {
			t.Errorf("record %d at %v is not after record %d at %v", i, positionOf(t, order[i]), i-1, positionOf(t, order[i-1]))
		}
	}
	if positionOf(t, analitica[0]) != positionOf(t, comanda) || positionOf(t, missatges[0]).index != 1 || positionOf(t, altre).index != 1 {
		t.Errorf("positions: analitica %v comanda %v message %v", positionOf(t, analitica[0]), positionOf(t, comanda), positionOf(t, missatges[0]))
	}
	f.waitConfirmed(end, 30*time.Second)
	_, metrics, err := d.Get(ctx, "/metrics")
	if err != nil || !strings.Contains(string(metrics), "\noutboxd_dropped_total 1\n") {
		t.Errorf("outboxd_dropped_total: %v\n%s", err, metrics)
	}
	d.term()
}

// createLimitedTopic creates a topic whose max.message.bytes refuses any
// record: a topic the broker refuses to write to.
func createLimitedTopic(t *testing.T, topic string) {
	t.Helper()
	conn, err := kafka.Dial("tcp", env.KafkaBrokers)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctrl, err := conn.Controller()
	if err != nil {
		t.Fatal(err)
	}
	cc, err := kafka.Dial("tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if err := cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "max.message.bytes", ConfigValue: "64"}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the limited topic has a leader", func() bool {
		ps, err := conn.ReadPartitions(topic)
		return err == nil && len(ps) == 1 && ps[0].Leader.Host != ""
	})
}

// TestSecondRouteHoldsTheSlot: a row published to two routes is one
// transaction's two records. When the broker acknowledges the first and
// refuses the second for good, outboxd stops and the slot stays before the
// transaction, although one of its records is in Kafka; with the second
// route dead-lettering, the refused record goes to its dead-letter topic
// and the slot passes the transaction.
func TestSecondRouteHoldsTheSlot(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1, "dlq": 1})
	createLimitedTopic(t, f.topic("petit"))
	ctx := context.Background()
	second := testenv.Route{Table: "public.outbox", Topic: f.topic("petit"), More: testenv.Section{"filter": "{tipus: comanda.creada}"}}
	d := f.start(f.config(seedRoute(f.topic("comandes")), second))
	// A row for comandes alone first: with kafka.deduplicate a partition's
	// first records wait for its own tail read, and were comandes's still
	// pending when petit's refusal stops the producer, its record of the
	// two-route row would never leave. Once comandes has a record, its tail
	// is known and the two-route row's record there goes at once; petit's
	// waits for its tail read.
	if _, err := f.db.Exec(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega) VALUES
		('00000000-0000-4000-8000-0000000000a0', 'comanda', 'K-0', 'comanda.pagada', '{"n": 0}')`); err != nil {
		t.Fatal(err)
	}
	consumeExactly(t, f.topic("comandes"), 1)
	if _, err := f.db.Exec(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega) VALUES
		('00000000-0000-4000-8000-0000000000a1', 'comanda', 'K-1', 'comanda.creada', '{"n": 1}')`); err != nil {
		t.Fatal(err)
	}
	if err := d.exited(60 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 with a record refused for good")
	}
	if got := consumeExactly(t, f.topic("comandes"), 2); header(got[1], "id_esdeveniment") != "00000000-0000-4000-8000-0000000000a1" {
		t.Fatalf("the first route's record: %v", got[1].Headers)
	}
	if passed := f.slotPassed("00000000-0000-4000-8000-0000000000a1"); len(passed) > 0 {
		c, _ := f.slot()
		t.Fatalf("the slot moved to %s, past the transaction whose second record Kafka refused", c)
	}
	if log := d.Log(); !strings.Contains(log, f.topic("petit")) {
		t.Errorf("the error does not name the refusing topic:\n%s", log)
	}
	second.More["on_error"], second.More["dead_letter_topic"] = "dead_letter", f.topic("dlq")
	d = f.start(f.config(seedRoute(f.topic("comandes")), second))
	dead := consumeExactly(t, f.topic("dlq"), 1)[0]
	if header(dead, "id_esdeveniment") != "00000000-0000-4000-8000-0000000000a1" || header(dead, "outboxd.original_size") == "" {
		t.Errorf("dead letter %v", dead.Headers)
	}
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	d.term()
}

// TestMixedCaseTable: a schema and a table whose names need quoting (capitals,
// a dot) work in the configuration, the publication outboxd creates, check,
// and the stream.
func TestMixedCaseTable(t *testing.T) {
	schema := `CREATE SCHEMA "Vendes";
CREATE TABLE "Vendes"."Outbox.Events" (id UUID PRIMARY KEY, agregat TEXT, agregat_id TEXT NOT NULL, tipus TEXT NOT NULL,
	versio INTEGER NOT NULL DEFAULT 1, carrega JSONB NOT NULL, creat_en TIMESTAMPTZ NOT NULL DEFAULT now(), "Mercat" TEXT, publicat_en TIMESTAMPTZ);`
	f := newFixture(t, schema, map[string]int{"vendes": 1, "girona": 1})
	ctx := context.Background()
	route := testenv.Route{Table: `'"Vendes"."Outbox.Events"'`, Topic: f.topic("vendes"), More: testenv.Section{
		"fields": `[{column: Mercat, header: mercat}]`}}
	girona := testenv.Route{Table: `'"Vendes"."Outbox.Events"'`, Topic: f.topic("girona"), More: testenv.Section{"filter": "{Mercat: girona}"}}
	cfg := f.config(route, girona)
	if r := outboxd(t, f.dsn, "check", "-c", f.configFile(cfg)); r.line(`PASS table "Vendes"."Outbox.Events":`) == "" || r.line("PASS publication:") == "" {
		t.Fatalf("check:\n%s", r)
	}
	d := f.start(cfg)
	if _, err := f.db.Exec(ctx, `INSERT INTO "Vendes"."Outbox.Events" (id, agregat_id, tipus, carrega, "Mercat") VALUES
		('00000000-0000-4000-8000-0000000000b1', 'V-1', 'venda.feta', '{"n": 1}', 'girona')`); err != nil {
		t.Fatal(err)
	}
	m := consumeExactly(t, f.topic("vendes"), 1)[0]
	if header(m, "mercat") != "girona" || string(m.Key) != "V-1" {
		t.Errorf("record %v", m.Headers)
	}
	consumeExactly(t, f.topic("girona"), 1)
	var tables []string
	rows, err := f.db.Query(ctx, "SELECT schemaname || '|' || tablename FROM pg_publication_tables WHERE pubname = $1", f.name)
	if err != nil {
		t.Fatal(err)
	}
	if tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || !reflect.DeepEqual(tables, []string{"Vendes|Outbox.Events"}) {
		t.Errorf("publication tables %v %v", tables, err)
	}
	// The fix hint names the table as SQL takes it.
	mustExec(f, fmt.Sprintf(`ALTER PUBLICATION %q DROP TABLE "Vendes"."Outbox.Events"`, f.name))
	d.term()
	if r := outboxd(t, f.dsn, "check", "-c", f.configFile(cfg)); !strings.Contains(r.line("FAIL publication:"), `ADD TABLE "Vendes"."Outbox.Events"`) {
		t.Errorf("check after the table left the publication:\n%s", r)
	}
}

// debeziumOutbox is Debezium's outbox table, with its optional timestamp
// and tracingspancontext columns.
const debeziumOutbox = `CREATE SCHEMA inventory;
CREATE TABLE inventory.outboxevent (id UUID PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL,
	type VARCHAR(255) NOT NULL, payload JSONB, timestamp BIGINT, tracingspancontext VARCHAR(256));`

// TestDebeziumPreset: preset: debezium on Debezium's table gives the record
// its documentation shows (envelope/debezium_test.go holds the documented
// example byte for byte): topic outbox.event.<aggregatetype>, the key, the
// id header, the payload as the value; the span context becomes traceparent.
func TestDebeziumPreset(t *testing.T) {
	f := newFixture(t, debeziumOutbox, nil)
	ctx := context.Background()
	order, customer := "order_"+f.name, "customer_"+f.name
	for _, topic := range []string{"outbox.event." + order, "outbox.event." + customer} {
		if err := env.CreateTopic(topic, 2); err != nil {
			t.Fatal(err)
		}
	}
	route := testenv.Route{Table: "inventory.outboxevent", More: testenv.Section{"preset": "debezium", "key_converter": "json", "value_converter": "json"}}
	d := f.start(f.config(route))
	const payload = `{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}], "customerId": 123}`
	props := "#Tue Sep 10 09:33:20 UTC 2026\ntraceparent=" + tp1 + "\n"
	ins := "INSERT INTO inventory.outboxevent (id, aggregatetype, aggregateid, type, payload, tracingspancontext) VALUES ($1, $2, $3, $4, $5, $6)"
	for _, r := range [][]any{
		{"4d47e190-0402-4048-bc2c-89dd54343cdc", order, "1", "OrderCreated", payload, props},
		{"5e58f2a1-1513-4159-9d3d-90ee65454ded", customer, "7", "CustomerCreated", `{"id": 7}`, nil},
		{"6f69a3b2-2624-426a-ae4e-a1ff76565efe", order, "1", "OrderDeleted", nil, nil},
	} {
		if _, err := f.db.Exec(ctx, ins, r...); err != nil {
			t.Fatal(err)
		}
	}
	orders := consumeExactly(t, "outbox.event."+order, 2)
	customers := consumeExactly(t, "outbox.event."+customer, 1)
	want, _ := json.Marshal(payload) // the payload as a JSON string, as JsonConverter writes it
	if m := orders[0]; string(m.Key) != `"1"` || string(m.Value) != string(want) || header(m, "id") != "4d47e190-0402-4048-bc2c-89dd54343cdc" ||
		header(m, "traceparent") != tp1 || routeHeaders(m) != 2 {
		t.Errorf("order: key %s value %s headers %v", m.Key, m.Value, m.Headers)
	}
	if m := orders[1]; string(m.Value) != "null" || header(m, "id") != "6f69a3b2-2624-426a-ae4e-a1ff76565efe" {
		t.Errorf("a NULL payload: value %q (want JsonConverter's null) headers %v", m.Value, m.Headers)
	}
	if m := customers[0]; string(m.Key) != `"7"` || string(m.Value) != `"{\"id\": 7}"` || routeHeaders(m) != 1 {
		t.Errorf("customer: key %s value %s headers %v", m.Key, m.Value, m.Headers)
	}
	d.term()
}

// TestLogicalMessagesAlone: a table-less outbox. The publication outboxd
// creates covers no table; a non-transactional message on a routed prefix
// stops outboxd with the reason and the slot before it; dead-lettered on
// a restart, the stream goes on.
func TestLogicalMessagesAlone(t *testing.T) {
	f := newFixture(t, "CREATE TABLE estat (id int);", map[string]int{"missatges": 1, "dlq": 1})
	ctx := context.Background()
	route := testenv.Route{Message: f.name, Topic: f.topic("missatges")}
	d := f.start(f.config(route))
	emit := func(transactional bool, content string) {
		t.Helper()
		if _, err := f.db.Exec(ctx, "SELECT pg_logical_emit_message($1, $2, $3)", transactional, f.name, content); err != nil {
			t.Fatal(err)
		}
	}
	emit(true, `{"id_esdeveniment": "m-1", "agregat_id": "K", "tipus": "t", "dades": {}}`)
	if _, err := f.db.Exec(ctx, "SELECT pg_logical_emit_message(true, 'altres', 'not ours')"); err != nil {
		t.Fatal(err)
	}
	consumeExactly(t, f.topic("missatges"), 1)
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	emit(false, `{"id_esdeveniment": "m-2", "agregat_id": "K", "tipus": "t", "dades": {}}`)
	if err := d.exited(30 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 on a non-transactional message")
	}
	if log := d.Log(); !strings.Contains(log, "non-transactional logical message") || !strings.Contains(log, "pg_logical_emit_message(true, ...)") {
		t.Errorf("the error does not say what to do:\n%s", log)
	}
	if passed := f.slotPassed(`"m-2"`); len(passed) > 0 {
		c, _ := f.slot()
		t.Fatalf("the slot passed the message: confirmed at %s", c)
	}
	route.More = testenv.Section{"on_error": "dead_letter", "dead_letter_topic": f.topic("dlq")}
	d = f.start(f.config(route))
	emit(true, `{"id_esdeveniment": "m-3", "agregat_id": "K", "tipus": "t", "dades": {}}`)
	dead := consumeExactly(t, f.topic("dlq"), 1)[0]
	var v map[string]string
	if json.Unmarshal(dead.Value, &v) != nil || !strings.Contains(v["content"], "m-2") || string(dead.Key) != "K" {
		t.Errorf("dead letter: key %s value %s", dead.Key, dead.Value)
	}
	if got := consumeExactly(t, f.topic("missatges"), 2); header(got[1], "id_esdeveniment") != "m-3" {
		t.Errorf("after the dead letter: %v", got[1].Headers)
	}
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	d.term()
}

// TestRoutingConfigErrors: a configuration outboxd cannot run names the
// line: at load (exit 2), and, for a column the table lacks, at start and
// in check (exit 1).
func TestRoutingConfigErrors(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	conflicting := seedRoute(f.topic("comandes"))
	conflicting.More = testenv.Section{"overrides": "\n      - when: {tipus: a}\n        drop: true\n      - when: {tipus: [b, a]}\n        topic: x"}
	cfg := f.config(conflicting)
	r := outboxd(t, f.dsn, "run", "-c", f.configFile(cfg))
	if r.code != 2 || !strings.Contains(r.stderr, `routes[0].overrides[1].when: conflicts with overrides[0]: both match tipus = "a"`) || !strings.Contains(r.stderr, "line 1") {
		t.Errorf("conflicting overrides:\n%s", r)
	}
	second := testenv.Route{Table: "public.outbox", Topic: f.topic("comandes") + "2", More: testenv.Section{"filter": "{tipo: comanda.creada}"}}
	cfg = f.config(seedRoute(f.topic("comandes")), second)
	path := f.configFile(cfg)
	line := 0
	for i, l := range strings.Split(cfg.YAML(), "\n") {
		if strings.Contains(l, "filter:") {
			line = i + 1
		}
	}
	want := fmt.Sprintf("column tipo (line %d: routes[1].filter.tipo) does not exist", line)
	if r := outboxd(t, f.dsn, "run", "-c", path); r.code != 1 || !strings.Contains(r.stderr, want) {
		t.Errorf("run with a filter on a missing column: want %q\n%s", want, r)
	}
	wantCheckFails(t, outboxd(t, f.dsn, "check", "-c", path), "table public.outbox", want, "correct line")
}
