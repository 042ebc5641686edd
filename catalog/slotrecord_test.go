package catalog_test

import (
	"testing"

	"github.com/outboxd/outboxd/catalog"
)

// A slot vouches for every row of a table only when its cut-over covered
// that table; a table routed later, or a slot without a cut-over, is
// vouched for by creat_en alone.
func TestSlotRecordCoversTable(t *testing.T) {
	outbox := catalog.Table{Schema: "public", Name: "outbox"}
	mixed := catalog.Table{Schema: "Vendes", Name: "Outbox.Events"}
	rec := &catalog.SlotRecord{Covers: []string{outbox.String(), mixed.String()}}
	for _, tt := range []struct {
		rec  *catalog.SlotRecord
		t    catalog.Table
		want bool
	}{
		{rec, outbox, true},
		{rec, mixed, true},
		{rec, catalog.Table{Schema: "public", Name: "arxiu"}, false},
		{&catalog.SlotRecord{}, outbox, false},
		{nil, outbox, false},
	} {
		if got := tt.rec.CoversTable(tt.t); got != tt.want {
			t.Errorf("%v.CoversTable(%s) = %t, want %t", tt.rec, tt.t, got, tt.want)
		}
	}
}
