package replication

import (
	"encoding/binary"
	"fmt"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/envelope"
)

// parseInsert reads a pgoutput Insert message (protocol version 1):
//
//	'I' | relation id int32 | 'N' | columns int16 |
//	per column: kind byte ('n' NULL, 'u' unchanged TOAST, 't' text,
//	'b' binary), and for 't' and 'b' a length int32 and the bytes
//
// into row, reusing its storage. The values reference wal: they are valid
// until the message's buffer is reused. pglogrepl's decoder allocates every
// column and copies it byte by byte; this is the stream's hot path.
func parseInsert(wal []byte, row []envelope.Column) (uint32, []envelope.Column, error) {
	if len(wal) < 8 || wal[0] != 'I' {
		return 0, row, fmt.Errorf("insert message of %d bytes is too short", len(wal))
	}
	rel := binary.BigEndian.Uint32(wal[1:])
	if wal[5] != 'N' {
		return 0, row, fmt.Errorf("insert message: new tuple marker %q, want 'N'", wal[5])
	}
	n := int(binary.BigEndian.Uint16(wal[6:]))
	row = row[:0]
	p := 8
	for i := 0; i < n; i++ {
		if p >= len(wal) {
			return 0, row, fmt.Errorf("insert message truncated at column %d of %d", i+1, n)
		}
		kind := wal[p]
		p++
		switch kind {
		case pglogrepl.TupleDataTypeNull, pglogrepl.TupleDataTypeToast:
			row = append(row, envelope.Column{Kind: kind})
		case pglogrepl.TupleDataTypeText, pglogrepl.TupleDataTypeBinary:
			if p+4 > len(wal) {
				return 0, row, fmt.Errorf("insert message truncated in the length of column %d", i+1)
			}
			l := int(binary.BigEndian.Uint32(wal[p:]))
			p += 4
			if l < 0 || l > len(wal)-p {
				return 0, row, fmt.Errorf("insert message: column %d claims %d bytes, %d left", i+1, l, len(wal)-p)
			}
			row = append(row, envelope.Column{Kind: kind, Data: wal[p : p+l : p+l]})
			p += l
		default:
			return 0, row, fmt.Errorf("insert message: unknown column kind %q", kind)
		}
	}
	return rel, row, nil
}
