package catalog

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// A cut-over is outboxd publishing, from a slot it has just created, the
// rows the slot's exported snapshot sees as pending, before it streams
// (replication/cutover.go). Two names make it safe across crashes and
// instances, and are read here by everyone who must respect it:
//
//   - the marker: a physical replication slot, created without reserving
//     WAL (it pins nothing), that exists from before the logical slot is
//     created until Kafka has acknowledged the snapshot. While it exists
//     the logical slot's position means nothing: its snapshot rows may not
//     all be delivered, and the next start publishes the pending rows
//     again (CutoverKeeps);
//   - the lock: an advisory lock held exclusively, for the session, by the
//     instance doing the cut-over; the retention job and replay take it
//     shared (ReadDelivery), so no cut-over starts while they decide what
//     the slot has confirmed.
//
// A cut-over that did not finish and is given up (postgres.snapshot: none)
// leaves the replay hold in the marker's place: a physical slot that
// reserves no WAL either, and says that outboxd told the operator to
// replay the snapshot's rows (outboxd replay). The retention job deletes
// nothing while it exists, or it could delete the rows to replay; the
// operator drops it once they are replayed.

// CutoverKeeps reports whether a start that finds the marker keeps slot,
// the logical slot of the cut-over that did not finish. It was never
// confirmed, so it is still at its consistent point and holds every change
// committed since: kept, it loses nothing the snapshot cannot see (logical
// messages, rows of a table without publicat_en or deleted since). A slot
// that is gone, lost (wal_status lost: its WAL was removed, or it was
// invalidated) or not a logical pgoutput slot of this database cannot be
// streamed from: the cut-over starts over with a new slot.
func CutoverKeeps(slot *Slot) bool {
	return slot != nil && slot.Type == "logical" && slot.Plugin == "pgoutput" && slot.SameDatabase && slot.Unusable() == ""
}

// CutoverMarker is the name of the marker slot of slot.
func CutoverMarker(slot string) string { return slotWithSuffix(slot, "_snapshot") }

// ReplayHold is the name of the replay hold slot of slot.
func ReplayHold(slot string) string { return slotWithSuffix(slot, "_replay") }

// slotWithSuffix is slot's name with suffix, within the 63 bytes of a
// slot name: a long name is cut and told apart by a hash of the whole.
func slotWithSuffix(slot, suffix string) string {
	if len(slot)+len(suffix) <= 63 {
		return slot + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(slot))
	return fmt.Sprintf("%s_%08x%s", slot[:63-len(suffix)-9], h.Sum32(), suffix)
}

// CutoverLock is the advisory lock key of slot's cut-over.
func CutoverLock(slot string) int64 {
	h := fnv.New64a()
	h.Write([]byte("outboxd cut-over " + slot))
	return int64(h.Sum64())
}

// LockHolder is a session holding a slot's cut-over lock, as pg_locks and
// pg_stat_activity show it to any role.
type LockHolder struct {
	PID         string
	Role        string
	Application string
	Client      string // the client's address; "" over a Unix socket
	Since       string // when its session began
	// Outboxd: the session is a replication connection (which needs the
	// REPLICATION privilege) or of the role asking: outboxd's own. Any
	// role that can connect can take an advisory lock.
	Outboxd bool
}

func (h LockHolder) String() string {
	from := ""
	if h.Client != "" {
		from = ", from " + h.Client
	}
	return fmt.Sprintf("pid %s (role %s, application %q%s, connected since %s)", h.PID, h.Role, h.Application, from, h.Since)
}

// CutoverLockHolders are the sessions, other than conn's, that hold slot's
// cut-over lock (CutoverLock: an advisory lock on one bigint key, which
// pg_locks shows as its two halves).
func CutoverLockHolders(ctx context.Context, conn *pgconn.PgConn, slot string) ([]LockHolder, error) {
	key := uint64(CutoverLock(slot))
	rows, err := query(ctx, conn, fmt.Sprintf(`SELECT l.pid, coalesce(a.usename, ''), coalesce(a.application_name, ''),
		coalesce(host(a.client_addr), ''), coalesce(to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), ''),
		coalesce(a.backend_type = 'walsender' OR a.usename = current_user, false)
		FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %d AND l.objid = %d AND l.objsubid = 1
		AND l.pid <> pg_catalog.pg_backend_pid() ORDER BY l.pid`, key>>32, key&0xffffffff))
	if err != nil {
		return nil, fmt.Errorf("read who holds the cut-over lock: %w", err)
	}
	var hs []LockHolder
	for _, r := range rows {
		hs = append(hs, LockHolder{PID: str(r[0]), Role: str(r[1]), Application: str(r[2]), Client: str(r[3]), Since: str(r[4]), Outboxd: str(r[5]) == "t"})
	}
	return hs, nil
}

// CutoverBusy says why slot's cut-over lock could not be taken, naming
// what holds it: outboxd's own work (a cut-over publishing its snapshot,
// a slot being created and recorded, the retention job or replay reading
// the slot), or a session of another role, which is not a cut-over and
// holds back what needs the lock until it lets go.
func CutoverBusy(ctx context.Context, conn *pgconn.PgConn, slot string) string {
	hs, err := CutoverLockHolders(ctx, conn, slot)
	return DescribeCutoverHolders(slot, hs, err)
}

// DescribeCutoverHolders is CutoverBusy's sentence for the holders hs (or
// the error reading them), for a caller that has read them already.
func DescribeCutoverHolders(slot string, hs []LockHolder, err error) string {
	if err != nil {
		return fmt.Sprintf("the cut-over lock of replication slot %q is held (%v)", slot, err)
	}
	var ours, others []string
	for _, h := range hs {
		if h.Outboxd {
			ours = append(ours, h.String())
		} else {
			others = append(others, h.String())
		}
	}
	switch {
	case len(others) > 0:
		pid := hs[0].PID
		for _, h := range hs {
			if !h.Outboxd {
				pid = h.PID
				break
			}
		}
		return fmt.Sprintf("the cut-over lock of replication slot %q is held by %s: not an outboxd (neither outboxd's role nor a replication connection), so no cut-over runs; nothing that needs the lock proceeds until it lets go: if that session is not yours, end it (SELECT pg_terminate_backend(%s))",
			slot, strings.Join(others, ", "), pid)
	case len(ours) > 0:
		return fmt.Sprintf("a cut-over is publishing its snapshot, or the slot is being created or read, by %s", strings.Join(ours, ", "))
	}
	return "a cut-over is publishing its snapshot, or the slot is being created (its holder let go since)"
}
