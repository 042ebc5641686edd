package schemareg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hamba/avro/v2"
)

// Avro: the value is carrega read as JSON and written in Avro's binary
// encoding by the schema: JSON numbers become the field's int, long, float
// or double (an integer schema refuses a fraction), strings its string,
// bytes or enum symbol, objects its records and maps, arrays its arrays; a
// union takes the first of its branches the value fits (null for null); a
// field missing from the object takes its default, else the row is bad.
//
// The schema is compiled once into avroNodes; a row's JSON text is read
// where it lies, driven by them, and the binary written as it goes (a
// record's members are found first, then written in the schema's order).
// The bytes are hamba/avro's for the same value (arrays and maps in blocks
// of 100 with their byte sizes, a decimal in hamba's two's complement), as
// FuzzAvro checks against the encoder this one replaced.

// avroKind is what a node writes.
type avroKind uint8

const (
	avroNull avroKind = iota
	avroBoolean
	avroInt
	avroLong
	avroFloat
	avroDouble
	avroBytes
	avroString
	avroRecord
	avroEnum
	avroArray
	avroMap
	avroUnion
	avroOther // not written from JSON (fixed)
)

// avroBlock is hamba/avro's block length for arrays and maps.
const avroBlock = 100

// avroNode is a compiled schema.
type avroNode struct {
	kind    avroKind
	typ     avro.Type        // the schema's type, for errors
	logical avro.LogicalType // "" none
	scale   int              // decimal
	prec    int              // decimal
	want    string           // what a mismatch says the schema wants
	fields  []avroField      // record
	items   *avroNode        // array items, map values
	symbols []string         // enum
	// union: its branches but null, in order, each with the index hamba
	// writes it by; nullIndex -1 when null is not one of them.
	branches  []avroBranch
	nullIndex int
}

type avroField struct {
	name       string
	node       *avroNode
	hasDefault bool
	def        []byte // the default, written
	defRefused bool   // hamba/avro cannot write the default
}

type avroBranch struct {
	node    *avroNode
	index   int
	refused bool // hamba/avro does not find it by its name
}

// avroCodec writes JSON values by one Avro schema.
type avroCodec struct {
	root *avroNode
	pool sync.Pool // *avroWriter
}

// newAvroCodec compiles schema.
func newAvroCodec(schema avro.Schema) *avroCodec {
	c := &avroCodec{root: compileAvro(schema, map[string]*avroNode{})}
	c.pool.New = func() any { return new(avroWriter) }
	return c
}

// compileAvro compiles s; named are the records and enums compiled so
// far, by full name (a record may refer to itself).
func compileAvro(s avro.Schema, named map[string]*avroNode) *avroNode {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if n, ok := s.(avro.NamedSchema); ok {
		if done := named[n.FullName()]; done != nil {
			return done
		}
	}
	n := &avroNode{typ: s.Type(), want: string(s.Type()), nullIndex: -1}
	switch s := s.(type) {
	case *avro.RecordSchema:
		n.kind, n.want = avroRecord, "record "+s.FullName()
		named[s.FullName()] = n
		for _, f := range s.Fields() {
			af := avroField{name: f.Name(), node: compileAvro(f.Type(), named), hasDefault: f.HasDefault()}
			if af.hasDefault {
				af.def, af.defRefused = avroDefault(f)
			}
			n.fields = append(n.fields, af)
		}
	case *avro.EnumSchema:
		n.kind, n.want, n.symbols = avroEnum, "a symbol of enum "+s.FullName(), s.Symbols()
		named[s.FullName()] = n
	case *avro.ArraySchema:
		n.kind, n.want, n.items = avroArray, "an array", compileAvro(s.Items(), named)
	case *avro.MapSchema:
		n.kind, n.want, n.items = avroMap, "a map", compileAvro(s.Values(), named)
	case *avro.UnionSchema:
		n.kind, n.want = avroUnion, "one of "+s.String()
		if _, pos := s.Types().Get(string(avro.Null)); pos >= 0 {
			n.nullIndex = pos
		}
		for i, b := range s.Types() {
			if b.Type() == avro.Null {
				continue
			}
			_, pos := s.Types().Get(unionName(b))
			n.branches = append(n.branches, avroBranch{node: compileAvro(b, named), index: pos, refused: pos != i})
		}
	case *avro.PrimitiveSchema:
		n.kind = map[avro.Type]avroKind{avro.Null: avroNull, avro.Boolean: avroBoolean, avro.Int: avroInt, avro.Long: avroLong,
			avro.Float: avroFloat, avro.Double: avroDouble, avro.Bytes: avroBytes, avro.String: avroString}[s.Type()]
		if l := s.Logical(); l != nil {
			n.logical = l.Type()
			if d, ok := l.(*avro.DecimalLogicalSchema); ok {
				n.scale, n.prec = d.Scale(), d.Precision()
			}
		}
	default:
		n.kind = avroOther
	}
	return n
}

// avroDefault is f's default as hamba/avro writes it for a record that
// leaves f out, and whether it refuses to.
func avroDefault(f *avro.Field) ([]byte, bool) {
	def := f.Default()
	if u, ok := f.Type().(*avro.UnionSchema); ok {
		def = map[string]any{string(u.Types()[0].Type()): def}
	} else if def == nil {
		return nil, false
	}
	out, err := avro.Marshal(f.Type(), def)
	return out, err != nil
}

// unionName is the name hamba/avro finds a union's branch by.
func unionName(s avro.Schema) string {
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	if r, ok := s.(*avro.RefSchema); ok {
		return r.Schema().FullName()
	}
	if p, ok := s.(*avro.PrimitiveSchema); ok && p.Logical() != nil {
		return string(s.Type()) + "." + string(p.Logical().Type()) // "long.timestamp-millis"
	}
	return string(s.Type())
}

// avroWriter is one encoding's state, reused.
type avroWriter struct {
	data  []byte
	out   []byte
	path  []avroSeg  // where the value being written is
	spans []avroSpan // each record's members, found
	str   []byte     // a string unquoted
	trial int        // > 0: trying a union's branch, its errors unread
	refus bool       // hamba/avro would refuse the value (a default)
	hdr   [20]byte   // a block's header
	keys  []avroSpan // a map's members: key, value
}

// avroSeg is a step of a path: a record's field, an array's index or a
// map's key (its JSON text, unquoted only for an error).
type avroSeg struct {
	name     string
	key      avroSpan
	index    int
	isIndex  bool
	isMapKey bool
}

// avroSpan is where a value (or a key) lies in the text; from 0: none.
type avroSpan struct{ from, to int }

// errNoFit is the error of a union's branch being tried.
var errNoFit = errors.New("no fit")

// encode appends to dst data (JSON) written by the schema.
func (c *avroCodec) encode(dst, data []byte) ([]byte, error) {
	end, err := jsonCheck(data)
	if err != nil {
		return nil, fmt.Errorf("not JSON: %v", notJSON(data))
	}
	w := c.pool.Get().(*avroWriter)
	w.data, w.out, w.path, w.spans, w.trial, w.refus = data[:end], dst, w.path[:0], w.spans[:0], 0, false
	err = w.value(c.root, skipSpace(data, 0))
	out, refused := w.out, w.refus
	w.data, w.out = nil, nil
	c.pool.Put(w)
	if err != nil {
		return nil, err
	}
	if refused {
		return nil, errors.New("the Avro encoder refused the value")
	}
	return out, nil
}

// at is the path of the value being written ("" the root).
func (w *avroWriter) at() string {
	var b strings.Builder
	for _, s := range w.path {
		b.WriteByte('/')
		switch {
		case s.isIndex:
			b.WriteString(strconv.Itoa(s.index))
		case s.isMapKey:
			b.Write(appendUnquoted(nil, w.data[s.key.from:s.key.to]))
		default:
			b.WriteString(s.name)
		}
	}
	return b.String()
}

func (w *avroWriter) where() string {
	if at := w.at(); at != "" {
		return at
	}
	return "/"
}

// fail is an error at the value being written: "at <where>: <text>".
func (w *avroWriter) fail(format string, args ...any) error {
	if w.trial > 0 {
		return errNoFit
	}
	return fmt.Errorf("at %s: "+format, append([]any{w.where()}, args...)...)
}

func (w *avroWriter) mismatch(want string, p int) error {
	if w.trial > 0 {
		return errNoFit
	}
	return w.fail("the schema wants %s, the value is %s", want, jsonKindAt(w.data, p))
}

func (w *avroWriter) long(i int64) {
	w.out = binary.AppendUvarint(w.out, uint64(i)<<1^uint64(i>>63))
}

// value writes the value at w.data[p] by n.
func (w *avroWriter) value(n *avroNode, p int) error {
	data := w.data
	c := data[p]
	switch n.kind {
	case avroRecord:
		if c != '{' {
			return w.mismatch(n.want, p)
		}
		return w.record(n, p)
	case avroArray:
		if c != '[' {
			return w.mismatch(n.want, p)
		}
		return w.array(n, p)
	case avroMap:
		if c != '{' {
			return w.mismatch(n.want, p)
		}
		return w.mapValue(n, p)
	case avroUnion:
		return w.union(n, p)
	case avroEnum:
		if c != '"' {
			return w.mismatch(n.want, p)
		}
		s := w.unquote(p)
		for i, sym := range n.symbols {
			if sym == string(s) {
				w.long(int64(i))
				return nil
			}
		}
		return w.fail("not a symbol of enum %s", strings.TrimPrefix(n.want, "a symbol of enum "))
	case avroOther:
		return w.fail("the schema's %s is not written from JSON", n.typ)
	}
	if n.logical != "" {
		if done, err := w.logical(n, p); done || err != nil {
			return err
		}
	}
	return w.primitive(n, p)
}

// unquote is the string at w.data[p], read (valid until the next call).
func (w *avroWriter) unquote(p int) []byte {
	s := w.data[p:skipString(w.data, p)]
	if plainString(s) {
		return s[1 : len(s)-1]
	}
	w.str = appendUnquoted(w.str[:0], s)
	return w.str
}

func (w *avroWriter) primitive(n *avroNode, p int) error {
	c := w.data[p]
	switch n.kind {
	case avroNull:
		if c != 'n' {
			return w.mismatch("null", p)
		}
		return nil
	case avroBoolean:
		if c == 't' || c == 'f' {
			w.out = append(w.out, boolByte(c == 't'))
			return nil
		}
	case avroString, avroBytes:
		if c == '"' {
			s := w.unquote(p)
			w.long(int64(len(s)))
			w.out = append(w.out, s...)
			return nil
		}
	case avroInt, avroLong:
		if c == '-' || c >= '0' && c <= '9' {
			i, ok := parseJSONInt(w.data[p:skipValue(w.data, p)])
			if !ok {
				return w.mismatch(string(n.typ)+" (an integer)", p)
			}
			if n.kind == avroInt && int64(int32(i)) != i {
				return w.mismatch("int (32 bits)", p)
			}
			w.long(i)
			return nil
		}
	case avroFloat, avroDouble:
		if c == '-' || c >= '0' && c <= '9' {
			f, err := strconv.ParseFloat(string(w.data[p:skipValue(w.data, p)]), 64)
			if err != nil {
				return w.mismatch(string(n.typ), p)
			}
			if n.kind == avroFloat {
				w.out = binary.LittleEndian.AppendUint32(w.out, math.Float32bits(float32(f)))
			} else {
				w.out = binary.LittleEndian.AppendUint64(w.out, math.Float64bits(f))
			}
			return nil
		}
	}
	return w.mismatch(string(n.typ), p)
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// parseJSONInt is strconv.ParseInt(s, 10, 64) of a JSON number's text.
func parseJSONInt(s []byte) (int64, bool) {
	neg := s[0] == '-'
	if neg {
		s = s[1:]
	}
	var u uint64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false // a fraction or an exponent
		}
		if u > (math.MaxUint64-9)/10 {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return -int64(u), true
	}
	if u > math.MaxInt64 {
		return 0, false
	}
	return int64(u), true
}

// record writes the object at w.data[p] by the record n: its members are
// found (the last of a name counts, as encoding/json reads them), then
// written in the schema's order.
func (w *avroWriter) record(n *avroNode, p int) error {
	base := len(w.spans)
	for range n.fields {
		w.spans = append(w.spans, avroSpan{})
	}
	data := w.data
	for p = skipSpace(data, p+1); data[p] != '}'; {
		keyEnd := skipString(data, p)
		key := data[p:keyEnd]
		p = skipSpace(data, skipSpace(data, keyEnd)+1)
		end := skipValue(data, p)
		if i := n.field(key, w); i >= 0 {
			w.spans[base+i] = avroSpan{p, end}
		}
		if p = skipSpace(data, end); data[p] == ',' {
			p = skipSpace(data, p+1)
		}
	}
	var err error
	for i := range n.fields {
		f := &n.fields[i]
		sp := w.spans[base+i]
		if sp.to == 0 {
			if f.hasDefault {
				w.out = append(w.out, f.def...)
				w.refus = w.refus || f.defRefused
				continue
			}
			if w.trial > 0 {
				err = errNoFit
			} else {
				err = fmt.Errorf("at %s/%s: required by the schema, missing", strings.TrimSuffix(w.at(), "/"), f.name)
			}
			break
		}
		w.path = append(w.path, avroSeg{name: f.name})
		err = w.value(f.node, sp.from)
		w.path = w.path[:len(w.path)-1]
		if err != nil {
			break
		}
	}
	w.spans = w.spans[:base]
	return err
}

// field is the index of the field named key (a JSON string), or -1.
func (n *avroNode) field(key []byte, w *avroWriter) int {
	name := key[1 : len(key)-1]
	if !plainString(key) {
		w.str = appendUnquoted(w.str[:0], key)
		name = w.str
	}
	for i := range n.fields {
		if n.fields[i].name == string(name) {
			return i
		}
	}
	return -1
}

// block writes the items written since from as one of hamba/avro's
// blocks: its count (negative) and byte size first, or the count alone
// when they take no byte.
func (w *avroWriter) block(from int, count int64) {
	size := int64(len(w.out) - from)
	h := w.hdr[:0]
	if size > 0 {
		h = binary.AppendUvarint(h, uint64(-count)<<1^uint64(-count>>63))
		h = binary.AppendUvarint(h, uint64(size)<<1)
	} else {
		h = binary.AppendUvarint(h, uint64(count)<<1)
	}
	w.out = append(w.out, h...)
	copy(w.out[from+len(h):], w.out[from:from+int(size)])
	copy(w.out[from:], h)
}

func (w *avroWriter) array(n *avroNode, p int) error {
	data := w.data
	w.path = append(w.path, avroSeg{isIndex: true})
	seg := len(w.path) - 1
	from, count := len(w.out), int64(0)
	var err error
	for p, i := skipSpace(data, p+1), 0; data[p] != ']'; i++ {
		w.path[seg].index = i
		if err = w.value(n.items, p); err != nil {
			break
		}
		if count++; count == avroBlock {
			w.block(from, count)
			from, count = len(w.out), 0
		}
		if p = skipSpace(data, skipValue(data, p)); data[p] == ',' {
			p = skipSpace(data, p+1)
		}
	}
	w.path = w.path[:seg]
	if err == nil {
		w.lastBlocks(from, count)
	}
	return err
}

// lastBlocks ends an array's or a map's blocks: the one open (from, with
// count items), then the empty one.
func (w *avroWriter) lastBlocks(from int, count int64) {
	if count > 0 {
		w.block(from, count)
	}
	w.out = append(w.out, 0)
}

// mapValue writes the object at w.data[p] by the map n: each name once,
// with its last value (as encoding/json reads an object).
func (w *avroWriter) mapValue(n *avroNode, p int) error {
	data := w.data
	base := len(w.keys)
	for p = skipSpace(data, p+1); data[p] != '}'; {
		keyEnd := skipString(data, p)
		key := avroSpan{p, keyEnd}
		p = skipSpace(data, skipSpace(data, keyEnd)+1)
		end := skipValue(data, p)
		dup := false
		for i := base; i < len(w.keys); i += 2 {
			if sameKey(data[w.keys[i].from:w.keys[i].to], data[key.from:key.to]) {
				w.keys[i+1], dup = avroSpan{p, end}, true
			}
		}
		if !dup {
			w.keys = append(w.keys, key, avroSpan{p, end})
		}
		if p = skipSpace(data, end); data[p] == ',' {
			p = skipSpace(data, p+1)
		}
	}
	from, count := len(w.out), int64(0)
	var err error
	for i := base; i < len(w.keys); i += 2 {
		k, v := w.keys[i], w.keys[i+1]
		s := w.unquote(k.from)
		w.long(int64(len(s)))
		w.out = append(w.out, s...)
		w.path = append(w.path, avroSeg{isMapKey: true, key: k})
		err = w.value(n.items, v.from)
		w.path = w.path[:len(w.path)-1]
		if err != nil {
			break
		}
		if count++; count == avroBlock {
			w.block(from, count)
			from, count = len(w.out), 0
		}
	}
	w.keys = w.keys[:base]
	if err == nil {
		w.lastBlocks(from, count)
	}
	return err
}

// sameKey: the JSON strings a and b read the same.
func sameKey(a, b []byte) bool {
	if plainString(a) && plainString(b) {
		return string(a) == string(b)
	}
	return string(appendUnquoted(nil, a)) == string(appendUnquoted(nil, b))
}

// union writes the value at w.data[p] by the first branch of n it fits.
func (w *avroWriter) union(n *avroNode, p int) error {
	if w.data[p] == 'n' {
		if n.nullIndex < 0 {
			return w.mismatch(n.want, p)
		}
		w.long(int64(n.nullIndex))
		return nil
	}
	mark, refus := len(w.out), w.refus
	for _, b := range n.branches {
		w.long(int64(b.index))
		w.trial++
		err := w.value(b.node, p)
		w.trial--
		if err == nil {
			w.refus = w.refus || b.refused
			return nil
		}
		w.out, w.refus = w.out[:mark], refus
	}
	return w.mismatch(n.want, p)
}

// logical writes the value at w.data[p] by n's logical type when it is in
// one of the type's JSON forms that are not its underlying type's: a
// timestamp as RFC 3339 text (or PostgreSQL's "2026-12-05 10:00:00+01"),
// a date as YYYY-MM-DD, a time of day as HH:MM:SS[.ffffff], a decimal as
// a number or its text, exactly within the schema's scale. done false:
// the value is the underlying type's form (a number of milliseconds, ...).
// The error names where and what, never the value.
func (w *avroWriter) logical(n *avroNode, p int) (done bool, err error) {
	c := w.data[p]
	switch l := n.logical; l {
	case avro.TimestampMillis, avro.TimestampMicros, avro.LocalTimestampMillis, avro.LocalTimestampMicros:
		if c != '"' {
			return false, nil
		}
		t, err := parseTimestamp(string(w.unquote(p)), l == avro.LocalTimestampMillis || l == avro.LocalTimestampMicros)
		if err != nil {
			return true, w.fail("the schema wants %s, an RFC 3339 time or a number; the value is a string that is neither", l)
		}
		if l == avro.TimestampMillis || l == avro.LocalTimestampMillis {
			w.long(t.UnixMilli())
		} else {
			w.long(t.UnixMicro())
		}
		return true, nil
	case avro.Date:
		if c != '"' {
			return false, nil
		}
		t, err := time.Parse(time.DateOnly, string(w.unquote(p)))
		if err != nil {
			return true, w.fail("the schema wants a date, YYYY-MM-DD or a number of days; the value is a string that is neither")
		}
		w.long(int64(int32(t.Unix() / 86400)))
		return true, nil
	case avro.TimeMillis, avro.TimeMicros:
		if c != '"' {
			return false, nil
		}
		t, err := time.Parse("15:04:05.999999", string(w.unquote(p)))
		if err != nil {
			return true, w.fail("the schema wants %s, HH:MM:SS[.ffffff] or a number; the value is a string that is neither", l)
		}
		d := t.Sub(time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC))
		if l == avro.TimeMillis {
			w.long(int64(int32(d.Milliseconds())))
		} else {
			w.long(d.Microseconds())
		}
		return true, nil
	case avro.Decimal:
		var text string
		switch {
		case c == '"':
			text = string(w.unquote(p))
		case c == '-' || c >= '0' && c <= '9':
			text = string(w.data[p:skipValue(w.data, p)])
		default:
			return true, w.fail("the schema wants a decimal, a number or its text; the value is %s", jsonKindAt(w.data, p))
		}
		return true, w.decimal(n, text)
	}
	return false, nil
}

// decimal writes text (a number) as the decimal n: its unscaled value in
// hamba/avro's two's complement bytes.
func (w *avroWriter) decimal(n *avroNode, text string) error {
	r, ok := new(big.Rat).SetString(text)
	if !ok {
		return w.fail("the schema wants a decimal, a number or its text; the value is a string that is not")
	}
	scaled := new(big.Rat).Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(n.scale)), nil)))
	if !scaled.IsInt() {
		return w.fail("more decimal places than the schema's scale %d", n.scale)
	}
	i := scaled.Num()
	if len(new(big.Int).Abs(i).String()) > n.prec {
		return w.fail("more digits than the schema's precision %d", n.prec)
	}
	var b []byte
	switch i.Sign() {
	case 0:
		b = []byte{0}
	case 1:
		b = i.Bytes()
		if b[0]&0x80 > 0 {
			b = append([]byte{0}, b...)
		}
	case -1:
		length := uint(i.BitLen()/8+1) * 8
		b = new(big.Int).Add(i, new(big.Int).Lsh(big.NewInt(1), length)).Bytes()
	}
	w.long(int64(len(b)))
	w.out = append(w.out, b...)
	return nil
}

// parseTimestamp reads RFC 3339, or PostgreSQL's text of a timestamptz;
// local (a local-timestamp) also takes either without an offset.
func parseTimestamp(s string, local bool) (time.Time, error) {
	layouts := [...]string{time.RFC3339Nano, "2006-01-02 15:04:05.999999Z07", "2006-01-02 15:04:05.999999Z07:00",
		"2006-01-02T15:04:05.999999", "2006-01-02 15:04:05.999999"}
	n := 3
	if local {
		n = len(layouts)
	}
	var err error
	for _, layout := range layouts[:n] {
		var t time.Time
		if t, err = time.Parse(layout, s); err == nil {
			if local {
				// A local timestamp counts from the epoch in its own
				// wall clock: the offset is not applied.
				t = time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
			}
			return t, nil
		}
	}
	return time.Time{}, err
}
