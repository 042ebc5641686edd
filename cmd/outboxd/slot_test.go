package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/replication"
)

// slot forget names the gap it accepts, or does nothing.
func TestSlotForgetUsage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"slot", "forget", "-c", "x.yaml"}, "--gap-from is required"},
		{[]string{"slot", "forget", "-c", "x.yaml", "--gap-from", "yesterday"}, `--gap-from "yesterday"`},
		{[]string{"slot", "forget", "-c", "/nonexistent/x.yaml", "--gap-from", "0/16B3748"}, "load config"},
	} {
		var out, errb bytes.Buffer
		if code := realMain(tt.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, code, errb.String(), tt.want)
		}
	}
}

// A missing slot outboxd had seen exits 3, however it is wrapped: the
// status the shipped systemd unit does not restart on.
func TestExitStatus(t *testing.T) {
	gone := replication.Fatal(&replication.SlotGoneError{})
	for _, tt := range []struct {
		err  error
		want int
	}{
		{errors.New("broker lost"), 1},
		{usageError{errors.New("bad key")}, 2},
		{gone, 3},
		{fmt.Errorf("replication: %w", gone), 3},
	} {
		if got := exitStatus(tt.err); got != tt.want {
			t.Errorf("exitStatus(%v) = %d, want %d", tt.err, got, tt.want)
		}
	}
}
