package envelope_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/envelope"
)

// The example of Debezium's outbox EventRouter documentation
// (documentation/modules/ROOT/pages/transformations/outbox-event-router.adoc,
// "Example outbox message"): the outbox row, and the message the SMT emits
// for it with Kafka Connect's JsonConverter (schemas.enable=false) and the
// default configuration.
const (
	dbzID      = "4d47e190-0402-4048-bc2c-89dd54343cdc"
	dbzPayload = `{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}, {"id": 2, "item": "Debezium for Dummies", "status": "ENTERED", "quantity": 1, "totalPrice": 29.99}], "orderDate": "2019-01-31T12:13:01", "customerId": 123}`
	// "# Kafka Topic: outbox.event.order", "# Kafka Message key: "1"",
	// "# Kafka Message Headers: "id=4d47e190-..."", and the value:
	dbzTopic     = "outbox.event.order"
	dbzJSONValue = `"{\"id\": 1, \"lineItems\": [{\"id\": 1, \"item\": \"Debezium in Action\", \"status\": \"ENTERED\", \"quantity\": 2, \"totalPrice\": 39.98}, {\"id\": 2, \"item\": \"Debezium for Dummies\", \"status\": \"ENTERED\", \"quantity\": 1, \"totalPrice\": 29.99}], \"orderDate\": \"2019-01-31T12:13:01\", \"customerId\": 123}"`
	dbzTimestamp = 1556890294344 // the row's timestamp column, for table.field.event.timestamp
)

// debeziumRouter is the router of a configuration with preset: debezium
// and the extra route keys given, parsed as outboxd parses its file.
func debeziumRouter(t *testing.T, more string) *envelope.Router {
	t.Helper()
	yml := `origen: inventory
postgres: {dsn: "postgres://outboxd@h/db", slot: s, publication: p}
kafka: {brokers: ["k:9092"]}
routes:
  - table: inventory.outboxevent
    preset: debezium
` + more
	cfg, err := config.Parse([]byte(yml), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return newRouter(t, cfg.Origen, cfg.Routing().Routes, 0)
}

// debeziumTable is Debezium's basic outbox table (id uuid, aggregatetype,
// aggregateid, type varchar, payload jsonb) with the optional timestamp
// (bigint milliseconds, the example's) and tracingspancontext.
var debeziumTable = table("inventory", "outboxevent", col{"id", 2950}, col{"aggregatetype", 1043}, col{"aggregateid", 1043},
	col{"type", 1043}, col{"payload", 3802}, col{"timestamp", 20}, col{"tracingspancontext", 25})

func debeziumRow(payload *string, spanContext *string) []envelope.Column {
	return tuple(s(dbzID), s("order"), s("1"), s("OrderCreated"), payload, s("1556890294344"), spanContext)
}

// TestDebeziumDocumentedShape: preset: debezium gives, for the
// documentation's example, the topic, key, headers and value Debezium's
// EventRouter gives, under each converter setting a team may have.
func TestDebeziumDocumentedShape(t *testing.T) {
	tests := []struct {
		name, yml string
		key       string
		value     string
		jsonEqual bool // Jackson re-serialises an expanded payload: compare as JSON
		headers   map[string]string
		time      int64
	}{
		{"JsonConverter for key and value, the documented message", "    key_converter: json\n    value_converter: json\n",
			`"1"`, dbzJSONValue, false, map[string]string{"id": dbzID}, 0},
		{"StringConverter", "", `1`, dbzPayload, false, map[string]string{"id": dbzID}, 0},
		{"table.expand.json.payload=true with JsonConverter", "    key_converter: json\n", `"1"`, dbzPayload, true, map[string]string{"id": dbzID}, 0},
		{"table.fields.additional.placement=type:header:eventType", "    fields: [{column: type, header: eventType}]\n",
			`1`, dbzPayload, false, map[string]string{"id": dbzID, "eventType": "OrderCreated"}, 0},
		{"table.fields.additional.placement=type:envelope:eventType, JsonConverter", "    value_converter: json\n    fields: [{column: type, envelope: eventType}]\n",
			`1`, `{"payload":` + dbzJSONValue + `,"eventType":"OrderCreated"}`, false, map[string]string{"id": dbzID}, 0},
		{"table.field.event.timestamp=timestamp", "    timestamp: timestamp\n", `1`, dbzPayload, false, map[string]string{"id": dbzID}, dbzTimestamp},
		{"route.by.field=type, route.topic.replacement=events.${routedByValue}", "    topic: \"events.{type}\"\n", `1`, dbzPayload, false, map[string]string{"id": dbzID}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := debeziumRouter(t, tc.yml)
			recs := publish(t, r, debeziumTable, debeziumRow(s(dbzPayload), nil))
			if len(recs) != 1 {
				t.Fatalf("%d records", len(recs))
			}
			rec := recs[0]
			wantTopic := dbzTopic
			if tc.name == "route.by.field=type, route.topic.replacement=events.${routedByValue}" {
				wantTopic = "events.OrderCreated"
			}
			if rec.Topic != wantTopic || string(rec.Key) != tc.key || rec.Time != tc.time {
				t.Errorf("topic %q key %q time %d, want %q %q %d", rec.Topic, rec.Key, rec.Time, wantTopic, tc.key, tc.time)
			}
			if !reflect.DeepEqual(headers(rec), tc.headers) {
				t.Errorf("headers %v, want %v", headers(rec), tc.headers)
			}
			if string(rec.RowID) != dbzID { // for postgres.mark_published: no id_esdeveniment header here
				t.Errorf("row id %q, want %q", rec.RowID, dbzID)
			}
			if tc.jsonEqual {
				var got, want any
				if json.Unmarshal(rec.Value, &got) != nil || json.Unmarshal([]byte(tc.value), &want) != nil || !reflect.DeepEqual(got, want) {
					t.Errorf("value %s, want JSON equal to %s", rec.Value, tc.value)
				}
			} else if string(rec.Value) != tc.value {
				t.Errorf("value\n got %s\nwant %s", rec.Value, tc.value)
			}
		})
	}
}

// TestDebeziumNulls: a NULL payload gives a null value (Debezium's
// tombstone, whatever route.tombstone.on.empty.payload says, when the value
// is the payload alone; JsonConverter's JSON null) and, with envelope
// fields, "payload": null; a NULL aggregateid a null key; a
// tracingspancontext column, when the table has one, becomes the
// traceparent header.
func TestDebeziumNulls(t *testing.T) {
	r := debeziumRouter(t, "")
	rec := publish(t, r, debeziumTable, debeziumRow(nil, nil))[0]
	if rec.Value != nil {
		t.Errorf("a NULL payload: value %q, want null", rec.Value)
	}
	row := debeziumRow(s(dbzPayload), nil)
	row[2] = tuple(nil)[0]
	if rec := publish(t, r, debeziumTable, row)[0]; rec.Key != nil {
		t.Errorf("a NULL aggregateid: key %q, want null", rec.Key)
	}
	// JsonConverter writes the null of an optional schema as JSON: null.
	r = debeziumRouter(t, "    key_converter: json\n    value_converter: json\n")
	row = debeziumRow(nil, nil)
	row[2] = tuple(nil)[0]
	if rec := publish(t, r, debeziumTable, row)[0]; string(rec.Value) != "null" || string(rec.Key) != "null" {
		t.Errorf("NULLs through JsonConverter: key %q value %q, want null and null", rec.Key, rec.Value)
	}
	r = debeziumRouter(t, "    value_converter: json\n    fields: [{column: type, envelope: eventType}]\n")
	if rec := publish(t, r, debeziumTable, debeziumRow(nil, nil))[0]; string(rec.Value) != `{"payload":null,"eventType":"OrderCreated"}` {
		t.Errorf("a NULL payload in an envelope: %s", rec.Value)
	}
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	r = debeziumRouter(t, "")
	rec = publish(t, r, debeziumTable, debeziumRow(s(dbzPayload), s("#Tue Sep 10 09:33:20 UTC 2026\ntraceparent="+tp+"\n")))[0]
	if headers(rec)["traceparent"] != tp {
		t.Errorf("tracingspancontext: headers %v", headers(rec))
	}
	// The basic table has no tracingspancontext: no header, no error.
	basic := table("inventory", "outboxevent", col{"id", 2950}, col{"aggregatetype", 1043}, col{"aggregateid", 1043}, col{"type", 1043}, col{"payload", 3802})
	rec = publish(t, r, basic, tuple(s(dbzID), s("order"), s("1"), s("OrderCreated"), s(dbzPayload)))[0]
	if len(rec.Headers) != 1 || rec.Topic != dbzTopic {
		t.Errorf("basic table: topic %s headers %v", rec.Topic, headers(rec))
	}
}

// TestConnectStringEscapes: value_converter: json escapes as Kafka Connect's
// JsonConverter (Jackson) does, as a real Debezium run shows
// (integration/debezium_compare_test.go): the short escapes, \u00XX in upper
// case, a character outside the BMP as two escaped surrogates, the rest as
// it is.
func TestConnectStringEscapes(t *testing.T) {
	r := debeziumRouter(t, "    value_converter: json\n")
	in := "diu \"hola\"\nadéu \\ 😀 \b\f\r\t\x01\x1f\x7f \u2028 / <>"
	rec := publish(t, r, debeziumTable, debeziumRow(s(in), nil))[0]
	want := `"diu \"hola\"\nadéu \\ \uD83D\uDE00 \b\f\r\t\u0001\u001F` + "\x7f \u2028" + ` / <>"`
	if string(rec.Value) != want {
		t.Errorf("got  %s\nwant %s", rec.Value, want)
	}
	var back string
	if err := json.Unmarshal(rec.Value, &back); err != nil || back != in {
		t.Errorf("does not decode to the payload: %q %v", back, err)
	}
}
