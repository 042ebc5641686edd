package catalog_test

import (
	"strings"
	"testing"

	"github.com/outboxd/outboxd/catalog"
)

func TestTableNames(t *testing.T) {
	for _, tc := range []struct {
		t           catalog.Table
		str, quoted string
	}{
		{catalog.Table{Schema: "public", Name: "outbox"}, "public.outbox", `"public"."outbox"`},
		{catalog.Table{Schema: "Vendes", Name: "OutboxEvent"}, `"Vendes"."OutboxEvent"`, `"Vendes"."OutboxEvent"`},
		{catalog.Table{Schema: "app.v2", Name: `we"ird`}, `"app.v2"."we""ird"`, `"app.v2"."we""ird"`},
		{catalog.Table{Schema: "s", Name: "_t$1"}, "s._t$1", `"s"."_t$1"`},
		{catalog.Table{Schema: "s", Name: "1t"}, `s."1t"`, `"s"."1t"`},
	} {
		if got := tc.t.String(); got != tc.str {
			t.Errorf("String() = %s, want %s", got, tc.str)
		}
		if got := tc.t.Quoted(); got != tc.quoted {
			t.Errorf("Quoted() = %s, want %s", got, tc.quoted)
		}
	}
	if got := catalog.QuoteLiteral("it's"); got != `'it''s'` {
		t.Errorf("QuoteLiteral: %s", got)
	}
}

// TestPublicationCheck is the one policy on a publication, with fix hints
// that are valid SQL for mixed-case names.
func TestPublicationCheck(t *testing.T) {
	outbox := catalog.Table{Schema: "public", Name: "outbox"}
	mixed := catalog.Table{Schema: "Vendes", Name: "OutboxEvent"}
	p1, p2 := catalog.Table{Schema: "public", Name: "outbox_p1"}, catalog.Table{Schema: "public", Name: "outbox_p2"}
	routes := []catalog.RoutedTable{
		{Table: outbox, Columns: []string{"id", "agregat_id", "tipus", "carrega", "creat_en"}},
		{Table: mixed, Columns: []string{"id", "aggregateid", "type", "payload", "timestamp"}},
	}
	all := map[catalog.Table]catalog.PublishedTable{outbox: {}, mixed: {}}
	pub := func(f func(*catalog.Publication)) catalog.Publication {
		p := catalog.Publication{Name: "Pub", Exists: true, Inserts: true, Tables: map[catalog.Table]catalog.PublishedTable{}}
		for k, v := range all {
			p.Tables[k] = v
		}
		if f != nil {
			f(&p)
		}
		return p
	}
	tests := []struct {
		name  string
		p     catalog.Publication
		kinds []string
		want  []string
	}{
		{"good", pub(nil), nil, nil},
		{"absent", catalog.Publication{Name: "Pub"}, []string{catalog.Unpublished},
			[]string{`CREATE PUBLICATION "Pub" FOR TABLE "public"."outbox", "Vendes"."OutboxEvent" WITH (publish = 'insert', publish_via_partition_root = true)`}},
		{"no inserts", pub(func(p *catalog.Publication) { p.Inserts = false }), []string{catalog.Unpublished}, []string{`ALTER PUBLICATION "Pub" SET (publish = 'insert')`}},
		{"mixed-case table not covered", pub(func(p *catalog.Publication) { delete(p.Tables, mixed) }), []string{catalog.Unpublished},
			[]string{`does not cover "Vendes"."OutboxEvent"`, `ALTER PUBLICATION "Pub" ADD TABLE "Vendes"."OutboxEvent"`}},
		{"column list leaves out a mapped column", pub(func(p *catalog.Publication) {
			p.Tables[mixed] = catalog.PublishedTable{Columns: []string{"id", "aggregateid", "type", "payload"}}
		}), []string{catalog.Unpublished}, []string{"leaves out timestamp", `SET TABLE "public"."outbox", "Vendes"."OutboxEvent"`}},
		{"row filter", pub(func(p *catalog.Publication) { p.Tables[outbox] = catalog.PublishedTable{RowFilter: "(tipus <> 'x')"} }),
			[]string{catalog.Unpublished}, []string{"never delivered"}},
		{"unrouted table", pub(func(p *catalog.Publication) {
			p.Tables[catalog.Table{Schema: "public", Name: "Comandes"}] = catalog.PublishedTable{}
		}),
			[]string{catalog.Unrouted}, []string{`covers public."Comandes", which has no route`, `DROP TABLE "public"."Comandes"`}},
		{"all tables", pub(func(p *catalog.Publication) { p.AllTables = true }), []string{catalog.Unrouted}, []string{"FOR ALL TABLES"}},
		// A partitioned outbox: pg_publication_tables lists its root with
		// publish_via_partition_root, its partitions without.
		{"partitioned, via its root", pub(func(p *catalog.Publication) { p.ViaRoot, p.Partitioned = true, map[catalog.Table]bool{outbox: true} }), nil, nil},
		{"partitioned, under its partitions' names", pub(func(p *catalog.Publication) {
			delete(p.Tables, outbox)
			p.Partitioned = map[catalog.Table]bool{outbox: true}
			p.Tables[p1] = catalog.PublishedTable{Root: outbox}
			p.Tables[p2] = catalog.PublishedTable{Root: outbox}
		}), []string{catalog.Unpublished}, []string{"has publish_via_partition_root off", "partitioned public.outbox", `ALTER PUBLICATION "Pub" SET (publish_via_partition_root = true)`}},
		{"partitioned without partitions yet, not via its root", pub(func(p *catalog.Publication) {
			delete(p.Tables, outbox)
			p.Partitioned = map[catalog.Table]bool{outbox: true}
		}), []string{catalog.Unpublished}, []string{`ALTER PUBLICATION "Pub" SET (publish_via_partition_root = true)`}},
		{"partitioned through a schema, not via its root", pub(func(p *catalog.Publication) {
			delete(p.Tables, outbox)
			p.Tables[p1] = catalog.PublishedTable{Root: outbox}
		}), []string{catalog.Unpublished}, []string{`ALTER PUBLICATION "Pub" SET (publish_via_partition_root = true)`}},
		{"a partition published by itself", pub(func(p *catalog.Publication) {
			p.ViaRoot = true
			delete(p.Tables, outbox)
			p.Tables[p1] = catalog.PublishedTable{Root: outbox}
		}), []string{catalog.Unpublished, catalog.Unrouted}, []string{`ADD TABLE "public"."outbox"`, "covers public.outbox_p1 (a partition of public.outbox), which has no route"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.p.Check(routes)
			var kinds []string
			var text strings.Builder
			for _, pr := range got {
				kinds = append(kinds, pr.Kind)
				text.WriteString(pr.String() + "\n")
			}
			if strings.Join(kinds, ",") != strings.Join(tc.kinds, ",") {
				t.Fatalf("kinds %v, want %v:\n%s", kinds, tc.kinds, text.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(text.String(), w) {
					t.Errorf("%q lacks %q", text.String(), w)
				}
			}
		})
	}
}

// TestSlotCommands: the option list, the only syntax with FAILOVER
// (PostgreSQL 17), only when asked for; the old syntax otherwise, which
// PostgreSQL 14 needs.
func TestSlotCommands(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{catalog.CreateSlotCommand("outboxd_comandes", false, true), `CREATE_REPLICATION_SLOT "outboxd_comandes" LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER true)`},
		{catalog.CreateSlotCommand("outboxd_comandes", false, false), `CREATE_REPLICATION_SLOT "outboxd_comandes" LOGICAL pgoutput NOEXPORT_SNAPSHOT`},
		{catalog.CreateSlotCommand("outboxd_comandes", true, true), `CREATE_REPLICATION_SLOT "outboxd_comandes" LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)`},
		{catalog.CreateSlotCommand("outboxd_comandes", true, false), `CREATE_REPLICATION_SLOT "outboxd_comandes" LOGICAL pgoutput EXPORT_SNAPSHOT`},
		{catalog.AlterSlotFailoverCommand("s", true), `ALTER_REPLICATION_SLOT "s" (FAILOVER true)`},
		{catalog.AlterSlotFailoverCommand("s", false), `ALTER_REPLICATION_SLOT "s" (FAILOVER false)`},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
	if !(catalog.Server{Version: 170000}).FailoverSlots() || (catalog.Server{Version: 160009}).FailoverSlots() {
		t.Error("failover slots are PostgreSQL 17's")
	}
}

func TestCutoverMarker(t *testing.T) {
	long := strings.Repeat("s", 63)
	for _, slot := range []string{"outboxd_comandes", strings.Repeat("a", 54), strings.Repeat("a", 55), long, long[:62] + "t"} {
		m, h := catalog.CutoverMarker(slot), catalog.ReplayHold(slot)
		if len(m) > 63 || !strings.HasSuffix(m, "_snapshot") || m == slot {
			t.Errorf("CutoverMarker(%q) = %q", slot, m)
		}
		if len(h) > 63 || !strings.HasSuffix(h, "_replay") || h == slot || h == m {
			t.Errorf("ReplayHold(%q) = %q", slot, h)
		}
	}
	if a, b := catalog.CutoverMarker(long), catalog.CutoverMarker(long[:62]+"t"); a == b {
		t.Errorf("two long slots share the marker %q", a)
	}
	if catalog.CutoverLock("a") == catalog.CutoverLock("b") {
		t.Error("two slots share a lock key")
	}
}
