#!/usr/bin/env bash
# End-to-end demo of outboxd (run by `make demo`):
#
#   throwaway PostgreSQL 15 + Kafka 4.1 (testenv/services.sh)
#   -> database km0_comandes with sql/001_outbox.sql
#   -> topic comandes.esdeveniments (3 partitions)
#   -> outboxd run with examples/outboxd.yaml
#   -> 4 transactions writing orders and 5 outbox events
#   -> what a Kafka consumer reads, outboxd status
#   -> the inventari consumer (examples/inventari) taking stock once per
#      order: killed between its database commit and its offset commit,
#      every event replayed (outboxd replay), an order beyond the stock
#      dead-lettered
#   -> the slot, clean SIGTERM.
#
# Usage: tools/demo/demo.sh        (KEEP=1 keeps the state folder and logs)
# Needs: go, make, psql, curl, PostgreSQL server binaries, Java (for Kafka;
# the jars are fetched once into a cache by testenv/kafka-fetch.sh).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SERVICES="$ROOT/testenv/services.sh"
# shellcheck source=../../testenv/common.sh
. "$ROOT/testenv/common.sh" # claim_port / release_ports

TOPIC=comandes.esdeveniments
DB=km0_comandes

STATE="$(mktemp -d "${TMPDIR:-/tmp}/outboxd-demo.XXXXXX")"
BIN="$STATE/bin"
OUTBOXD="$ROOT/bin/outboxd"
OUTBOXD_LOG="$STATE/outboxd.log"
OUTBOXD_PID=""
INVENTARI_PID=""
HEALTH_PORT=""
SERVICES_UP=0

section() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
fail() {
  echo "demo: FAILED: $*" >&2
  if [[ -s "$OUTBOXD_LOG" ]]; then
    echo "---- tail of the outboxd log ($OUTBOXD_LOG) ----" >&2
    tail -n 40 "$OUTBOXD_LOG" >&2
  fi
  exit 1
}

cleanup() {
  local rc=$?
  set +e
  if [[ -n "$INVENTARI_PID" ]]; then
    kill -TERM "$INVENTARI_PID" 2>/dev/null
    wait "$INVENTARI_PID" 2>/dev/null
  fi
  if [[ -n "$OUTBOXD_PID" ]] && kill -0 "$OUTBOXD_PID" 2>/dev/null; then
    kill -TERM "$OUTBOXD_PID" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$OUTBOXD_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$OUTBOXD_PID" 2>/dev/null
    wait "$OUTBOXD_PID" 2>/dev/null
  fi
  if ((SERVICES_UP)); then
    bash "$SERVICES" down "$STATE" >/dev/null 2>&1 ||
      echo "demo: services.sh down $STATE failed" >&2
  fi
  [[ -n "$HEALTH_PORT" ]] && release_ports "$STATE" "$HEALTH_PORT"
  if [[ "${KEEP:-0}" == 1 || $rc -ne 0 ]] && [[ -d "$STATE" ]]; then
    echo "demo: state kept in $STATE" >&2
  else
    rm -rf "$STATE"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------
section "Building outboxd (make build) and the demo consumer"
make -s -C "$ROOT" build || fail "make build"
(cd "$ROOT" && go build -o "$BIN/demo-consumer" ./tools/demo) || fail "go build ./tools/demo"
(cd "$ROOT" && go build -o "$BIN/inventari" ./examples/inventari) || fail "go build ./examples/inventari"
echo "built $OUTBOXD, $BIN/demo-consumer and $BIN/inventari"

# ---------------------------------------------------------------------------
section "Starting PostgreSQL 15 and Kafka (KRaft, single node)"
SERVICES_UP=1
bash "$SERVICES" up "$STATE" >/dev/null || fail "services.sh up"
set -a
# shellcheck disable=SC1091
. "$STATE/pg.env"
# shellcheck disable=SC1091
. "$STATE/kafka.env"
set +a
echo "PostgreSQL on 127.0.0.1:$PGPORT, Kafka on $OUTBOXD_KAFKA_BROKERS"

# psql as the postgres superuser over loopback (trust), stop on any error.
pg() { psql -X -q -h 127.0.0.1 -p "$PGPORT" -U postgres -v ON_ERROR_STOP=1 "$@"; }

# ---------------------------------------------------------------------------
section "Creating database $DB with sql/001_outbox.sql"
pg -d postgres -c "CREATE DATABASE $DB" || fail "create database"
pg -d "$DB" -f "$ROOT/sql/001_outbox.sql" || fail "apply sql/001_outbox.sql"
pg -d "$DB" -c '\dt public.*'

# ---------------------------------------------------------------------------
section "Creating topic $TOPIC with 3 partitions"
"$BIN/demo-consumer" create-topic "$OUTBOXD_KAFKA_BROKERS" "$TOPIC" 3 || fail "create topic"

# ---------------------------------------------------------------------------
section "Starting outboxd with examples/outboxd.yaml"
HEALTH_PORT="$(claim_port "$STATE")"
export KM0_DSN="postgres://postgres@127.0.0.1:$PGPORT/$DB?sslmode=disable"
export KAFKA_BROKERS="$OUTBOXD_KAFKA_BROKERS"
export OUTBOXD_HEALTH_LISTEN="127.0.0.1:$HEALTH_PORT"
HEALTH_URL="http://$OUTBOXD_HEALTH_LISTEN"
cp "$ROOT/examples/outboxd.yaml" "$STATE/outboxd.yaml"
echo "KM0_DSN=$KM0_DSN"
echo "KAFKA_BROKERS=$KAFKA_BROKERS"
echo "OUTBOXD_HEALTH_LISTEN=$OUTBOXD_HEALTH_LISTEN"
"$OUTBOXD" check -c "$STATE/outboxd.yaml" || fail "outboxd check"

"$OUTBOXD" run -c "$STATE/outboxd.yaml" >"$OUTBOXD_LOG" 2>&1 &
OUTBOXD_PID=$!
echo "outboxd running as pid $OUTBOXD_PID, log in $OUTBOXD_LOG; waiting for $HEALTH_URL/readyz"
ready=0
for _ in $(seq 1 300); do # 30 s
  kill -0 "$OUTBOXD_PID" 2>/dev/null || fail "outboxd exited before it was ready"
  if curl -fsS -o /dev/null "$HEALTH_URL/readyz" 2>/dev/null; then ready=1; break; fi
  sleep 0.1
done
((ready)) || fail "outboxd not ready after 30 s: $(curl -sS "$HEALTH_URL/readyz" 2>&1 || true)"
echo "readyz: $(curl -sS "$HEALTH_URL/readyz")"
sed 's/^/  | /' "$OUTBOXD_LOG"

# ---------------------------------------------------------------------------
section "Writing 4 transactions: 3 orders, then one order created and paid"
# comanda ID CLIENT MERCAT PRODUCTE QUANTITAT PREU_CENTIMS: one transaction
# with the order row and its 'comanda.creada' event.
comanda() {
  local carrega
  carrega="{\"id\": \"$1\", \"client\": \"$2\", \"mercat\": \"$3\", \"linies\": [{\"producte\": \"$4\", \"quantitat\": $5, \"preu_centims\": $6}]}"
  echo "BEGIN; INSERT INTO comandes + INSERT INTO outbox ($1, comanda.creada); COMMIT;"
  pg -d "$DB" <<SQL
BEGIN;
INSERT INTO comandes (id, client, mercat) VALUES ('$1', '$2', '$3');
INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega)
VALUES (gen_random_uuid(), 'comanda', '$1', 'comanda.creada', '$carrega'::jsonb);
COMMIT;
SQL
}
comanda P-2026-000121 anna girona formatge-curat 2 1450
comanda P-2026-000122 jordi vic llonganissa 1 890
comanda P-2026-000123 marta olot fesols-santpau 3 420

echo "BEGIN; order P-2026-000124: comanda.creada, then comanda.pagada; COMMIT;"
pg -d "$DB" <<'SQL'
BEGIN;
INSERT INTO comandes (id, client, mercat) VALUES ('P-2026-000124', 'pau', 'figueres');
INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega)
VALUES (gen_random_uuid(), 'comanda', 'P-2026-000124', 'comanda.creada',
        '{"id": "P-2026-000124", "client": "pau", "mercat": "figueres",
          "linies": [{"producte": "oli-arbequina", "quantitat": 1, "preu_centims": 1200},
                     {"producte": "mel-de-romani", "quantitat": 2, "preu_centims": 650}]}');
UPDATE comandes SET estat = 'pagada' WHERE id = 'P-2026-000124';
INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega)
VALUES (gen_random_uuid(), 'comanda', 'P-2026-000124', 'comanda.pagada',
        '{"id": "P-2026-000124", "import_centims": 2500}');
COMMIT;
SQL
t_commit=$(date +%s%N)
pg -d "$DB" -c "SELECT id, agregat_id, tipus, creat_en FROM outbox ORDER BY creat_en, tipus"

# ---------------------------------------------------------------------------
section "Reading $TOPIC from Kafka (5 records, sorted by partition and offset)"
"$BIN/demo-consumer" consume "$OUTBOXD_KAFKA_BROKERS" "$TOPIC" 5 20s ||
  fail "the consumer did not read 5 records"

# ---------------------------------------------------------------------------
section "Waiting until outboxd has confirmed every transaction to PostgreSQL"
# outboxd moves the slot (confirmed_flush_lsn) only after Kafka acknowledged
# every event of a transaction and of all earlier ones.
confirmed=0
for _ in $(seq 1 200); do # 20 s
  st="$(curl -fsS "$HEALTH_URL/status" 2>/dev/null | tr -d ' \n' || true)"
  if [[ "$st" == *'"counters":{"events":5,'* && "$st" == *'"in_flight":{"events":0,"bytes":0,"transactions":0}'* ]]; then
    confirmed=1
    break
  fi
  sleep 0.1
done
((confirmed)) || fail "outboxd did not acknowledge all 5 events within 20 s; last /status: $st"
echo "all 5 events acknowledged and their 4 transactions confirmed (at most $((($(date +%s%N) - t_commit) / 1000000)) ms after the last COMMIT)"

# ---------------------------------------------------------------------------
section "outboxd status --url $HEALTH_URL"
"$OUTBOXD" status --url "$HEALTH_URL" || fail "outboxd status"

# ---------------------------------------------------------------------------
section "The inventari consumer (examples/inventari): stock taken once per order"
INV_DB=km0_inventari
DLQ=comandes.esdeveniments.dlq
pg -d postgres -c "CREATE DATABASE $INV_DB" || fail "create database $INV_DB"
pg -d "$INV_DB" -f "$ROOT/examples/inventari/schema.sql" || fail "apply examples/inventari/schema.sql"
pg -d "$INV_DB" -c "INSERT INTO estoc VALUES ('formatge-curat', 5), ('llonganissa', 10), ('fesols-santpau', 20), ('oli-arbequina', 8), ('mel-de-romani', 12)"
"$BIN/demo-consumer" create-topic "$OUTBOXD_KAFKA_BROKERS" "$DLQ" 1 || fail "create topic $DLQ"
INV_DSN="postgres://postgres@127.0.0.1:$PGPORT/$INV_DB?sslmode=disable"
INVENTARI=("$BIN/inventari" -dsn "$INV_DSN" -brokers "$OUTBOXD_KAFKA_BROKERS" -session-timeout 6s)
estoc() { pg -d "$INV_DB" -Atc "SELECT string_agg(producte || '=' || unitats, ' ' ORDER BY producte) FROM estoc"; }
echo "estoc before: $(estoc)"
# wait_for FILE TEXT N SECONDS: until FILE has N lines containing TEXT.
wait_for() {
  for _ in $(seq 1 $(($4 * 10))); do
    (($(grep -c -- "$2" "$1" 2>/dev/null || true) >= $3)) && return 0
    sleep 0.1
  done
  fail "no $3 lines with '$2' in $1 within $4 s: $(cat "$1")"
}

echo
echo "inventari -crash-after 2: it dies right after its 2nd database commit, before that event's offset commit"
# (the braces keep bash from reporting the kill)
{ timeout 60 "${INVENTARI[@]}" -crash-after 2 >"$STATE/inventari-crash.log" 2>&1 || true; } 2>/dev/null
sed 's/^/  | /' "$STATE/inventari-crash.log"
grep -q "SIGKILL after the database commit" "$STATE/inventari-crash.log" || fail "inventari did not crash as asked"

echo
echo "inventari again: Kafka redelivers the 2nd order (its offset was not committed); missatges_processats says it is done"
"${INVENTARI[@]}" >"$STATE/inventari.log" 2>&1 &
INVENTARI_PID=$!
wait_for "$STATE/inventari.log" ": processat" 2 60
wait_for "$STATE/inventari.log" ": duplicat" 1 10
sed 's/^/  | /' "$STATE/inventari.log"
want="fesols-santpau=17 formatge-curat=3 llonganissa=9 mel-de-romani=10 oli-arbequina=7"
got="$(estoc)"
echo "estoc after the 4 orders: $got"
[[ "$got" == "$want" ]] || fail "stock is '$got', want '$want'"

section "outboxd replay --from 1h: every event published again; inventari finds each one processed"
"$OUTBOXD" replay -c "$STATE/outboxd.yaml" --from 1h || fail "outboxd replay"
wait_for "$STATE/inventari.log" ": duplicat" 5 30
sed 's/^/  | /' "$STATE/inventari.log" | tail -n 4
got="$(estoc)"
echo "estoc after the replay: $got (unchanged)"
[[ "$got" == "$want" ]] || fail "stock is '$got' after the replay, want '$want'"

section "An order beyond the stock: to the dead-letter topic $DLQ, nothing taken"
comanda P-2026-000125 nuria reus formatge-curat 9 1450
wait_for "$STATE/inventari.log" "P-2026-000125: a la cua morta" 1 30
"$BIN/demo-consumer" consume "$OUTBOXD_KAFKA_BROKERS" "$DLQ" 1 20s || fail "the dead-letter record"
got="$(estoc)"
[[ "$got" == "$want" ]] || fail "stock is '$got' after the refused order, want '$want'"
echo "estoc: $got (unchanged)"
pg -d "$INV_DB" -c "SELECT left(id_missatge, 8) AS id_missatge, consumidor, processat_en FROM missatges_processats ORDER BY processat_en"
kill -TERM "$INVENTARI_PID"
wait "$INVENTARI_PID" || true
INVENTARI_PID=""

# ---------------------------------------------------------------------------
section "Stopping outboxd with SIGTERM"
kill -TERM "$OUTBOXD_PID"
rc=0
wait "$OUTBOXD_PID" || rc=$?
OUTBOXD_PID=""
echo "--- outboxd log ---"
sed 's/^/  | /' "$OUTBOXD_LOG"
((rc == 0)) || fail "outboxd exited with status $rc after SIGTERM (want 0)"
echo "outboxd exited with status 0"

section "The replication slot after shutdown (outboxd's only bookmark)"
pg -d "$DB" -c "SELECT slot_name, plugin, active, confirmed_flush_lsn, pg_current_wal_lsn() AS wal_end FROM pg_replication_slots"

section "Done in ${SECONDS}s"
