// Package envelope turns one outbox row, as decoded from pgoutput, into the
// Kafka record of the contract: key agregat_id, headers tipus and
// id_esdeveniment, value the standard JSON envelope with carrega embedded
// verbatim (never re-encoded).
package envelope

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
)

// Columns names the outbox table's columns. An empty Versio means the table
// has no version column and every event has versio 1.
type Columns struct {
	ID, AgregatID, Tipus, Versio, Carrega, CreatEn string
}

// Route sends one outbox table to one topic.
type Route struct {
	Schema, Table string
	Topic         string
	Columns       Columns
	// DeadLetterTopic receives the rows that cannot become records; empty
	// means such a row stops outboxd.
	DeadLetterTopic string
}

// Header names, as set by the polling relay.
const (
	HeaderTipus = "tipus"
	HeaderID    = "id_esdeveniment"
)

// Headers of a dead-letter record.
const (
	HeaderError = "outboxd.error" // why the row could not become a record
	HeaderTable = "outboxd.table" // schema.table it was inserted into
	HeaderLSN   = "outboxd.lsn"   // its transaction's commit LSN
	HeaderTime  = "outboxd.time"  // when outboxd dead-lettered it (RFC 3339, UTC)
	HeaderSize  = "outboxd.original_size"
)

// PostgreSQL type OIDs whose text form is already valid JSON.
const (
	oidJSON  = 114
	oidJSONB = 3802
)

// RowError says why a row could not become a record. It names the table,
// the row (its id and agregat_id, when readable) and the column, so an
// operator can find the row.
type RowError struct {
	Table     string
	ID        string // the row's id column, "" when unreadable
	AgregatID string // the row's agregat_id column, "" when unreadable
	Column    string
	Reason    string
}

func (e *RowError) Error() string {
	row := "outbox row"
	if e.ID != "" {
		row += " id=" + strconv.Quote(e.ID)
	}
	if e.AgregatID != "" {
		row += " agregat_id=" + strconv.Quote(e.AgregatID)
	}
	if e.Column == "" {
		return fmt.Sprintf("%s in %s: %s", row, e.Table, e.Reason)
	}
	return fmt.Sprintf("%s in %s, column %q: %s", row, e.Table, e.Column, e.Reason)
}

// maxNameInError bounds an id or agregat_id quoted in an error.
const maxNameInError = 200

// Router knows the routes, the service name and the largest record Kafka
// takes.
type Router struct {
	origen   []byte // origen already encoded as a JSON string
	routes   map[string]*Route
	maxBytes int // the largest WireSize a record may have; 0: no limit
}

// NewRouter indexes routes by "schema.table". maxRecordBytes is
// kafka.batch_bytes: a record whose WireSize is larger is a bad row.
func NewRouter(origen string, routes []Route, maxRecordBytes int) *Router {
	r := &Router{origen: appendString(nil, []byte(origen)), routes: make(map[string]*Route, len(routes)), maxBytes: maxRecordBytes}
	for i := range routes {
		rt := routes[i]
		r.routes[rt.Schema+"."+rt.Table] = &rt
	}
	return r
}

// Binding maps one relation (as announced by a pgoutput Relation message) to
// its route, with the mapped columns found by name.
type Binding struct {
	Name  string // schema.table
	Route *Route // nil when the table has no route
	// Column positions in the tuple, -1 when absent.
	id, agregatID, tipus, versio, carrega, creatEn int
	carregaIsJSON                                  bool
	columns                                        []string // every column's name, in tuple order
}

// Bind resolves a relation's columns. It does not fail on missing columns:
// a table may be altered back before any insert arrives, so the error is
// reported when a row needs the column.
func (r *Router) Bind(rel *pglogrepl.RelationMessage) *Binding {
	b := &Binding{Name: rel.Namespace + "." + rel.RelationName}
	b.Route = r.routes[b.Name]
	if b.Route == nil {
		return b
	}
	b.columns = make([]string, len(rel.Columns))
	for i, c := range rel.Columns {
		b.columns[i] = c.Name
	}
	find := func(name string) int {
		for i, c := range rel.Columns {
			if c.Name == name {
				return i
			}
		}
		return -1
	}
	c := b.Route.Columns
	b.id, b.agregatID, b.tipus = find(c.ID), find(c.AgregatID), find(c.Tipus)
	b.carrega, b.creatEn = find(c.Carrega), find(c.CreatEn)
	b.versio = -1
	if c.Versio != "" {
		b.versio = find(c.Versio)
	}
	if b.carrega >= 0 {
		t := rel.Columns[b.carrega].DataType
		b.carregaIsJSON = t == oidJSON || t == oidJSONB
	}
	return b
}

// Column is one value of a decoded row, as pgoutput sends it.
type Column struct {
	Kind byte // pglogrepl.TupleDataType*: 'n' NULL, 'u' unchanged TOAST, 't' text, 'b' binary
	Data []byte
}

// Scratch is the memory Build reuses from one row to the next.
type Scratch struct {
	value   []byte
	headers [2]outboxd.Header
}

// Build turns one inserted row into a record for the binding's route. The
// record references the row's bytes (its key and headers) and, when sc is
// not nil, sc's memory (its value and header list): it is valid until the
// row's buffer or sc is reused, so it must go to a Producer that copies it
// before then.
func (r *Router) Build(b *Binding, row []Column, sc *Scratch) (outboxd.Record, error) {
	rec, err := r.build(b, row, sc)
	if err != nil {
		var re *RowError
		if errors.As(err, &re) {
			re.ID = readable(text(row, b.id))
			re.AgregatID = readable(text(row, b.agregatID))
		}
		return outboxd.Record{}, err
	}
	if r.maxBytes > 0 {
		if n := rec.WireSize(); n > r.maxBytes {
			return outboxd.Record{}, &RowError{Table: b.Name, ID: readable(text(row, b.id)), AgregatID: readable(text(row, b.agregatID)),
				Reason: fmt.Sprintf("the record is %d bytes, over kafka.batch_bytes (%d): raise it together with the broker's and the topic's max.message.bytes, or make the row smaller", n, r.maxBytes)}
		}
	}
	return rec, nil
}

// text is the text value of column idx of row, nil when absent or NULL.
func text(row []Column, idx int) []byte {
	if idx < 0 || idx >= len(row) || row[idx].Kind != pglogrepl.TupleDataTypeText {
		return nil
	}
	return row[idx].Data
}

// readable is a value as an error may quote it: valid UTF-8, not too long.
func readable(v []byte) string {
	if len(v) > maxNameInError {
		v = append(v[:maxNameInError:maxNameInError], "..."...)
	}
	return strings.ToValidUTF8(string(v), "\ufffd")
}

func (r *Router) build(b *Binding, row []Column, sc *Scratch) (outboxd.Record, error) {
	if b.Route == nil {
		return outboxd.Record{}, &RowError{Table: b.Name, Reason: "the table is published but has no route; add a route for it or remove it from the publication"}
	}
	c := b.Route.Columns
	col := func(idx int, name string) ([]byte, error) {
		if idx < 0 {
			return nil, &RowError{Table: b.Name, Column: name, Reason: "the column does not exist in the table (check the route's columns mapping)"}
		}
		if idx >= len(row) {
			return nil, &RowError{Table: b.Name, Column: name, Reason: "the column is missing from the decoded row"}
		}
		v := &row[idx]
		switch v.Kind {
		case pglogrepl.TupleDataTypeText:
			return v.Data, nil
		case pglogrepl.TupleDataTypeNull:
			return nil, &RowError{Table: b.Name, Column: name, Reason: "the value is NULL"}
		default:
			return nil, &RowError{Table: b.Name, Column: name, Reason: fmt.Sprintf("unexpected tuple data kind %q", v.Kind)}
		}
	}
	id, err := col(b.id, c.ID)
	if err != nil {
		return outboxd.Record{}, err
	}
	key, err := col(b.agregatID, c.AgregatID)
	if err != nil {
		return outboxd.Record{}, err
	}
	tipus, err := col(b.tipus, c.Tipus)
	if err != nil {
		return outboxd.Record{}, err
	}
	versio := int64(1)
	if c.Versio != "" {
		raw, err := col(b.versio, c.Versio)
		if err != nil {
			return outboxd.Record{}, err
		}
		var ok bool
		if versio, ok = parseInt(raw); !ok {
			return outboxd.Record{}, &RowError{Table: b.Name, Column: c.Versio, Reason: fmt.Sprintf("%q is not an integer", raw)}
		}
	}
	carrega, err := col(b.carrega, c.Carrega)
	if err != nil {
		return outboxd.Record{}, err
	}
	if !b.carregaIsJSON && !json.Valid(carrega) {
		return outboxd.Record{}, &RowError{Table: b.Name, Column: c.Carrega, Reason: "the value is not valid JSON"}
	}
	creat, err := col(b.creatEn, c.CreatEn)
	if err != nil {
		return outboxd.Record{}, err
	}
	us, err := ParseTimestamptz(creat)
	if err != nil {
		return outboxd.Record{}, &RowError{Table: b.Name, Column: c.CreatEn, Reason: err.Error()}
	}

	var val []byte
	if sc != nil {
		val = sc.value[:0]
	}
	if need := len(id) + len(tipus) + len(carrega) + len(r.origen) + 96; cap(val) < need {
		val = make([]byte, 0, need)
	}
	val = append(val, `{"id_esdeveniment":`...)
	val = appendString(val, id)
	val = append(val, `,"tipus":`...)
	val = appendString(val, tipus)
	val = append(val, `,"versio":`...)
	val = strconv.AppendInt(val, versio, 10)
	val = append(val, `,"data_ms":`...)
	// Truncated toward zero, as the relay's int(timestamp()*1000) does.
	val = strconv.AppendInt(val, us/1000, 10)
	val = append(val, `,"origen":`...)
	val = append(val, r.origen...)
	val = append(val, `,"dades":`...)
	val = append(val, carrega...)
	val = append(val, '}')

	var headers []outboxd.Header
	if sc != nil {
		sc.value = val
		headers = sc.headers[:]
	} else {
		headers = make([]outboxd.Header, 2)
	}
	headers[0] = outboxd.Header{Key: HeaderTipus, Value: tipus}
	headers[1] = outboxd.Header{Key: HeaderID, Value: id}
	// A route with a dead-letter topic takes a record the broker refuses
	// there too.
	return outboxd.Record{Topic: b.Route.Topic, Key: key, Value: val, Headers: headers, Refusable: b.Route.DeadLetterTopic != ""}, nil
}

// parseInt reads a decimal integer as strconv.ParseInt does, without its
// allocation for the common short case.
func parseInt(b []byte) (int64, bool) {
	digits := b
	if len(digits) > 0 && (digits[0] == '-' || digits[0] == '+') {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		v, err := strconv.ParseInt(string(b), 10, 64)
		return v, err == nil
	}
	var v int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if b[0] == '-' {
		v = -v
	}
	return v, true
}

// DeadLetter builds the dead-letter record of a row that could not become a
// record: the original key when the row has a usable agregat_id; as value
// the row itself, a JSON object of every column's text value (null for
// NULL), unless that makes the record too large for Kafka (then only the
// row's size is kept, in a header); the original id_esdeveniment and tipus
// headers when readable; and headers naming the reason, the table, the
// transaction's commit LSN and the time.
func (r *Router) DeadLetter(b *Binding, row []Column, reason error, lsn string, now time.Time) outboxd.Record {
	rec := outboxd.Record{Topic: b.Route.DeadLetterTopic, Key: text(row, b.agregatID)}
	if v := text(row, b.id); v != nil {
		rec.Headers = append(rec.Headers, outboxd.Header{Key: HeaderID, Value: v})
	}
	if v := text(row, b.tipus); v != nil {
		rec.Headers = append(rec.Headers, outboxd.Header{Key: HeaderTipus, Value: v})
	}
	rec.Headers = appendReason(rec.Headers, reason, b.Name, lsn, now)
	val := []byte{'{'}
	for i, name := range b.columns {
		if i > 0 {
			val = append(val, ',')
		}
		val = appendString(val, []byte(name))
		val = append(val, ':')
		if v := text(row, i); v != nil {
			val = appendString(val, v)
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
		if h.Key == HeaderID || h.Key == HeaderTipus {
			rec.Headers = append(rec.Headers, h)
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
