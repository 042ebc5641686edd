// Package envelope turns one outbox row, as decoded from pgoutput, into the
// Kafka record of the contract: key agregat_id, headers tipus and
// id_esdeveniment, value the standard JSON envelope with carrega embedded
// verbatim (never re-encoded).
package envelope

import (
	"encoding/json"
	"fmt"
	"strconv"
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
// the column and the transaction's position so an operator can find the row.
type RowError struct {
	Table  string
	Column string
	Reason string
}

func (e *RowError) Error() string {
	if e.Column == "" {
		return fmt.Sprintf("outbox row in %s: %s", e.Table, e.Reason)
	}
	return fmt.Sprintf("outbox row in %s, column %q: %s", e.Table, e.Column, e.Reason)
}

// Router knows the routes and the service name.
type Router struct {
	origen []byte // origen already encoded as a JSON string
	routes map[string]*Route
}

// NewRouter indexes routes by "schema.table".
func NewRouter(origen string, routes []Route) *Router {
	r := &Router{origen: appendString(nil, []byte(origen)), routes: make(map[string]*Route, len(routes))}
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
	return outboxd.Record{Topic: b.Route.Topic, Key: key, Value: val, Headers: headers}, nil
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
// NULL), unless keepRow is false (the row is too large to be written
// anywhere, so only its size is kept); the original id_esdeveniment and
// tipus headers when readable; and headers naming the reason, the table,
// the transaction's commit LSN and the time.
func (r *Router) DeadLetter(b *Binding, row []Column, reason error, lsn string, now time.Time, keepRow bool) outboxd.Record {
	text := func(idx int) []byte {
		if idx < 0 || idx >= len(row) || row[idx].Kind != pglogrepl.TupleDataTypeText {
			return nil
		}
		return row[idx].Data
	}
	rec := outboxd.Record{Topic: b.Route.DeadLetterTopic, Key: text(b.agregatID)}
	if v := text(b.id); v != nil {
		rec.Headers = append(rec.Headers, outboxd.Header{Key: HeaderID, Value: v})
	}
	if v := text(b.tipus); v != nil {
		rec.Headers = append(rec.Headers, outboxd.Header{Key: HeaderTipus, Value: v})
	}
	rec.Headers = append(rec.Headers,
		outboxd.Header{Key: HeaderError, Value: []byte(reason.Error())},
		outboxd.Header{Key: HeaderTable, Value: []byte(b.Name)},
		outboxd.Header{Key: HeaderLSN, Value: []byte(lsn)},
		outboxd.Header{Key: HeaderTime, Value: []byte(now.UTC().Format(time.RFC3339Nano))},
	)
	if !keepRow {
		size := 0
		for _, c := range row {
			size += len(c.Data)
		}
		rec.Headers = append(rec.Headers, outboxd.Header{Key: HeaderSize, Value: strconv.AppendInt(nil, int64(size), 10)})
		return rec
	}
	val := []byte{'{'}
	for i, name := range b.columns {
		if i > 0 {
			val = append(val, ',')
		}
		val = appendString(val, []byte(name))
		val = append(val, ':')
		if v := text(i); v != nil {
			val = appendString(val, v)
		} else {
			val = append(val, "null"...)
		}
	}
	rec.Value = append(val, '}')
	return rec
}
