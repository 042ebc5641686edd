-- 004_missatges_processats.sql: the consumers' deduplication table.
--
-- outboxd delivers at least once: after a crash an event may arrive again,
-- with the same id_esdeveniment. A consumer applies each event once by
-- recording its id in the SAME transaction as the effect. This table lives
-- in the consumer service's database (e.g. inventari), not in the outbox's.
-- Idempotent: safe to run again.

CREATE TABLE IF NOT EXISTS missatges_processats (
    id_missatge  TEXT        NOT NULL,   -- id_esdeveniment of the envelope
    consumidor   TEXT        NOT NULL,   -- e.g. 'inventari.descompte_estoc'
    processat_en TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (id_missatge, consumidor)
);

-- The idempotent apply, for each record read from Kafka:
--
--   BEGIN;
--   INSERT INTO missatges_processats (id_missatge, consumidor)
--   VALUES ($1, 'inventari.descompte_estoc')   -- $1 = envelope.id_esdeveniment
--   ON CONFLICT DO NOTHING
--   RETURNING id_missatge;
--   -- no row returned: a duplicate, already applied; COMMIT and skip it.
--   -- one row returned: apply the effect in this same transaction, e.g.
--   --   UPDATE estoc SET unitats = unitats - $2 WHERE producte = $3 AND unitats >= $2;
--   COMMIT;
--   -- then commit the Kafka offset. A crash before the offset commit
--   -- redelivers the record, and the INSERT above turns it into a no-op.
--
-- The consumer package (consumer/) does exactly this, with retries and a
-- dead-letter topic; examples/inventari is the consumer above.
