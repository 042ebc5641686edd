-- 005_slot_record.sql: the slot record (postgres.slot_table, by default
-- public.outboxd_slots), for a role that may not create it itself.
--
--   psql -v ON_ERROR_STOP=1 -d km0_comandes -f sql/005_slot_record.sql
--
-- outboxd writes one row per replication slot it creates or finds: that it
-- has seen the slot (a later start that finds the slot missing refuses to
-- create it again until `outboxd slot forget`), and from when the slot
-- vouches for the outbox's rows (the retention job deletes or drops no row
-- the slot does not vouch for). The row is the same table as outboxd
-- creates when its role may (CREATE on the schema); it is in the database,
-- so a standby has it after a failover. Run as the schema's owner (or a
-- superuser), with the other postgres.slot_table when you set one.

CREATE TABLE IF NOT EXISTS public.outboxd_slots (
	slot text PRIMARY KEY,          -- the replication slot's name
	since timestamptz NOT NULL,     -- rows with creat_en at or after it were committed after the slot's consistent point
	covers jsonb NOT NULL,          -- the tables whose rows before the slot its cut-over snapshot (or the relay) published
	seen_lsn pg_lsn NOT NULL,       -- the slot's confirmed position when outboxd last found it
	seen_at timestamptz NOT NULL,
	missing_since timestamptz       -- when a start found the slot missing
);

GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE public.outboxd_slots TO outboxd;
