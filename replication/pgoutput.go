package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
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

// logicalMessage is a pgoutput logical decoding message, parsed in place:
// prefix and content reference the message buffer.
type logicalMessage struct {
	transactional bool
	lsn           pglogrepl.LSN // the end of the message's WAL record
	prefix        []byte
	content       []byte
}

// parseMessage reads a pgoutput Message (protocol version 1):
//
//	'M' | flags int8 (1: transactional) | LSN int64 | prefix, NUL-terminated |
//	length int32 | content
func parseMessage(wal []byte) (logicalMessage, error) {
	var m logicalMessage
	if len(wal) < 11 || wal[0] != 'M' {
		return m, fmt.Errorf("message of %d bytes is too short", len(wal))
	}
	m.transactional = wal[1]&1 != 0
	m.lsn = pglogrepl.LSN(binary.BigEndian.Uint64(wal[2:]))
	end := bytes.IndexByte(wal[10:], 0)
	if end < 0 {
		return m, errors.New("message: the prefix has no terminating NUL")
	}
	m.prefix = wal[10 : 10+end]
	p := 10 + end + 1
	if p+4 > len(wal) {
		return m, errors.New("message truncated in the content's length")
	}
	n := int(binary.BigEndian.Uint32(wal[p:]))
	p += 4
	if n < 0 || n != len(wal)-p {
		return m, fmt.Errorf("message: content claims %d bytes, %d left", n, len(wal)-p)
	}
	m.content = wal[p:len(wal):len(wal)]
	return m, nil
}
