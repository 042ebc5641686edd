package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// SeedSchema is sql/001_outbox.sql: the outbox table of the contract, its
// index, and the demo's comandes table.
func SeedSchema() (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(root, "sql", "001_outbox.sql"))
	if err != nil {
		return "", fmt.Errorf("testenv: seed schema: %w", err)
	}
	return string(b), nil
}

// PartitionedOutbox is the contract's outbox partitioned by RANGE
// (creat_en), as a busy service keeps it (pg_partman's layout: the primary
// key holds the partition key), with no partition yet: the caller makes
// them, as pg_partman would.
const PartitionedOutbox = `CREATE TABLE outbox (
    id UUID NOT NULL, agregat TEXT NOT NULL, agregat_id TEXT NOT NULL, tipus TEXT NOT NULL,
    versio INTEGER NOT NULL DEFAULT 1, carrega JSONB NOT NULL, creat_en TIMESTAMPTZ NOT NULL DEFAULT now(),
    publicat_en TIMESTAMPTZ, PRIMARY KEY (id, creat_en)) PARTITION BY RANGE (creat_en);`

// CommitOutboxRows commits rows seed outbox rows in transactions of txn,
// each its own aggregate (prefix and a zero-padded number, also the
// carrega's id), and returns an LSN inside the last transaction, after
// its rows: a slot confirmed past it has every row in Kafka.
func CommitOutboxRows(ctx context.Context, db *pgx.Conn, rows, txn int, prefix string) (pglogrepl.LSN, error) {
	var last string
	for lo := 0; lo < rows; lo += txn {
		hi := min(lo+txn, rows) - 1
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega)
				SELECT gen_random_uuid(), 'comanda', $3 || lpad(g::text, 8, '0'), 'comanda.creada',
				  jsonb_build_object('id', $3 || lpad(g::text, 8, '0'), 'client', 'anna', 'mercat', 'girona', 'import_centims', g % 10000)
				FROM generate_series($1::int, $2::int) g`, lo, hi, prefix); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&last)
		})
		if err != nil {
			return 0, fmt.Errorf("testenv: insert rows %d-%d: %w", lo, hi, err)
		}
	}
	return pglogrepl.ParseLSN(last)
}
