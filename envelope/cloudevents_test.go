package envelope_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/envelope"
)

// TestCloudEventsBinaryAndStructured: one outbox row as a CloudEvent in
// each content mode: the attributes from the row (time from creat_en in
// UTC to the microsecond, the source from the service's name, the
// position extensions from the change's place in the WAL), data carrega
// as it is, the key agregat_id. A row read from its table (no position)
// has no position extensions; a carrega that is not JSON is a bad row.
func TestCloudEventsBinaryAndStructured(t *testing.T) {
	carrega := `{"id": "P-7", "linies": [{"producte": "formatge", "quantitat": 2}]}`
	row := tuple(s("6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70"), s("comanda"), s("P-7"), s("comanda.creada"), s("3"), s(carrega), s("2026-09-10 09:33:20.123999+02"), nil)
	rel := relation("id", "agregat", "agregat_id", "tipus", "versio", "carrega", "creat_en", "publicat_en")
	pos := envelope.Position{CommitLSN: 0x16B3748, Index: 4}
	want := map[string]any{"specversion": "1.0", "id": "6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70", "source": "/km0/comandes", "type": "comanda.creada",
		"subject": "P-7", "time": "2026-09-10T07:33:20.123999Z", "datacontenttype": "application/json", "versio": float64(3),
		"commitlsn": "23803720", "txnindex": float64(4)}
	var data any
	if err := json.Unmarshal([]byte(carrega), &data); err != nil {
		t.Fatal(err)
	}

	t.Run("binary", func(t *testing.T) {
		r := newRouter(t, "comandes", []envelope.Route{{Schema: "public", Table: "outbox", Topic: "comandes.ce", Columns: seedCols, Value: envelope.ValueCloudEvents}}, 0)
		rec, _, err := r.Build(bind(r, rel), row, pos, nil)
		if err != nil {
			t.Fatal(err)
		}
		if string(rec.Value) != carrega || string(rec.Key) != "P-7" {
			t.Errorf("value %s key %s: want carrega as it is, keyed by agregat_id", rec.Value, rec.Key)
		}
		got := map[string]any{}
		for _, h := range rec.Headers {
			switch name, ok := strings.CutPrefix(h.Key, "ce_"); {
			case ok && (name == "versio" || name == "txnindex"):
				var n float64
				_ = json.Unmarshal(h.Value, &n)
				got[name] = n
			case ok:
				got[name] = string(h.Value)
			case h.Key == "content-type":
				got["datacontenttype"] = string(h.Value)
			default:
				t.Errorf("header %s=%s: a binary CloudEvent carries ce_ headers and content-type", h.Key, h.Value)
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("attributes\n got %v\nwant %v", got, want)
		}
		// Read from the table: no position, so no position extensions.
		rec, _, err = r.Build(bind(r, rel), row, envelope.Position{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if header(rec, "ce_commitlsn") != "" || header(rec, "ce_txnindex") != "" || header(rec, "ce_id") == "" {
			t.Errorf("a row read from its table: headers %v", rec.Headers)
		}
	})

	t.Run("structured", func(t *testing.T) {
		r := newRouter(t, "comandes", []envelope.Route{{Schema: "public", Table: "outbox", Topic: "comandes.ce", Columns: seedCols,
			Value: envelope.ValueCloudEvents, CloudEvents: envelope.CloudEvents{Mode: envelope.CEStructured, Source: "urn:km0:{origen}:outbox"}}}, 0)
		rec, _, err := r.Build(bind(r, rel), row, pos, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Headers) != 1 || header(rec, "content-type") != "application/cloudevents+json; charset=UTF-8" || string(rec.Key) != "P-7" {
			t.Errorf("headers %v key %s", rec.Headers, rec.Key)
		}
		got := map[string]any{}
		if err := json.Unmarshal(rec.Value, &got); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, rec.Value)
		}
		w := map[string]any{"data": data}
		for k, v := range want {
			w[k] = v
		}
		w["source"] = "urn:km0:comandes:outbox"
		if !reflect.DeepEqual(got, w) {
			t.Errorf("event\n got %v\nwant %v", got, w)
		}
	})

	t.Run("carrega not JSON", func(t *testing.T) {
		r := newRouter(t, "comandes", []envelope.Route{{Schema: "public", Table: "outbox", Topic: "comandes.ce", Columns: seedCols, Value: envelope.ValueCloudEvents}}, 0)
		text := relation("id", "agregat", "agregat_id", "tipus", "versio", "carrega", "creat_en", "publicat_en")
		text.Columns[5].DataType = 25 // a text carrega
		bad := tuple(s("id-1"), s("comanda"), s("P-7"), s("comanda.creada"), s("1"), s("not json"), s("2026-09-10 09:33:20+02"), nil)
		if _, _, err := r.Build(bind(r, text), bad, pos, nil); err == nil || !strings.Contains(err.Error(), "not valid JSON") {
			t.Errorf("err = %v, want a bad row (carrega not JSON)", err)
		}
	})
}

// TestCloudEventsProblems: what a CloudEvents route may not be.
func TestCloudEventsProblems(t *testing.T) {
	base := func() envelope.Route {
		return envelope.Route{Schema: "public", Table: "outbox", Topic: "t", Columns: seedCols, Value: envelope.ValueCloudEvents}
	}
	for _, tc := range []struct {
		name string
		edit func(r *envelope.Route)
		want string
	}{
		{"unknown mode", func(r *envelope.Route) { r.CloudEvents.Mode = "batched" }, `cloudevents.mode: "batched" is not one of binary, structured`},
		{"a placeholder other than origen", func(r *envelope.Route) { r.CloudEvents.Source = "/km0/{agregat}" }, "only {origen} stands for something"},
		{"with the Debezium preset", func(r *envelope.Route) { r.Preset = envelope.PresetDebezium }, "does not go with preset debezium"},
		{"an envelope field", func(r *envelope.Route) { r.Fields = []envelope.Field{{Column: "agregat", Envelope: "agregat"}} }, "a CloudEvent has no envelope"},
		{"a field on a ce_ header", func(r *envelope.Route) { r.Fields = []envelope.Field{{Column: "agregat", Header: "ce_type"}} }, `"ce_type" is already a header`},
		{"settings without the value", func(r *envelope.Route) { r.Value = ""; r.CloudEvents.Mode = envelope.CEStructured }, "value is not cloudevents"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := base()
			tc.edit(&r)
			var got []string
			for _, p := range r.Problems() {
				got = append(got, p.String())
			}
			if !strings.Contains(strings.Join(got, "\n"), tc.want) {
				t.Errorf("problems %q, want one with %q", got, tc.want)
			}
		})
	}
	r := base()
	r.Fields = []envelope.Field{{Column: "agregat", Header: "agregat"}}
	if ps := r.Problems(); len(ps) > 0 {
		t.Errorf("a binary CloudEvents route with a header field: %v", ps)
	}
}
