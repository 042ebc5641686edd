-- 001_outbox.sql: the outbox table of a km0 service database, and the demo's
-- `comandes` table.
--
-- A service writes its state change and the event in ONE transaction; the
-- event goes into `outbox`. outboxd reads the inserts from the WAL (logical
-- replication, pgoutput) and never updates or deletes outbox rows.
-- Idempotent: safe to run again.

CREATE TABLE IF NOT EXISTS outbox (
    id           UUID        PRIMARY KEY,           -- becomes id_esdeveniment
    agregat      TEXT        NOT NULL,              -- 'comanda'
    agregat_id   TEXT        NOT NULL,              -- 'P-2026-000123': the Kafka key
    tipus        TEXT        NOT NULL,              -- 'comanda.creada'
    versio       INTEGER     NOT NULL DEFAULT 1,
    carrega      JSONB       NOT NULL,
    creat_en     TIMESTAMPTZ NOT NULL DEFAULT now(),
    publicat_en  TIMESTAMPTZ                        -- used by the polling relay only
);

-- Serves the polling relay (`WHERE publicat_en IS NULL ORDER BY creat_en`).
-- outboxd does not need it; keep it while the relay may still run, e.g.
-- during a cut-over.
CREATE INDEX IF NOT EXISTS outbox_pendents ON outbox (creat_en) WHERE publicat_en IS NULL;

-- The `comandes` service's own state, used by the demo. An order and its
-- 'comanda.creada' event are written together:
--
--   BEGIN;
--   INSERT INTO comandes (id, client, mercat) VALUES ('P-2026-000123', 'C-42', 'mercat-del-ter');
--   INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega)
--   VALUES (gen_random_uuid(), 'comanda', 'P-2026-000123', 'comanda.creada',
--           '{"id": "P-2026-000123", "client": "C-42", "mercat": "mercat-del-ter"}');
--   COMMIT;
CREATE TABLE IF NOT EXISTS comandes (
    id       TEXT        PRIMARY KEY,               -- 'P-2026-000123'
    client   TEXT        NOT NULL,
    mercat   TEXT        NOT NULL,
    estat    TEXT        NOT NULL DEFAULT 'creada',
    creat_en TIMESTAMPTZ NOT NULL DEFAULT now()
);
