#!/bin/bash
# docker-compose.yml: run sql/003_role.sql in the postgres image's first-start
# initialisation (/docker-entrypoint-initdb.d), after 001_outbox.sql and
# 002_publication.sql. The file needs the psql variable outboxd_password,
# which the image's own *.sql runner cannot pass, hence this wrapper.
# POSTGRES_USER, POSTGRES_DB and OUTBOXD_PASSWORD come from the container's
# environment; sql/ is mounted at /sql.
psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v outboxd_password="${OUTBOXD_PASSWORD:?set OUTBOXD_PASSWORD}" -f /sql/003_role.sql
