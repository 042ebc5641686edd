#!/usr/bin/env bash
# An Apache Kafka cluster on loopback for the high-availability tests and
# the chaos suite: KAFKA_NODES brokers (default 3) and one KRaft controller
# (with Kafka 2.x, KAFKA_VERSION=2.8.2: one ZooKeeper, and one of the brokers
# is Kafka's controller), each a kafka.sh node in a folder of its own. The
# controller (ZooKeeper) runs apart so
# that brokers can go down without taking the metadata quorum with them:
# two brokers of three down leaves the third leading with an ISR of one,
# and a produce with acks=all gets NOT_ENOUGH_REPLICAS.
#
#   kafka-cluster.sh start   DIR [ID]   create (once) + start every node (or node ID), wait, print env
#   kafka-cluster.sh stop    DIR [ID]   SIGTERM (a broker's controlled shutdown), keeps data
#   kafka-cluster.sh kill    DIR ID     SIGKILL node ID, keeps data
#   kafka-cluster.sh env     DIR        print DIR/kafka.env
#   kafka-cluster.sh destroy DIR        stop and remove every node
#
# Brokers are nodes 1..KAFKA_NODES, the controller node 0; node ID lives in
# DIR/kafka-nodeID (kafka.sh's state: server.properties, data, broker.log).
# Topics get replication factor min(KAFKA_NODES, 3) and
# min.insync.replicas = RF - 1 (2 for 3 brokers) by default, unclean leader
# election off. DIR/kafka.env: OUTBOXD_KAFKA_BROKERS (every broker's
# PLAINTEXT address), KAFKA_NODES, KAFKA_CONTROLLER_PORT, and per node
# KAFKA_NODE_<ID>_DIR (and KAFKA_NODE_<ID>_PORT for a broker).
# Read at the first start, per broker ID (e.g. to put a proxy between two
# brokers, or between a broker and the controller):
#   KAFKA_LISTENERS_<ID>              kafka.sh's KAFKA_LISTENERS for that broker
#   KAFKA_INTER_BROKER_LISTENER_<ID>  the listener it reaches the other brokers on
#   KAFKA_CONTROLLER_ADDR_<ID>        where it reaches the controller (HOST:PORT)
# KAFKA_AUTO_CREATE, KAFKA_HEAP_OPTS and the other kafka.sh knobs pass through.
# All subcommands are idempotent.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$HERE/common.sh"

usage() {
  sed -n '2,30p' "$0" >&2
  exit 2
}

[[ $# -ge 2 ]] || usage
cmd="$1"
DIR="$(abs_dir "$2")"
ENVF="$DIR/kafka.env"
CL="$DIR/kafka-cluster.env" # the cluster's own settings

node_dir() { echo "$DIR/kafka-node$1"; }

exec 8>"$DIR/.kafka-cluster.lock"
flock 8

# settings: the cluster's size, controller port and id, made at the first
# start and kept.
settings() {
  if [[ ! -f "$CL" ]]; then
    local n="${KAFKA_NODES:-3}" id
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "KAFKA_NODES must be a positive number"
    while :; do
      id="$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
      [[ "$id" != -* ]] && break
    done
    {
      echo "NODES=$n"
      echo "CONTROLLER_PORT=$(claim_port "$DIR")"
      echo "CLUSTER_ID=$id"
      echo "RF=$((n < 3 ? n : 3))"
    } >"$CL"
  fi
  NODES="$(read_env "$CL" NODES)"
  CONTROLLER_PORT="$(read_env "$CL" CONTROLLER_PORT)"
  CLUSTER_ID="$(read_env "$CL" CLUSTER_ID)"
  RF="$(read_env "$CL" RF)"
}

# node ID CMD: kafka.sh CMD on node ID, with its first-start settings.
node() {
  local id="$1" sub="$2" roles=broker cport="" addr="127.0.0.1:$CONTROLLER_PORT" ls="" ibl=PLAINTEXT v
  if ((id == 0)); then
    roles=controller cport="$CONTROLLER_PORT"
  else
    v="KAFKA_CONTROLLER_ADDR_$id" && addr="${!v:-$addr}"
    v="KAFKA_LISTENERS_$id" && ls="${!v:-}"
    v="KAFKA_INTER_BROKER_LISTENER_$id" && ibl="${!v:-PLAINTEXT}"
  fi
  KAFKA_NODE_ID="$id" KAFKA_PROCESS_ROLES="$roles" KAFKA_VOTERS="0@$addr" KAFKA_CLUSTER_ID="$CLUSTER_ID" \
    KAFKA_CONTROLLER_PORT="$cport" KAFKA_REPLICATION_FACTOR="$RF" KAFKA_MIN_ISR="$((RF > 1 ? RF - 1 : 1))" \
    KAFKA_LISTENERS="$ls" KAFKA_INTER_BROKER_LISTENER="$ibl" \
    bash "$HERE/kafka.sh" "$sub" "$(node_dir "$id")" 8>&- # a broker must not hold the cluster's lock
}

write_env() {
  local id brokers=""
  for ((id = 1; id <= NODES; id++)); do
    brokers+="${brokers:+,}127.0.0.1:$(read_env "$(node_dir "$id")/kafka.env" KAFKA_PORT)"
  done
  {
    echo "OUTBOXD_KAFKA_BROKERS=$brokers"
    echo "KAFKA_NODES=$NODES"
    echo "KAFKA_CONTROLLER_PORT=$CONTROLLER_PORT"
    for ((id = 0; id <= NODES; id++)); do
      echo "KAFKA_NODE_${id}_DIR=$(node_dir "$id")"
      ((id == 0)) || echo "KAFKA_NODE_${id}_PORT=$(read_env "$(node_dir "$id")/kafka.env" KAFKA_PORT)"
    done
  } >"$ENVF"
}

# start_all: the controller and the brokers at once (a broker waits for the
# controller), each kafka.sh waiting until its node is ready.
start_all() {
  local id pids=() rc=0
  for ((id = 0; id <= NODES; id++)); do
    node "$id" start >/dev/null &
    pids+=($!)
  done
  for id in "${!pids[@]}"; do wait "${pids[$id]}" || rc=$?; done
  ((rc == 0)) || die "the cluster in $DIR did not start (kafka-cluster.sh destroy $DIR cleans up)"
}

check_id() {
  [[ "${1:-}" =~ ^[0-9]+$ ]] && (($1 <= NODES)) || die "no node ${1:-} (brokers 1..$NODES, controller 0)"
}

settings
case "$cmd" in
  start)
    if [[ -n "${3:-}" ]]; then
      check_id "$3"
      node "$3" start >/dev/null
    else
      start_all
    fi
    write_env
    cat "$ENVF"
    ;;
  stop)
    if [[ -n "${3:-}" ]]; then
      check_id "$3"
      node "$3" stop
    else
      # The brokers at once (each one's controlled shutdown needs the
      # controller), then the controller.
      pids=()
      for ((id = 1; id <= NODES; id++)); do
        node "$id" stop &
        pids+=($!)
      done
      rc=0
      for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
      node 0 stop || rc=$?
      exit "$rc"
    fi
    ;;
  kill)
    check_id "${3:-}"
    node "$3" kill
    ;;
  env) [[ -f "$ENVF" ]] && cat "$ENVF" || die "no $ENVF" ;;
  destroy)
    # SIGKILL first: the data goes anyway, and a broker's controlled
    # shutdown in a cluster going down waits on the others.
    for ((id = NODES; id >= 0; id--)); do node "$id" kill >/dev/null 2>&1 || true; done
    rc=0
    for ((id = NODES; id >= 0; id--)); do
      node "$id" destroy || rc=$?
      rmdir "$(node_dir "$id")" 2>/dev/null || true
    done
    release_ports "$DIR" "$CONTROLLER_PORT"
    rm -f "$ENVF" "$CL" "$DIR/.kafka-cluster.lock"
    exit "$rc"
    ;;
  *) usage ;;
esac
