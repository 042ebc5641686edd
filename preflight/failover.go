package preflight

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/postgres"
)

// ---- failover ----

// failoverView is what the failover check reads: the server and the slot,
// the standbys the primary waits for (synchronized_standby_slots) and
// those streaming from it, and every other host of a multi-host DSN as
// that host sees itself.
type failoverView struct {
	srv          catalog.Server
	slot         *catalog.Slot
	marker       bool // the slot's cut-over did not finish
	standbySlots []catalog.StandbySlot
	streaming    []catalog.Standby
	others       []hostView
	// stats of each routed table, read where a failover loses the slot
	// (lostSlot)
	stats map[catalog.Table]tableStats
}

// hostView is another host of the DSN (a standby, normally): its settings
// and its copy of the slot, or why it could not be read.
type hostView struct {
	addr string
	err  error
	srv  catalog.Server
	slot *catalog.Slot
}

func checkFailover(ctx context.Context, conn *pgx.Conn, cfg target) []Result {
	var v failoverView
	var err error
	pc := conn.PgConn()
	if v.srv, err = catalog.ReadServer(ctx, pc); err != nil {
		return queryFailed("failover", err)
	}
	if v.slot, err = catalog.ReadSlot(ctx, pc, cfg.Postgres.Slot); err != nil {
		return queryFailed("failover", err)
	}
	marker, err := catalog.ReadSlot(ctx, pc, catalog.CutoverMarker(cfg.Postgres.Slot))
	if err != nil {
		return queryFailed("failover", err)
	}
	v.marker = marker != nil
	if v.standbySlots, err = catalog.ReadStandbySlots(ctx, pc, v.srv.SynchronizedStandbySlots); err != nil {
		return queryFailed("failover", err)
	}
	if v.streaming, err = catalog.ReadStandbys(ctx, pc); err != nil {
		return queryFailed("failover", err)
	}
	v.others = otherHosts(ctx, cfg.Postgres, pc.Conn().RemoteAddr().String())
	if !lostSlot(cfg.Postgres, v.srv) {
		return []Result{evalFailover(cfg, v)}
	}
	if v.stats, err = readTableStats(ctx, conn, cfg); err != nil {
		return queryFailed("failover", err)
	}
	return append([]Result{evalFailover(cfg, v)}, snapshotGaps(cfg, v.stats)...)
}

// otherHosts reads every host of the DSN but the one connected to (the
// primary), each on a connection of its own without target_session_attrs,
// so that a standby answers.
func otherHosts(ctx context.Context, pg config.Postgres, connected string) []hostView {
	cc, err := pg.ConnConfig()
	if err != nil {
		return nil
	}
	hosts := append([]*pgconn.FallbackConfig{{Host: cc.Host, Port: cc.Port, TLSConfig: cc.TLSConfig}}, cc.Fallbacks...)
	var out []hostView
	seen := map[string]bool{connected: true}
	for _, h := range hosts {
		addr := net.JoinHostPort(h.Host, strconv.Itoa(int(h.Port)))
		if strings.HasPrefix(h.Host, "/") || seen[addr] || resolvesTo(h.Host, h.Port, connected) {
			continue
		}
		seen[addr] = true
		out = append(out, readHost(ctx, cc, h, addr, pg.Slot))
	}
	return out
}

// resolvesTo: host:port is the address connected to (a name for it).
func resolvesTo(host string, port uint16, connected string) bool {
	ips, err := net.LookupHost(host)
	if err != nil {
		return false
	}
	for _, ip := range ips {
		if net.JoinHostPort(ip, strconv.Itoa(int(port))) == connected {
			return true
		}
	}
	return false
}

func readHost(ctx context.Context, base *pgconn.Config, h *pgconn.FallbackConfig, addr, slot string) hostView {
	v := hostView{addr: addr}
	c := base.Copy()
	c.Host, c.Port, c.TLSConfig, c.Fallbacks = h.Host, h.Port, h.TLSConfig, nil
	c.ValidateConnect = nil
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := postgres.Connect(ctx, c, postgres.Session{})
	if err != nil {
		v.err = errors.New(oneLine(err.Error()))
		return v
	}
	defer conn.Close(context.Background())
	if v.srv, v.err = catalog.ReadServer(ctx, conn); v.err == nil {
		v.slot, v.err = catalog.ReadSlot(ctx, conn, slot)
	}
	return v
}

// lostSlot: a failover loses the slot, which the standby does not keep:
// before PostgreSQL 17, or on 17 with postgres.failover_slot false.
func lostSlot(pg config.Postgres, srv catalog.Server) bool {
	return !srv.FailoverSlots() || !srv.InRecovery && !pg.FailoverSlot
}

// evalFailover: is the slot a failover slot, and does a standby keep it?
// Where it cannot be one (before PostgreSQL 17) or is not, a warning: the
// window a failover loses, and the tables the re-created slot's snapshot
// publishes again (snapshotGaps warns about each route it does not
// cover); on 17, a warning for each way the slot could be lost or get
// ahead of a standby, a failure for a synchronized_standby_slots entry
// that makes logical walsenders wait for ever.
func evalFailover(cfg target, v failoverView) Result {
	const name = "failover"
	pg := cfg.Postgres
	slot := pg.Slot
	if lostSlot(pg, v.srv) {
		detail := fmt.Sprintf("PostgreSQL %d has no failover slots: a standby promoted after a failover has no slot %s", v.srv.Major(), slot)
		remedy := "PostgreSQL 17's failover slots remove this window"
		if v.srv.FailoverSlots() {
			detail = fmt.Sprintf("postgres.failover_slot is false: slot %s is not synchronised to standbys, and a failover loses it", slot)
			remedy = "postgres.failover_slot: true removes this window"
		}
		detail += "; outboxd stops on the promoted standby (\"does not exist\"), and the events committed after the slot's last confirmed position, up to its re-creation on the new primary, are not delivered unless reconciled"
		fix := "after a failover, reconcile (docs/failover.md), accept the gap (outboxd slot forget --gap-from, with the position outboxd's error names) and start outboxd with postgres.create_slot: true; " + remedy
		tables := coveredTables(cfg, v.stats)
		switch {
		case pg.Snapshot == config.SnapshotNone:
			detail += "; with postgres.snapshot: none the re-created slot comes without a snapshot"
		case len(tables) == 0:
			detail += "; the re-created slot's snapshot covers no route"
		default:
			detail += fmt.Sprintf("; with postgres.snapshot: pending the re-created slot's snapshot publishes again every row still pending (publicat_en NULL) of %s, which covers their window as long as rows stay in the table until delivered (duplicates, not loss)", strings.Join(tables, ", "))
			fix = "after a failover, accept the gap (outboxd slot forget --gap-from, with the position outboxd's error names), start outboxd with postgres.create_slot: true (its snapshot publishes the window of the tables it covers again) and reconcile each route a \"failover\" line below names (docs/failover.md); " + remedy
		}
		if s := standbyNames(v); s != "" {
			detail += "; standbys: " + s
		}
		return warn(name, detail, fix)
	}
	if v.srv.InRecovery {
		return warn(name, "the DSN leads to a standby (in recovery): only a primary's slot can be a failover slot",
			"point postgres.dsn at the primary, or list every host with target_session_attrs=read-write")
	}
	var state string
	switch {
	case v.slot == nil && pg.Snapshot == config.SnapshotPending && pg.CreateSlot:
		state = fmt.Sprintf("slot %s will be created for the cut-over, and made a failover slot once its snapshot is in Kafka (a failover before that stops outboxd: docs/failover.md)", slot)
	case v.slot == nil:
		state = fmt.Sprintf("slot %s will be created as a failover slot", slot)
	case v.marker:
		state = fmt.Sprintf("the cut-over of slot %s did not finish: the next start does it again, and makes the slot a failover slot once its snapshot is in Kafka", slot)
	case !v.slot.Failover:
		state = fmt.Sprintf("slot %s is not a failover slot yet: outboxd makes it one at start", slot)
	default:
		state = fmt.Sprintf("slot %s is a failover slot", slot)
	}
	// The standbys the primary waits for.
	var waited, missing, idle []string
	for _, s := range v.standbySlots {
		switch {
		case !s.Exists || !s.Physical:
			missing = append(missing, s.Name)
		case !s.Active:
			idle = append(idle, s.Name)
		default:
			waited = append(waited, s.Name+holderName(s.Holder))
		}
	}
	if len(missing) > 0 {
		return fail(name, fmt.Sprintf("%s; synchronized_standby_slots names %s, not a physical slot on this server: logical walsenders wait for it, so outboxd would receive nothing", state, strings.Join(missing, ", ")),
			"remove it from synchronized_standby_slots (SELECT pg_reload_conf() after), or create the standby it stands for")
	}
	problems, notes := standbyViews(v, slot)
	if len(idle) > 0 {
		problems = append(problems, fmt.Sprintf("the standby of %s does not stream: until it does, the primary holds back every change from outboxd", strings.Join(idle, ", ")))
	}
	if len(v.standbySlots) == 0 {
		if s := standbyNames(v); s != "" {
			problems = append(problems, fmt.Sprintf("standbys stream from this server (%s) but synchronized_standby_slots is empty: the slot can get ahead of them, and a failover can leave in Kafka events of transactions the new primary never had", s))
		} else {
			notes = append(notes, "no standby streams from this server (nothing to fail over to; a standby outboxd cannot see must be listed in synchronized_standby_slots)")
		}
	} else if len(waited) > 0 {
		notes = append(notes, "the primary waits for the standby of "+strings.Join(waited, ", ")+" before sending a change (synchronized_standby_slots): the slot never gets ahead of it")
	}
	detail := strings.Join(append([]string{state}, append(problems, notes...)...), "; ")
	if len(problems) > 0 {
		return warn(name, detail, "on the primary: synchronized_standby_slots = 'STANDBY_SLOT'; on each standby: primary_slot_name = 'STANDBY_SLOT', sync_replication_slots = on, hot_standby_feedback = on, dbname in primary_conninfo (docs/failover.md)")
	}
	return pass(name, "%s", detail)
}

// standbyViews judges the other hosts of the DSN: a standby that keeps a
// synchronised copy of the slot is a note, anything else a problem.
func standbyViews(v failoverView, slot string) (problems, notes []string) {
	for _, h := range v.others {
		switch {
		case h.err != nil:
			notes = append(notes, fmt.Sprintf("%s unreachable (%v)", h.addr, h.err))
		case !h.srv.InRecovery:
			problems = append(problems, fmt.Sprintf("%s is not a standby (not in recovery)", h.addr))
		case !h.srv.SyncReplicationSlots:
			problems = append(problems, fmt.Sprintf("standby %s does not synchronise failover slots (sync_replication_slots = off)", h.addr))
		case !h.srv.HotStandbyFeedback:
			problems = append(problems, fmt.Sprintf("standby %s has hot_standby_feedback = off (its copy of the slot can be invalidated)", h.addr))
		case len(v.srv.SynchronizedStandbySlots) > 0 && !slices.Contains(v.srv.SynchronizedStandbySlots, h.srv.PrimarySlotName):
			problems = append(problems, fmt.Sprintf("standby %s streams from slot %q, which synchronized_standby_slots does not list", h.addr, h.srv.PrimarySlotName))
		case h.slot == nil || !h.slot.Synced || h.slot.ConfirmedFlush == 0: // a copy being made has no position yet
			problems = append(problems, fmt.Sprintf("standby %s has no synchronised copy of slot %s yet", h.addr, slot))
		default:
			behind := ""
			if v.slot != nil && v.slot.ConfirmedFlush >= h.slot.ConfirmedFlush {
				behind = fmt.Sprintf(", %d bytes behind the primary's", v.slot.ConfirmedFlush-h.slot.ConfirmedFlush)
			}
			notes = append(notes, fmt.Sprintf("standby %s keeps a synchronised copy (confirmed_flush_lsn %s%s)", h.addr, h.slot.ConfirmedFlush, behind))
		}
	}
	return problems, notes
}

func standbyNames(v failoverView) string {
	var names []string
	for _, s := range v.streaming {
		n := s.Name
		if n == "" {
			n = "unnamed"
		}
		if s.Addr != "" {
			n += " from " + s.Addr
		}
		if s.Slot != "" {
			n += ", slot " + s.Slot
		}
		names = append(names, n)
	}
	return strings.Join(names, "; ")
}

func holderName(h string) string {
	if h == "" {
		return ""
	}
	return " (" + h + ")"
}

// tableStats is what pg_stat_user_tables says of a routed table: rows
// inserted and deleted since its statistics were reset, and live now.
type tableStats struct{ inserted, deleted, live int64 }

// deletesItsRows: every row inserted is gone, and the table is empty: the
// service deletes each row in the transaction that inserts it
// (docs/housekeeping.md), or something else deleted them all. Its rows do
// not stay until delivered, so a snapshot finds nothing of them.
func (s tableStats) deletesItsRows() bool {
	return s.inserted > 0 && s.live == 0 && s.deleted >= s.inserted
}

// readTableStats reads the statistics of every table a route reads that
// has a publicat_en column (a table the snapshot would read).
func readTableStats(ctx context.Context, conn *pgx.Conn, cfg target) (map[catalog.Table]tableStats, error) {
	out := map[catalog.Table]tableStats{}
	for _, i := range snapshotRoutes(cfg.routing) {
		r := &cfg.routing.Routes[i]
		if r.Prefix != "" || r.Columns.PublicatEn == "" {
			continue
		}
		t := catalog.Table{Schema: r.Schema, Name: r.Table}
		var s tableStats
		err := conn.QueryRow(ctx, "SELECT n_tup_ins, n_tup_del, n_live_tup FROM pg_catalog.pg_stat_user_tables WHERE relid = to_regclass($1)",
			t.Quoted()).Scan(&s.inserted, &s.deleted, &s.live)
		switch {
		case errors.Is(err, pgx.ErrNoRows): // no such table: its own check fails
		case err != nil:
			return nil, err
		default:
			out[t] = s
		}
	}
	return out, nil
}

// snapshotRoutes are the routes as the snapshot sees them: each table
// once, by its first route (whose publicat_en it reads, as outboxd's run
// does), each message route.
func snapshotRoutes(m envelope.Routing) []int {
	var out []int
	for _, s := range m.Sources {
		if s.Prefix != "" {
			out = append(out, s.Routes...)
		} else {
			out = append(out, s.Routes[0])
		}
	}
	return out
}

// coveredTables are the tables whose window the snapshot of a re-created
// slot publishes again: with a publicat_en column, and not seen deleting
// their rows.
func coveredTables(cfg target, stats map[catalog.Table]tableStats) []string {
	var out []string
	for _, i := range snapshotRoutes(cfg.routing) {
		r := &cfg.routing.Routes[i]
		t := catalog.Table{Schema: r.Schema, Name: r.Table}
		if r.Prefix == "" && r.Columns.PublicatEn != "" && !stats[t].deletesItsRows() {
			out = append(out, t.String())
		}
	}
	return out
}

// snapshotGaps warns, for each route the snapshot of a slot re-created
// after a failover does not cover (lostSlot), why, and how to reconcile
// its events of the window instead: a logical message is in no table; a
// table without publicat_en has nothing pending; a table that deletes its
// rows keeps none; postgres.snapshot: none takes no snapshot at all.
func snapshotGaps(cfg target, stats map[catalog.Table]tableStats) []Result {
	const reconcile = "reconcile its events of the window by hand after a failover (docs/failover.md)"
	var out []Result
	for _, i := range snapshotRoutes(cfg.routing) {
		r := &cfg.routing.Routes[i]
		t := catalog.Table{Schema: r.Schema, Name: r.Table}
		name := "failover " + t.String()
		if r.Prefix != "" {
			name = fmt.Sprintf("failover message prefix %q", r.Prefix)
		}
		gap := "the snapshot of a slot re-created after a failover does not cover it"
		switch {
		case cfg.Postgres.Snapshot == config.SnapshotNone:
			out = append(out, warn(name, gap+": postgres.snapshot is none, so the new slot starts without one",
				"set postgres.snapshot: pending, or "+reconcile))
		case r.Prefix != "":
			out = append(out, warn(name, fmt.Sprintf("%s (routes[%d]): logical messages are in no table, so the snapshot cannot publish them again", gap, i),
				"after a failover, have the service emit the window's messages again (docs/failover.md), or route an outbox table instead"))
		case r.Columns.PublicatEn == "":
			out = append(out, warn(name, fmt.Sprintf("%s: routes[%d].columns.publicat_en is \"-\", so no row of it is pending", gap, i),
				"add a publicat_en column (NULL on insert) and name it in routes[].columns.publicat_en, or "+reconcile+" (outboxd replay --from)"))
		case stats[t].deletesItsRows():
			st := stats[t]
			out = append(out, warn(name, fmt.Sprintf("%s: the table is empty though %d rows were inserted and %d deleted (pg_stat_user_tables): a service that deletes each row in its own transaction leaves the snapshot nothing", gap, st.inserted, st.deleted),
				"keep the rows until delivered (retention.max_age deletes them once Kafka has them), or reconcile the window from the service's own records after a failover (the table keeps nothing to replay); if rows do stay (the table was just emptied), ignore this"))
		}
	}
	return out
}
