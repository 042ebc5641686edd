package catalog

import "testing"

// TestParseRange: the bounds of a one-column range partition, as
// pg_get_expr prints them, including a quote inside a literal and
// MINVALUE/MAXVALUE; anything else is an error, never a guess.
func TestParseRange(t *testing.T) {
	for _, c := range []struct {
		bound, lo, hi string
		err           bool
	}{
		{bound: "FOR VALUES FROM ('2026-11-01 00:00:00+00') TO ('2026-12-01 00:00:00+00')", lo: "2026-11-01 00:00:00+00", hi: "2026-12-01 00:00:00+00"},
		{bound: "FOR VALUES FROM (MINVALUE) TO ('2026-12-01')", lo: "", hi: "2026-12-01"},
		{bound: "FOR VALUES FROM ('2026-12-01') TO (MAXVALUE)", lo: "2026-12-01", hi: ""},
		{bound: "FOR VALUES FROM ('it''s') TO ('z')", lo: "it's", hi: "z"},
		{bound: "FOR VALUES FROM ('a', 1) TO ('b', 2)", err: true}, // two columns
		{bound: "FOR VALUES IN ('a')", err: true},                  // a list partition
		{bound: "FOR VALUES WITH (modulus 4, remainder 0)", err: true},
		{bound: "DEFAULT", err: true},
		{bound: "FOR VALUES FROM (1) TO (2)", err: true}, // not a literal
		{bound: "FOR VALUES FROM ('a) TO ('b", err: true},
	} {
		lo, hi, err := parseRange(c.bound)
		switch {
		case c.err && err == nil:
			t.Errorf("%s: parsed as [%q, %q), want an error", c.bound, lo, hi)
		case !c.err && err != nil:
			t.Errorf("%s: %v", c.bound, err)
		case !c.err && (lo != c.lo || hi != c.hi):
			t.Errorf("%s: [%q, %q), want [%q, %q)", c.bound, lo, hi, c.lo, c.hi)
		}
	}
}
