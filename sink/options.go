package sink

import "strings"

// option is one value of a setting the sink acts on, and what it stands
// for. Each setting's options are one table: the switch that acts on the
// value reads it, and its exported list (Partitioners, Compressions, ...)
// is what config validates against, so the two cannot drift apart.
type option[T any] struct {
	name string
	v    T
}

func names[T any](opts []option[T]) []string {
	out := make([]string, len(opts))
	for i, o := range opts {
		out[i] = o.name
	}
	return out
}

func lookup[T any](opts []option[T], name string) (T, bool) {
	for _, o := range opts {
		if o.name == name {
			return o.v, true
		}
	}
	var zero T
	return zero, false
}

// either is "a, b or c".
func either(list []string) string {
	if len(list) < 2 {
		return strings.Join(list, "")
	}
	return strings.Join(list[:len(list)-1], ", ") + " or " + list[len(list)-1]
}
