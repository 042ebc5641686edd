package schemareg

import (
	"sync"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The JSON Schema fast path: a schema made of the structural keywords
// (type, properties, required, additionalProperties, items, minItems,
// maxItems, minLength, maxLength, $ref, true and false) checks a row's
// JSON text where it lies, without building Go values, and says "valid"
// only when the compiled schema's Validate would: a member named twice,
// an escaped name, a number type it cannot tell from the text, or any
// other keyword, and it gives no verdict. Every row it does not pass
// (and every refusal, with its where and keyword) is the validator's:
// the fast path never refuses a row. FuzzJSONSchema checks both agree.

// jsNode is a compiled schema the fast path checks.
type jsNode struct {
	other     bool // a keyword the fast path leaves to the validator
	never     bool // false: no value is valid
	types     jsonschema.Types
	ref       *jsNode
	props     []jsProp
	required  []string
	addlFalse bool
	addl      *jsNode
	items     *jsNode
	minItems  int
	maxItems  int // -1: none
	minLen    int
	maxLen    int // -1: none
}

type jsProp struct {
	name string
	node *jsNode
}

// jsonFast checks rows against one schema.
type jsonFast struct {
	root    *jsNode
	integer jsonschema.Types
	number  jsonschema.Types
	pool    sync.Pool // *jsScratch
}

// jsScratch is one check's memory, reused.
type jsScratch struct {
	str  []byte     // a string unquoted
	keys []avroSpan // the names of the objects being checked, by depth
}

// newJSONFast compiles s, or nil when the fast path can tell nothing.
func newJSONFast(s *jsonschema.Schema) *jsonFast {
	f := &jsonFast{}
	f.integer.Add("integer")
	f.number.Add("number")
	f.root = compileJS(s, map[*jsonschema.Schema]*jsNode{})
	if f.root.other {
		return nil
	}
	f.pool.New = func() any { return new(jsScratch) }
	return f
}

// compileJS compiles s; done are the schemas compiled so far (a schema
// may refer to itself).
func compileJS(s *jsonschema.Schema, done map[*jsonschema.Schema]*jsNode) *jsNode {
	if n := done[s]; n != nil {
		return n
	}
	n := &jsNode{maxItems: -1, maxLen: -1}
	done[s] = n
	if s.Bool != nil {
		n.never = !*s.Bool
		return n
	}
	if s.RecursiveRef != nil || s.DynamicRef != nil || s.Enum != nil || s.Const != nil || s.Not != nil ||
		len(s.AllOf)+len(s.AnyOf)+len(s.OneOf) > 0 || s.If != nil || s.Then != nil || s.Else != nil || s.Format != nil ||
		s.MaxProperties != nil || s.MinProperties != nil || s.PropertyNames != nil || len(s.PatternProperties) > 0 ||
		len(s.Dependencies)+len(s.DependentRequired)+len(s.DependentSchemas) > 0 || s.UnevaluatedProperties != nil ||
		s.UniqueItems || s.Contains != nil || s.MinContains != nil || s.MaxContains != nil || s.AdditionalItems != nil ||
		len(s.PrefixItems) > 0 || s.Items2020 != nil || s.UnevaluatedItems != nil || s.Pattern != nil ||
		s.ContentEncoding != nil || s.ContentMediaType != nil || s.ContentSchema != nil || s.Maximum != nil ||
		s.Minimum != nil || s.ExclusiveMaximum != nil || s.ExclusiveMinimum != nil || s.MultipleOf != nil ||
		len(s.Extensions) > 0 {
		n.other = true
		return n
	}
	if s.Types != nil {
		n.types = *s.Types
	}
	if s.Ref != nil {
		n.ref = compileJS(s.Ref, done)
		if n.ref == n {
			n.other = true // a $ref to itself: the validator's cycle
		}
	}
	for name, p := range s.Properties {
		n.props = append(n.props, jsProp{name, compileJS(p, done)})
	}
	n.required = s.Required
	switch a := s.AdditionalProperties.(type) {
	case bool:
		n.addlFalse = !a
	case *jsonschema.Schema:
		n.addl = compileJS(a, done)
	}
	switch i := s.Items.(type) {
	case *jsonschema.Schema:
		n.items = compileJS(i, done)
	case nil:
	default:
		n.other = true // a tuple
	}
	if s.MinItems != nil {
		n.minItems = *s.MinItems
	}
	if s.MaxItems != nil {
		n.maxItems = *s.MaxItems
	}
	if s.MinLength != nil {
		n.minLen = *s.MinLength
	}
	if s.MaxLength != nil {
		n.maxLen = *s.MaxLength
	}
	return n
}

// valid: data is a value the schema takes, for certain; false: the fast
// path cannot say.
func (f *jsonFast) valid(data []byte) bool {
	end, err := jsonCheck(data)
	if err != nil || skipSpace(data, end) != len(data) {
		return false
	}
	sc := f.pool.Get().(*jsScratch)
	sc.keys = sc.keys[:0]
	ok := f.check(f.root, data[:end], skipSpace(data, 0), sc, 0)
	f.pool.Put(sc)
	return ok
}

// check: the value at data[p] is valid by n, for certain. refs counts
// the $refs followed to n without going into the value (a cycle of them
// is the validator's to report).
func (f *jsonFast) check(n *jsNode, data []byte, p int, sc *jsScratch, refs int) bool {
	if n.other || n.never || refs > 32 {
		return false
	}
	if n.ref != nil && !f.check(n.ref, data, p, sc, refs+1) {
		return false
	}
	c := data[p]
	if n.types != 0 {
		var t string
		switch {
		case c == '{':
			t = "object"
		case c == '[':
			t = "array"
		case c == '"':
			t = "string"
		case c == 't' || c == 'f':
			t = "boolean"
		case c == 'n':
			t = "null"
		default:
			num := data[p:skipValue(data, p)]
			if n.types&f.number == 0 {
				// integer (or a type the value is not): an integer's
				// text only; a fraction or an exponent may still be
				// one (1.0), for the validator to say.
				if _, ok := parseJSONInt(num); !ok || n.types&f.integer == 0 {
					return false
				}
			}
		}
		if t != "" && !n.hasType(t) {
			return false
		}
	}
	switch c {
	case '"':
		if n.minLen > 0 || n.maxLen >= 0 {
			s := data[p:skipString(data, p)]
			l := len(s) - 2
			if !plainString(s) {
				sc.str = appendUnquoted(sc.str[:0], s)
				l = utf8.RuneCount(sc.str)
			}
			if l < n.minLen || n.maxLen >= 0 && l > n.maxLen {
				return false
			}
		}
	case '[':
		count := 0
		for p = skipSpace(data, p+1); data[p] != ']'; count++ {
			if n.items != nil && !f.check(n.items, data, p, sc, 0) {
				return false
			}
			if p = skipSpace(data, skipValue(data, p)); data[p] == ',' {
				p = skipSpace(data, p+1)
			}
		}
		if count < n.minItems || n.maxItems >= 0 && count > n.maxItems {
			return false
		}
	case '{':
		return f.object(n, data, p, sc)
	}
	return true
}

func (n *jsNode) hasType(t string) bool {
	var one jsonschema.Types
	one.Add(t)
	return n.types&one != 0
}

// object checks the members of the object at data[p].
func (f *jsonFast) object(n *jsNode, data []byte, p int, sc *jsScratch) bool {
	base := len(sc.keys)
	defer func() { sc.keys = sc.keys[:base] }()
	for p = skipSpace(data, p+1); data[p] != '}'; {
		keyEnd := skipString(data, p)
		key := data[p:keyEnd]
		if !plainString(key) {
			return false
		}
		// Named twice: the validator reads the last.
		for _, k := range sc.keys[base:] {
			if string(data[k.from:k.to]) == string(key) {
				return false
			}
		}
		sc.keys = append(sc.keys, avroSpan{p, keyEnd})
		p = skipSpace(data, skipSpace(data, keyEnd)+1)
		name := key[1 : len(key)-1]
		var node *jsNode
		for i := range n.props {
			if n.props[i].name == string(name) {
				node = n.props[i].node
				break
			}
		}
		switch {
		case node != nil:
		case n.addlFalse:
			return false
		default:
			node = n.addl
		}
		if node != nil && !f.check(node, data, p, sc, 0) {
			return false
		}
		if p = skipSpace(data, skipValue(data, p)); data[p] == ',' {
			p = skipSpace(data, p+1)
		}
	}
	for _, r := range n.required {
		found := false
		for _, k := range sc.keys[base:] {
			if string(data[k.from+1:k.to-1]) == r {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
