package config

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// expandEnv replaces ${NAME} with its value and $$ with $, line by line, so
// that line numbers in later errors still refer to the original file. A value
// containing a line break is rejected: it would shift every later line and
// could inject YAML structure. A $ followed by anything else is kept as is.
func expandEnv(data []byte, lookupEnv func(string) (string, bool)) ([]byte, error) {
	var (
		out  bytes.Buffer
		errs []error
		line = 1
	)
	out.Grow(len(data))
	for i := 0; i < len(data); i++ {
		c := data[i]
		if c == '\n' {
			line++
		}
		if c != '$' || i+1 >= len(data) {
			out.WriteByte(c)
			continue
		}
		switch data[i+1] {
		case '$':
			out.WriteByte('$')
			i++
		case '{':
			end := bytes.IndexByte(data[i+2:], '}')
			nl := bytes.IndexByte(data[i+2:], '\n')
			if end < 0 || (nl >= 0 && nl < end) {
				errs = append(errs, fmt.Errorf("line %d: unterminated variable reference \"${\" (write $$ for a literal $)", line))
				out.WriteByte(c)
				continue
			}
			name := string(data[i+2 : i+2+end])
			i += 2 + end
			if !envName.MatchString(name) {
				errs = append(errs, fmt.Errorf("line %d: invalid variable name %q in ${%s}", line, name, name))
				continue
			}
			val, ok := lookupEnv(name)
			if !ok {
				errs = append(errs, fmt.Errorf("line %d: environment variable %s is not set", line, name))
				continue
			}
			if strings.ContainsAny(val, "\r\n") {
				errs = append(errs, fmt.Errorf("line %d: environment variable %s contains a line break, which is not allowed", line, name))
				continue
			}
			out.WriteString(val)
		default:
			out.WriteByte(c)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out.Bytes(), nil
}
