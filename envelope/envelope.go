// Package envelope turns one change (an outbox row as decoded from
// pgoutput, or a transactional logical message) into the Kafka records of
// its routes. By default that is the contract's record: key agregat_id,
// headers tipus and id_esdeveniment, value the standard JSON envelope with
// carrega embedded verbatim (never re-encoded). Routes choose other topics
// (templates, overrides), filter, place extra columns, shape the record as
// Debezium's outbox EventRouter does, and carry the trace context and the
// source position. Router.Build is the one place that decides whether a
// change can become a record (docs/routing.md).
//
// The package also holds the routed model that everything acting on routes
// reads: Route (route.go: the route, its presets and their defaults),
// Routing (routing.go: every route and each source once, the routed
// tables, what the publication must publish), Route.Problems (check.go:
// the one judgement of a route's shape) and the PostgreSQL types each use
// of a column accepts (types.go). The rest follows a change: compile.go
// and router.go (a route's columns, bound to a relation), envelope.go,
// record.go and value.go (Build), message.go (a logical message's JSON),
// deadletter.go.
package envelope

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd"
)

// Header names, as set by the polling relay.
const (
	HeaderTipus = "tipus"
	HeaderID    = "id_esdeveniment"
	// HeaderDebeziumID is the event id header of Debezium's EventRouter.
	HeaderDebeziumID = "id"
)

// ReservedHeaderPrefix starts the names of outboxd's own headers (these,
// the dead-letter record's, sink.HeaderStream): a route's fields may not
// take one, so that no row's column reaches Kafka under such a name.
const ReservedHeaderPrefix = "outboxd."

// Source position headers (Route.Position).
const (
	HeaderCommitLSN = "outboxd.commit_lsn" // the transaction's commit LSN, decimal
	HeaderTxnIndex  = "outboxd.txn_index"  // the change's index in its transaction, from 0
)

// RowError says why a change could not become a record. It names the
// table, the row by its id (when readable) and the column, so an operator
// can find the row, and never quotes what the row holds (its agregat_id,
// the bad value): the error reaches the log, /status and the dead-letter
// record's headers, and the id is enough to SELECT the rest.
type RowError struct {
	Table  string
	ID     string // the row's id column, "" when unreadable
	Column string
	Reason string
	// Message: a logical message rather than a row (Table is then
	// `message prefix "..."` and Column a member of its JSON).
	Message bool
}

func (e *RowError) Error() string {
	row, col := "outbox row", "column"
	if e.Message {
		row, col = "logical message", "member"
	}
	if e.ID != "" {
		row += " id=" + strconv.Quote(e.ID)
	}
	if e.Column == "" {
		return fmt.Sprintf("%s in %s: %s", row, e.Table, e.Reason)
	}
	return fmt.Sprintf("%s in %s, %s %q: %s", row, e.Table, col, e.Column, e.Reason)
}

// maxNameInError bounds an id or agregat_id quoted in an error.
const maxNameInError = 200

// Column is one value of a decoded row, as pgoutput sends it.
type Column struct {
	Kind byte // pglogrepl.TupleDataType*: 'n' NULL, 'u' unchanged TOAST, 't' text, 'b' binary
	Data []byte
}

// Position is where a change sits in the WAL.
type Position struct {
	CommitLSN  pglogrepl.LSN // its transaction's commit LSN (0: a row read from its table)
	Index      uint32        // its index among the transaction's changes
	CommitTime int64         // the commit time, µs since the epoch
}

// Verdict says what Build made of a change for a route.
type Verdict uint8

const (
	// Publish: the record is to be produced.
	Publish Verdict = iota
	// Filtered: the route's filter does not take the change.
	Filtered
	// Dropped: an override drops the change on purpose.
	Dropped
)

// Scratch is the memory Build reuses from one change to the next.
type Scratch struct {
	value, key, topic, hdr []byte
	enc                    []byte // a value in a schema registry's wire format
	headers                []outboxd.Header
	// A logical message's members, as columns (see parseMessage).
	msg    []Column
	msgRaw [][]byte
	msgBuf []byte
}

// Build turns one change into the record of the binding's route: for a
// table, row is the inserted tuple; for a logical message, row is one
// column holding the message's content. The record references the row's
// bytes and, when sc is not nil, sc's memory: it is valid until the row's
// buffer or sc is reused, so it must go to a Producer that copies it before
// then. A Verdict other than Publish comes with no record and no error.
func (r *Router) Build(b *Binding, row []Column, pos Position, sc *Scratch) (outboxd.Record, Verdict, error) {
	if sc == nil {
		sc = &Scratch{}
	}
	if b.Route == nil {
		return outboxd.Record{}, Publish, &RowError{Table: b.Name, Reason: "the table is published but has no route; add a route for it or remove it from the publication"}
	}
	v := view{b: b, row: row}
	if b.message {
		if err := v.parse(row, sc); err != nil {
			return outboxd.Record{}, Publish, err
		}
	}
	rec, verdict, err := r.build(&v, pos, sc)
	if err != nil {
		var re *RowError
		if errors.As(err, &re) {
			re.ID = readable(v.text(roleID))
		}
		return outboxd.Record{}, Publish, err
	}
	if verdict != Publish {
		return outboxd.Record{}, verdict, nil
	}
	if r.maxBytes > 0 {
		if n := rec.WireSize(); n > r.maxBytes {
			return outboxd.Record{}, Publish, &RowError{Table: b.Name, ID: readable(v.text(roleID)), Message: b.message,
				Reason: fmt.Sprintf("the record is %d bytes, over kafka.batch_bytes (%d): raise it together with the broker's and the topic's max.message.bytes, or make the row smaller", n, r.maxBytes)}
		}
	}
	return rec, Publish, nil
}

// view reads a change through its binding: a route column by index.
type view struct {
	b   *Binding
	row []Column
	raw [][]byte // a message's members as JSON, by route column
}

// parse makes a message's members the view's columns.
func (v *view) parse(row []Column, sc *Scratch) error {
	if len(row) != 1 || row[0].Kind != pglogrepl.TupleDataTypeText {
		return &RowError{Table: v.b.Name, Message: true, Reason: "no content"}
	}
	if err := parseMessage(v.b.rt, row[0].Data, sc); err != nil {
		return &RowError{Table: v.b.Name, Message: true, Reason: err.Error()}
	}
	v.row, v.raw = sc.msg, sc.msgRaw
	return nil
}

// col is route column i's value, nil when the column is absent.
func (v *view) col(i int) *Column {
	if i < 0 {
		return nil
	}
	p := v.b.pos[i]
	if p < 0 || p >= len(v.row) || v.row[p].Kind == 0 {
		return nil
	}
	return &v.row[p]
}

// text is the text value of role's column, nil when absent or NULL.
func (v *view) text(role int) []byte {
	if v.b.rt == nil {
		return nil
	}
	c := v.col(v.b.rt.role[role])
	if c == nil || c.Kind != pglogrepl.TupleDataTypeText {
		return nil
	}
	return c.Data
}

func (v *view) rowError(i int, reason string) error {
	return &RowError{Table: v.b.Name, Column: v.b.rt.cols[i], Reason: reason, Message: v.b.message}
}

// value is route column i's text; null reports a NULL (an error unless
// nullable).
func (v *view) value(i int, nullable bool) (val []byte, null bool, err error) {
	c := v.col(i)
	switch {
	case c == nil && v.b.rt.optional[i]:
		return nil, true, nil
	case c == nil && v.b.message:
		return nil, false, v.rowError(i, "the message has no such member (check the route's columns mapping)")
	case c == nil && v.b.pos[i] < 0:
		return nil, false, v.rowError(i, "the column does not exist in the table (check the route's columns mapping)")
	case c == nil:
		return nil, false, v.rowError(i, "the column is missing from the decoded row")
	}
	switch c.Kind {
	case pglogrepl.TupleDataTypeText:
		return c.Data, false, nil
	case pglogrepl.TupleDataTypeNull:
		if nullable {
			return nil, true, nil
		}
		return nil, false, v.rowError(i, "the value is NULL")
	default:
		return nil, false, v.rowError(i, fmt.Sprintf("unexpected tuple data kind %q", c.Kind))
	}
}

// isJSON: route column i's text is JSON as it stands.
func (v *view) isJSON(i int) bool {
	return v.b.message || v.b.kind[i] == kindJSON
}

// matches reports whether every condition holds. A column the filter needs
// must exist.
func (v *view) matches(conds []condition) (bool, error) {
	for k := range conds {
		c := &conds[k]
		val, null, err := v.value(c.col, true)
		if err != nil {
			return false, err
		}
		if null || !oneOf(val, c.values) {
			return false, nil
		}
	}
	return true, nil
}

func oneOf(v []byte, values []string) bool {
	for _, s := range values {
		if string(v) == s {
			return true
		}
	}
	return false
}
