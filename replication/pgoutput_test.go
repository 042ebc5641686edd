package replication

import (
	"bytes"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/envelope"
)

// TestParseInsertAgreesWithPglogrepl: on every Insert recorded from a real
// server, the hot-path parser reads what pglogrepl's decoder reads.
func TestParseInsertAgreesWithPglogrepl(t *testing.T) {
	n := 0
	var row []envelope.Column
	for _, m := range readFixture(t, "testdata/outbox.pgoutput") {
		if m[0] != 'I' {
			continue
		}
		n++
		msg, err := pglogrepl.Parse(m)
		if err != nil {
			t.Fatal(err)
		}
		want := msg.(*pglogrepl.InsertMessage)
		var rel uint32
		rel, row, err = parseInsert(m, row)
		if err != nil {
			t.Fatal(err)
		}
		if rel != want.RelationID || len(row) != len(want.Tuple.Columns) {
			t.Fatalf("relation %d with %d columns, want %d with %d", rel, len(row), want.RelationID, len(want.Tuple.Columns))
		}
		for i, c := range want.Tuple.Columns {
			if row[i].Kind != c.DataType || !bytes.Equal(row[i].Data, c.Data) {
				t.Errorf("column %d: %q %q, want %q %q", i, row[i].Kind, row[i].Data, c.DataType, c.Data)
			}
		}
	}
	if n == 0 {
		t.Fatal("the fixture has no Insert")
	}
}

// TestParseInsertRejectsBadMessages: a malformed message is an error, never
// a panic or a value read past the message.
func TestParseInsertRejectsBadMessages(t *testing.T) {
	good := []byte{'I', 0, 0, 0x40, 0x10, 'N', 0, 3, 'n', 't', 0, 0, 0, 2, 'h', 'i', 'u'}
	if _, row, err := parseInsert(good, nil); err != nil || len(row) != 3 || string(row[1].Data) != "hi" || row[0].Kind != 'n' || row[2].Kind != 'u' {
		t.Fatalf("good message: %v %v", row, err)
	}
	for name, m := range map[string][]byte{
		"empty":          {},
		"short":          {'I', 0, 0, 0},
		"old tuple":      {'I', 0, 0, 0x40, 0x10, 'O', 0, 1, 'n'},
		"missing column": {'I', 0, 0, 0x40, 0x10, 'N', 0, 2, 'n'},
		"cut length":     {'I', 0, 0, 0x40, 0x10, 'N', 0, 1, 't', 0, 0},
		"long length":    {'I', 0, 0, 0x40, 0x10, 'N', 0, 1, 't', 0, 0, 0, 9, 'a'},
		"huge length":    {'I', 0, 0, 0x40, 0x10, 'N', 0, 1, 't', 0xff, 0xff, 0xff, 0xff, 'a'},
		"unknown kind":   {'I', 0, 0, 0x40, 0x10, 'N', 0, 1, 'x'},
	} {
		if _, _, err := parseInsert(m, nil); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func FuzzParseInsert(f *testing.F) {
	f.Add([]byte{'I', 0, 0, 0x40, 0x10, 'N', 0, 3, 'n', 't', 0, 0, 0, 2, 'h', 'i', 'u'})
	f.Fuzz(func(t *testing.T, m []byte) {
		_, row, err := parseInsert(m, nil)
		if err != nil {
			return
		}
		for _, c := range row {
			if len(c.Data) > len(m) {
				t.Fatalf("a column of %d bytes from a message of %d", len(c.Data), len(m))
			}
		}
	})
}
