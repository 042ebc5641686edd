package catalog

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// HasSlotStats: the server has pg_stat_replication_slots (PostgreSQL 14+).
func (s Server) HasSlotStats() bool { return s.Version >= 140000 }

// SlotStats is a logical slot's row in pg_stat_replication_slots: what the
// walsender's decoding did for the slot, cumulative since StatsReset (the
// slot's creation when never reset). Spill* count transactions queued past
// logical_decoding_work_mem and written to the server's disk, Stream* those
// sent to the client before their commit instead, Total* every decoded
// transaction. The server may set them back to 0: pg_stat_reset_replication_slot,
// or a crash (its statistics are not kept through one).
type SlotStats struct {
	SpillTxns, SpillCount, SpillBytes    int64
	StreamTxns, StreamCount, StreamBytes int64
	TotalTxns, TotalBytes                int64
	StatsReset                           time.Time // zero: never reset
}

// ReadSlotStats returns the statistics of the slot called name, or nil when
// the view has no row for it. Ask only a server that HasSlotStats: the
// view does not exist before PostgreSQL 14.
func ReadSlotStats(ctx context.Context, conn *pgconn.PgConn, name string) (*SlotStats, error) {
	rows, err := query(ctx, conn, `SELECT spill_txns, spill_count, spill_bytes, stream_txns, stream_count, stream_bytes,
			total_txns, total_bytes, (extract(epoch FROM stats_reset) * 1000000)::bigint
		FROM pg_catalog.pg_stat_replication_slots WHERE slot_name = `+QuoteLiteral(name))
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, nil
	}
	return parseSlotStats(rows[0])
}

// parseSlotStats reads ReadSlotStats's row: eight counters, then
// stats_reset in microseconds since the epoch (NULL: never reset).
func parseSlotStats(r []*string) (*SlotStats, error) {
	if len(r) != 9 {
		return nil, fmt.Errorf("pg_stat_replication_slots: %d columns, want 9", len(r))
	}
	var s SlotStats
	for i, dst := range []*int64{&s.SpillTxns, &s.SpillCount, &s.SpillBytes, &s.StreamTxns, &s.StreamCount, &s.StreamBytes, &s.TotalTxns, &s.TotalBytes} {
		n, err := strconv.ParseInt(str(r[i]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("pg_stat_replication_slots column %d: %w", i+1, err)
		}
		*dst = n
	}
	if r[8] != nil {
		us, err := strconv.ParseInt(*r[8], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("pg_stat_replication_slots stats_reset: %w", err)
		}
		s.StatsReset = time.UnixMicro(us).UTC()
	}
	return &s, nil
}
