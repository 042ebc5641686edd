package retention

import (
	"testing"

	"github.com/outboxd/outboxd/catalog"
)

// TestFingerprintComment: the fingerprint a detached table's comment
// carries reads back as written, and only under its own outbox's prefix.
func TestFingerprintComment(t *testing.T) {
	outbox := catalog.Table{Schema: "public", Name: "outbox"}
	f := fingerprint{rows: 4096, sum: "-92233720368547758070"}
	comment := detachedPrefix(outbox) + f.String()
	if got, ok := parseFingerprint(comment, detachedPrefix(outbox)); !ok || got != f {
		t.Errorf("parseFingerprint(%q) = %v, %v; want %v", comment, got, ok, f)
	}
	other := detachedPrefix(catalog.Table{Schema: "vendes", Name: "outbox"})
	if _, ok := parseFingerprint(comment, other); ok {
		t.Errorf("another outbox's prefix read %q", comment)
	}
	if _, ok := parseFingerprint(detachedPrefix(outbox)+"rows many", detachedPrefix(outbox)); ok {
		t.Error("a comment without a fingerprint read as one")
	}
}
