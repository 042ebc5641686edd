package envelope

import "slices"

// kind is what Build makes of a column's PostgreSQL type.
type kind uint8

const (
	kindOther       kind = iota // read as its text
	kindText                    // text and its kin
	kindInteger                 // a JSON number in the envelope; milliseconds as a timestamp
	kindBool                    // true or false, as Kafka Connect writes it
	kindJSON                    // embedded as it is
	kindBytea                   // decoded from its hex output
	kindTimestamp               // without time zone: read as UTC
	kindTimestamptz             // an instant
	kindUUID                    // its text
)

// pgTypes are the PostgreSQL types Build tells apart: the one table of
// them. Build reads a column by the kind its type OID has here (what a
// pgoutput Relation gives), and `outboxd check` accepts a column for a use
// by the kind its type name has here (pg_type.typname, what the catalogs
// give; a domain's base type), so the two cannot drift apart. OID 0: an
// extension's type, whose OID differs from one database to the next.
var pgTypes = []struct {
	name string
	oid  uint32
	kind kind
}{
	{"text", 25, kindText}, {"varchar", 1043, kindText}, {"bpchar", 1042, kindText}, {"name", 19, kindText}, {"citext", 0, kindText},
	{"int2", 21, kindInteger}, {"int4", 23, kindInteger}, {"int8", 20, kindInteger},
	{"bool", 16, kindBool},
	{"json", 114, kindJSON}, {"jsonb", 3802, kindJSON},
	{"bytea", 17, kindBytea},
	{"timestamp", 1114, kindTimestamp}, {"timestamptz", 1184, kindTimestamptz},
	{"uuid", 2950, kindUUID},
}

// kindOfOID is the kind of a type by its OID; kindOther when the table
// does not list it (or for 0, a message member).
func kindOfOID(oid uint32) kind {
	for _, t := range pgTypes {
		if oid != 0 && t.oid == oid {
			return t.kind
		}
	}
	return kindOther
}

// kindOfName is the kind of a type by its name.
func kindOfName(name string) kind {
	for _, t := range pgTypes {
		if t.name == name {
			return t.kind
		}
	}
	return kindOther
}

// demand is what a use needs of its column's type: one of kinds, said as
// want.
type demand struct {
	kinds []kind
	want  string
}

var (
	textDemand = demand{[]kind{kindText}, "text or varchar"}
	// demands are the uses (Ref.Use) whose column must be of a kind
	// Build reads for them; the other uses read any type's text.
	demands = map[string]demand{
		"columns.agregat_id": {[]kind{kindText, kindUUID, kindInteger}, "text, varchar, uuid or an integer (its text form is the Kafka key)"},
		"columns.tipus":      textDemand,
		"columns.versio":     {[]kind{kindInteger, kindText}, "smallint, integer, bigint or text holding an integer"},
		"columns.carrega":    {[]kind{kindJSON, kindText}, "jsonb, json or text holding JSON"},
		"columns.creat_en":   {[]kind{kindTimestamptz}, "timestamptz"},
		"timestamp":          {[]kind{kindTimestamptz, kindTimestamp, kindInteger}, "timestamptz, timestamp (read as UTC) or an integer of milliseconds"},
		"trace.traceparent":  textDemand,
		"trace.tracestate":   textDemand,
		"trace.span_context": textDemand,
	}
	// payloadDemand: a payload value takes the payload's bytes as they are.
	payloadDemand = demand{[]kind{kindJSON, kindText, kindBytea}, "jsonb, json, text or bytea"}
)

// Fits reports whether a column whose type is typname (pg_type.typname;
// for a domain, its base type's) can serve use (a Ref's Use) on the route,
// and, when it cannot, what the use needs. A use without a demand takes
// any type.
func (r *Route) Fits(use, typname string) (ok bool, want string) {
	d, typed := demands[use]
	if use == "columns.carrega" && r.Value == ValuePayload {
		d = payloadDemand
	}
	if !typed || slices.Contains(d.kinds, kindOfName(typname)) {
		return true, ""
	}
	return false, d.want
}
