package schemareg

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

const orderProto = `syntax = "proto3";
package km0;
import "google/protobuf/timestamp.proto";
message ComandaCreada {
  int64 n = 1;
  string client = 2;
  repeated Linia linies = 3;
  Estat estat = 4;
  google.protobuf.Timestamp quan = 5;
}
message Linia { string sku = 1; int32 quantitat = 2; }
enum Estat { ESTAT_DESCONEGUT = 0; PAGADA = 1; }
`

// TestProtobufEncode: carrega read by Protobuf's JSON mapping into the
// schema's first message and written behind the magic byte, the id and
// the message indexes [0]; a refusal (a member the message does not have,
// an enum name it does not know) names the field and never the value.
func TestProtobufEncode(t *testing.T) {
	e, err := newEntry(FormatProtobuf, Registered{Subject: "comandes-value", ID: 258, Version: 1, Schema: orderProto, SchemaType: "PROTOBUF"})
	if err != nil {
		t.Fatal(err)
	}
	c := &Codec{only: e}
	out, err := c.Encode(nil, []byte(`{"n": "7", "client": "anna", "linies": [{"sku": "A-1", "quantitat": 2}], "estat": "PAGADA", "quan": "2026-12-05T10:00:00Z"}`), []byte("comanda.creada"), 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := "\x00\x00\x00\x01\x02\x00"; string(out[:6]) != want {
		t.Fatalf("wire form % x, want % x first", out[:6], want)
	}
	m := dynamicpb.NewMessage(e.proto)
	if err := proto.Unmarshal(out[6:], m); err != nil {
		t.Fatal(err)
	}
	fields := e.proto.Fields()
	if m.Get(fields.ByName("n")).Int() != 7 || m.Get(fields.ByName("client")).String() != "anna" ||
		m.Get(fields.ByName("linies")).List().Len() != 1 || m.Get(fields.ByName("estat")).Enum() != 1 {
		t.Errorf("decoded %v", m)
	}
	_, err = c.Encode(nil, []byte(`{"n": "set-secret"}`), []byte("comanda.creada"), 1)
	if err == nil || !strings.Contains(err.Error(), "invalid value for int64 field n") || strings.Contains(err.Error(), "secret") {
		t.Errorf("err = %v: want the field, not the value", err)
	}
	for v, want := range map[string]string{
		`{"quan": "dimarts-secret"}`:  "invalid google.protobuf.Timestamp",
		`{"estat": "secret"}`:         "invalid value for enum field estat",
		`{"secret": 1}`:               `unknown field "secret"`,
		`{"linies": "secret"}`:        "the value does not fit the message",
		`{"n": 1, "client": "secret"`: "the value does not fit the message",
	} {
		_, err = c.Encode(nil, []byte(v), []byte("comanda.creada"), 1)
		if err == nil || !strings.HasSuffix(err.Error(), want) || strings.Count(err.Error(), "secret") > strings.Count(want, "secret") {
			t.Errorf("%s: err = %v, want one ending %q and without the value", v, err, want)
		}
	}
}

func TestProtobufSubject(t *testing.T) {
	for _, tc := range []struct{ strategy, want string }{
		{StrategyTopic, "comandes-value"},
		{StrategyRecord, "km0.ComandaCreada"},
		{StrategyTopicRecord, "comandes-km0.ComandaCreada"},
	} {
		got, err := Subject(FormatProtobuf, tc.strategy, "comandes", "comanda.creada", orderProto)
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.strategy, got, err, tc.want)
		}
	}
	if _, err := Subject(FormatProtobuf, StrategyRecord, "comandes", "x", "message {"); err == nil {
		t.Error("a .proto that does not compile named a subject")
	}
	if _, err := newEntry(FormatProtobuf, Registered{Subject: "s", Schema: `syntax = "proto3"; enum E { A = 0; }`, SchemaType: "PROTOBUF"}); err == nil || !strings.Contains(err.Error(), "no message") {
		t.Errorf("a .proto without a message: %v", err)
	}
}
