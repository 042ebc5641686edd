-- 002_publication.sql: the insert-only publication outboxd subscribes to.
--
-- Requires: the owner of public.outbox, or a superuser.
-- outboxd creates this publication itself at start when it is absent and the
-- config says `create_publication: true` (the default), provided its role has
-- that privilege. Run this file instead when outboxd's role is not the table
-- owner (see 003_role.sql) and set `create_publication: false`.
--
-- publish = 'insert': outboxd only turns inserted rows into events; updates
-- (e.g. the polling relay's `UPDATE ... SET publicat_en`) and deletes (outbox
-- cleanup) are not even sent over the replication connection.
--
-- Not idempotent: CREATE PUBLICATION has no IF NOT EXISTS; running it twice
-- fails with "publication "outboxd_comandes" already exists". The name must
-- match `postgres.publication` in outboxd.yaml.
-- Also needs wal_level = logical on the server (a restart is needed to change it).

CREATE PUBLICATION outboxd_comandes FOR TABLE public.outbox WITH (publish = 'insert');
