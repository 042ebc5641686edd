// Command pgoutput-fixture records real pgoutput messages for the decoder's
// unit tests: it starts a throwaway PostgreSQL (testenv), runs a small
// outbox workload on the seed schema and writes every message the pgoutput
// plugin emits for it, one per line as "LSN HEX", to the file given.
//
//	go run ./tools/pgoutput-fixture replication/testdata/outbox.pgoutput
package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/testenv"
)

// workload runs on the seed schema (sql/001_outbox.sql).
const workload = `
CREATE PUBLICATION fx FOR TABLE outbox WITH (publish = 'insert');
SELECT pg_create_logical_replication_slot('fx', 'pgoutput');
BEGIN;
INSERT INTO comandes (id, client, mercat) VALUES ('P-2026-000123', 'anna', 'girona');
INSERT INTO outbox (id, agregat, agregat_id, tipus, versio, carrega, creat_en) VALUES
  ('6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70', 'comanda', 'P-2026-000123', 'comanda.creada', 1,
   '{"id": "P-2026-000123", "client": "anna", "linies": [{"producte": "formatge-curat", "quantitat": 2, "preu_centims": 1450}]}',
   '2026-09-10 09:33:20.123999+02');
SELECT pg_logical_emit_message(true, 'km0', 'ignored by outboxd');
SELECT pg_logical_emit_message(true, 'comandes', '{"id_esdeveniment": "9c4f2b5d-3d7e-4fb0-8a4c-5e6f708192a3", "agregat_id": "P-2026-000123", "tipus": "comanda.notificada", "dades": {"canal": "sms"}}');
SELECT pg_logical_emit_message(false, 'comandes', '{"id_esdeveniment": "not-transactional"}');
INSERT INTO outbox (id, agregat, agregat_id, tipus, versio, carrega, creat_en) VALUES
  ('7a2d0f3b-1b5c-4d9f-8e2a-3c4d5e6f7081', 'comanda', 'P-2026-000123', 'comanda.pagada', 2, '{"import_centims": 2900}', '1969-12-31 23:59:59.9995+00');
COMMIT;
UPDATE outbox SET publicat_en = now();
DELETE FROM comandes;
ALTER TABLE outbox DROP COLUMN agregat;
ALTER TABLE outbox ADD COLUMN nota TEXT;
INSERT INTO outbox (id, agregat_id, tipus, carrega, creat_en, nota) VALUES
  ('8b3e1a4c-2c6d-4eaf-9f3b-4d5e6f708192', 'P-2026-000124', 'comanda.creada', '{"id": "P-2026-000124"}', '2026-12-02 12:46:05+05:30', 'after ALTER');
`

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: pgoutput-fixture OUTFILE")
		os.Exit(2)
	}
	if err := run(context.Background(), os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "pgoutput-fixture:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out string) error {
	env, err := testenv.Start(testenv.Options{NoKafka: true})
	if err != nil {
		return err
	}
	defer env.Cleanup()
	seed, err := testenv.SeedSchema()
	if err != nil {
		return err
	}
	dsn, err := env.CreateDatabase("outboxd_fixture", seed)
	if err != nil {
		return err
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["timezone"] = "UTC"
	cfg.RuntimeParams["datestyle"] = "ISO, YMD"
	fx, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer fx.Close(ctx)
	for _, stmt := range strings.Split(workload, ";\n") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := fx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", strings.TrimSpace(stmt), err)
		}
	}
	rows, err := fx.Query(ctx, "SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes('fx', NULL, NULL, 'proto_version', '1', 'publication_names', 'fx', 'messages', 'true')")
	if err != nil {
		return err
	}
	defer rows.Close()
	var b strings.Builder
	b.WriteString("# pgoutput messages (proto_version 1, messages true) recorded by tools/pgoutput-fixture\n")
	for rows.Next() {
		var lsn string
		var data []byte
		if err := rows.Scan(&lsn, &data); err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %c %s\n", lsn, data[0], hex.EncodeToString(data))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return os.WriteFile(out, []byte(b.String()), 0o644)
}
