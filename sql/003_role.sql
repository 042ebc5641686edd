-- 003_role.sql: a least-privilege login role for outboxd.
--
-- Run with psql, passing the password as a variable so it never lands in
-- this file or in the shell history of the SQL text:
--
--   psql -v ON_ERROR_STOP=1 -v outboxd_password="$OUTBOXD_PASSWORD" \
--        -d km0_comandes -f sql/003_role.sql
--
-- Requires:
--   * CREATE ROLE ... REPLICATION: a superuser (a role with CREATEROLE cannot
--     grant REPLICATION unless it has it itself, and before PostgreSQL 16 only
--     a superuser can).
--   * GRANT CONNECT ON DATABASE: the database owner or a superuser.
--   * GRANT USAGE ON SCHEMA, GRANT SELECT ON TABLE: the owner of the schema
--     or table (the service's own role), or a superuser.
--   * CREATE PUBLICATION (002_publication.sql) needs the table owner too, so
--     with this role outboxd cannot create the publication itself: run 002
--     as the owner and set `create_publication: false`.
--
-- The role writes no row of the outbox by default: the replication slot is
-- outboxd's only bookmark (confirmed_flush_lsn moves when Kafka has
-- acknowledged), so nothing needs marking as published. It does write one
-- row per slot in the slot record (sql/005_slot_record.sql, which grants
-- it): that it has seen the slot, so that no later start re-creates a
-- dropped slot silently, and which rows the slot vouches for (the
-- retention job needs it).
-- REPLICATION lets it create and read the slot (`create_slot: true`) and the
-- cut-over's marker slot. SELECT is not checked for streaming changes, but
-- it is what reading the table needs (the cut-over snapshot of the rows the
-- relay left pending, `outboxd replay`, a preflight that inspects the
-- table's columns).
-- Two optional features write, and need one grant each (commented out at
-- the end): postgres.mark_published sets publicat_en (UPDATE on that
-- column), the retention job deletes delivered rows (DELETE).

-- Idempotent creation: CREATE ROLE has no IF NOT EXISTS, so create it only
-- when absent (\gexec runs the generated statement), then (re)set its
-- attributes and password.
SELECT 'CREATE ROLE outboxd'
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outboxd')
\gexec

-- Superuser needed (REPLICATION). The password comes from the psql variable
-- outboxd_password; psql quotes it as a literal (:'var').
ALTER ROLE outboxd WITH LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE
    PASSWORD :'outboxd_password';

-- Database owner or superuser. current_database() cannot be used in GRANT,
-- so build the statement.
SELECT format('GRANT CONNECT ON DATABASE %I TO outboxd', current_database())
\gexec

-- Schema owner or superuser.
GRANT USAGE ON SCHEMA public TO outboxd;

-- Table owner or superuser: read-only access to the outbox table(s) routed in
-- outboxd.yaml. Add one line per routed table.
GRANT SELECT ON TABLE public.outbox TO outboxd;

-- Only with postgres.mark_published: true (outboxd sets publicat_en once
-- Kafka has the row):
-- GRANT UPDATE (publicat_en) ON TABLE public.outbox TO outboxd;
-- Only with retention.max_age set (outboxd deletes delivered old rows):
-- GRANT DELETE ON TABLE public.outbox TO outboxd;
-- With retention.mode: drop_partitions instead (outboxd detaches and drops
-- old partitions, which only their owner may do): membership of the role
-- that owns the outbox and its partitions, e.g.
-- GRANT service_owner TO outboxd;
