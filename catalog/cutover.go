package catalog

import (
	"fmt"
	"hash/fnv"
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
