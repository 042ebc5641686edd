package envelope

import (
	"errors"
	"fmt"
	"time"
	"unsafe"
)

// unsafeString views b as a string without copying; b must not change while
// the string is in use (the parser only reads it during the call).
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// ParseTimestamptz parses PostgreSQL's text output of a timestamptz in the
// ISO DateStyle ("2026-12-02 12:46:05.123456+05:30", "... BC" for years
// before 1) and returns microseconds since the Unix epoch. Offsets may carry
// minutes and seconds (+05:30, -03:30:45); fractions have up to 6 digits.
func ParseTimestamptz(b []byte) (int64, error) { return parseTime(b, timeZoned) }

// The forms parseTime reads.
const (
	timeZoned  = iota // PostgreSQL's timestamptz output: a space, an offset
	timeNoZone        // PostgreSQL's timestamp output: a space, no offset (read as UTC)
	timeMember        // a JSON member: a space or a 'T', an offset or 'Z'
)

func parseTime(b []byte, form int) (int64, error) {
	// Converted only for an error message: the hot path allocates nothing.
	what := "timestamptz"
	if form == timeNoZone {
		what = "timestamp"
	}
	// The value is not quoted: it is a row's, and errors name rows by id.
	bad := func(why string) error { return fmt.Errorf("cannot parse the %s: %s", what, why) }
	switch string(b) {
	case "infinity", "-infinity":
		return 0, bad("infinite timestamps have no epoch time")
	}
	p := parser{s: unsafeString(b)}
	bc := false
	if n := len(p.s); n > 3 && p.s[n-3:] == " BC" {
		bc = true
		p.s = p.s[:n-3]
	}
	year := p.digits(4, 9)
	p.expect('-')
	month := p.digits(2, 2)
	p.expect('-')
	day := p.digits(2, 2)
	if form == timeMember && p.peek('T') {
		p.i++
	} else {
		p.expect(' ')
	}
	hour := p.digits(2, 2)
	p.expect(':')
	minute := p.digits(2, 2)
	p.expect(':')
	sec := p.digits(2, 2)
	var frac int64
	if p.peek('.') {
		p.expect('.')
		start := p.i
		f := p.digits(1, 6)
		for n := p.i - start; n < 6; n++ {
			f *= 10
		}
		frac = f
	}
	sign, off := int64(1), int64(0)
	switch {
	case form == timeNoZone:
	case form == timeMember && p.peek('Z'):
		p.i++
	case p.peek('+'), p.peek('-'):
		if p.s[p.i] == '-' {
			sign = -1
		}
		p.i++
		off = p.digits(2, 2) * 3600
		if p.peek(':') {
			p.expect(':')
			off += p.digits(2, 2) * 60
			if p.peek(':') {
				p.expect(':')
				off += p.digits(2, 2)
			}
		}
	default:
		p.fail("missing UTC offset")
	}
	if p.err == nil && p.i != len(p.s) {
		p.fail("trailing characters")
	}
	if p.err != nil {
		return 0, bad(p.err.Error())
	}
	if month < 1 || month > 12 || day < 1 || day > 31 || hour > 24 || minute > 59 || sec > 60 {
		return 0, bad("field out of range")
	}
	if bc {
		year = 1 - year
	}
	t := time.Date(int(year), time.Month(month), int(day), int(hour), int(minute), int(sec), 0, time.UTC)
	return (t.Unix()-sign*off)*1_000_000 + frac, nil
}

type parser struct {
	s   string
	i   int
	err error
}

func (p *parser) fail(why string) {
	if p.err == nil {
		p.err = errors.New(why)
	}
}

func (p *parser) peek(c byte) bool { return p.err == nil && p.i < len(p.s) && p.s[p.i] == c }

func (p *parser) expect(c byte) {
	if !p.peek(c) {
		p.fail(fmt.Sprintf("expected %q at position %d", c, p.i))
		return
	}
	p.i++
}

// digits reads between min and max decimal digits.
func (p *parser) digits(min, max int) int64 {
	if p.err != nil {
		return 0
	}
	var v int64
	n := 0
	for p.i < len(p.s) && n < max && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
		v = v*10 + int64(p.s[p.i]-'0')
		p.i++
		n++
	}
	if n < min {
		p.fail(fmt.Sprintf("expected at least %d digits at position %d", min, p.i-n))
	}
	return v
}
