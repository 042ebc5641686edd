-- The inventari service's database (the course's km0/sql/inventari):
-- its stock, and the consumers' deduplication table (sql/004).
CREATE TABLE IF NOT EXISTS estoc (
    producte TEXT PRIMARY KEY,
    unitats  INTEGER NOT NULL CHECK (unitats >= 0)
);

CREATE TABLE IF NOT EXISTS missatges_processats (
    id_missatge  TEXT        NOT NULL,   -- id_esdeveniment of the envelope
    consumidor   TEXT        NOT NULL,   -- 'inventari.descompte_estoc'
    processat_en TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (id_missatge, consumidor)
);
