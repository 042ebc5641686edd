package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// parseDocument parses exactly one YAML document whose top level is a mapping.
func parseDocument(data []byte) (*yaml.Node, error) {
	docs, err := parseStream(data)
	if err != nil {
		return nil, syntaxError(data, err)
	}
	if len(docs) > 1 {
		return nil, fmt.Errorf("line %d: a second YAML document; the configuration must be a single document", docs[1].Line)
	}
	if len(docs) == 0 || len(docs[0].Content) == 0 {
		return nil, errors.New("empty configuration")
	}
	root := docs[0].Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, errors.New("empty configuration")
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: the top level must be a mapping of keys (origen, postgres, kafka, ...)", root.Line)
	}
	return root, nil
}

// parseStream parses the YAML documents of data, stopping after the second
// (one too many is all parseDocument needs to know).
func parseStream(data []byte) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []*yaml.Node
	for len(docs) < 2 {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		docs = append(docs, &doc)
	}
	return docs, nil
}

var yamlErrorRe = regexp.MustCompile(`^yaml: (?:line ([0-9]+): )?(.*)$`)

// syntaxError returns yaml.v3's syntax error err as "line N: problem" with N
// the line of the problem. yaml.v3 gets N wrong in three ways: a parser error
// (as opposed to a scanner error) counts lines from 0, so it names the line
// before; when the mapping or list around the problem does not start on the
// first line, it names the line where that starts instead; an unknown alias
// has no line. The parser reads a stream, so the shortest run of whole lines
// from the top that fails with the same problem ends on the problem's line;
// yaml.v3's own N is never after it, so the search starts there.
func syntaxError(data []byte, err error) error {
	m := yamlErrorRe.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	problem := m[2]
	line, _ := strconv.Atoi(m[1]) // 0 when absent
	n := 0
	for end := 0; end < len(data); {
		if next := bytes.IndexByte(data[end:], '\n'); next >= 0 {
			end += next + 1
		} else {
			end = len(data)
		}
		if n++; n < line {
			continue
		}
		_, perr := parseStream(data[:end])
		if pm := yamlErrorRe.FindStringSubmatch(fmt.Sprint(perr)); pm != nil && pm[2] == problem {
			line = n
			break
		}
	}
	if line == 0 {
		return errors.New(problem)
	}
	return fmt.Errorf("line %d: %s%s", line, problem, syntaxHint(data, line, problem))
}

// syntaxHint explains the syntax error a ${NAME} causes inside a flow list or
// mapping ([a, b] or {k: v}), where YAML reads "{" as the start of a mapping.
func syntaxHint(data []byte, line int, problem string) string {
	if !strings.HasPrefix(problem, "did not find expected ',' or ") {
		return ""
	}
	lines := bytes.Split(data, []byte("\n"))
	if line > len(lines) || !bytes.Contains(lines[line-1], []byte("${")) {
		return ""
	}
	return ` (inside [ ] or { }, quote a value that holds a variable: "${NAME}")`
}

var (
	durationType = reflect.TypeOf(time.Duration(0))
	matchType    = reflect.TypeOf(Match(nil))
)

// decoder walks the yaml.Node tree and the target value together, so that
// every problem is reported with its line and field path, all of them at
// once, and the line of every key is remembered for Validate.
type decoder struct {
	lines map[string]int
	errs  []error
	// aliased counts the values decoded through an alias (*name), which
	// the decoder follows itself: a few lines of anchors whose aliases
	// nest can otherwise stand for millions of values (a "billion
	// laughs"). Past maxAliased the decoding stops with an error.
	aliasDepth, aliased int
}

// maxAliased bounds the values reached through aliases: far above what
// sharing a columns mapping or a filter between routes takes.
const maxAliased = 10000

// follow resolves an alias and counts n (see count).
func (d *decoder) follow(n *yaml.Node) (*yaml.Node, bool) {
	if n.Kind == yaml.AliasNode {
		for n.Kind == yaml.AliasNode {
			n = n.Alias
		}
		d.aliasDepth++
	}
	return n, d.count(n)
}

// count counts n when it is reached through an alias; it reports false,
// with an error the first time, once the aliases have stood for more than
// maxAliased values.
func (d *decoder) count(n *yaml.Node) bool {
	if d.aliasDepth == 0 {
		return true
	}
	if d.aliased++; d.aliased == maxAliased+1 {
		d.errs = append(d.errs, fmt.Errorf("line %d: the aliases (*name) stand for more than %d values: write the values out, or share less", n.Line, maxAliased))
	}
	return d.aliased <= maxAliased
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if path != "" {
		msg = path + ": " + msg
	}
	d.errs = append(d.errs, fmt.Errorf("line %d: %s", n.Line, msg))
}

func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	depth := d.aliasDepth
	defer func() { d.aliasDepth = depth }()
	n, ok := d.follow(n)
	if !ok {
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // "key:" with no value keeps the default
	}
	if v.Type() == durationType {
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "expected a duration such as \"250ms\" or \"1s\"")
			return
		}
		dur, err := time.ParseDuration(n.Value)
		if err != nil {
			d.fail(n, path, "invalid duration %q (write e.g. \"250ms\", \"1s\", \"2m\")", n.Value)
			return
		}
		v.SetInt(int64(dur))
		return
	}
	if v.Type() == matchType {
		d.decodeMatch(n, v, path)
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		d.decodeStruct(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(n, path, "expected a list")
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			d.lines[p] = item.Line
			elem := s.Index(i)
			if r, ok := elem.Addr().Interface().(*Route); ok {
				*r = defaultRoute()
			}
			d.decode(item, elem, p)
		}
		v.Set(s)
	case reflect.Map:
		// map[string]string: a mapping of names to single values.
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "expected a mapping of names to values")
			return
		}
		m := reflect.MakeMap(v.Type())
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			p := path + "." + k.Value
			d.lines[p] = k.Line
			elem := reflect.New(v.Type().Elem()).Elem()
			d.decode(val, elem, p)
			m.SetMapIndex(reflect.ValueOf(k.Value), elem)
		}
		v.Set(m)
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int64, reflect.Float64:
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "expected a single value, not a %s", kindName(n.Kind))
			return
		}
		if err := n.Decode(v.Addr().Interface()); err != nil {
			d.fail(n, path, "expected %s, got %q", typeName(v.Kind()), n.Value)
		}
	default:
		// Unreachable for the types of this package.
		d.fail(n, path, "cannot decode into %s", v.Type())
	}
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "expected a mapping of keys, not a %s", kindName(n.Kind))
		return
	}
	fields := map[string]int{}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		tag := t.Field(i).Tag.Get("yaml")
		if tag != "" && tag != "-" {
			fields[tag] = i
		}
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		key := k.Value
		where := ""
		if path != "" {
			where = " in " + path
		}
		if k.Kind != yaml.ScalarNode {
			d.fail(k, "", "keys must be plain names%s", where)
			continue
		}
		if first, dup := seen[key]; dup {
			d.fail(k, "", "duplicate key %q%s (first at line %d)", key, where, first)
			continue
		}
		seen[key] = k.Line
		idx, ok := fields[key]
		if !ok {
			d.fail(k, "", "unknown key %q%s", key, where)
			continue
		}
		p := key
		if path != "" {
			p = path + "." + key
		}
		d.lines[p] = k.Line
		d.decode(val, v.Field(idx), p)
	}
}

// decodeMatch reads {column: value, column: [values]}; the line of each
// column is remembered at path.column.
func (d *decoder) decodeMatch(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "expected a mapping of column names to a value or a list of values, e.g. {tipus: [comanda.creada]}")
		return
	}
	var m Match
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		depth := d.aliasDepth
		c, ok := d.decodeCondition(n.Content[i], n.Content[i+1], path, seen)
		d.aliasDepth = depth
		if !ok {
			return
		}
		if c != nil {
			m = append(m, *c)
		}
	}
	v.Set(reflect.ValueOf(m))
}

// decodeCondition reads one column of a Match: nil when it is in error,
// false when the aliases ran over their bound.
func (d *decoder) decodeCondition(k, val *yaml.Node, path string, seen map[string]int) (*Condition, bool) {
	val, ok := d.follow(val)
	if !ok {
		return nil, false
	}
	if k.Kind != yaml.ScalarNode {
		d.fail(k, path, "a column name must be a plain name")
		return nil, true
	}
	if first, dup := seen[k.Value]; dup {
		d.fail(k, path, "duplicate column %q (first at line %d)", k.Value, first)
		return nil, true
	}
	seen[k.Value] = k.Line
	d.lines[path+"."+k.Value] = k.Line
	c := Condition{Column: k.Value}
	items := []*yaml.Node{val}
	if val.Kind == yaml.SequenceNode {
		items = val.Content
	}
	for _, it := range items {
		if !d.count(it) {
			return nil, false
		}
		switch {
		case it.Kind != yaml.ScalarNode:
			d.fail(it, path+"."+k.Value, "expected a value or a list of values")
		case it.Tag == "!!null":
			d.fail(it, path+"."+k.Value, "null never matches (a NULL matches no condition); list values only")
		default:
			c.Values = append(c.Values, it.Value)
		}
	}
	return &c, true
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	default:
		return "single value"
	}
}

func typeName(k reflect.Kind) string {
	switch k {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64:
		return "an integer"
	case reflect.Float64:
		return "a number"
	default:
		return "a string"
	}
}

// noColumn is how the YAML says that a table has no such column (Debezium
// tables have no versio); in Columns it is "".
const noColumn = "-"

// fromYAML turns what the YAML spells its own way into the plain structs:
// each route's Schema and Name come from its table, a preset's defaults
// fill what its route does not set, and "-" becomes "". An empty versio is
// an error, as for every column: "" is too easily an empty variable or a
// slip to mean "no column".
func fromYAML(c *Config) []error {
	var errs []error
	for i := range c.Routes {
		errs = append(errs, c.routeFromYAML(i)...)
	}
	return errs
}
