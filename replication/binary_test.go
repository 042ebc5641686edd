package replication

import (
	"encoding/binary"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxd/outboxd/envelope"
)

// wireColumn is one column of a hand-built Relation and Insert message.
type wireColumn struct {
	name string
	oid  uint32
	kind byte // 't', 'b', 'n'
	val  []byte
}

// tableMessages are the Relation and Insert messages (protocol 1) of one
// row of public.outbox with these columns.
func tableMessages(cols []wireColumn) (rel, ins []byte) {
	rel = append([]byte{'R', 0, 0, 0x40, 0x02}, "public\x00outbox\x00d"...)
	rel = binary.BigEndian.AppendUint16(rel, uint16(len(cols)))
	ins = append([]byte{'I', 0, 0, 0x40, 0x02, 'N'}, 0, 0)
	binary.BigEndian.PutUint16(ins[6:], uint16(len(cols)))
	for _, c := range cols {
		rel = append(append(append(rel, 0), c.name...), 0)
		rel = binary.BigEndian.AppendUint32(rel, c.oid)
		rel = binary.BigEndian.AppendUint32(rel, 0xffffffff)
		ins = append(ins, c.kind)
		if c.kind != 'n' {
			ins = binary.BigEndian.AppendUint32(ins, uint32(len(c.val)))
			ins = append(ins, c.val...)
		}
	}
	return rel, ins
}

// streamRow streams one transaction holding the row and returns the
// stream's error and what it produced.
func streamRow(t *testing.T, binaryOn bool, cols []wireColumn) (*fakeProducer, error) {
	t.Helper()
	router := mustRouter(t, []envelope.Route{{Schema: "public", Table: "outbox", Topic: "comandes", Columns: seedColumns,
		Fields: []envelope.Field{{Column: "agregat", Header: "agregat"}}}})
	prod := &fakeProducer{}
	s := &stream{r: &Runner{router: router, log: hclog.NewNullLogger(), cfg: Config{Binary: binaryOn}}, prod: prod,
		tracker: NewTracker(0x100, 100, 1<<20), relations: map[uint32][]*envelope.Binding{}}
	rel, ins := tableMessages(cols)
	for _, m := range [][]byte{rel, beginMsg(0x200), ins, commitMsg(0x200, 0x210)} {
		if err := s.handleMessage(m); err != nil {
			return prod, err
		}
	}
	return prod, nil
}

// TestStreamBinaryFormat: with postgres.binary the stream reads a row sent
// in binary format into the record the same row sent as text gives; a
// binary value of a type outboxd does not read stops it, naming the fix.
func TestStreamBinaryFormat(t *testing.T) {
	carrega := `{"id": "P-2026-000123", "client": "anna"}`
	text := []wireColumn{
		{"id", 2950, 't', []byte("6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70")}, {"agregat", 25, 't', []byte("comanda")},
		{"agregat_id", 25, 't', []byte("P-2026-000123")}, {"tipus", 25, 't', []byte("comanda.creada")},
		{"versio", 23, 't', []byte("2")}, {"carrega", 3802, 't', []byte(carrega)},
		{"creat_en", 1184, 't', []byte("2026-09-10 09:33:20.123999+02")}, {"publicat_en", 1184, 'n', nil},
	}
	bin := []wireColumn{
		{"id", 2950, 'b', []byte{0x6f, 0x1c, 0x9e, 0x2a, 0x0a, 0x4b, 0x4c, 0x8e, 0x9d, 0x1f, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70}},
		{"agregat", 25, 'b', []byte("comanda")}, {"agregat_id", 25, 'b', []byte("P-2026-000123")},
		{"tipus", 25, 'b', []byte("comanda.creada")}, {"versio", 23, 'b', []byte{0, 0, 0, 2}},
		{"carrega", 3802, 'b', append([]byte{1}, carrega...)},
		// 2026-09-10 07:33:20.123999 UTC in µs since 2000-01-01.
		{"creat_en", 1184, 'b', binary.BigEndian.AppendUint64(nil, uint64(842340800123999))},
		{"publicat_en", 1184, 'n', nil},
	}
	want, err := streamRow(t, false, text)
	if err != nil {
		t.Fatal(err)
	}
	got, err := streamRow(t, true, bin)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.recs) != 1 || len(want.recs) != 1 {
		t.Fatalf("%d and %d records, want 1 each", len(got.recs), len(want.recs))
	}
	g, w := got.recs[0], want.recs[0]
	g.Ack, w.Ack = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Errorf("binary:\n got %+v\nwant %+v", g, w)
	}

	// Without postgres.binary a binary value is not rendered: the row is bad.
	if _, err := streamRow(t, false, bin); err == nil || !strings.Contains(err.Error(), "unexpected tuple data kind 'b'") {
		t.Errorf("binary values without postgres.binary: got %v", err)
	}

	bad := append(append([]wireColumn(nil), bin...), wireColumn{"import", 1700, 'b', []byte{0, 1, 0, 0, 0, 0, 0, 0, 0, 1}})
	_, err = streamRow(t, true, bad)
	if err == nil || !IsFatal(err) || !strings.Contains(err.Error(), `column "import" of public.outbox`) || !strings.Contains(err.Error(), "postgres.binary: false") {
		t.Errorf("a numeric in binary format: got %v, want a fatal error naming the column and the fix", err)
	}
}
