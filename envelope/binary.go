package envelope

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
)

// More type OIDs, for values in binary format.
const (
	oidName    = 19
	oidText    = 25
	oidOID     = 26
	oidBpchar  = 1042
	oidVarchar = 1043
	oidDate    = 1082
	oidUUID    = 2950
)

// pgEpoch is 2000-01-01 00:00:00 UTC, where PostgreSQL's binary
// timestamps and dates count from, in µs since the Unix epoch.
const pgEpoch = 946_684_800_000_000

// Text rewrites, in place, every value of row that pgoutput sent in binary
// format (its binary option, postgres.binary) as the text PostgreSQL's
// output function gives for it, so that everything downstream reads text
// and a record is the same bytes whichever format the server sent. Values
// that need rendering are appended to buf, returned for reuse; the others
// (text types, jsonb after its version byte) keep referencing the message.
// Timestamps are rendered in UTC ("+00"): the text format follows the
// walsender's TimeZone instead. A binary value of a type not listed in
// BinaryTypes is an error naming the column: the server sends every type
// with a binary send function in binary when asked to.
func (b *Binding) Text(row []Column, buf []byte) ([]byte, error) {
	for i := range row {
		c := &row[i]
		if c.Kind != pglogrepl.TupleDataTypeBinary {
			continue
		}
		var oid uint32
		if i < len(b.types) {
			oid = b.types[i]
		}
		at := len(buf)
		var err error
		data := c.Data
		switch oid {
		case oidText, oidVarchar, oidBpchar, oidName, oidJSON:
			// textsend and json_send send the text itself.
		case oidJSONB:
			if len(data) < 1 || data[0] != 1 {
				err = fmt.Errorf("jsonb binary format version %v, want 1", data[:min(len(data), 1)])
				break
			}
			data = data[1:]
		default:
			buf, err = appendBinaryText(buf, oid, data)
			data = buf[at:len(buf):len(buf)]
		}
		if err != nil {
			name := fmt.Sprintf("#%d", i+1)
			if i < len(b.columns) {
				name = strconv.Quote(b.columns[i])
			}
			return buf[:at], fmt.Errorf("column %s of %s (type OID %d) in binary format: %w", name, b.Name, oid, err)
		}
		*c = Column{Kind: pglogrepl.TupleDataTypeText, Data: data}
	}
	return buf, nil
}

// BinaryTypes names the types Text reads in binary format.
const BinaryTypes = "text, varchar, char, name, json, jsonb, uuid, timestamptz, timestamp, date, bool, smallint, integer, bigint, oid, bytea"

// appendBinaryText appends the text output of a value of type oid sent by
// its type's send function.
func appendBinaryText(dst []byte, oid uint32, v []byte) ([]byte, error) {
	size := func(n int) error {
		if len(v) != n {
			return fmt.Errorf("%d bytes, want %d", len(v), n)
		}
		return nil
	}
	switch oid {
	case oidUUID:
		if err := size(16); err != nil {
			return dst, err
		}
		for i, c := range v {
			if i == 4 || i == 6 || i == 8 || i == 10 {
				dst = append(dst, '-')
			}
			dst = append(dst, hexDigits[c>>4], hexDigits[c&0xf])
		}
		return dst, nil
	case oidTimestamptz, oidTimestamp:
		if err := size(8); err != nil {
			return dst, err
		}
		return appendTimestamp(dst, int64(binary.BigEndian.Uint64(v)), oid == oidTimestamptz), nil
	case oidDate:
		if err := size(4); err != nil {
			return dst, err
		}
		return appendDate(dst, int32(binary.BigEndian.Uint32(v))), nil
	case oidBool:
		if err := size(1); err != nil {
			return dst, err
		}
		if v[0] != 0 {
			return append(dst, 't'), nil
		}
		return append(dst, 'f'), nil
	case oidInt2:
		if err := size(2); err != nil {
			return dst, err
		}
		return strconv.AppendInt(dst, int64(int16(binary.BigEndian.Uint16(v))), 10), nil
	case oidInt4:
		if err := size(4); err != nil {
			return dst, err
		}
		return strconv.AppendInt(dst, int64(int32(binary.BigEndian.Uint32(v))), 10), nil
	case oidOID:
		if err := size(4); err != nil {
			return dst, err
		}
		return strconv.AppendUint(dst, uint64(binary.BigEndian.Uint32(v)), 10), nil
	case oidInt8:
		if err := size(8); err != nil {
			return dst, err
		}
		return strconv.AppendInt(dst, int64(binary.BigEndian.Uint64(v)), 10), nil
	case oidBytea:
		// bytea_output = 'hex', the default since PostgreSQL 9.0.
		dst = append(dst, '\\', 'x')
		for _, c := range v {
			dst = append(dst, hexDigits[c>>4], hexDigits[c&0xf])
		}
		return dst, nil
	}
	return dst, fmt.Errorf("outboxd reads only %s in binary format: set postgres.binary: false", BinaryTypes)
}

// appendTimestamp appends a timestamp (µs since 2000-01-01) as
// PostgreSQL's ISO output does, in UTC: "2026-12-02 12:46:05.123456+00",
// the fraction without trailing zeros, " BC" for years before 1.
func appendTimestamp(dst []byte, us int64, zone bool) []byte {
	switch us {
	case math.MaxInt64:
		return append(dst, "infinity"...)
	case math.MinInt64:
		return append(dst, "-infinity"...)
	}
	// In seconds: µs since 1970 overflow int64 near PostgreSQL's last
	// timestamp (294276 AD).
	sec, frac := us/1_000_000, us%1_000_000
	if frac < 0 {
		sec, frac = sec-1, frac+1_000_000
	}
	t := time.Unix(sec+pgEpoch/1_000_000, frac*1000).UTC()
	dst, bc := appendYMD(dst, t)
	dst = append(dst, ' ')
	dst = append2(dst, t.Hour())
	dst = append(dst, ':')
	dst = append2(dst, t.Minute())
	dst = append(dst, ':')
	dst = append2(dst, t.Second())
	if frac := t.Nanosecond() / 1000; frac != 0 {
		dst = append(dst, '.')
		digits := 6
		for frac%10 == 0 {
			frac /= 10
			digits--
		}
		for p := digits - 1; p >= 0; p-- {
			dst = append(dst, byte('0'+frac/pow10[p]%10))
		}
	}
	if zone {
		dst = append(dst, "+00"...)
	}
	if bc {
		dst = append(dst, " BC"...)
	}
	return dst
}

var pow10 = [6]int{1, 10, 100, 1000, 10000, 100000}

// appendDate appends a date (days since 2000-01-01) as PostgreSQL's ISO
// output does.
func appendDate(dst []byte, days int32) []byte {
	switch days {
	case math.MaxInt32:
		return append(dst, "infinity"...)
	case math.MinInt32:
		return append(dst, "-infinity"...)
	}
	dst, bc := appendYMD(dst, time.Unix(pgEpoch/1_000_000, 0).UTC().AddDate(0, 0, int(days)))
	if bc {
		dst = append(dst, " BC"...)
	}
	return dst
}

// appendYMD appends "YYYY-MM-DD" (at least four digits of year; a year
// before 1 as its BC number, reported by bc).
func appendYMD(dst []byte, t time.Time) ([]byte, bool) {
	y := t.Year()
	bc := y <= 0
	if bc {
		y = 1 - y
	}
	for p := 1000; p > 1 && y < p; p /= 10 {
		dst = append(dst, '0')
	}
	dst = strconv.AppendInt(dst, int64(y), 10)
	dst = append(dst, '-')
	dst = append2(dst, int(t.Month()))
	dst = append(dst, '-')
	return append2(dst, t.Day()), bc
}

func append2(dst []byte, n int) []byte {
	return append(dst, byte('0'+n/10), byte('0'+n%10))
}
