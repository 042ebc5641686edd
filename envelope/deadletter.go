package envelope

import (
	"strconv"
	"time"

	"github.com/outboxd/outboxd"
)

// Headers of a dead-letter record.
const (
	HeaderError = "outboxd.error" // why the row could not become a record
	HeaderTable = "outboxd.table" // schema.table it was inserted into (or the message prefix)
	HeaderLSN   = "outboxd.lsn"   // its transaction's commit LSN
	HeaderTime  = "outboxd.time"  // when outboxd dead-lettered it (RFC 3339, UTC)
	HeaderSize  = "outboxd.original_size"
)

// DeadLetter builds the dead-letter record of a change that could not
// become a record on b's route: the original key when the change has a
// usable agregat_id; as value the row itself, a JSON object of every
// column's text value (null for NULL; a logical message's is its content),
// unless that makes the record too large for Kafka (then only the row's
// size is kept, in a header); the original id_esdeveniment and tipus
// headers when readable; and headers naming the reason, the table, the
// transaction's commit LSN and the time.
func (r *Router) DeadLetter(b *Binding, row []Column, reason error, lsn string, now time.Time) outboxd.Record {
	v := view{b: b, row: row}
	if b.message {
		// A message that failed may not even parse: its members are then
		// unreadable, and its content is still kept.
		_ = v.parse(row, &Scratch{})
	}
	rec := outboxd.Record{Topic: b.Route.DeadLetterTopic, Key: v.text(roleKey)}
	if id := v.text(roleID); id != nil {
		rec.Headers = append(rec.Headers, outboxd.Header{Key: HeaderID, Value: id})
	}
	if t := v.text(roleTipus); t != nil {
		rec.Headers = append(rec.Headers, outboxd.Header{Key: HeaderTipus, Value: t})
	}
	rec.Headers = appendReason(rec.Headers, reason, b.Name, lsn, now)
	val := []byte{'{'}
	for i, name := range b.columns {
		if i > 0 {
			val = append(val, ',')
		}
		val = appendString(val, []byte(name))
		val = append(val, ':')
		if t := text(row, i); t != nil {
			val = appendString(val, t)
		} else {
			val = append(val, "null"...)
		}
	}
	rec.Value = append(val, '}')
	if r.maxBytes > 0 && rec.WireSize() > r.maxBytes {
		size := 0
		for _, c := range row {
			size += len(c.Data)
		}
		rec.Value = nil
		rec.Headers = append(rec.Headers, outboxd.Header{Key: HeaderSize, Value: strconv.AppendInt(nil, int64(size), 10)})
	}
	return rec
}

// DeadLetterRefused builds the dead-letter record of a record the broker
// refused for its own content: its key and its id_esdeveniment and tipus
// headers, the reason, the table, the commit LSN, the time and the refused
// record's size; no value (the broker would refuse it again).
func (r *Router) DeadLetterRefused(b *Binding, refused *outboxd.RefusedError, lsn string, now time.Time) outboxd.Record {
	rec := outboxd.Record{Topic: b.Route.DeadLetterTopic, Key: refused.Key}
	for _, h := range refused.Headers {
		switch h.Key {
		case HeaderID, HeaderTipus:
			rec.Headers = append(rec.Headers, h)
		case HeaderDebeziumID:
			if b.rt.debezium {
				rec.Headers = append(rec.Headers, outboxd.Header{Key: HeaderID, Value: h.Value})
			}
		}
	}
	rec.Headers = appendReason(rec.Headers, refused, b.Name, lsn, now)
	rec.Headers = append(rec.Headers, outboxd.Header{Key: HeaderSize, Value: strconv.AppendInt(nil, int64(refused.Size), 10)})
	return rec
}

func appendReason(hs []outboxd.Header, reason error, table, lsn string, now time.Time) []outboxd.Header {
	return append(hs,
		outboxd.Header{Key: HeaderError, Value: []byte(reason.Error())},
		outboxd.Header{Key: HeaderTable, Value: []byte(table)},
		outboxd.Header{Key: HeaderLSN, Value: []byte(lsn)},
		outboxd.Header{Key: HeaderTime, Value: []byte(now.UTC().Format(time.RFC3339Nano))},
	)
}
