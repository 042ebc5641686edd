package preflight

import (
	"context"
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
}

// hostView is another host of the DSN (a standby, normally): its settings
// and its copy of the slot, or why it could not be read.
type hostView struct {
	addr string
	err  error
	srv  catalog.Server
	slot *catalog.Slot
}

func checkFailover(ctx context.Context, conn *pgx.Conn, cfg config.Config) []Result {
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
	return []Result{evalFailover(cfg.Postgres, v)}
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
	conn, err := pgconn.ConnectConfig(ctx, c)
	if err != nil {
		v.err = fmt.Errorf("%s", oneLine(scrub(err.Error(), c.Password)))
		return v
	}
	defer conn.Close(context.Background())
	if v.srv, v.err = catalog.ReadServer(ctx, conn); v.err == nil {
		v.slot, v.err = catalog.ReadSlot(ctx, conn, slot)
	}
	return v
}

// evalFailover: is the slot a failover slot, and does a standby keep it?
// Before PostgreSQL 17 it cannot be (a warning: the window a failover
// loses); on 17, a warning for each way the slot could be lost or get
// ahead of a standby, a failure for a synchronized_standby_slots entry that
// makes logical walsenders wait for ever.
func evalFailover(pg config.Postgres, v failoverView) Result {
	const name = "failover"
	slot := pg.Slot
	if !v.srv.FailoverSlots() {
		detail := fmt.Sprintf("PostgreSQL %d has no failover slots: a standby promoted after a failover has no slot %s, outboxd stops there (\"does not exist\"), and the events committed after the slot's last confirmed position, up to its re-creation on the new primary, are not delivered unless reconciled", v.srv.Major(), slot)
		fix := "after a failover, reconcile (README, Failover) and start outboxd with postgres.create_slot: true; PostgreSQL 17's failover slots remove this window"
		if pg.Snapshot == config.SnapshotPending {
			detail += "; with postgres.snapshot: pending the re-created slot's snapshot publishes every row whose publicat_en is NULL, which covers the window where that column exists (duplicates, not loss)"
			fix = "after a failover, start outboxd with postgres.create_slot: true (its snapshot republishes the pending rows; reconcile tables without publicat_en, README, Failover); PostgreSQL 17's failover slots remove this window"
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
	if !pg.FailoverSlot {
		return warn(name, fmt.Sprintf("postgres.failover_slot is false: slot %s is not synchronised to standbys, and a failover loses it", slot),
			"set postgres.failover_slot: true (outboxd makes the slot a failover slot at its next start)")
	}
	var state string
	switch {
	case v.slot == nil && pg.Snapshot == config.SnapshotPending && pg.CreateSlot:
		state = fmt.Sprintf("slot %s will be created for the cut-over, and made a failover slot once its snapshot is in Kafka (a failover before that stops outboxd: README, Failover)", slot)
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
		return warn(name, detail, "on the primary: synchronized_standby_slots = 'STANDBY_SLOT'; on each standby: primary_slot_name = 'STANDBY_SLOT', sync_replication_slots = on, hot_standby_feedback = on, dbname in primary_conninfo (README, Failover)")
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
