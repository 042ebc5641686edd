package schemareg

import (
	"encoding/json"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

// TestEncodeKey: a registered key is the wire format's prefix, then the
// key as its string schema writes it: a JSON string (escaped as
// encoding/json does) or Avro's length and bytes.
func TestEncodeKey(t *testing.T) {
	k := &KeyCodec{prefix: [5]byte{0, 0, 0, 1, 2}}
	for _, key := range []string{"P-1", `a"b\c` + "\n\t\x01é", "\xffx"} {
		out := k.EncodeKey(nil, []byte(key))
		if string(out[:5]) != "\x00\x00\x00\x01\x02" {
			t.Fatalf("% x", out)
		}
		want, _ := json.Marshal(key)
		var back string
		if string(out[5:]) != string(want) && (json.Unmarshal(out[5:], &back) != nil || back != string([]rune(key))) {
			t.Errorf("%q: %s, want %s", key, out[5:], want)
		}
	}
	k.format = FormatAvro
	if out := k.EncodeKey(nil, []byte("P-1")); string(out) != "\x00\x00\x00\x01\x02\x06P-1" {
		t.Errorf("avro key % x", out)
	}
	// Protobuf: the message outboxd.Key, read back by the schema itself.
	k.format = FormatProtobuf
	out := k.EncodeKey(nil, []byte("P-1"))
	if string(out[:6]) != "\x00\x00\x00\x01\x02\x00" {
		t.Fatalf("protobuf key % x", out)
	}
	md, err := protoMessage(KeyProto)
	if err != nil {
		t.Fatal(err)
	}
	m := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(out[6:], m); err != nil || m.Get(md.Fields().ByName("agregat_id")).String() != "P-1" || md.FullName() != "outboxd.Key" {
		t.Errorf("protobuf key %v (%v)", m, err)
	}
}
