package schemareg

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The Protobuf fast path: a row in the common forms of Protobuf's JSON
// mapping (a member by its JSON or its own name, once; integers as JSON
// integers or their text, floats as numbers, enums by name or number,
// null for unset) of a proto3 message of scalars, strings, enums, nested
// messages and repeated fields is written from its JSON text where it
// lies, fields in number order, packed where the field is, zero values
// left out: the bytes protojson and proto.Marshal (deterministic) write
// for it. Anything else, a row it does not take (a refusal, an
// exponent, base64 bytes, a well-known type, a map, a oneof, proto2),
// goes to protoOf, which owns every verdict the fast path does not give:
// the fast path never refuses a row. FuzzProtobuf checks both agree.

// protoMsg is a message the fast path writes, compiled.
type protoMsg struct {
	fields []protoFieldW // by number
}

type protoFieldW struct {
	jsonName, name string
	num            protowire.Number
	kind           protoreflect.Kind
	list, packed   bool
	msg            *protoMsg                         // a message field's
	enum           protoreflect.EnumValueDescriptors // an enum field's
}

// protoFast writes by one message.
type protoFast struct {
	root *protoMsg
	pool sync.Pool // *protoWriter
}

// newProtoFast compiles md, or nil when the fast path does not take its
// messages.
func newProtoFast(md protoreflect.MessageDescriptor) *protoFast {
	root := compileProto(md, map[protoreflect.FullName]*protoMsg{})
	if root == nil {
		return nil
	}
	f := &protoFast{root: root}
	f.pool.New = func() any { return new(protoWriter) }
	return f
}

// compileProto compiles md; nil when the fast path does not take it.
// done are the messages compiled so far (a message may hold itself).
func compileProto(md protoreflect.MessageDescriptor, done map[protoreflect.FullName]*protoMsg) *protoMsg {
	if m, ok := done[md.FullName()]; ok {
		return m
	}
	if md.Syntax() != protoreflect.Proto3 || md.FullName().Parent() == "google.protobuf" || md.Oneofs().Len() > 0 || md.ExtensionRanges().Len() > 0 {
		return nil
	}
	m := &protoMsg{}
	done[md.FullName()] = m
	fds := md.Fields()
	for i := range fds.Len() {
		fd := fds.Get(i)
		if fd.IsMap() || fd.IsExtension() {
			return nil
		}
		f := protoFieldW{jsonName: fd.JSONName(), name: string(fd.Name()), num: fd.Number(), kind: fd.Kind(), list: fd.IsList(), packed: fd.IsPacked()}
		switch fd.Kind() {
		case protoreflect.BytesKind, protoreflect.GroupKind:
			return nil
		case protoreflect.MessageKind:
			if f.msg = compileProto(fd.Message(), done); f.msg == nil {
				return nil
			}
		case protoreflect.EnumKind:
			if fd.Enum().FullName().Parent() == "google.protobuf" {
				return nil // NullValue reads null
			}
			f.enum = fd.Enum().Values()
		}
		m.fields = append(m.fields, f)
	}
	slices.SortFunc(m.fields, func(a, b protoFieldW) int { return cmp.Compare(a.num, b.num) })
	return m
}

// protoWriter is one encoding's state, reused.
type protoWriter struct {
	data  []byte
	out   []byte
	spans []avroSpan // each message's members, found
	str   []byte
}

// encode appends data written by the message to dst; ok false when the
// fast path does not take data (dst's bytes past its length are then
// undefined).
func (f *protoFast) encode(dst, data []byte) ([]byte, bool) {
	end, err := jsonCheck(data)
	if err != nil || skipSpace(data, end) != len(data) {
		return nil, false
	}
	w := f.pool.Get().(*protoWriter)
	w.data, w.out, w.spans = data[:end], dst, w.spans[:0]
	p := skipSpace(data, 0)
	ok := data[p] == '{' && w.message(f.root, p)
	out := w.out
	w.data, w.out = nil, nil
	f.pool.Put(w)
	return out, ok
}

// message writes the members of the object at w.data[p].
func (w *protoWriter) message(m *protoMsg, p int) bool {
	base := len(w.spans)
	for range m.fields {
		w.spans = append(w.spans, avroSpan{})
	}
	data := w.data
	ok := true
	for p = skipSpace(data, p+1); data[p] != '}'; {
		keyEnd := skipString(data, p)
		key := data[p+1 : keyEnd-1]
		p = skipSpace(data, skipSpace(data, keyEnd)+1)
		end := skipValue(data, p)
		i := m.field(key)
		if i < 0 || w.spans[base+i].to != 0 {
			ok = false // unknown, escaped or named twice: protoOf's to say
			break
		}
		w.spans[base+i] = avroSpan{p, end}
		if p = skipSpace(data, end); data[p] == ',' {
			p = skipSpace(data, p+1)
		}
	}
	for i := range m.fields {
		if !ok {
			break
		}
		if sp := w.spans[base+i]; sp.to != 0 && data[sp.from] != 'n' {
			ok = w.field(&m.fields[i], sp.from)
		}
	}
	w.spans = w.spans[:base]
	return ok
}

// field is the index of the field key (a JSON string's text) names, by
// its JSON name or its own, or -1 (escapes are left to protoOf).
func (m *protoMsg) field(key []byte) int {
	for _, c := range key {
		if c == '\\' {
			return -1
		}
	}
	for i := range m.fields {
		if m.fields[i].jsonName == string(key) {
			return i
		}
	}
	for i := range m.fields {
		if m.fields[i].name == string(key) {
			return i
		}
	}
	return -1
}

// field writes f's value at w.data[p] (not null).
func (w *protoWriter) field(f *protoFieldW, p int) bool {
	data := w.data
	if !f.list {
		return w.singular(f, p, false)
	}
	if data[p] != '[' {
		return false
	}
	from := -1
	if f.packed {
		w.out = protowire.AppendTag(w.out, f.num, protowire.BytesType)
		from = len(w.out)
	}
	for p = skipSpace(data, p+1); data[p] != ']'; {
		if data[p] == 'n' || !w.singular(f, p, true) {
			return false // a null element is refused
		}
		if p = skipSpace(data, skipValue(data, p)); data[p] == ',' {
			p = skipSpace(data, p+1)
		}
	}
	if from >= 0 {
		if len(w.out) == from {
			w.out = w.out[:from-protowire.SizeTag(f.num)] // none: no field
		} else {
			w.length(from)
		}
	}
	return true
}

// length puts before w.out[from:] its length.
func (w *protoWriter) length(from int) {
	n := len(w.out) - from
	var h [binary.MaxVarintLen64]byte
	l := binary.PutUvarint(h[:], uint64(n))
	w.out = append(w.out, h[:l]...)
	copy(w.out[from+l:], w.out[from:from+n])
	copy(w.out[from:], h[:l])
}

// singular writes one value of f at w.data[p]: in a list (item), always
// and without its tag when packed; else with its tag, unless it is the
// zero value.
func (w *protoWriter) singular(f *protoFieldW, p int, item bool) bool {
	data := w.data
	tagged := !item || !f.packed
	tag := func(t protowire.Type) {
		if tagged {
			w.out = protowire.AppendTag(w.out, f.num, t)
		}
	}
	switch f.kind {
	case protoreflect.MessageKind:
		if data[p] != '{' {
			return false
		}
		tag(protowire.BytesType)
		from := len(w.out)
		if !w.message(f.msg, p) {
			return false
		}
		w.length(from)
		return true
	case protoreflect.StringKind:
		if data[p] != '"' {
			return false
		}
		s, ok := w.utf8String(p)
		if !ok {
			return false
		}
		if len(s) > 0 || item {
			tag(protowire.BytesType)
			w.out = protowire.AppendBytes(w.out, s)
		}
		return true
	case protoreflect.BoolKind:
		if data[p] != 't' && data[p] != 'f' {
			return false
		}
		if data[p] == 't' || item {
			tag(protowire.VarintType)
			w.out = append(w.out, boolByte(data[p] == 't'))
		}
		return true
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		if data[p] != '-' && (data[p] < '0' || data[p] > '9') {
			return false
		}
		bits := 64
		if f.kind == protoreflect.FloatKind {
			bits = 32
		}
		v, err := strconv.ParseFloat(string(data[p:skipValue(data, p)]), bits)
		if err != nil {
			return false
		}
		if math.Float64bits(v) == 0 && !item {
			return true
		}
		if bits == 32 {
			tag(protowire.Fixed32Type)
			w.out = protowire.AppendFixed32(w.out, math.Float32bits(float32(v)))
		} else {
			tag(protowire.Fixed64Type)
			w.out = protowire.AppendFixed64(w.out, math.Float64bits(v))
		}
		return true
	case protoreflect.EnumKind:
		var n int64
		switch {
		case data[p] == '"':
			s := data[p+1 : skipString(data, p)-1]
			v := f.enum.ByName(protoreflect.Name(s)) // an escaped name is not found: protoOf's
			if v == nil {
				return false
			}
			n = int64(v.Number())
		case data[p] == '-' || data[p] >= '0' && data[p] <= '9':
			var ok bool
			if n, ok = integer(data[p:skipValue(data, p)], true, 32); !ok {
				return false
			}
		default:
			return false
		}
		if n != 0 || item {
			tag(protowire.VarintType)
			w.out = protowire.AppendVarint(w.out, uint64(n))
		}
		return true
	}
	signed := f.kind != protoreflect.Uint32Kind && f.kind != protoreflect.Uint64Kind &&
		f.kind != protoreflect.Fixed32Kind && f.kind != protoreflect.Fixed64Kind
	bits := 64
	switch f.kind {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		bits = 32
	}
	var tok []byte
	switch {
	case data[p] == '"':
		tok = data[p+1 : skipString(data, p)-1] // an integer's text
	case data[p] == '-' || data[p] >= '0' && data[p] <= '9':
		tok = data[p:skipValue(data, p)]
	default:
		return false
	}
	n, ok := integer(tok, signed, bits)
	if !ok {
		return false
	}
	if n == 0 && !item {
		return true
	}
	switch f.kind {
	case protoreflect.Sint32Kind, protoreflect.Sint64Kind:
		tag(protowire.VarintType)
		w.out = protowire.AppendVarint(w.out, protowire.EncodeZigZag(n))
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind:
		tag(protowire.Fixed32Type)
		w.out = protowire.AppendFixed32(w.out, uint32(n))
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind:
		tag(protowire.Fixed64Type)
		w.out = protowire.AppendFixed64(w.out, uint64(n))
	default:
		tag(protowire.VarintType)
		w.out = protowire.AppendVarint(w.out, uint64(n))
	}
	return true
}

// integer reads tok, an integer's JSON text: -?(0|[1-9][0-9]*) ("-0"
// left out), within bits (unsigned: not negative). An unsigned 64-bit
// value above MaxInt64 comes back as its bits.
func integer(tok []byte, signed bool, bits int) (int64, bool) {
	neg := len(tok) > 0 && tok[0] == '-'
	if neg {
		if !signed {
			return 0, false
		}
		tok = tok[1:]
	}
	if len(tok) == 0 || tok[0] == '0' && (len(tok) > 1 || neg) {
		return 0, false
	}
	var u uint64
	for _, c := range tok {
		if c < '0' || c > '9' || u > (math.MaxUint64-9)/10 {
			return 0, false // a fraction, an exponent, or too long
		}
		u = u*10 + uint64(c-'0')
	}
	switch {
	case !signed && bits == 32:
		return int64(u), u <= math.MaxUint32
	case !signed:
		return int64(u), true
	case neg && bits == 32:
		return -int64(u), u <= 1<<31
	case neg:
		return -int64(u), u <= 1<<63
	case bits == 32:
		return int64(u), u <= math.MaxInt32
	}
	return int64(u), u <= math.MaxInt64
}

// utf8String is the string at w.data[p], read; ok false for an escape
// of a surrogate or invalid UTF-8 (protojson refuses them, or reads them
// otherwise).
func (w *protoWriter) utf8String(p int) ([]byte, bool) {
	s := w.data[p:skipString(w.data, p)]
	if plainString(s) {
		return s[1 : len(s)-1], true
	}
	in := s[1 : len(s)-1]
	for i := 0; i < len(in); i++ {
		if in[i] == '\\' && in[i+1] == 'u' {
			if r := hex4(in[i+2:]); r >= 0xD800 && r < 0xE000 {
				return nil, false
			}
		}
		if in[i] == '\\' {
			i++
		}
	}
	if !utf8.Valid(in) {
		return nil, false
	}
	w.str = appendUnquoted(w.str[:0], s)
	return w.str, true
}
