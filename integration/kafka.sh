#!/usr/bin/env bash
# Single-node Apache Kafka (KRaft, combined broker+controller) on loopback for
# tests, the demo and benchmarks. Jars come from kafka-fetch.sh (cached).
#
#   kafka.sh start   DIR   format (once) + start, wait until ready, print env
#   kafka.sh stop    DIR   SIGTERM, wait up to 30 s, then SIGKILL; keeps data
#   kafka.sh kill    DIR   SIGKILL (crash tests); keeps data
#   kafka.sh status  DIR   exit 0 when running (prints env)
#   kafka.sh env     DIR   print DIR/kafka.env
#   kafka.sh destroy DIR   stop and remove DIR/kafka, DIR/kafka.env
#
# State: DIR/kafka/{server.properties,data/,broker.log,broker.pid}.
# DIR/kafka.env gets KAFKA_PORT, KAFKA_CONTROLLER_PORT, OUTBOXD_KAFKA_BROKERS.
# Ports are picked on the first start and reused afterwards, so a restarted
# broker keeps its address, topics and data. All subcommands are idempotent.
# Knobs: KAFKA_AUTO_CREATE (default true), KAFKA_HEAP_OPTS (default
# "-Xms256m -Xmx512m"), KAFKA_LOG_LEVEL (default info), KAFKA_START_TIMEOUT
# (seconds, default 90).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$HERE/common.sh"

usage() {
  sed -n '2,19p' "$0" >&2
  exit 2
}

setup_dirs() {
  DIR="$(abs_dir "$1")"
  KD="$DIR/kafka"
  ENVF="$DIR/kafka.env"
  PROPS="$KD/server.properties"
  PIDF="$KD/broker.pid"
  LOGF="$KD/broker.log"
}

lock() {
  exec 9>"$DIR/.kafka.lock"
  flock 9
}

# broker_pid: prints the pid of this DIR's live broker, fails when none.
broker_pid() {
  local pid
  [[ -f "$PIDF" ]] || return 1
  pid="$(cat "$PIDF" 2>/dev/null || true)"
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  # A zombie has an empty cmdline; a recycled pid has another one.
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "kafka.Kafka $PROPS" || return 1
  echo "$pid"
}

write_env() {
  cat >"$ENVF" <<EOF
KAFKA_PORT=$PORT
KAFKA_CONTROLLER_PORT=$CPORT
OUTBOXD_KAFKA_BROKERS=127.0.0.1:$PORT
EOF
}

print_env() { cat "$ENVF"; }

write_props() {
  cat >"$PROPS" <<EOF
# written by integration/kafka.sh
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CPORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$KD/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=${KAFKA_AUTO_CREATE:-true}
delete.topic.enable=true
# Short broker session so a broker restarted after SIGKILL re-registers fast
# (the controller rejects the new incarnation until the old session expires).
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
EOF
}

gen_cluster_id() {
  # 16 random bytes, base64url without padding (Kafka Uuid string form);
  # avoid a leading '-' which would look like a CLI flag.
  local id
  while :; do
    id="$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [[ "$id" != -* && "$id" != AAAAAAAAAAAAAAAAAAAAA* ]] && break
  done
  echo "$id"
}

format_storage() {
  [[ -f "$KD/data/meta.properties" ]] && return 0
  local id
  id="$(gen_cluster_id)"
  java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -cp "$LIB/*" kafka.tools.StorageTool format -t "$id" -c "$PROPS" --ignore-formatted \
    >"$KD/format.log" 2>&1 9>&- || { cat "$KD/format.log" >&2; die "kafka storage format failed"; }
}

launch() {
  : >"$LOGF"
  # shellcheck disable=SC2086
  setsid java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m} \
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
    -Djava.awt.headless=true \
    -Dorg.slf4j.simpleLogger.defaultLogLevel="${KAFKA_LOG_LEVEL:-info}" \
    -Dorg.slf4j.simpleLogger.showDateTime=true \
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS" \
    -cp "$LIB/*" kafka.Kafka "$PROPS" \
    </dev/null >>"$LOGF" 2>&1 9>&- &
  echo $! >"$PIDF"
}

# wait_ready: 0 ready, 1 process died, 2 timeout.
wait_ready() {
  local deadline=$((SECONDS + ${KAFKA_START_TIMEOUT:-90}))
  while ((SECONDS < deadline)); do
    broker_pid >/dev/null || return 1
    if grep -q "Kafka Server started" "$LOGF" 2>/dev/null && port_listening "$PORT"; then
      return 0
    fi
    sleep 0.1
  done
  return 2
}

fail_with_log() {
  echo "---- tail of $LOGF ----" >&2
  tail -n 40 "$LOGF" >&2 || true
  die "$1"
}

cmd_start() {
  if broker_pid >/dev/null; then print_env; return; fi
  LIB="$(bash "$HERE/kafka-fetch.sh")"
  mkdir -p "$KD"
  local first=0
  PORT="$(read_env "$ENVF" KAFKA_PORT)"
  CPORT="$(read_env "$ENVF" KAFKA_CONTROLLER_PORT)"
  if [[ -z "$PORT" || -z "$CPORT" ]]; then
    first=1
    PORT="$(claim_port "$DIR")"
    CPORT="$(claim_port "$DIR")"
  fi
  local attempt rc t0=$SECONDS
  for attempt in 1 2 3; do
    if port_listening "$PORT" || port_listening "$CPORT"; then
      if ((first)); then
        release_ports "$DIR" "$PORT" "$CPORT"
        PORT="$(claim_port "$DIR")"
        CPORT="$(claim_port "$DIR")"
        continue
      fi
      die "port $PORT or $CPORT on 127.0.0.1 is in use by another process (a stray broker for $DIR?)"
    fi
    write_env
    write_props
    format_storage
    launch
    rc=0
    wait_ready || rc=$?
    if ((rc == 0)); then
      rm -f "$KD/format.log"
      log "broker ready on 127.0.0.1:$PORT after $((SECONDS - t0)) s"
      print_env
      return 0
    fi
    if ((rc == 2)); then
      stop_broker KILL
      fail_with_log "Kafka did not become ready within ${KAFKA_START_TIMEOUT:-90} s"
    fi
    # Died: a port race on the very first start is retried with new ports.
    if ((first)) && ((attempt < 3)) && grep -q "Address already in use" "$LOGF"; then
      log "port collision, picking other ports"
      release_ports "$DIR" "$PORT" "$CPORT"
      PORT="$(claim_port "$DIR")"
      CPORT="$(claim_port "$DIR")"
      continue
    fi
    fail_with_log "Kafka exited during startup"
  done
  die "Kafka failed to start"
}

# stop_broker TERM|KILL
stop_broker() {
  local pid i
  pid="$(broker_pid)" || { rm -f "$PIDF"; return 0; }
  if [[ "$1" == TERM ]]; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 300; i++)); do
      broker_pid >/dev/null || break
      sleep 0.1
    done
  fi
  if broker_pid >/dev/null; then
    [[ "$1" == TERM ]] && log "broker did not stop within 30 s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      broker_pid >/dev/null || break
      sleep 0.1
    done
  fi
  broker_pid >/dev/null && die "could not stop broker pid $pid"
  # Wait for the listening socket to go away too.
  PORT="$(read_env "$ENVF" KAFKA_PORT)"
  for ((i = 0; i < 50; i++)); do
    [[ -n "$PORT" ]] && port_listening "$PORT" || break
    sleep 0.1
  done
  rm -f "$PIDF"
}

[[ $# -ge 2 ]] || usage
cmd="$1"
setup_dirs "$2"
lock
case "$cmd" in
  start) cmd_start ;;
  stop) stop_broker TERM ;;
  kill) stop_broker KILL ;;
  status)
    if broker_pid >/dev/null; then print_env; else echo "stopped" >&2; exit 1; fi
    ;;
  env) [[ -f "$ENVF" ]] && print_env || die "no $ENVF" ;;
  destroy)
    stop_broker TERM
    release_ports "$DIR" "$(read_env "$ENVF" KAFKA_PORT)" "$(read_env "$ENVF" KAFKA_CONTROLLER_PORT)"
    rm -rf "$KD" "$ENVF" "$DIR/.kafka.lock"
    ;;
  *) usage ;;
esac
