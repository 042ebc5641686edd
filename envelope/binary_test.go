package envelope_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/envelope"
)

// bin is a value in binary format (pgoutput's 'b' column kind).
func bin(b []byte) envelope.Column {
	return envelope.Column{Kind: pglogrepl.TupleDataTypeBinary, Data: b}
}

func be16(v int16) []byte { return binary.BigEndian.AppendUint16(nil, uint16(v)) }
func be32(v int32) []byte { return binary.BigEndian.AppendUint32(nil, uint32(v)) }
func be64(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }

// pgMicros is t as a binary timestamp: µs since 2000-01-01 00:00 UTC.
func pgMicros(t time.Time) []byte {
	return be64(t.UnixMicro() - time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro())
}

// pgDays is a date as a binary date: days since 2000-01-01.
func pgDays(y int, m time.Month, d int) []byte {
	return be32(int32((time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() - time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).Unix()) / 86400))
}

// textOf binds a one-column table of type oid and returns Text's
// rendering of v in binary format.
func textOf(oid uint32, v []byte) (string, error) {
	r, _ := envelope.NewRouter("x", nil, 0)
	rel := &pglogrepl.RelationMessage{Namespace: "public", RelationName: "t",
		Columns: []*pglogrepl.RelationMessageColumn{{Name: "c", DataType: oid}}}
	row := []envelope.Column{bin(v)}
	if _, err := r.Bind(rel)[0].Text(row, nil); err != nil {
		return "", err
	}
	if row[0].Kind != pglogrepl.TupleDataTypeText {
		return "", nil
	}
	return string(row[0].Data), nil
}

// TestBinaryValues: each type's binary format becomes PostgreSQL's text
// output of the same value (the expected texts are what psql prints with
// TimeZone UTC and the default DateStyle and bytea_output).
func TestBinaryValues(t *testing.T) {
	uuid := []byte{0x6f, 0x1c, 0x9e, 0x2a, 0x0a, 0x4b, 0x4c, 0x8e, 0x9d, 0x1f, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70}
	tests := []struct {
		name string
		oid  uint32
		in   []byte
		want string
	}{
		{"uuid", 2950, uuid, "6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70"},
		{"uuid zero", 2950, make([]byte, 16), "00000000-0000-0000-0000-000000000000"},
		{"timestamptz µs", 1184, pgMicros(time.Date(2026, 9, 10, 7, 33, 20, 123999000, time.UTC)), "2026-09-10 07:33:20.123999+00"},
		{"timestamptz trailing zeros", 1184, pgMicros(time.Date(2026, 12, 2, 12, 46, 5, 500000000, time.UTC)), "2026-12-02 12:46:05.5+00"},
		{"timestamptz whole second", 1184, pgMicros(time.Date(2026, 12, 2, 12, 46, 5, 0, time.UTC)), "2026-12-02 12:46:05+00"},
		{"timestamptz one µs", 1184, pgMicros(time.Date(2026, 12, 2, 12, 46, 5, 1000, time.UTC)), "2026-12-02 12:46:05.000001+00"},
		{"timestamptz the epoch", 1184, be64(0), "2000-01-01 00:00:00+00"},
		{"timestamptz before 1970", 1184, pgMicros(time.Date(1969, 12, 31, 23, 59, 59, 999500000, time.UTC)), "1969-12-31 23:59:59.9995+00"},
		{"timestamptz year 10000+", 1184, pgMicros(time.Date(12026, 1, 1, 0, 0, 0, 0, time.UTC)), "12026-01-01 00:00:00+00"},
		{"timestamptz year < 1000", 1184, pgMicros(time.Date(999, 6, 1, 0, 0, 0, 0, time.UTC)), "0999-06-01 00:00:00+00"},
		{"timestamptz BC", 1184, pgMicros(time.Date(-43, 3, 15, 12, 0, 0, 0, time.UTC)), "0044-03-15 12:00:00+00 BC"},
		{"timestamptz the last one", 1184, pgMicros(time.Date(294276, 12, 31, 23, 59, 59, 999999000, time.UTC)), "294276-12-31 23:59:59.999999+00"},
		{"timestamptz infinity", 1184, be64(math.MaxInt64), "infinity"},
		{"timestamptz -infinity", 1184, be64(math.MinInt64), "-infinity"},
		{"timestamp", 1114, pgMicros(time.Date(2026, 9, 10, 7, 33, 20, 120000000, time.UTC)), "2026-09-10 07:33:20.12"},
		{"timestamp BC", 1114, pgMicros(time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)), "0001-01-01 00:00:00 BC"},
		{"date", 1082, pgDays(2026, 2, 28), "2026-02-28"},
		{"date before 2000", 1082, pgDays(1999, 12, 31), "1999-12-31"},
		{"date BC", 1082, pgDays(-99, 7, 4), "0100-07-04 BC"},
		{"date infinity", 1082, be32(math.MaxInt32), "infinity"},
		{"date -infinity", 1082, be32(math.MinInt32), "-infinity"},
		{"bool true", 16, []byte{1}, "t"},
		{"bool false", 16, []byte{0}, "f"},
		{"smallint", 21, be16(-32768), "-32768"},
		{"integer", 23, be32(-7), "-7"},
		{"integer max", 23, be32(math.MaxInt32), "2147483647"},
		{"bigint", 20, be64(math.MinInt64), "-9223372036854775808"},
		{"oid", 26, be32(-1), "4294967295"},
		{"bytea", 17, []byte{0x00, 0xde, 0xad, 0xbe, 0xef}, `\x00deadbeef`},
		{"bytea empty", 17, nil, `\x`},
		{"text", 25, []byte("àèò \"x\"\n"), "àèò \"x\"\n"},
		{"varchar", 1043, []byte("vàr"), "vàr"},
		{"char", 1042, []byte("ab   "), "ab   "},
		{"name", 19, []byte("nom"), "nom"},
		{"json", 114, []byte(`{"b":  1, "a":[2]}`), `{"b":  1, "a":[2]}`},
		{"jsonb", 3802, append([]byte{1}, `{"a": [2], "b": 1}`...), `{"a": [2], "b": 1}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := textOf(tc.oid, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestBinaryTimestampsRoundTrip: a rendered timestamptz parses back to the
// same microsecond, across 5,000 random instants from 4713 BC to 9999.
func TestBinaryTimestampsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 4))
	lo := time.Date(-4712, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	hi := time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC).UnixMicro()
	for i := 0; i < 5000; i++ {
		us := lo + rng.Int64N(hi-lo)
		if i%3 == 0 {
			us -= us % 1000 // fractions with trailing zeros
		}
		got, err := textOf(1184, be64(us-946_684_800_000_000))
		if err != nil {
			t.Fatal(err)
		}
		back, err := envelope.ParseTimestamptz([]byte(got))
		if err != nil || back != us {
			t.Fatalf("%d µs rendered %q, parsed back %d (%v)", us, got, back, err)
		}
	}
}

func TestBinaryErrors(t *testing.T) {
	tests := []struct {
		name string
		oid  uint32
		in   []byte
		want string
	}{
		{"numeric is not read", 1700, []byte{0, 1, 0, 0, 0, 0, 0, 0, 0, 1}, "set postgres.binary: false"},
		{"float8 is not read", 701, be64(0), "set postgres.binary: false"},
		{"short uuid", 2950, make([]byte, 15), "15 bytes, want 16"},
		{"long integer", 23, be64(1), "8 bytes, want 4"},
		{"short timestamptz", 1184, be32(1), "4 bytes, want 8"},
		{"jsonb version 2", 3802, []byte{2, '{', '}'}, "version"},
		{"empty jsonb", 3802, nil, "version"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := textOf(tc.oid, tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `column "c" of public.t`) {
				t.Errorf("got %v, want an error naming the column and saying %q", err, tc.want)
			}
		})
	}
}

// TestBinaryRowBuildsTheSameRecord: the seed's row in binary format gives
// the record its text format gives, byte for byte, and values that came as
// text or NULL are left alone.
func TestBinaryRowBuildsTheSameRecord(t *testing.T) {
	r := newRouter(t, "comandes", []envelope.Route{{Schema: "public", Table: "outbox", Topic: "comandes", Columns: seedCols,
		Fields: []envelope.Field{{Column: "agregat", Header: "agregat"}, {Column: "creat_en", Envelope: "creat"}}}}, 0)
	rel := relation("id", "agregat", "agregat_id", "tipus", "versio", "carrega", "creat_en", "publicat_en")
	b := bind(r, rel)
	carrega := `{"id": "P-2026-000123", "nota": "àèò \"cometes\""}`
	creat := time.Date(2026, 9, 10, 7, 33, 20, 123999000, time.UTC)
	text := tuple(s("6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70"), s("comanda"), s("P-2026-000123"), s("comanda.creada"), s("3"),
		s(carrega), s("2026-09-10 07:33:20.123999+00"), nil)
	binRow := []envelope.Column{
		bin([]byte{0x6f, 0x1c, 0x9e, 0x2a, 0x0a, 0x4b, 0x4c, 0x8e, 0x9d, 0x1f, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70}),
		text[1], // a value may come as text even with binary on (a type without a send function)
		bin([]byte("P-2026-000123")), bin([]byte("comanda.creada")), bin(be32(3)),
		bin(append([]byte{1}, carrega...)), bin(pgMicros(creat)), {Kind: pglogrepl.TupleDataTypeNull},
	}
	want, err := build(r, b, text, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := b.Text(binRow, make([]byte, 0, 4)) // a small buffer: it must grow
	if err != nil {
		t.Fatal(err)
	}
	if len(buf) == 0 {
		t.Error("nothing rendered into the buffer")
	}
	got, err := build(r, b, binRow, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("binary row:\n got %+v\nwant %+v", got, want)
	}
}
