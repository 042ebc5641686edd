package preflight

import (
	"errors"
	"slices"
	"testing"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/config"
)

func TestEvalFailover(t *testing.T) {
	pg := config.Default().Postgres
	pg.Slot = "s"
	noFailover := pg
	noFailover.FailoverSlot = false
	noSnapshot := pg
	noSnapshot.Snapshot = config.SnapshotNone
	pg15 := catalog.Server{Version: 150018}
	pg17 := catalog.Server{Version: 170012}
	waiting := pg17
	waiting.SynchronizedStandbySlots = []string{"sb1"}
	slot := &catalog.Slot{Name: "s", Failover: true, ConfirmedFlush: 0x3000100}
	notYet := &catalog.Slot{Name: "s"}
	kept := []catalog.StandbySlot{{Name: "sb1", Exists: true, Physical: true, Active: true, Holder: "replica-a"}}
	streaming := []catalog.Standby{{Name: "replica-a", Addr: "10.0.0.8", Slot: "sb1", State: "streaming"}}
	standby := catalog.Server{Version: 170012, InRecovery: true, SyncReplicationSlots: true, HotStandbyFeedback: true, PrimarySlotName: "sb1"}
	synced := hostView{addr: "10.0.0.8:5432", srv: standby, slot: &catalog.Slot{Name: "s", Failover: true, Synced: true, ConfirmedFlush: 0x3000000}}
	with := func(h hostView, f func(*hostView)) hostView { f(&h); return h }
	tests := []struct {
		name   string
		pg     config.Postgres
		v      failoverView
		status string
		want   []string
	}{
		{"15: the window", pg, failoverView{srv: pg15, streaming: streaming}, Warn,
			[]string{"PostgreSQL 15 has no failover slots", "reconcile", "replica-a from 10.0.0.8, slot sb1", "create_slot: true",
				"publishes again every row still pending (publicat_en NULL) of public.outbox", "as long as rows stay in the table until delivered"}},
		{"15: snapshot none", noSnapshot, failoverView{srv: pg15}, Warn, []string{"comes without a snapshot", "reconcile (docs/failover.md)"}},
		{"15: a table that deletes its rows", pg, failoverView{srv: pg15, stats: map[catalog.Table]tableStats{{Schema: "public", Name: "outbox"}: {inserted: 9, deleted: 9}}}, Warn,
			[]string{"covers no route"}},
		{"17 through a standby", pg, failoverView{srv: catalog.Server{Version: 170012, InRecovery: true}}, Warn, []string{"leads to a standby"}},
		{"17, turned off", noFailover, failoverView{srv: waiting, slot: slot}, Warn, []string{"postgres.failover_slot is false", "publishes again every row still pending", "failover_slot: true removes this window"}},
		{"17, alone", pg, failoverView{srv: pg17, slot: slot}, Pass, []string{"slot s is a failover slot", "no standby streams"}},
		{"17, to be created for the cut-over", pg, failoverView{srv: pg17}, Pass, []string{"created for the cut-over, and made a failover slot once its snapshot is in Kafka"}},
		{"17, to be created", noSnapshot, failoverView{srv: pg17}, Pass, []string{"will be created as a failover slot"}},
		{"17, cut-over unfinished", pg, failoverView{srv: pg17, slot: notYet, marker: true}, Pass, []string{"did not finish", "makes the slot a failover slot once its snapshot is in Kafka"}},
		{"17, to be altered", pg, failoverView{srv: pg17, slot: notYet}, Pass, []string{"not a failover slot yet: outboxd makes it one"}},
		{"17, a standby the primary does not wait for", pg, failoverView{srv: pg17, slot: slot, streaming: streaming}, Warn,
			[]string{"synchronized_standby_slots is empty", "events of transactions the new primary never had", "sync_replication_slots = on"}},
		{"17, kept", pg, failoverView{srv: waiting, slot: slot, standbySlots: kept, streaming: streaming, others: []hostView{synced}}, Pass,
			[]string{"waits for the standby of sb1 (replica-a)", "standby 10.0.0.8:5432 keeps a synchronised copy (confirmed_flush_lsn 0/3000000, 256 bytes behind"}},
		{"17, waited-for slot missing", pg, failoverView{srv: waiting, slot: slot, standbySlots: []catalog.StandbySlot{{Name: "sb1"}}}, Fail,
			[]string{"names sb1, not a physical slot", "would receive nothing"}},
		{"17, waited-for standby down", pg, failoverView{srv: waiting, slot: slot, standbySlots: []catalog.StandbySlot{{Name: "sb1", Exists: true, Physical: true}}}, Warn,
			[]string{"the standby of sb1 does not stream", "holds back every change"}},
		{"17, standby without slot sync", pg, failoverView{srv: waiting, slot: slot, standbySlots: kept,
			others: []hostView{with(synced, func(h *hostView) { h.srv.SyncReplicationSlots = false })}}, Warn, []string{"sync_replication_slots = off"}},
		{"17, standby without feedback", pg, failoverView{srv: waiting, slot: slot, standbySlots: kept,
			others: []hostView{with(synced, func(h *hostView) { h.srv.HotStandbyFeedback = false })}}, Warn, []string{"hot_standby_feedback = off"}},
		{"17, standby on another slot", pg, failoverView{srv: waiting, slot: slot, standbySlots: kept,
			others: []hostView{with(synced, func(h *hostView) { h.srv.PrimarySlotName = "other" })}}, Warn, []string{`streams from slot "other"`}},
		{"17, no copy yet", pg, failoverView{srv: waiting, slot: slot, standbySlots: kept,
			others: []hostView{with(synced, func(h *hostView) { h.slot = nil })}}, Warn, []string{"no synchronised copy of slot s yet"}},
		{"17, a copy without a position yet", pg, failoverView{srv: waiting, slot: slot, standbySlots: kept,
			others: []hostView{with(synced, func(h *hostView) { h.slot = &catalog.Slot{Name: "s", Failover: true, Synced: true} })}}, Warn, []string{"no synchronised copy of slot s yet"}},
		{"17, another primary in the DSN", pg, failoverView{srv: waiting, slot: slot, standbySlots: kept,
			others: []hostView{with(synced, func(h *hostView) { h.srv.InRecovery = false })}}, Warn, []string{"is not a standby"}},
		{"17, standby unreachable", pg, failoverView{srv: waiting, slot: slot, standbySlots: kept,
			others: []hostView{{addr: "10.0.0.9:5432", err: errors.New("connection refused")}}}, Pass, []string{"10.0.0.9:5432 unreachable (connection refused)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { check(t, evalFailover(routed(tc.pg, outbox), tc.v), tc.status, tc.want...) })
	}
}

// outbox is the seed's table, routed.
var outbox = config.Route{Table: "public.outbox", Schema: "public", Name: "outbox", Columns: config.Columns{PublicatEn: "publicat_en"}}

// routed is a configuration of pg and routes, as the checks judge it.
func routed(pg config.Postgres, routes ...config.Route) target {
	cfg := config.Default()
	cfg.Postgres, cfg.Routes = pg, routes
	return newTarget(cfg)
}

func TestSnapshotGaps(t *testing.T) {
	pg := config.Default().Postgres
	noSnapshot := pg
	noSnapshot.Snapshot = config.SnapshotNone
	message := config.Route{Message: "pagaments"}
	noColumn := config.Route{Table: "public.events", Schema: "public", Name: "events"}
	deleting := config.Route{Table: "public.fleeting", Schema: "public", Name: "fleeting", Columns: config.Columns{PublicatEn: "publicat_en"}}
	filtered := outbox
	filtered.Filter = config.Match{{Column: "tipus", Values: []string{"x"}}}
	stats := map[catalog.Table]tableStats{
		{Schema: "public", Name: "fleeting"}: {inserted: 200, deleted: 200},
		{Schema: "public", Name: "outbox"}:   {inserted: 200, deleted: 150, live: 50}, // retention at work
	}
	tests := []struct {
		name string
		cfg  target
		want [][]string // one warning per uncovered route, in route order
	}{
		{"covered", routed(pg, outbox, filtered), nil},
		{"each route it does not cover", routed(pg, outbox, message, noColumn, deleting), [][]string{
			{`failover message prefix "pagaments"`, "routes[1]", "logical messages are in no table"},
			{"failover public.events", `routes[2].columns.publicat_en is "-"`},
			{"failover public.fleeting", "empty though 200 rows were inserted and 200 deleted", "deletes each row in its own transaction"},
		}},
		{"snapshot none", routed(noSnapshot, outbox, message), [][]string{
			{"failover public.outbox", "postgres.snapshot is none"},
			{`failover message prefix "pagaments"`, "postgres.snapshot is none"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := snapshotGaps(tc.cfg, stats)
			if len(got) != len(tc.want) {
				t.Fatalf("%d warnings, want %d: %v", len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				check(t, got[i], Warn, w...)
			}
		})
	}
	if got := coveredTables(routed(pg, outbox, filtered, message, noColumn, deleting), stats); !slices.Equal(got, []string{"public.outbox"}) {
		t.Errorf("covered tables %q, want public.outbox alone", got)
	}
}
