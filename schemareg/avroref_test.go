package schemareg

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
)

// Avro: the value is carrega read as JSON and written in Avro's binary
// encoding by the schema: JSON numbers become the field's int, long, float
// or double (an integer schema refuses a fraction), strings its string,
// bytes or enum symbol, objects its records and maps, arrays its arrays; a
// union takes the first of its branches the value fits (null for null); a
// field missing from the object takes its default, else the row is bad.

// refAvroOf is the encoder avroCodec replaced, kept as the fuzz tests'
// reference: it reads data (JSON) into Go values and has hamba/avro write
// them by schema.
func refAvroOf(schema avro.Schema, data []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not JSON: %v", err)
	}
	native, err := avroNative(schema, v, "")
	if err != nil {
		return nil, err
	}
	out, err := avro.Marshal(schema, native)
	if err != nil {
		// Its message may quote the value: not repeated.
		return nil, errors.New("the Avro encoder refused the value")
	}
	return out, nil
}

// avroNative is v as hamba/avro encodes it by s; at is where v is, for the
// error (which never says what v holds).
func avroNative(s avro.Schema, v any, at string) (any, error) {
	where := at
	if where == "" {
		where = "/"
	}
	mismatch := func(want string) error {
		return fmt.Errorf("at %s: the schema wants %s, the value is %s", where, want, jsonKind(v))
	}
	switch s := s.(type) {
	case *avro.RefSchema:
		return avroNative(s.Schema(), v, at)
	case *avro.RecordSchema:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, mismatch("record " + s.FullName())
		}
		out := make(map[string]any, len(s.Fields()))
		for _, f := range s.Fields() {
			fv, ok := m[f.Name()]
			if !ok {
				if f.HasDefault() {
					continue
				}
				return nil, fmt.Errorf("at %s/%s: required by the schema, missing", strings.TrimSuffix(at, "/"), f.Name())
			}
			nv, err := avroNative(f.Type(), fv, at+"/"+f.Name())
			if err != nil {
				return nil, err
			}
			out[f.Name()] = nv
		}
		return out, nil
	case *avro.ArraySchema:
		a, ok := v.([]any)
		if !ok {
			return nil, mismatch("an array")
		}
		out := make([]any, len(a))
		for i, item := range a {
			nv, err := avroNative(s.Items(), item, fmt.Sprintf("%s/%d", at, i))
			if err != nil {
				return nil, err
			}
			out[i] = nv
		}
		return out, nil
	case *avro.MapSchema:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, mismatch("a map")
		}
		out := make(map[string]any, len(m))
		for k, item := range m {
			nv, err := avroNative(s.Values(), item, at+"/"+k)
			if err != nil {
				return nil, err
			}
			out[k] = nv
		}
		return out, nil
	case *avro.UnionSchema:
		if v == nil {
			if s.Contains(avro.Null) {
				return nil, nil
			}
			return nil, mismatch("one of " + s.String())
		}
		for _, branch := range s.Types() {
			if branch.Type() == avro.Null {
				continue
			}
			if nv, err := avroNative(branch, v, at); err == nil {
				return map[string]any{unionName(branch): nv}, nil
			}
		}
		return nil, mismatch("one of " + s.String())
	case *avro.EnumSchema:
		str, ok := v.(string)
		if !ok {
			return nil, mismatch("a symbol of enum " + s.FullName())
		}
		for _, sym := range s.Symbols() {
			if sym == str {
				return str, nil
			}
		}
		return nil, fmt.Errorf("at %s: not a symbol of enum %s", where, s.FullName())
	case *avro.PrimitiveSchema:
		nv, err := avroPrimitive(s.Type(), v, mismatch)
		if l := s.Logical(); l != nil {
			var ok bool
			if nv, ok, err = avroLogical(l, v, where); !ok && err == nil {
				nv, err = avroPrimitive(s.Type(), v, mismatch)
			}
			if i, isLong := nv.(int64); isLong && l.Type() == avro.TimeMicros {
				// hamba/avro writes an int64 by a time-micros schema as a
				// time.Duration, in nanoseconds: this encoder wrote a
				// time of day 1,000 times too small. The reference is
				// corrected.
				nv = time.Duration(i) * time.Microsecond
			}
		}
		return nv, err
	}
	return nil, fmt.Errorf("at %s: the schema's %s is not written from JSON", where, s.Type())
}

func avroPrimitive(t avro.Type, v any, mismatch func(string) error) (any, error) {
	switch t {
	case avro.Null:
		if v != nil {
			return nil, mismatch("null")
		}
		return nil, nil
	case avro.Boolean:
		if b, ok := v.(bool); ok {
			return b, nil
		}
	case avro.String:
		if str, ok := v.(string); ok {
			return str, nil
		}
	case avro.Bytes:
		if str, ok := v.(string); ok {
			return []byte(str), nil
		}
	case avro.Int, avro.Long:
		if n, ok := v.(json.Number); ok {
			i, err := n.Int64()
			if err != nil {
				return nil, mismatch(string(t) + " (an integer)")
			}
			if t == avro.Int {
				if int64(int32(i)) != i {
					return nil, mismatch("int (32 bits)")
				}
				return int(i), nil
			}
			return i, nil
		}
	case avro.Float, avro.Double:
		if n, ok := v.(json.Number); ok {
			f, err := n.Float64()
			if err != nil {
				return nil, mismatch(string(t))
			}
			if t == avro.Float {
				return float32(f), nil
			}
			return f, nil
		}
	}
	return nil, mismatch(string(t))
}

// avroLogical reads the JSON forms of a logical type's values that are
// not its underlying type's: a timestamp as RFC 3339 text (or PostgreSQL's
// "2026-12-05 10:00:00+01"), a date as YYYY-MM-DD, a time of day as
// HH:MM:SS[.ffffff], a decimal as a number or its text, exactly within
// the schema's scale. ok false: v is the underlying type's form (a number
// of milliseconds, ...), for avroPrimitive. The error names where and
// what, never the value.
func avroLogical(l avro.LogicalSchema, v any, where string) (out any, ok bool, err error) {
	str, isString := v.(string)
	switch l.Type() {
	case avro.TimestampMillis, avro.TimestampMicros, avro.LocalTimestampMillis, avro.LocalTimestampMicros:
		if !isString {
			return nil, false, nil
		}
		t, err := parseTimestamp(str, l.Type() == avro.LocalTimestampMillis || l.Type() == avro.LocalTimestampMicros)
		if err != nil {
			return nil, true, fmt.Errorf("at %s: the schema wants %s, an RFC 3339 time or a number; the value is a string that is neither", where, l.Type())
		}
		if l.Type() == avro.TimestampMillis || l.Type() == avro.LocalTimestampMillis {
			return t.UnixMilli(), true, nil
		}
		return t.UnixMicro(), true, nil
	case avro.Date:
		if !isString {
			return nil, false, nil
		}
		t, err := time.Parse(time.DateOnly, str)
		if err != nil {
			return nil, true, fmt.Errorf("at %s: the schema wants a date, YYYY-MM-DD or a number of days; the value is a string that is neither", where)
		}
		return int(t.Unix() / 86400), true, nil
	case avro.TimeMillis, avro.TimeMicros:
		if !isString {
			return nil, false, nil
		}
		t, err := time.Parse("15:04:05.999999", str)
		if err != nil {
			return nil, true, fmt.Errorf("at %s: the schema wants %s, HH:MM:SS[.ffffff] or a number; the value is a string that is neither", where, l.Type())
		}
		d := t.Sub(time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC))
		if l.Type() == avro.TimeMillis {
			return int(d.Milliseconds()), true, nil
		}
		return d.Microseconds(), true, nil
	case avro.Decimal:
		dec, _ := l.(*avro.DecimalLogicalSchema)
		text := str
		if n, isNumber := v.(json.Number); isNumber {
			text = string(n)
		} else if !isString {
			return nil, true, fmt.Errorf("at %s: the schema wants a decimal, a number or its text; the value is %s", where, jsonKind(v))
		}
		r, ok := new(big.Rat).SetString(text)
		if !ok {
			return nil, true, fmt.Errorf("at %s: the schema wants a decimal, a number or its text; the value is a string that is not", where)
		}
		scaled := new(big.Rat).Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(dec.Scale())), nil)))
		if !scaled.IsInt() {
			return nil, true, fmt.Errorf("at %s: more decimal places than the schema's scale %d", where, dec.Scale())
		}
		if len(new(big.Int).Abs(scaled.Num()).String()) > dec.Precision() {
			return nil, true, fmt.Errorf("at %s: more digits than the schema's precision %d", where, dec.Precision())
		}
		return r, true, nil
	}
	return nil, false, nil
}

// jsonKind names a JSON value's kind, never its content.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
