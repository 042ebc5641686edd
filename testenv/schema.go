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
