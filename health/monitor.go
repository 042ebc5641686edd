package health

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// SlotInfo is the slot's row in pg_replication_slots.
type SlotInfo struct {
	Name              string `json:"name"`
	Plugin            string `json:"plugin"`
	Active            bool   `json:"active"`
	ActivePID         *int32 `json:"active_pid"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
	RestartLSN        string `json:"restart_lsn"`
	WALStatus         string `json:"wal_status"`
	SafeWALSize       *int64 `json:"safe_wal_size"`
}

// Snapshot is what one poll of PostgreSQL and the brokers found.
type Snapshot struct {
	At               time.Time
	Err              string    // why the slot could not be read, if it could not
	Slot             *SlotInfo // nil when the slot does not exist (or Err)
	ServerWALLSN     string
	RetainedBytes    int64 // current WAL LSN - restart_lsn
	UnconfirmedBytes int64 // current WAL LSN - confirmed_flush_lsn
	Brokers          int
	BrokersReachable int
	// Publication says what is wrong with the publication ("" when it
	// exists, publishes inserts and covers every routed table).
	Publication string
}

// Monitor polls pg_replication_slots and the brokers on an interval, on a
// connection of its own (never the replication connection).
type Monitor struct {
	dsn      string
	slot     string
	pub      string
	tables   []string // schema.table of every route
	brokers  []string
	interval time.Duration
	log      hclog.Logger

	mu   sync.Mutex
	last Snapshot
}

// NewMonitor prepares a monitor; Run starts polling.
func NewMonitor(dsn, slot, publication string, tables, brokers []string, interval time.Duration, log hclog.Logger) *Monitor {
	return &Monitor{dsn: dsn, slot: slot, pub: publication, tables: tables, brokers: brokers, interval: interval, log: log}
}

// Snapshot returns the latest poll.
func (m *Monitor) Snapshot() Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// Run polls until ctx ends. after, when set, is called after every poll.
func (m *Monitor) Run(ctx context.Context, after func(Snapshot)) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(cctx)
			cancel()
		}
	}()
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		snap := Snapshot{At: time.Now(), Brokers: len(m.brokers)}
		pctx, cancel := context.WithTimeout(ctx, m.interval)
		snap.BrokersReachable = m.dialBrokers(pctx)
		var err error
		conn, err = m.readSlot(pctx, conn, &snap)
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
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Monitor) dialBrokers(ctx context.Context) int {
	n := 0
	var d net.Dialer
	for _, b := range m.brokers {
		c, err := d.DialContext(ctx, "tcp", b)
		if err == nil {
			c.Close()
			n++
		}
	}
	return n
}

// readSlot fills snap from the server, (re)connecting when needed; it
// returns the connection to reuse.
func (m *Monitor) readSlot(ctx context.Context, conn *pgx.Conn, snap *Snapshot) (*pgx.Conn, error) {
	if conn == nil || conn.IsClosed() {
		cfg, err := pgx.ParseConfig(m.dsn)
		if err != nil {
			return nil, fmt.Errorf("postgres.dsn is not a valid connection string")
		}
		cfg.RuntimeParams["application_name"] = "outboxd-monitor"
		if conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
			return nil, fmt.Errorf("connect: %w", err)
		}
	}
	var cur string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&cur); err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("read pg_current_wal_lsn(): %w", err)
	}
	snap.ServerWALLSN = cur
	if err := m.readPublication(ctx, conn, snap); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	var s SlotInfo
	var confirmed, restart, walStatus *string
	err := conn.QueryRow(ctx, `SELECT slot_name, plugin, active, active_pid, confirmed_flush_lsn::text, restart_lsn::text, wal_status, safe_wal_size
		FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, m.slot).
		Scan(&s.Name, &s.Plugin, &s.Active, &s.ActivePID, &confirmed, &restart, &walStatus, &s.SafeWALSize)
	if err == pgx.ErrNoRows {
		return conn, nil
	}
	if err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("read pg_replication_slots: %w", err)
	}
	s.ConfirmedFlushLSN, s.RestartLSN, s.WALStatus = deref(confirmed), deref(restart), deref(walStatus)
	snap.Slot = &s
	curLSN, _ := pglogrepl.ParseLSN(cur)
	if l, err := pglogrepl.ParseLSN(s.RestartLSN); err == nil && curLSN >= l {
		snap.RetainedBytes = int64(curLSN - l)
	}
	if l, err := pglogrepl.ParseLSN(s.ConfirmedFlushLSN); err == nil && curLSN >= l {
		snap.UnconfirmedBytes = int64(curLSN - l)
	}
	return conn, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// readPublication checks that the publication still exists, publishes
// inserts and covers every routed table: altered under a running outboxd,
// it would stop events silently.
func (m *Monitor) readPublication(ctx context.Context, conn *pgx.Conn, snap *Snapshot) error {
	var insert bool
	err := conn.QueryRow(ctx, "SELECT pubinsert FROM pg_catalog.pg_publication WHERE pubname = $1", m.pub).Scan(&insert)
	if err == pgx.ErrNoRows {
		snap.Publication = fmt.Sprintf("publication %q does not exist: no outbox insert reaches outboxd; recreate it (sql/002_publication.sql)", m.pub)
		return nil
	}
	if err != nil {
		return fmt.Errorf("read pg_publication: %w", err)
	}
	if !insert {
		snap.Publication = fmt.Sprintf("publication %q no longer publishes inserts: ALTER PUBLICATION %s SET (publish = 'insert')", m.pub, m.pub)
		return nil
	}
	rows, err := conn.Query(ctx, "SELECT schemaname || '.' || tablename FROM pg_catalog.pg_publication_tables WHERE pubname = $1", m.pub)
	if err != nil {
		return fmt.Errorf("read pg_publication_tables: %w", err)
	}
	published := map[string]bool{}
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return err
		}
		published[t] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	var missing []string
	for _, t := range m.tables {
		if !published[t] {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		snap.Publication = fmt.Sprintf("publication %q no longer covers %s: inserts into it do not reach outboxd; ALTER PUBLICATION %s ADD TABLE %s", m.pub, strings.Join(missing, ", "), m.pub, strings.Join(missing, ", "))
	}
	return nil
}
