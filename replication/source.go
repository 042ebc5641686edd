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
	System       string            // the system identifier (IDENTIFY_SYSTEM)
	Timeline     uint32            // the server's current timeline
	TimelineEnds map[uint32]uint64 // earlier timelines of its history -> the LSN each ended at
}

// readSource reads the source over the session's replication connection.
func readSource(ctx context.Context, conn *pgconn.PgConn) (Source, error) {
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return Source{}, fmt.Errorf("identify system: %w", err)
	}
	src := Source{System: sys.SystemID, Timeline: uint32(sys.Timeline)}
	if sys.Timeline <= 1 {
		return src, nil // timeline 1 has no history
	}
	h, err := pglogrepl.TimelineHistory(ctx, conn, sys.Timeline)
	if err != nil {
		return Source{}, fmt.Errorf("timeline history %d: %w", sys.Timeline, err)
	}
	if src.TimelineEnds, err = parseTimelineHistory(h.Content); err != nil {
		return Source{}, fmt.Errorf("timeline history %d (%s): %w", sys.Timeline, h.FileName, err)
	}
	return src, nil
}

// parseTimelineHistory reads a timeline history file: one line per
// ancestor, "<timeline>\t<switch point LSN>\t<reason>".
func parseTimelineHistory(content []byte) (map[uint32]uint64, error) {
	ends := map[uint32]uint64{}
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
		lsn, err := pglogrepl.ParseLSN(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %q: %w", line, err)
		}
		ends[uint32(tli)] = uint64(lsn)
	}
	return ends, sc.Err()
}
