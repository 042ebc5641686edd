package integration_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/testenv"
)

// TestCloudEventsReadBySDK: one outbox, two routes, value: cloudevents in
// binary and in structured mode, read back by the official CloudEvents SDK
// (Python, its Kafka protocol binding, which validates each event): every
// row one event in each topic, its attributes from the row (id, type,
// subject ← agregat_id, time ← creat_en, source from origen, versio), the
// position extensions, data the row's carrega, the key agregat_id
// (partitionkey to the SDK). The cut-over snapshot's rows (read from the
// table: no position) are CloudEvents too, without the position extensions.
func TestCloudEventsReadBySDK(t *testing.T) {
	kafkaOnly(t)
	f := newFixture(t, seedSchema, map[string]int{"ce.binary": 2, "ce.structured": 2})
	ctx := context.Background()
	// Pending before outboxd starts: the cut-over snapshot publishes them.
	before := insertRows(t, f.db, "outbox", 5, "now() - interval '1 hour'", false)
	binary := testenv.Route{Table: "public.outbox", Topic: f.topic("ce.binary"), More: testenv.Section{"value": "cloudevents"}}
	structured := testenv.Route{Table: "public.outbox", Topic: f.topic("ce.structured"),
		More: testenv.Section{"value": "cloudevents", "cloudevents": "{mode: structured, source: \"urn:km0:{origen}\"}",
			// A second route of the table takes the rows its filter matches
			// (every row here).
			"filter": "{agregat: comanda}"}}
	d := f.start(f.config(binary, structured))
	streamed := insertRows(t, f.db, "outbox", 20, "now()", false)

	type row struct {
		agregatID, tipus, carrega, creatEn string
		versio                             int
	}
	rows := map[string]row{}
	r, err := f.db.Query(ctx, "SELECT id::text, agregat_id, tipus, carrega::text, to_char(creat_en AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US'), versio FROM outbox")
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var id string
		var w row
		if err := r.Scan(&id, &w.agregatID, &w.tipus, &w.carrega, &w.creatEn, &w.versio); err != nil {
			t.Fatal(err)
		}
		rows[id] = w
	}
	if r.Err() != nil || len(rows) != len(before)+len(streamed) {
		t.Fatalf("%d rows (%v)", len(rows), r.Err())
	}
	snapshot := map[string]bool{}
	for _, b := range before {
		snapshot[b.id] = true
	}

	for _, tc := range []struct{ topic, source string }{{f.topic("ce.binary"), "/km0/comandes"}, {f.topic("ce.structured"), "urn:km0:comandes"}} {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		events, err := testenv.ReadCloudEvents(cctx, env.KafkaBrokers, tc.topic, len(rows))
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", tc.topic, err)
		}
		seen := map[string]int{}
		for _, e := range events {
			if e.Error != "" {
				t.Fatalf("%s: the SDK refused the record at %d/%d: %s", tc.topic, e.Partition, e.Offset, e.Error)
			}
			a := e.Attributes
			id, _ := a["id"].(string)
			w, ok := rows[id]
			if !ok {
				t.Fatalf("%s: an event whose id %q is no row's: %v", tc.topic, id, a)
			}
			seen[id]++
			// The SDK parses time; Python's isoformat of a UTC time has six
			// digits of fraction, none when it is 0, and ends +00:00.
			want := map[string]any{"specversion": "1.0", "id": id, "source": tc.source, "type": w.tipus, "subject": w.agregatID,
				"time": strings.TrimSuffix(w.creatEn, ".000000") + "+00:00", "datacontenttype": "application/json", "versio": strconv.Itoa(w.versio), "partitionkey": w.agregatID}
			if !snapshot[id] {
				if _, ok := a["commitlsn"]; !ok {
					t.Errorf("%s: streamed event %s has no commitlsn: %v", tc.topic, id, a)
				}
				if _, ok := a["txnindex"]; !ok {
					t.Errorf("%s: streamed event %s has no txnindex: %v", tc.topic, id, a)
				}
			}
			got := map[string]any{}
			for k, v := range a {
				if k == "commitlsn" || k == "txnindex" {
					if snapshot[id] {
						t.Errorf("%s: snapshot event %s has %s (a row read from its table has no WAL position)", tc.topic, id, k)
					}
					continue
				}
				if n, ok := v.(float64); ok { // a structured event's number
					v = strconv.FormatFloat(n, 'f', -1, 64)
				}
				got[k] = v
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: attributes\n got %v\nwant %v", tc.topic, got, want)
			}
			var data, carrega any
			if err := json.Unmarshal(e.Data, &data); err != nil {
				t.Fatalf("%s: data %s: %v", tc.topic, e.Data, err)
			}
			_ = json.Unmarshal([]byte(w.carrega), &carrega)
			if !reflect.DeepEqual(data, carrega) {
				t.Errorf("%s: data %s, want the row's carrega %s", tc.topic, e.Data, w.carrega)
			}
		}
		for id := range rows {
			if seen[id] != 1 {
				t.Errorf("%s: %d events of row %s, want 1", tc.topic, seen[id], id)
			}
		}
		t.Logf("%s: %d events read by the CloudEvents SDK, %d from the cut-over snapshot", tc.topic, len(events), len(before))
	}
	d.term()
}
