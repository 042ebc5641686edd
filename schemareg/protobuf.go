package schemareg

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Protobuf: the value is carrega read as Protobuf's JSON mapping
// (protojson: a field by its JSON name or its own, 64-bit integers as
// numbers or strings, an enum by name or number, bytes in base64, the
// well-known types in their JSON forms) into the first message of the
// schema, and written in Protobuf's binary encoding. The mapping is
// strict: a member the message does not have is refused, as is an enum
// name it does not know (left out, it would be lost without a word). In the wire format the message indexes
// follow the schema id: [0], the first message, is the single byte 0.

// protoFile is the name a schema's text is compiled under.
const protoFile = "schema.proto"

// protoMessage compiles text (a .proto file, its imports among Protobuf's
// well-known types) and returns its first message.
func protoMessage(text string) (protoreflect.MessageDescriptor, error) {
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{protoFile: text}),
	})}
	files, err := c.Compile(context.Background(), protoFile)
	if err != nil {
		return nil, fmt.Errorf("not a .proto file Protobuf compiles: %w", err)
	}
	msgs := files[0].Messages()
	if msgs.Len() == 0 {
		return nil, errors.New("the .proto file has no message")
	}
	return msgs.Get(0), nil
}

// protoOf reads data (JSON) into a message of md and writes it.
func protoOf(md protoreflect.MessageDescriptor, data []byte) ([]byte, error) {
	m := dynamicpb.NewMessage(md)
	if err := protojson.Unmarshal(data, m); err != nil {
		return nil, protoReason(err)
	}
	out, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, protoReason(err)
	}
	return out, nil
}

// protoField is the part of protojson's (or proto's) refusal that names
// the field and what is wrong, without the value it goes on to quote
// ("invalid value for int32 field n: \"x\"").
var protoField = regexp.MustCompile(`invalid value for \w+ field [\w.]+|required field [\w.]+ not set|(?:duplicate|unknown) field "?[\w.]+"?|invalid google\.protobuf\.\w+`)

// protoReason is a refusal without the value: the field and what is wrong
// with it, or no more than that it does not fit.
func protoReason(err error) error {
	if m := protoField.FindString(err.Error()); m != "" {
		return errors.New(m)
	}
	return errors.New("the value does not fit the message")
}
