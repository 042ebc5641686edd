package schemareg

import (
	"context"
	"encoding/binary"
	"strconv"
	"unicode/utf8"
)

// A registered key: the record's key (agregat_id, a string) written in
// the wire format too, by a string schema of the route's format registered
// under <topic>-key, as Confluent's serializers write a key: JSON Schema
// {"type": "string"} (the key a JSON string, quoted), Avro "string" (its
// length, then its bytes), or Protobuf, which has no bare string, a
// message outboxd.Key whose one field agregat_id holds it. Kafka's
// partitioner hashes these bytes, as it does for a Java producer with the
// registry's key serializer.

// KeyProto is the Protobuf schema of a registered key.
const KeyProto = `syntax = "proto3";
package outboxd;

message Key {
  string agregat_id = 1;
}
`

// KeySchema is the schema of format's keys.
func KeySchema(format string) string {
	switch format {
	case FormatProtobuf:
		return KeyProto
	case FormatAvro:
		return `{"type": "string"}`
	}
	// JSON Schema; Apicurio refuses one without $schema or properties.
	return `{"$schema": "http://json-schema.org/draft-07/schema#", "type": "string"}`
}

// KeySubject is the subject of the keys of a route to topic.
func KeySubject(topic string) string { return topic + "-key" }

// KeyCodec writes a route's keys. Its schema was found (or registered)
// once; writing asks the registry nothing.
type KeyCodec struct {
	format string
	prefix [5]byte
}

// ResolveKey finds the key schema of format under topic's key subject,
// registering it with autoRegister. A Permanent error is the
// configuration's to fix; any other is an outage.
func ResolveKey(ctx context.Context, c *Client, topic, format string, autoRegister bool) (*KeyCodec, error) {
	text := KeySchema(format)
	subject := KeySubject(topic)
	r, err := c.find(ctx, subject, text, SchemaType(format), autoRegister, "the key schema "+text)
	if err != nil {
		return nil, err
	}
	return &KeyCodec{format: format, prefix: wirePrefix(r.ID)}, nil
}

// Identity names the key schema by its id in the registry: part of the
// key bytes the partitioner hashes.
func (k *KeyCodec) Identity() string {
	return strconv.Itoa(int(binary.BigEndian.Uint32(k.prefix[1:])))
}

// EncodeKey appends key's wire form to dst.
func (k *KeyCodec) EncodeKey(dst, key []byte) []byte {
	dst = append(dst, k.prefix[:]...)
	switch k.format {
	case FormatAvro:
		return append(binary.AppendVarint(dst, int64(len(key))), key...)
	case FormatProtobuf:
		// Message indexes [0], then field 1 (agregat_id), length-delimited.
		dst = append(dst, 0, 1<<3|2)
		return append(binary.AppendUvarint(dst, uint64(len(key))), key...)
	}
	return appendJSONString(dst, key)
}

// appendJSONString appends s as a JSON string (invalid UTF-8 replaced, as
// encoding/json does).
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for len(s) > 0 {
		r, n := utf8.DecodeRune(s)
		switch {
		case r == utf8.RuneError && n == 1:
			dst = append(dst, `\ufffd`...)
		case r == '"' || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r == '\n':
			dst = append(dst, `\n`...)
		case r == '\r':
			dst = append(dst, `\r`...)
		case r == '\t':
			dst = append(dst, `\t`...)
		case r < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
		default:
			dst = append(dst, s[:n]...)
		}
		s = s[n:]
	}
	return append(dst, '"')
}
