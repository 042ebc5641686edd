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
	bound := "FOR VALUES FROM ('2026-12-01 00:00:00+00') TO ('2026-12-02 00:00:00+00')"
	comment := detachedComment(outbox, f, bound)
	if got, b, ok := parseFingerprint(comment, detachedPrefix(outbox)); !ok || got != f || b != bound {
		t.Errorf("parseFingerprint(%q) = %v, %q, %v; want %v, %q", comment, got, b, ok, f, bound)
	}
	// An older outboxd's comment: the fingerprint alone.
	if got, b, ok := parseFingerprint(detachedPrefix(outbox)+f.String(), detachedPrefix(outbox)); !ok || got != f || b != "" {
		t.Errorf("a comment without a bound: %v, %q, %v; want %v", got, b, ok, f)
	}
	other := detachedPrefix(catalog.Table{Schema: "vendes", Name: "outbox"})
	if _, _, ok := parseFingerprint(comment, other); ok {
		t.Errorf("another outbox's prefix read %q", comment)
	}
	if _, _, ok := parseFingerprint(detachedPrefix(outbox)+"rows many", detachedPrefix(outbox)); ok {
		t.Error("a comment without a fingerprint read as one")
	}
}
