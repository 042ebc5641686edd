package config

import (
	"fmt"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// expandTree replaces ${NAME} with the value of the variable and $$ with $ in
// every scalar value under n. The YAML is parsed first, so a value is data
// wherever it lands: a quote, a colon or a line break in it cannot change the
// structure of the file. Mapping keys are names and stay as written; comments
// are not part of the tree. Every problem is returned, each with its line.
func expandTree(n *yaml.Node, path string, lookupEnv func(string) (string, bool)) []error {
	var errs []error
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			errs = append(errs, expandTree(n.Content[i+1], joinPath(path, n.Content[i].Value), lookupEnv)...)
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			errs = append(errs, expandTree(item, fmt.Sprintf("%s[%d]", path, i), lookupEnv)...)
		}
	case yaml.ScalarNode:
		join := template.join
		if path == "postgres.dsn" {
			join = joinDSN
		}
		errs = expandScalar(n, path, lookupEnv, join)
	}
	// An alias is expanded where its anchor is defined.
	return errs
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// emptyAllowed are the keys whose variables may be set but empty: there ""
// means the default, which is as safe (the system's trusted roots, the
// broker's own name). Anywhere else an empty value is far more often a
// variable the deployment forgot to fill than a choice: an empty password,
// or health.listen "" turning the health server off.
var emptyAllowed = map[string]bool{"kafka.tls.ca_file": true, "kafka.tls.server_name": true}

// expandScalar expands the references in one scalar value, at path.
func expandScalar(n *yaml.Node, path string, lookupEnv func(string) (string, bool), join func(template, []string) (string, []templateError)) []error {
	if !strings.Contains(n.Value, "$") {
		return nil
	}
	t, errs := parseTemplate(n.Value)
	values := make([]string, len(t.refs))
	for i, r := range t.refs {
		v, ok := lookupEnv(r.name)
		switch {
		case !ok:
			errs = append(errs, templateError{r.offset, fmt.Sprintf("environment variable %s is not set", r.name)})
		case v == "" && !emptyAllowed[path]:
			errs = append(errs, templateError{r.offset, fmt.Sprintf("%s: environment variable %s is set but empty (give it a value, or remove the key to take its default)", path, r.name)})
		}
		values[i] = v
	}
	if len(errs) == 0 {
		n.Value, errs = join(t, values)
	}
	if len(errs) > 0 {
		out := make([]error, len(errs))
		for i, e := range errs {
			out[i] = fmt.Errorf("line %d: %s", lineAt(n, e.offset), e.msg)
		}
		return out
	}
	if n.Style == 0 {
		retag(n)
	}
	return nil
}

// retag gives an expanded plain scalar the tag YAML would have given the
// value written in its place (so that batch_size: ${N} is an integer), except
// that a variable's value is never null unless it is empty: a password
// "null" stays a string.
func retag(n *yaml.Node) {
	n.Tag = ""
	tag := n.ShortTag()
	if tag == "!!null" && n.Value != "" {
		tag = "!!str"
	}
	n.Tag = tag
}

// lineAt is the line of the byte at offset in the value of n: the scalar's
// own line, but for a literal block scalar (|), whose lines are the file's.
func lineAt(n *yaml.Node, offset int) int {
	if n.Style&yaml.LiteralStyle != 0 {
		return n.Line + 1 + strings.Count(n.Value[:offset], "\n")
	}
	return n.Line
}

// A template is a scalar value cut at its ${NAME} references.
type template struct {
	text []string // the literal text around the references, $$ already $; one more than refs
	refs []varRef
}

type varRef struct {
	name   string
	offset int // of the "$" in the value, for the line of an error
}

type templateError struct {
	offset int
	msg    string
}

// parseTemplate cuts s at its references. "$$" is a literal "$"; a "$" before
// anything else than "{" or "$" is kept as it is.
func parseTemplate(s string) (template, []templateError) {
	var (
		t    template
		errs []templateError
		lit  strings.Builder
	)
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			lit.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			lit.WriteByte('$')
			i++
		case '{':
			end := strings.IndexByte(s[i+2:], '}')
			if nl := strings.IndexByte(s[i+2:], '\n'); end < 0 || (nl >= 0 && nl < end) {
				errs = append(errs, templateError{i, `unterminated variable reference "${" (write $$ for a literal $)`})
				lit.WriteByte('$')
				continue
			}
			name := s[i+2 : i+2+end]
			if envName.MatchString(name) {
				t.text = append(t.text, lit.String())
				t.refs = append(t.refs, varRef{name: name, offset: i})
				lit.Reset()
			} else {
				errs = append(errs, templateError{i, fmt.Sprintf("invalid variable name %q in ${%s}", name, name)})
			}
			i += 2 + end
		default:
			lit.WriteByte('$')
		}
	}
	t.text = append(t.text, lit.String())
	return t, errs
}

// join puts the values of the references in their places, as they are.
func (t template) join(values []string) (string, []templateError) {
	var b strings.Builder
	for i, v := range values {
		b.WriteString(t.text[i])
		b.WriteString(v)
	}
	b.WriteString(t.text[len(values)])
	return b.String(), nil
}
