package testenv

import (
	"fmt"
	"os"
	"path/filepath"
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
