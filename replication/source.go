package replication

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// Source is where a session's records come from, as restart
// de-duplication (sink.Config) needs it: the database system, its current
// timeline, and where each earlier timeline of its history ended. A
// position reached on an earlier timeline is still history on this one
// when it is at or before that timeline's end; one past it was on a branch
// a promotion left (WAL the new primary never had).
type Source struct {
	System   string // the system identifier (IDENTIFY_SYSTEM)
	Timeline uint32 // the server's current timeline
	// Timelines are the current timeline and its ancestors: where each
	// began (its parent's switch point; 0 for timeline 1) and, but for the
	// current one, where it ended. Timeline numbers alone are not unique:
	// two branches made without a shared archive can both be timeline 2;
	// with its start a timeline is one branch.
	Timelines map[uint32]Timeline
	// WALEnd is the server's WAL position when the session began: a
	// position past it is not in this server's history.
	WALEnd uint64
}

// Timeline is one timeline of a server's history.
type Timeline struct {
	Start, End uint64 // End 0: the current one
}

// readSource reads the source over the session's replication connection.
// A history that cannot be read (a missing history file) is said and
// left out: earlier timelines then prove nothing, which costs duplicates,
// never events.
func (r *Runner) readSource(ctx context.Context, conn *pgconn.PgConn) (Source, error) {
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return Source{}, fmt.Errorf("identify system: %w", err)
	}
	src := Source{System: sys.SystemID, Timeline: uint32(sys.Timeline), WALEnd: uint64(sys.XLogPos),
		Timelines: map[uint32]Timeline{uint32(sys.Timeline): {}}}
	if sys.Timeline <= 1 {
		return src, nil // timeline 1 has no history
	}
	h, err := pglogrepl.TimelineHistory(ctx, conn, sys.Timeline)
	if err == nil {
		src.Timelines, err = timelines(uint32(sys.Timeline), h.Content)
	}
	if err != nil {
		r.log.Warn("cannot read the timeline history: records of earlier timelines will not spare duplicates after this promotion", "timeline", sys.Timeline, "error", err)
		src.Timelines = map[uint32]Timeline{uint32(sys.Timeline): {}}
	}
	return src, nil
}

// timelines reads the history file of timeline current: one line per
// ancestor, "<timeline>\t<switch point LSN>\t<reason>", oldest first.
func timelines(current uint32, content []byte) (map[uint32]Timeline, error) {
	out := map[uint32]Timeline{}
	start := uint64(0)
	sc := bufio.NewScanner(bytes.NewReader(content))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			return nil, fmt.Errorf("line %q: want a timeline and a switch point", line)
		}
		tli, err := strconv.ParseUint(f[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("line %q: %w", line, err)
		}
		end, err := pglogrepl.ParseLSN(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %q: %w", line, err)
		}
		out[uint32(tli)] = Timeline{Start: start, End: uint64(end)}
		start = uint64(end)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out[current] = Timeline{Start: start}
	return out, nil
}
