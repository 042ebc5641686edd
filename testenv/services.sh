#!/usr/bin/env bash
# PostgreSQL (pg.sh) and Kafka (kafka.sh) together, on loopback.
#
#   services.sh up      DIR   start both (in parallel), print both env files
#   services.sh stop    DIR   stop both, keep data (a later `up` reuses them)
#   services.sh down    DIR   stop both and remove their data and env files
#   services.sh env     DIR   print both env files
#
# Printed/written env: DIR/pg.env (PGHOST, PGPORT, PGUSER, OUTBOXD_PG_DSN,
# PGDATA_DIR) and DIR/kafka.env (KAFKA_PORT, KAFKA_CONTROLLER_PORT,
# OUTBOXD_KAFKA_BROKERS). Use e.g.: set -a; . DIR/pg.env; . DIR/kafka.env; set +a
# The settings of pg.sh and kafka.sh (PG_WAL_LEVEL, PG_SSL, KAFKA_LISTENERS,
# ...) pass through from the environment; both take their certificates from
# one DIR/pki (pki.sh), which `down` removes too. KAFKA_NODES above 1
# starts a cluster (kafka-cluster.sh) instead of one broker; stop and down
# find it.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$HERE/common.sh"

[[ $# -ge 2 ]] || { sed -n '2,16p' "$0" >&2; exit 2; }
cmd="$1"
DIR="$(abs_dir "$2")"
KAFKA=kafka.sh
if [[ -f "$DIR/kafka-cluster.env" ]] || (( ${KAFKA_NODES:-1} > 1 )); then KAFKA=kafka-cluster.sh; fi

case "$cmd" in
  up)
    bash "$HERE/pg.sh" start "$DIR" >/dev/null &
    pgpid=$!
    rc=0
    bash "$HERE/$KAFKA" start "$DIR" >/dev/null || rc=$?
    wait "$pgpid" || rc=$?
    ((rc == 0)) || die "services failed to start (run: $0 down $DIR)"
    cat "$DIR/pg.env" "$DIR/kafka.env"
    ;;
  stop)
    rc=0
    bash "$HERE/$KAFKA" stop "$DIR" || rc=$?
    bash "$HERE/pg.sh" stop "$DIR" fast || rc=$?
    exit "$rc"
    ;;
  down)
    rc=0
    bash "$HERE/$KAFKA" destroy "$DIR" || rc=$?
    bash "$HERE/pg.sh" destroy "$DIR" || rc=$?
    bash "$HERE/pki.sh" destroy "$DIR" || rc=$?
    rmdir "$DIR" 2>/dev/null || true
    exit "$rc"
    ;;
  env) cat "$DIR/pg.env" "$DIR/kafka.env" ;;
  *) sed -n '2,16p' "$0" >&2; exit 2 ;;
esac
