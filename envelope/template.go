package envelope

import (
	"errors"
	"fmt"
	"strings"
)

// MaxTopicLen is the longest topic name Kafka accepts.
const MaxTopicLen = 249

// ValidTopic reports whether t is a valid Kafka topic name: 1 to 249 of
// letters, digits, '.', '_' and '-', and neither "." nor "..".
func ValidTopic(t string) bool {
	if len(t) == 0 || len(t) > MaxTopicLen || t == "." || t == ".." {
		return false
	}
	for i := 0; i < len(t); i++ {
		if !topicByte(t[i]) {
			return false
		}
	}
	return true
}

func topicByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// Template is a topic name with {column} placeholders, parsed.
type Template struct {
	Parts []TemplatePart
}

// TemplatePart is a literal, or a column whose value goes in its place.
type TemplatePart struct {
	Literal string
	Column  string // "" for a literal
}

// Columns lists the template's columns, in order of appearance.
func (t Template) Columns() []string {
	var out []string
	for _, p := range t.Parts {
		if p.Column != "" {
			out = append(out, p.Column)
		}
	}
	return out
}

// Static reports whether the template has no placeholder.
func (t Template) Static() bool { return len(t.Columns()) == 0 }

// ParseTemplate parses a topic or a template such as
// "{agregat}.esdeveniments". A placeholder names a column (or, for a
// logical message, a member of its JSON payload) between braces; the
// literal parts must be made of topic characters, so that only a value can
// make a name invalid. A name without braces must be a valid topic.
func ParseTemplate(s string) (Template, error) {
	var t Template
	if s == "" {
		return t, errors.New("empty")
	}
	literal := 0
	for rest := s; rest != ""; {
		open := strings.IndexByte(rest, '{')
		if close := strings.IndexByte(rest, '}'); close >= 0 && (open < 0 || close < open) {
			return t, fmt.Errorf("%q: a '}' without its '{'", s)
		}
		if open < 0 {
			t.Parts = append(t.Parts, TemplatePart{Literal: rest})
			literal += len(rest)
			break
		}
		if open > 0 {
			t.Parts = append(t.Parts, TemplatePart{Literal: rest[:open]})
			literal += open
		}
		rest = rest[open+1:]
		close := strings.IndexByte(rest, '}')
		if close < 0 {
			return t, fmt.Errorf("%q: a '{' without its '}'", s)
		}
		col := rest[:close]
		if col == "" || strings.ContainsAny(col, "{") {
			return t, fmt.Errorf("%q: a placeholder must name a column, e.g. {agregat}", s)
		}
		t.Parts = append(t.Parts, TemplatePart{Column: col})
		rest = rest[close+1:]
	}
	if t.Static() {
		if !ValidTopic(s) {
			return t, fmt.Errorf("%q is not a valid Kafka topic name (letters, digits, '.', '_', '-'; at most %d)", s, MaxTopicLen)
		}
		return t, nil
	}
	for _, p := range t.Parts {
		for i := 0; i < len(p.Literal); i++ {
			if !topicByte(p.Literal[i]) {
				return t, fmt.Errorf("%q: %q can never be part of a Kafka topic name (letters, digits, '.', '_', '-')", s, p.Literal[i])
			}
		}
	}
	if literal >= MaxTopicLen {
		return t, fmt.Errorf("%q: the literal parts alone reach %d characters, the longest topic name Kafka accepts", s, MaxTopicLen)
	}
	return t, nil
}

// maxCachedTopics bounds a template's cache of rendered names: values
// beyond it (a template on an unbounded column) still work, each row then
// allocating its topic string.
const maxCachedTopics = 4096

// topicCache remembers the names a template rendered, valid or not ("").
// Only the stream's goroutine uses it.
type topicCache map[string]string

// lookup returns the topic for the rendered name, whether it is valid, and
// remembers it. Looking up a []byte converted in the index expression does
// not allocate.
func (c topicCache) lookup(rendered []byte) (string, bool) {
	if t, ok := c[string(rendered)]; ok {
		return t, t != ""
	}
	name := string(rendered)
	valid := ValidTopic(name)
	if len(c) < maxCachedTopics {
		if valid {
			c[name] = name
		} else {
			c[name] = ""
		}
	}
	if !valid {
		return "", false
	}
	return name, true
}
