package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestIsTransient(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("apply: %w", &pgconn.PgError{Code: code}) }
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"marked permanent", Permanent(errors.New("estoc insuficient")), false},
		{"marked transient", Transient(errors.New("mapes: 503")), true},
		{"marked permanent wins over a transient cause", Permanent(pg("40001")), false},
		{"serialization failure", pg("40001"), true},
		{"deadlock", pg("40P01"), true},
		{"lock timeout", pg("55P03"), true},
		{"admin shutdown", pg("57P01"), true},
		{"connection failure", pg("08006"), true},
		{"too many connections", pg("53300"), true},
		{"check constraint", pg("23514"), false},
		{"bad input", pg("22P02"), false},
		{"unexpected EOF", fmt.Errorf("begin: %w", io.ErrUnexpectedEOF), true},
		{"deadline", context.DeadlineExceeded, true},
		{"a bug", errors.New("index out of range"), false},
	} {
		if got := IsTransient(tt.err); got != tt.want {
			t.Errorf("%s: IsTransient(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
