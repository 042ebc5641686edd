package health

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/clock"
	"github.com/outboxd/outboxd/postgres"
)

// SlotInfo is the slot's row in pg_replication_slots, as /status shows it.
type SlotInfo struct {
	Name              string `json:"name"`
	Plugin            string `json:"plugin"`
	Active            bool   `json:"active"`
	ActivePID         *int32 `json:"active_pid"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
	RestartLSN        string `json:"restart_lsn"`
	WALStatus         string `json:"wal_status"`
	SafeWALSize       *int64 `json:"safe_wal_size"`
	// InvalidationReason is why PostgreSQL invalidated the slot (17+;
	// 18 adds idle_timeout); Unusable, why it cannot be streamed from.
	InvalidationReason string `json:"invalidation_reason,omitempty"`
	Unusable           string `json:"unusable,omitempty"`
	// Stats is the slot's row in pg_stat_replication_slots (PostgreSQL
	// 14+); nil when it could not be read.
	Stats *SlotStats `json:"stats"`
}

// SlotStats is what the server's logical decoding did for the slot, as
// pg_stat_replication_slots counts it: cumulative since stats_reset (or
// the slot's creation), and set back to 0 by pg_stat_reset_replication_slot
// or a crash of the server.
type SlotStats struct {
	SpillTxns   int64      `json:"spill_txns"`
	SpillCount  int64      `json:"spill_count"`
	SpillBytes  int64      `json:"spill_bytes"`
	StreamTxns  int64      `json:"stream_txns"`
	StreamCount int64      `json:"stream_count"`
	StreamBytes int64      `json:"stream_bytes"`
	TotalTxns   int64      `json:"total_txns"`
	TotalBytes  int64      `json:"total_bytes"`
	StatsReset  *time.Time `json:"stats_reset"` // nil: never reset
}

// slotStats is s as /status shows it.
func slotStats(s *catalog.SlotStats) *SlotStats {
	if s == nil {
		return nil
	}
	out := &SlotStats{SpillTxns: s.SpillTxns, SpillCount: s.SpillCount, SpillBytes: s.SpillBytes,
		StreamTxns: s.StreamTxns, StreamCount: s.StreamCount, StreamBytes: s.StreamBytes, TotalTxns: s.TotalTxns, TotalBytes: s.TotalBytes}
	if !s.StatsReset.IsZero() {
		reset := s.StatsReset
		out.StatsReset = &reset
	}
	return out
}

// Snapshot is what one poll of PostgreSQL and the brokers found.
type Snapshot struct {
	At               time.Time     // when the poll began
	Err              string        // why the slot could not be read, if it could not
	Slot             *SlotInfo     // nil when the slot does not exist (or Err)
	ServerWAL        pglogrepl.LSN // the server's WAL position (0: not read)
	RetainedBytes    int64         // current WAL LSN - restart_lsn
	UnconfirmedBytes int64         // current WAL LSN - confirmed_flush_lsn
	Brokers          int
	BrokersReachable int
	// Publication says what keeps routed events from reaching outboxd
	// ("" when nothing does), with the statement that fixes it.
	Publication string
}

// pollTimeout bounds one poll (its queries and broker probes) at least.
const pollTimeout = 10 * time.Second

// MonitorConfig is what the monitor watches and how often.
type MonitorConfig struct {
	Conn        *pgconn.Config // a normal connection to the service database
	Slot        string
	Publication string
	Tables      []catalog.RoutedTable // what the publication must publish
	Brokers     []string
	// Probe asks addr whether it is a Kafka broker that answers.
	Probe    func(ctx context.Context, addr string) error
	Interval time.Duration
	// Clock is what the polls are dated and paced by, and what the health
	// server reads the time from (nil: the system's).
	Clock clock.Clock
}

// Monitor polls the slot, the publication and the brokers on an interval,
// and at once when asked (PollNow), on a connection of its own (never the
// replication connection).
type Monitor struct {
	cfg  MonitorConfig
	log  hclog.Logger
	kick chan struct{}

	mu   sync.Mutex
	last Snapshot
}

// NewMonitor prepares a monitor; Run starts polling.
func NewMonitor(cfg MonitorConfig, log hclog.Logger) *Monitor {
	cfg.Clock = clock.Or(cfg.Clock)
	return &Monitor{cfg: cfg, log: log, kick: make(chan struct{}, 1)}
}

// Snapshot returns the latest poll.
func (m *Monitor) Snapshot() Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// PollNow asks for a poll at once (the replication stream has just created
// or found the slot): the next Snapshot then reflects it.
func (m *Monitor) PollNow() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Run polls until ctx ends. after, when set, is called after every poll.
func (m *Monitor) Run(ctx context.Context, after func(Snapshot)) {
	p := poller{log: m.log}
	defer p.close()
	for {
		snap := Snapshot{At: m.cfg.Clock.Now(), Brokers: len(m.cfg.Brokers)}
		// A short poll_interval is how often to look, not how long a look
		// may take on a busy server.
		pctx, cancel := context.WithTimeout(ctx, max(m.cfg.Interval, pollTimeout))
		snap.BrokersReachable = m.probeBrokers(pctx)
		err := p.read(pctx, m.cfg, &snap)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			snap.Err = err.Error()
		}
		m.mu.Lock()
		m.last = snap
		m.mu.Unlock()
		if after != nil {
			after(snap)
		}
		// Polls start every Interval, however long one took (at once
		// after one that took longer).
		select {
		case <-ctx.Done():
			return
		case <-m.cfg.Clock.After(snap.At.Add(m.cfg.Interval).Sub(m.cfg.Clock.Now())):
		case <-m.kick:
		}
	}
}

func (m *Monitor) probeBrokers(ctx context.Context) int {
	n := 0
	for _, b := range m.cfg.Brokers {
		if m.cfg.Probe(ctx, b) == nil {
			n++
		}
	}
	return n
}

// poller holds the monitor's connection between polls.
type poller struct {
	log     hclog.Logger
	conn    *pgconn.PgConn
	version int
	// stats: the server has pg_stat_replication_slots; statsNoted: why
	// the slot's statistics are missing was logged on this connection.
	stats, statsNoted bool
}

func (p *poller) close() {
	if p.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = p.conn.Close(ctx)
		cancel()
		p.conn = nil
	}
}

// read fills snap from the server, (re)connecting when needed.
func (p *poller) read(ctx context.Context, cfg MonitorConfig, snap *Snapshot) error {
	if p.conn == nil || p.conn.IsClosed() {
		conn, err := postgres.Connect(ctx, cfg.Conn, postgres.Session{App: "outboxd-monitor"})
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		srv, err := catalog.ReadServer(ctx, conn)
		if err != nil {
			_ = conn.Close(ctx)
			return fmt.Errorf("read server settings: %w", err)
		}
		p.conn, p.version, p.stats, p.statsNoted = conn, srv.Version, srv.HasSlotStats(), false
	}
	pub, err := catalog.ReadPublication(ctx, p.conn, cfg.Publication, p.version)
	if err != nil {
		p.close()
		return fmt.Errorf("read the publication: %w", err)
	}
	var problems []string
	for _, pr := range pub.Check(cfg.Tables) {
		if pr.Kind == catalog.Unpublished {
			problems = append(problems, pr.String())
		}
	}
	snap.Publication = strings.Join(problems, "; ")
	s, err := catalog.ReadSlot(ctx, p.conn, cfg.Slot)
	if err != nil {
		p.close()
		return fmt.Errorf("read pg_replication_slots: %w", err)
	}
	if s == nil {
		return p.currentLSN(ctx, snap)
	}
	info := &SlotInfo{Name: s.Name, Plugin: s.Plugin, Active: s.Active, WALStatus: s.WALStatus, SafeWALSize: s.SafeWALSize,
		InvalidationReason: s.Invalidated, Unusable: s.Unusable()}
	if s.ActivePID != 0 {
		pid := s.ActivePID
		info.ActivePID = &pid
	}
	info.ConfirmedFlushLSN, info.RestartLSN = lsnText(s.ConfirmedFlush), lsnText(s.Restart)
	info.Stats = slotStats(p.readStats(ctx, cfg.Slot))
	snap.Slot = info
	snap.ServerWAL = s.CurrentWAL
	snap.RetainedBytes, snap.UnconfirmedBytes = s.RetainedBytes(), s.UnconfirmedBytes()
	return nil
}

// readStats reads the slot's decoding statistics. They only inform (a
// metric, /status), so a server without them (before PostgreSQL 14) or a
// failed read leaves them out, said once per connection at debug level,
// and the poll goes on.
func (p *poller) readStats(ctx context.Context, slot string) *catalog.SlotStats {
	note := func(why string) {
		if !p.statsNoted {
			p.statsNoted = true
			p.log.Debug("no slot statistics", "reason", why)
		}
	}
	if !p.stats {
		note(fmt.Sprintf("pg_stat_replication_slots needs PostgreSQL 14 (server_version_num %d)", p.version))
		return nil
	}
	st, err := catalog.ReadSlotStats(ctx, p.conn, slot)
	if err != nil {
		note("read pg_stat_replication_slots: " + err.Error())
		return nil
	}
	return st
}

// currentLSN reads the server's WAL position when there is no slot row to
// carry it.
func (p *poller) currentLSN(ctx context.Context, snap *Snapshot) error {
	results, err := p.conn.Exec(ctx, "SELECT pg_catalog.pg_current_wal_lsn()").ReadAll()
	if err == nil && (len(results) != 1 || len(results[0].Rows) != 1) {
		err = errors.New("no row")
	}
	if err == nil {
		snap.ServerWAL, err = pglogrepl.ParseLSN(string(results[0].Rows[0][0]))
	}
	if err != nil {
		p.close()
		return fmt.Errorf("read pg_current_wal_lsn(): %w", err)
	}
	return nil
}

// lsnText is an LSN as /status shows it: "" for none.
func lsnText(l pglogrepl.LSN) string {
	if l == 0 {
		return ""
	}
	return l.String()
}
