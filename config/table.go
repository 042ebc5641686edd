package config

import (
	"errors"
	"fmt"
	"strings"
)

// splitTable splits "schema.table" in SQL identifier syntax into its two
// names: an unquoted name is lowercase letters, digits, _ and $ (PostgreSQL
// would fold capitals to lowercase: a name with capitals must be quoted,
// so that it means one thing); a quoted one is any text, "" standing for ".
func splitTable(t string) (schema, name string, err error) {
	schema, rest, err := ident(t)
	if err != nil {
		return "", "", err
	}
	if !strings.HasPrefix(rest, ".") {
		return "", "", errors.New("must be schema.table")
	}
	name, rest, err = ident(rest[1:])
	switch {
	case err != nil:
		return "", "", err
	case rest != "":
		return "", "", fmt.Errorf("has %q after the table name: must be schema.table (quote a name that holds a dot)", rest)
	}
	return schema, name, nil
}

// maxIdent is PostgreSQL's longest identifier (NAMEDATALEN - 1), in bytes.
const maxIdent = 63

func ident(s string) (name, rest string, err error) {
	if strings.HasPrefix(s, `"`) {
		var b strings.Builder
		for i := 1; i < len(s); i++ {
			if s[i] != '"' {
				b.WriteByte(s[i])
				continue
			}
			if i+1 < len(s) && s[i+1] == '"' {
				b.WriteByte('"')
				i++
				continue
			}
			switch name = b.String(); {
			case name == "":
				return "", "", errors.New("has an empty quoted name")
			case len(name) > maxIdent:
				return "", "", fmt.Errorf("has a name longer than %d bytes", maxIdent)
			}
			return name, s[i+1:], nil
		}
		return "", "", errors.New("has a quoted name without its closing quote")
	}
	end := strings.IndexByte(s, '.')
	if end < 0 {
		end = len(s)
	}
	name, rest = s[:end], s[end:]
	if name == "" {
		return "", "", errors.New("has an empty name")
	}
	for i, c := range name {
		switch {
		case c >= 'a' && c <= 'z' || c == '_', i > 0 && (c >= '0' && c <= '9' || c == '$'):
		case c >= 'A' && c <= 'Z':
			return "", "", fmt.Errorf("has %s unquoted, which SQL reads as %s: quote a name with capitals (\"%s\")", name, strings.ToLower(name), name)
		default:
			return "", "", fmt.Errorf("has %s unquoted: quote a name with such characters (\"%s\")", name, name)
		}
	}
	if len(name) > maxIdent {
		return "", "", fmt.Errorf("has a name longer than %d bytes", maxIdent)
	}
	return name, rest, nil
}

// SlotTableName is postgres.slot_table's schema and name (valid once
// Validate passed).
func (p Postgres) SlotTableName() (schema, name string) {
	schema, name, _ = splitTable(p.SlotTable)
	return schema, name
}
