#!/bin/bash
# The demo's service: writes an order and its 'comanda.creada' event in one
# transaction, as a km0 service does (sql/001_outbox.sql), every INTERVAL
# seconds, COUNT times (0 = for ever).
#
# docker-compose.yml runs it in the postgres image; the container test
# (integration/container_test.go) runs it against the test's database.
#
#   DATABASE_URL  postgres://user:password@host:port/km0_comandes
#   SLOT          the slot outboxd reads (default outboxd_comandes): rows
#                 committed before it exists would never be read, so the
#                 writer waits for it
set -euo pipefail
: "${DATABASE_URL:?set DATABASE_URL}"
SLOT="${SLOT:-outboxd_comandes}"
COUNT="${COUNT:-0}"
INTERVAL="${INTERVAL:-2}"
FIRST="${FIRST:-1}"

sql() { psql -d "$DATABASE_URL" -X -q -v ON_ERROR_STOP=1 "$@"; }

for _ in $(seq 1 120); do
  if [[ "$(sql -tA -v slot="$SLOT" <<<"SELECT count(*) FROM pg_replication_slots WHERE slot_name = :'slot'" 2>/dev/null)" == 1 ]]; then
    break
  fi
  echo "writer: waiting for the replication slot $SLOT (outboxd creates it)" >&2
  sleep 1
done

clients=(C-7 C-42 C-88 C-105)
mercats=(mercat-del-ter mercat-de-sant-antoni mercat-de-la-boqueria)
i=$FIRST
while ((COUNT == 0 || i < FIRST + COUNT)); do
  order=$(printf 'P-2026-%06d' "$i")
  client=${clients[i % ${#clients[@]}]}
  mercat=${mercats[i % ${#mercats[@]}]}
  sql -v order="$order" -v client="$client" -v mercat="$mercat" <<'SQL'
BEGIN;
INSERT INTO comandes (id, client, mercat) VALUES (:'order', :'client', :'mercat');
INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega)
VALUES (gen_random_uuid(), 'comanda', :'order', 'comanda.creada',
        jsonb_build_object('id', :'order', 'client', :'client', 'mercat', :'mercat'));
COMMIT;
SQL
  echo "writer: order $order committed with its comanda.creada event"
  i=$((i + 1))
  sleep "$INTERVAL"
done
