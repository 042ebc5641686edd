package envelope

// SessionParams are the session settings under which PostgreSQL writes a
// value's text the way Build parses it (a timestamptz in the ISO DateStyle,
// in UTC): set them on every connection whose rows become records, the
// replication connection (pgoutput writes with the walsender's settings)
// as well as one that reads the table itself.
var SessionParams = map[string]string{
	"datestyle": "ISO, YMD",
	"timezone":  "UTC",
}
