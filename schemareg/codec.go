package schemareg

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/hamba/avro/v2"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Subject name strategies (Confluent's TopicNameStrategy,
// RecordNameStrategy and TopicRecordNameStrategy).
const (
	StrategyTopic       = "topic"
	StrategyRecord      = "record"
	StrategyTopicRecord = "topic_record"
)

// The formats written: JSON Schema (the value is carrega, validated), Avro
// (carrega written in Avro's binary encoding by the schema) and Protobuf
// (carrega read by Protobuf's JSON mapping into the schema's first message
// and written in Protobuf's binary encoding).
const (
	FormatJSONSchema = "json_schema"
	FormatAvro       = "avro"
	FormatProtobuf   = "protobuf"
)

// SchemaType is the registry's name of a format's schemas.
func SchemaType(format string) string {
	switch format {
	case FormatAvro:
		return "AVRO"
	case FormatProtobuf:
		return "PROTOBUF"
	}
	return "JSON"
}

// Spec is a route's schema settings.
type Spec struct {
	Format       string // FormatJSONSchema ("" too) or FormatAvro
	Strategy     string // StrategyTopic ("" too), StrategyRecord or StrategyTopicRecord
	AutoRegister bool
	// Schemas: a schema per tipus, or per tipus/versio, each the text of a
	// schema of Format; none: the subject's registered schema (Version: 0 the
	// latest, or that version) for every row.
	Schemas map[string]string
	Version int
}

// Codec writes one route's values: each validated against its schema and
// prefixed with the schema's id. Its schemas were found (or registered)
// once; writing asks the registry nothing.
type Codec struct {
	only  *entry            // the one schema of every row
	byKey map[string]*entry // by tipus/versio, then tipus
}

type entry struct {
	subject string
	id      int
	version int
	schema  *jsonschema.Schema // json_schema
	// jsonFast passes schema's rows it can tell valid from their text;
	// nil when it can tell none.
	jsonFast *jsonFast
	avro     *avroCodec                     // avro
	proto    protoreflect.MessageDescriptor // protobuf: the schema's first message
	// protoFast writes proto's rows in the common forms; nil when it
	// does not take proto's messages.
	protoFast *protoFast
	// prefix is what comes before the encoded value: the wire format's
	// magic byte and id, and for Protobuf the message indexes ([0]: 0).
	prefix []byte
	// uri is the schema's address in the registry (a CloudEvent's
	// dataschema), contentType the media type of the values it writes.
	uri, contentType []byte
}

// Identity names the schemas c writes by, by their ids in the registry:
// what decides which rows pass (the restart de-duplication's stream
// identity covers it).
func (c *Codec) Identity() string {
	if c.only != nil {
		return strconv.Itoa(c.only.id)
	}
	keys := slices.Sorted(maps.Keys(c.byKey))
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d;", k, c.byKey[k].id)
	}
	return b.String()
}

// contentTypes are the media types of the formats' values.
var contentTypes = map[string]string{FormatJSONSchema: "application/json", "": "application/json", FormatAvro: "application/avro", FormatProtobuf: "application/protobuf"}

// Resolve finds each schema of spec under its subject (registering it with
// AutoRegister), or reads the subject's, for a route whose topic is topic.
// A Permanent error is the configuration's to fix; any other is an outage.
func Resolve(ctx context.Context, c *Client, topic string, spec Spec) (*Codec, error) {
	if len(spec.Schemas) == 0 {
		subject := topic + "-value"
		r, err := c.Version(ctx, subject, spec.Version)
		if err != nil {
			return nil, err
		}
		e, err := newEntry(spec.Format, r)
		if err != nil {
			return nil, permanent(err)
		}
		e.describe(c, spec.Format)
		return &Codec{only: e}, nil
	}
	codec := &Codec{byKey: map[string]*entry{}}
	keys := make([]string, 0, len(spec.Schemas))
	for k := range spec.Schemas {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		text := spec.Schemas[key]
		subject, err := Subject(spec.Format, spec.Strategy, topic, key, text)
		if err != nil {
			return nil, permanent(fmt.Errorf("schema of %s: %w", key, err))
		}
		r, err := c.find(ctx, subject, text, SchemaType(spec.Format), spec.AutoRegister, "the schema of "+key)
		if err != nil {
			return nil, err
		}
		// Found as asked: the file's text, of the route's format (the
		// answer may leave the type out).
		r.Schema, r.SchemaType = text, SchemaType(spec.Format)
		e, err := newEntry(spec.Format, r)
		if err != nil {
			return nil, permanent(fmt.Errorf("schema of %s: %w", key, err))
		}
		e.describe(c, spec.Format)
		codec.byKey[key] = e
	}
	return codec, nil
}

// find registers text (of type typ) under subject when autoRegister, then
// looks it up there; what names it in the error when it is not registered.
func (c *Client) find(ctx context.Context, subject, text, typ string, autoRegister bool, what string) (Registered, error) {
	if autoRegister {
		if _, err := c.Register(ctx, subject, text, typ); err != nil {
			return Registered{}, err
		}
	}
	r, err := c.Lookup(ctx, subject, text, typ)
	var re *Error
	if errors.As(err, &re) && re.Status == 404 {
		return r, fmt.Errorf("%w; %s is not registered under subject %q: register it, or set schema.auto_register: true", err, what, subject)
	}
	return r, err
}

// wirePrefix is the wire format's magic byte and schema id.
func wirePrefix(id int) [5]byte {
	var p [5]byte
	binary.BigEndian.PutUint32(p[1:], uint32(id))
	return p
}

// Subject names the subject of the schema of key (tipus or tipus/versio)
// on a route to topic: the record name is a JSON Schema's title, an Avro
// schema's full name or a Protobuf schema's first message's, else the
// tipus.
func Subject(format, strategy, topic, key, text string) (string, error) {
	if strategy == "" || strategy == StrategyTopic {
		return topic + "-value", nil
	}
	if format == FormatProtobuf {
		md, err := protoMessage(text)
		if err != nil {
			return "", err
		}
		if strategy == StrategyRecord {
			return string(md.FullName()), nil
		}
		return topic + "-" + string(md.FullName()), nil
	}
	var doc struct {
		Title     string `json:"title"`
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	}
	if err := json.Unmarshal([]byte(text), &doc); err != nil {
		return "", fmt.Errorf("not JSON: %w", err)
	}
	record := doc.Title
	if format == FormatAvro {
		record = doc.Name
		if doc.Namespace != "" && !strings.Contains(doc.Name, ".") {
			record = doc.Namespace + "." + doc.Name
		}
	}
	if record == "" {
		record, _, _ = strings.Cut(key, "/")
	}
	if strategy == StrategyRecord {
		return record, nil
	}
	return topic + "-" + record, nil
}

// describe names e's schema by its id in c's registry (Confluent's GET
// /schemas/ids/<id>).
func (e *entry) describe(c *Client, format string) {
	e.uri = []byte(c.base + "/schemas/ids/" + strconv.Itoa(e.id))
	e.contentType = []byte(contentTypes[format])
}

func newEntry(format string, r Registered) (*entry, error) {
	typ := r.SchemaType
	if typ == "" {
		typ = "AVRO" // the registry's default, which it leaves out
	}
	if typ != SchemaType(format) {
		return nil, fmt.Errorf("subject %q version %d is a %s schema, and the route's format is %s", r.Subject, r.Version, typ, formatName(format))
	}
	prefix := wirePrefix(r.ID)
	e := &entry{subject: r.Subject, id: r.ID, version: r.Version, prefix: prefix[:]}
	if format == FormatProtobuf {
		md, err := protoMessage(r.Schema)
		if err != nil {
			return nil, fmt.Errorf("subject %q version %d: %w", r.Subject, r.Version, err)
		}
		e.proto, e.protoFast = md, newProtoFast(md)
		e.prefix = append(e.prefix, 0) // message indexes [0]: the first message
		return e, nil
	}
	if format == FormatAvro {
		sch, err := avro.Parse(r.Schema)
		if err != nil {
			return nil, fmt.Errorf("subject %q version %d: %w", r.Subject, r.Version, err)
		}
		e.avro = newAvroCodec(sch)
		return e, nil
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(r.Schema))
	if err != nil {
		return nil, fmt.Errorf("subject %q version %d: the schema is not JSON: %w", r.Subject, r.Version, err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7) // Confluent's JSON Schema default
	loc := fmt.Sprintf("registry:///%s/%d.json", r.Subject, r.ID)
	if err := c.AddResource(loc, doc); err != nil {
		return nil, err
	}
	sch, err := c.Compile(loc)
	if err != nil {
		return nil, fmt.Errorf("subject %q version %d: %w", r.Subject, r.Version, err)
	}
	e.schema, e.jsonFast = sch, newJSONFast(sch)
	return e, nil
}

func formatName(format string) string {
	if format == "" {
		return FormatJSONSchema
	}
	return format
}

// Encode appends to dst the wire-format value of data (a JSON value): the
// schema's magic byte and id, then data. The schema is that of tipus/versio,
// else of tipus, else the only one. An error says why data cannot be
// written, by where it fails the schema and which keyword, never by what
// it holds.
func (c *Codec) Encode(dst, data, tipus []byte, versio int64) ([]byte, error) {
	e := c.entry(tipus, versio)
	if e == nil {
		return nil, fmt.Errorf("no schema for tipus %q (versio %d) in the route's schema.schemas", tipus, versio)
	}
	if e.avro != nil {
		out, err := e.avro.encode(append(dst, e.prefix...), data)
		if err != nil {
			return nil, fmt.Errorf("cannot be written by the schema of subject %q version %d (id %d): %v", e.subject, e.version, e.id, err)
		}
		return out, nil
	}
	if e.proto != nil {
		if e.protoFast != nil {
			if out, ok := e.protoFast.encode(append(dst, e.prefix...), data); ok {
				return out, nil
			}
		}
		enc, err := protoOf(e.proto, data)
		if err != nil {
			return nil, fmt.Errorf("cannot be written by the schema of subject %q version %d (id %d): %v", e.subject, e.version, e.id, err)
		}
		dst = append(dst, e.prefix...)
		return append(dst, enc...), nil
	}
	if e.jsonFast != nil && e.jsonFast.valid(data) {
		return append(append(dst, e.prefix...), data...), nil
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %v", err)
	}
	if err := e.schema.Validate(v); err != nil {
		return nil, fmt.Errorf("does not match the schema of subject %q version %d (id %d): %s", e.subject, e.version, e.id, where(err))
	}
	dst = append(dst, e.prefix...)
	return append(dst, data...), nil
}

// entry is the schema of tipus/versio, else of tipus, else the only one;
// nil when none.
func (c *Codec) entry(tipus []byte, versio int64) *entry {
	if c.only != nil {
		return c.only
	}
	// tipus/versio built on the stack: Encode and Describe both look it
	// up for every record, and a map index by string(bytes) copies nothing.
	var buf [64]byte
	key := strconv.AppendInt(append(append(buf[:0], tipus...), '/'), versio, 10)
	if e := c.byKey[string(key)]; e != nil {
		return e
	}
	return c.byKey[string(tipus)]
}

// Describe is the URI in the registry of the schema Encode writes
// tipus/versio with, and the media type of its values; nil when there is
// none.
func (c *Codec) Describe(tipus []byte, versio int64) (dataschema, contentType []byte) {
	e := c.entry(tipus, versio)
	if e == nil {
		return nil, nil
	}
	return e.uri, e.contentType
}

// where is the first leaf of a validation error: the value's location and
// the failing keyword, without the value.
func where(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return "invalid"
	}
	for len(ve.Causes) > 0 {
		ve = ve.Causes[0]
	}
	loc := "/" + strings.Join(ve.InstanceLocation, "/")
	kw := "schema"
	if p := ve.ErrorKind.KeywordPath(); len(p) > 0 {
		kw = strings.Join(p, "/")
	}
	return fmt.Sprintf("at %s: fails %q", loc, kw)
}
