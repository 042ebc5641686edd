#!/usr/bin/env bash
# Apache Kafka (KRaft, one combined broker+controller node; Kafka 2.x: one
# broker and a ZooKeeper) on loopback for the tests, chaos, benchmarks and
# the demo. Jars come from kafka-fetch.sh.
#
#   kafka.sh start   DIR   format (once) + start, wait until ready, print env
#   kafka.sh stop    DIR   SIGTERM, wait up to 30 s, then SIGKILL; keeps data
#   kafka.sh kill    DIR   SIGKILL (crash tests); keeps data
#   kafka.sh status  DIR   exit 0 when running (prints env)
#   kafka.sh env     DIR   print DIR/kafka.env
#   kafka.sh destroy DIR   stop and remove DIR/kafka, DIR/kafka.env
#
# State: DIR/kafka/{server.properties,data/,broker.log,broker.pid}.
# DIR/kafka.env gets KAFKA_PORT, KAFKA_CONTROLLER_PORT, OUTBOXD_KAFKA_BROKERS,
# the settings below, and KAFKA_<NAME>_PORT for each extra listener.
# Settings read at the first start and kept in kafka.env, like the ports, so
# a restarted broker keeps its addresses, topics and data:
#   KAFKA_VERSION      the Apache Kafka version (kafka-fetch.sh; default
#                      4.1.1). 3.x and 4.x run KRaft; 2.x runs with a
#                      ZooKeeper of its own (the jars Kafka depends on) on
#                      KAFKA_CONTROLLER_PORT, state in DIR/kafka/zookeeper:
#                      stop and kill leave it running, destroy stops it (a
#                      cluster's controller node runs that ZooKeeper alone,
#                      its brokers register there)
#   KAFKA_AUTO_CREATE  auto.create.topics.enable (default true)
#   KAFKA_ACLS         on: ACLs (StandardAuthorizer; with ZooKeeper,
#                      AclAuthorizer): the PLAINTEXT
#                      listener's principal (User:ANONYMOUS, which the
#                      inter-broker and controller connections use too) is
#                      a super user, the SASL user outboxd may do what ACLs
#                      grant it and nothing else (default off)
#   KAFKA_LISTENERS    extra client listeners, NAME[:PROTOCOL][=HOST:PORT],...:
#                      each binds a port of its own and is advertised at
#                      HOST:PORT (e.g. a TCP proxy in front of it), or at
#                      127.0.0.1 on its own port without one. PROTOCOL is
#                      PLAINTEXT (the default), SSL (mTLS: a client
#                      certificate is required), SASL_SSL or SASL_PLAINTEXT.
#                      PLAINTEXT (clients, inter-broker) is always there, as
#                      itself. A TLS listener uses DIR/pki (pki.sh: a CA of
#                      this DIR, the server certificate for 127.0.0.1 and
#                      localhost); a SASL listener takes PLAIN, SCRAM-SHA-256
#                      and SCRAM-SHA-512 for the user outboxd, whose random
#                      password is made at the first start (SCRAM credentials
#                      with StorageTool format --add-scram; with ZooKeeper,
#                      ConfigCommand --zookeeper --add-config) and kept in
#                      DIR/kafka/sasl.password; kafka.env then names it
#                      (KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD_FILE) and the
#                      PKI's files (TLS_CA_FILE, TLS_CERT_FILE, ...).
# Knobs read at every start: KAFKA_HEAP_OPTS (default "-Xms256m -Xmx512m"),
# KAFKA_LOG_LEVEL (default info), KAFKA_START_TIMEOUT (seconds, default 180: a broker restarted late in a
# test run recovers the logs of every topic the run made, slowly on a loaded
# machine).
# All subcommands are idempotent.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$HERE/common.sh"

usage() {
  sed -n '2,51p' "$0" >&2
  exit 2
}

# The node. A cluster on loopback gives each node its own id, state folder
# and ports, and lists every node's controller in the quorum voters
# (kafka-cluster.sh; the node settings below).
NODE_ID=1
NODE_ROLES=broker,controller
# ZK: non-empty when the version runs with ZooKeeper (Kafka 2.x; cmd_start);
# ZK_ADDR: the ZooKeeper the broker registers in (its own on CPORT, or a
# cluster's: the controller node's, which runs ZooKeeper alone).
ZK="" ZK_ADDR=""

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

# The settings: PORT (PLAINTEXT), CPORT (CONTROLLER), AUTO_CREATE, and the
# extra listeners as four parallel arrays: XNAME, XPROTO (its security
# protocol), XADV (its advertised address, "" for its own port) and XPORT
# (its own port).

# load_settings: the settings kafka.env keeps; fails before the first start.
load_settings() {
  local i
  PORT="$(read_env "$ENVF" KAFKA_PORT)"
  CPORT="$(read_env "$ENVF" KAFKA_CONTROLLER_PORT)"
  [[ -n "$PORT" && -n "$CPORT" ]] || return 1
  AUTO_CREATE="$(read_env "$ENVF" KAFKA_AUTO_CREATE)"
  VERSION="$(read_env "$ENVF" KAFKA_VERSION)"
  ACLS="$(read_env "$ENVF" KAFKA_ACLS)"
  parse_listeners "$(read_env "$ENVF" KAFKA_LISTENERS)"
  for i in "${!XNAME[@]}"; do
    XPORT[i]="$(read_env "$ENVF" "KAFKA_${XNAME[$i]}_PORT")"
    [[ -n "${XPORT[$i]}" ]] || die "$ENVF lacks KAFKA_${XNAME[$i]}_PORT"
  done
  node_load_settings
}

# first_settings: the settings of a first start, from the environment.
first_settings() {
  VERSION="${KAFKA_VERSION:-}"
  [[ -z "$VERSION" || "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "KAFKA_VERSION must be a release such as 3.9.1, got '$VERSION'"
  AUTO_CREATE="${KAFKA_AUTO_CREATE:-true}"
  [[ "$AUTO_CREATE" == true || "$AUTO_CREATE" == false ]] || die "KAFKA_AUTO_CREATE must be true or false"
  ACLS="${KAFKA_ACLS:-off}"
  [[ "$ACLS" == on || "$ACLS" == off ]] || die "KAFKA_ACLS must be on or off"
  parse_listeners "${KAFKA_LISTENERS:-}"
  node_first_settings
  claim_ports
}

# parse_listeners SPEC: fills XNAME, XPROTO and XADV from
# NAME[:PROTOCOL][=HOST:PORT],...
parse_listeners() {
  local items item name proto adv
  XNAME=() XPROTO=() XADV=() XPORT=()
  IFS=',' read -ra items <<<"$1"
  for item in "${items[@]}"; do
    [[ -n "$item" ]] || continue
    name="${item%%=*}" adv=""
    [[ "$item" == *=* ]] && adv="${item#*=}"
    proto=PLAINTEXT
    if [[ "$name" == *:* ]]; then proto="${name#*:}" name="${name%%:*}"; fi
    [[ "$name" =~ ^[A-Z][A-Z0-9_]*$ && "$name" != PLAINTEXT && "$name" != CONTROLLER ]] ||
      die "KAFKA_LISTENERS: bad listener name '$name' (upper case, not PLAINTEXT or CONTROLLER)"
    case "$proto" in
      PLAINTEXT | SSL | SASL_SSL | SASL_PLAINTEXT) ;;
      *) die "KAFKA_LISTENERS: listener $name: protocol '$proto' is not PLAINTEXT, SSL, SASL_SSL or SASL_PLAINTEXT" ;;
    esac
    [[ -z "$adv" || "$adv" =~ ^[^:=]+:[0-9]+$ ]] ||
      die "KAFKA_LISTENERS: listener $name: the advertised address must be HOST:PORT, got '$adv'"
    XNAME+=("$name") XPROTO+=("$proto") XADV+=("$adv")
  done
}

# uses PATTERN: some extra listener's protocol matches ('*SSL', 'SASL_*').
uses() {
  local p
  for p in "${XPROTO[@]}"; do
    # shellcheck disable=SC2053
    [[ "$p" == $1 ]] && return 0
  done
  return 1
}

all_ports() { echo "$PORT" "$CPORT" "${XPORT[@]}"; }

claim_ports() {
  local i
  PORT="$(claim_port "$DIR")"
  CPORT="${NODE_CPORT:-$(claim_port "$DIR")}"
  for i in "${!XNAME[@]}"; do XPORT[i]="$(claim_port "$DIR")"; done
}

# new_ports: a port race on the very first start is retried with new ports.
new_ports() {
  # shellcheck disable=SC2046
  release_ports "$DIR" $(all_ports)
  claim_ports
}

write_env() {
  local i spec=""
  for i in "${!XNAME[@]}"; do spec+="${spec:+,}${XNAME[$i]}:${XPROTO[$i]}${XADV[$i]:+=${XADV[$i]}}"; done
  {
    echo "KAFKA_PORT=$PORT"
    echo "KAFKA_CONTROLLER_PORT=$CPORT"
    echo "OUTBOXD_KAFKA_BROKERS=127.0.0.1:$PORT"
    echo "KAFKA_VERSION=$VERSION"
    [[ -z "${ZK:-}" ]] || echo "KAFKA_ZOOKEEPER=$ZK_ADDR"
    echo "KAFKA_AUTO_CREATE=$AUTO_CREATE"
    echo "KAFKA_ACLS=${ACLS:-off}"
    echo "KAFKA_LISTENERS=$spec"
    for i in "${!XNAME[@]}"; do echo "KAFKA_${XNAME[$i]}_PORT=${XPORT[$i]}"; done
    if uses 'SASL_*'; then
      echo "KAFKA_SASL_USERNAME=$SASL_USER"
      echo "KAFKA_SASL_PASSWORD_FILE=$KD/sasl.password"
    fi
    if uses '*SSL'; then cat "$DIR/pki/pki.env"; fi
  } >"$ENVF"
}

print_env() { cat "$ENVF"; }

write_props() {
  # Every listener as name, security protocol, port and advertised address
  # (none for the controller; with ZooKeeper there is no controller
  # listener). A listener with another protocol (SSL, SASL_SSL,
  # SASL_PLAINTEXT) also needs its listener.name.<name>.* properties
  # (keystore, JAAS) below the list.
  local names=(PLAINTEXT CONTROLLER) protos=(PLAINTEXT PLAINTEXT) ports=("$PORT" "$CPORT")
  local advs=("127.0.0.1:$PORT" "") i listeners="" advertised="" protomap=""
  if [[ -n "$ZK" ]]; then names=(PLAINTEXT) protos=(PLAINTEXT) ports=("$PORT") advs=("127.0.0.1:$PORT"); fi
  for i in "${!XNAME[@]}"; do
    names+=("${XNAME[$i]}") protos+=("${XPROTO[$i]}") ports+=("${XPORT[$i]}")
    advs+=("${XADV[$i]:-127.0.0.1:${XPORT[$i]}}")
  done
  for i in "${!names[@]}"; do
    listeners+="${listeners:+,}${names[$i]}://127.0.0.1:${ports[$i]}"
    protomap+="${protomap:+,}${names[$i]}:${protos[$i]}"
    if [[ -n "${advs[$i]}" ]]; then advertised+="${advertised:+,}${names[$i]}://${advs[$i]}"; fi
  done
  {
    echo "# written by testenv/kafka.sh (Apache Kafka $VERSION)"
    if [[ -n "$ZK" ]]; then
      # Kafka 2.x: a broker registered in ZooKeeper, whose session is short
      # so that a broker restarted after SIGKILL re-registers soon (the old
      # registration lives until the old session expires).
      echo "broker.id=$NODE_ID"
      echo "zookeeper.connect=$ZK_ADDR"
      echo "zookeeper.session.timeout.ms=$ZK_SESSION_MS"
      # What a (re)starting broker waits for ZooKeeper's answers: not the
      # short session's 4 s (the default), which a loaded machine misses.
      echo "zookeeper.connection.timeout.ms=30000"
    else
      echo "process.roles=broker,controller"
      echo "node.id=$NODE_ID"
      echo "controller.quorum.voters=$NODE_ID@127.0.0.1:$CPORT"
      echo "controller.listener.names=CONTROLLER"
    fi
  } >"$PROPS"
  cat >>"$PROPS" <<EOF
listeners=$listeners
advertised.listeners=$advertised
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protomap
log.dirs=$KD/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=$AUTO_CREATE
delete.topic.enable=true
# Retention checked every second, not every 5 minutes: a test topic with a
# short retention.ms loses its old records within seconds, as a week does
# to a real one (restart de-duplication's tests).
log.retention.check.interval.ms=1000
EOF
  if [[ -z "$ZK" ]]; then
    cat >>"$PROPS" <<EOF
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Short broker session so a broker restarted after SIGKILL re-registers fast
# (the controller rejects the new incarnation until the old session expires).
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
EOF
  fi
  if [[ "${ACLS:-off}" == on ]]; then
    # KRaft keeps ACLs in its metadata log (StandardAuthorizer), a
    # ZooKeeper cluster in ZooKeeper (AclAuthorizer).
    local authorizer=org.apache.kafka.metadata.authorizer.StandardAuthorizer
    [[ -z "$ZK" ]] || authorizer=kafka.security.authorizer.AclAuthorizer
    cat >>"$PROPS" <<EOF
authorizer.class.name=$authorizer
super.users=User:ANONYMOUS
EOF
  fi
  write_security_props
}

# The secured listeners' properties: one PEM keystore and truststore for
# every TLS listener, a client certificate required on SSL ones (mTLS), and
# PLAIN and SCRAM for the user outboxd on SASL ones.
SASL_USER=outboxd
write_security_props() {
  local i lname password=""
  if uses '*SSL' && [[ -n "$ZK" ]]; then
    # Kafka 2.x takes a PEM key only encrypted: a PKCS#12 keystore there.
    local kspass
    kspass="$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
    (umask 077 && openssl pkcs12 -export -in "$DIR/pki/server.pem" -inkey "$DIR/pki/server.key" \
      -passout "pass:$kspass" -out "$KD/keystore.p12")
    cat >>"$PROPS" <<EOF
ssl.keystore.type=PKCS12
ssl.keystore.location=$KD/keystore.p12
ssl.keystore.password=$kspass
ssl.truststore.type=PEM
ssl.truststore.location=$DIR/pki/ca.pem
EOF
  elif uses '*SSL'; then
    (umask 077 && cat "$DIR/pki/server.key" "$DIR/pki/server.pem" >"$KD/keystore.pem")
    cat >>"$PROPS" <<EOF
ssl.keystore.type=PEM
ssl.keystore.location=$KD/keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$DIR/pki/ca.pem
EOF
  fi
  if uses 'SASL_*'; then password="$(cat "$KD/sasl.password")"; fi
  for i in "${!XNAME[@]}"; do
    lname="listener.name.${XNAME[$i],,}"
    case "${XPROTO[$i]}" in
      SSL) echo "$lname.ssl.client.auth=required" >>"$PROPS" ;;
      SASL_*)
        cat >>"$PROPS" <<EOF
$lname.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
$lname.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$SASL_USER="$password";
$lname.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
$lname.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
EOF
        ;;
    esac
  done
}

# make_secrets: what the secured listeners need before the first format:
# the environment's PKI and the SASL user's password (hex: nothing to
# escape in the JAAS line or in --add-scram).
make_secrets() {
  if uses '*SSL'; then bash "$HERE/pki.sh" make "$DIR" >/dev/null 9>&-; fi
  if uses 'SASL_*' && [[ ! -s "$KD/sasl.password" ]]; then
    (umask 077 && od -An -N18 -tx1 /dev/urandom | tr -d ' \n' >"$KD/sasl.password")
  fi
}

gen_cluster_id() {
  # 16 random bytes, base64url without padding (Kafka Uuid string form);
  # avoid a leading '-' which would look like a CLI flag. A cluster's
  # nodes share the one kafka-cluster.sh made.
  if [[ -n "${NODE_CLUSTER_ID:-}" ]]; then echo "$NODE_CLUSTER_ID"; return; fi
  local id
  while :; do
    id="$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [[ "$id" != -* && "$id" != AAAAAAAAAAAAAAAAAAAAA* ]] && break
  done
  echo "$id"
}

format_storage() {
  if [[ -n "$ZK" ]]; then zk_users; return; fi
  [[ -f "$KD/data/meta.properties" ]] && return 0
  local id scram=() m password
  id="$(gen_cluster_id)"
  if uses 'SASL_*'; then
    password="$(cat "$KD/sasl.password")"
    for m in SCRAM-SHA-256 SCRAM-SHA-512; do scram+=(--add-scram "$m=[name=$SASL_USER,password=$password]"); done
  fi
  java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -cp "$LIB/*" kafka.tools.StorageTool format -t "$id" -c "$PROPS" --ignore-formatted "${scram[@]}" \
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
  echo "$!" >"$PIDF"
  wait_exec "$!" broker_pid
}

# wait_exec PID CHECK: a child started in the background runs as a copy of
# this shell until it has exec'ed setsid and java; CHECK (broker_pid,
# zk_pid), which checks the command line, would take it for a dead process
# in that window (seen on a loaded CI machine: "Kafka exited during
# startup" with an empty log). Wait until CHECK sees it, or for its end.
wait_exec() {
  local i
  for ((i = 0; i < 200; i++)); do
    "$2" >/dev/null && return 0
    [[ -r "/proc/$1/cmdline" ]] || return 0
    sleep 0.05
  done
}

# all_listening: every port of the broker accepts connections.
all_listening() {
  local p
  for p in $(listen_ports); do port_listening "$p" || return 1; done
}

# any_listening: something already listens on one of the broker's ports
# (this DIR's ZooKeeper on its own).
any_listening() {
  local p
  for p in $(all_ports); do
    [[ -n "$ZK" && "$p" == "$CPORT" ]] && zk_pid >/dev/null && continue
    port_listening "$p" && return 0
  done
  return 1
}

# wait_ready: 0 ready, 1 process died, 2 timeout.
wait_ready() {
  local deadline=$((SECONDS + ${KAFKA_START_TIMEOUT:-180}))
  while ((SECONDS < deadline)); do
    broker_pid >/dev/null || return 1
    # KRaft says "Kafka Server started", a ZooKeeper broker "[KafkaServer id=N] started".
    if grep -qE "Kafka Server started|\[KafkaServer id=[0-9]+\] started" "$LOGF" 2>/dev/null && all_listening; then
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
  if broker_pid >/dev/null || zk_only; then print_env; return; fi
  mkdir -p "$KD"
  local first=0
  if ! load_settings; then
    first=1
    first_settings
  fi
  LIB="$(KAFKA_VERSION="$VERSION" bash "$HERE/kafka-fetch.sh")"
  VERSION="$(basename "$(dirname "$LIB")")" VERSION="${VERSION#kafka-}"
  ZK="" ZK_ADDR="127.0.0.1:$CPORT"
  if [[ "$VERSION" == 2.* ]]; then ZK=1; fi
  if [[ -n "$ZK" && -f "$KD/node.env" ]]; then
    # A cluster with ZooKeeper: the controller node runs ZooKeeper alone
    # (the cluster's metadata, as a KRaft controller holds it), each broker
    # registers in it, and one of the brokers is Kafka's controller.
    if [[ "$NODE_ROLES" == controller ]]; then
      write_env
      start_zk
      log "ZooKeeper ready on $ZK_ADDR after $((SECONDS)) s"
      print_env
      return 0
    fi
    [[ "$NODE_ROLES" == broker ]] || die "Kafka $VERSION runs with ZooKeeper: a cluster node is a broker or the controller (ZooKeeper), not both"
    ZK_ADDR="${NODE_VOTERS#*@}"
  fi
  local attempt rc t0=$SECONDS
  for attempt in 1 2 3; do
    if any_listening; then
      if ((first)); then new_ports; continue; fi
      die "a port of $(all_ports) on 127.0.0.1 is in use by another process (a stray broker for $DIR?)"
    fi
    make_secrets
    write_env
    write_props
    write_node_props
    if [[ -n "$ZK" && "$ZK_ADDR" == "127.0.0.1:$CPORT" ]]; then start_zk; fi
    format_storage
    if [[ -n "$ZK" ]]; then zk_wait_unregistered; fi
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
      fail_with_log "Kafka did not become ready within ${KAFKA_START_TIMEOUT:-180} s"
    fi
    if ((first)) && ((attempt < 3)) && grep -q "Address already in use" "$LOGF"; then
      log "port collision, picking other ports"
      new_ports
      continue
    fi
    if ((attempt < 3)) && [[ ! -s "$LOGF" ]]; then
      # Gone before its first line (seen once in CI, restarting a cluster
      # node under load): nothing to learn from it; start it again.
      log "the broker exited before writing a line of its log; starting it again"
      continue
    fi
    fail_with_log "Kafka exited during startup"
  done
  die "Kafka failed to start"
}

# stop_broker TERM|KILL
stop_broker() {
  local pid i p
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
  p="$(read_env "$ENVF" KAFKA_PORT)"
  for ((i = 0; i < 50; i++)); do
    [[ -n "$p" ]] && port_listening "$p" || break
    sleep 0.1
  done
  rm -f "$PIDF"
}

# ---- ZooKeeper (Kafka 2.x) ----
# One ZooKeeper server of this DIR on 127.0.0.1:$CPORT, from the jars
# Kafka 2.x depends on; its state in DIR/kafka/zookeeper survives stop and
# kill (a broker's crash), destroy stops it and removes it.

# The broker's ZooKeeper session: the registration of a broker killed with
# SIGKILL lives this long, and a new broker with its id waits for it to go.
ZK_SESSION_MS=4000

zk_pid() {
  local pid
  [[ -f "$KD/zookeeper.pid" ]] || return 1
  pid="$(cat "$KD/zookeeper.pid" 2>/dev/null || true)"
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "ZooKeeperServerMain $KD/zookeeper.cfg" || return 1
  echo "$pid"
}

# zk_say WORD: ZooKeeper's answer to a four-letter word (ruok, dump).
zk_say() {
  timeout 5 bash -c 'exec 3<>"/dev/tcp/${1%:*}/${1##*:}" && printf %s "$2" >&3 && cat <&3' _ "$ZK_ADDR" "$1" 2>/dev/null
}

start_zk() {
  local i
  if ! zk_pid >/dev/null; then
    mkdir -p "$KD/zookeeper"
    cat >"$KD/zookeeper.cfg" <<EOF
# written by testenv/kafka.sh
dataDir=$KD/zookeeper
clientPortAddress=127.0.0.1
clientPort=$CPORT
tickTime=500
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,dump
EOF
    setsid java -Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
      -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
      -cp "$LIB/*" org.apache.zookeeper.server.ZooKeeperServerMain "$KD/zookeeper.cfg" \
      </dev/null >>"$KD/zookeeper.log" 2>&1 9>&- &
    echo "$!" >"$KD/zookeeper.pid"
    wait_exec "$!" zk_pid
  fi
  for ((i = 0; i < 600; i++)); do
    [[ "$(zk_say ruok)" == imok ]] && return 0
    zk_pid >/dev/null || break
    sleep 0.1
  done
  echo "---- tail of $KD/zookeeper.log ----" >&2
  tail -n 40 "$KD/zookeeper.log" >&2 || true
  die "ZooKeeper on 127.0.0.1:$CPORT did not become ready"
}

# zk_only: this node runs ZooKeeper alone (a cluster's controller node
# with Kafka 2.x), and it is up.
zk_only() {
  [[ -f "$KD/node.env" && "$(read_env "$KD/node.env" NODE_ROLES)" == controller ]] && zk_pid >/dev/null
}

# stop_zk [TERM|KILL]
stop_zk() {
  local pid i
  pid="$(zk_pid)" || { rm -f "$KD/zookeeper.pid"; return 0; }
  kill "-${1:-TERM}" "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    zk_pid >/dev/null || break
    sleep 0.1
  done
  if zk_pid >/dev/null; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.2; fi
  rm -f "$KD/zookeeper.pid"
}

# zk_users: the SASL user's SCRAM credentials, written into ZooKeeper
# once (what StorageTool --add-scram does for KRaft).
zk_users() {
  local password
  uses 'SASL_*' || return 0
  [[ -f "$KD/scram-users.done" ]] && return 0
  password="$(cat "$KD/sasl.password")"
  java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$LIB/*" \
    kafka.admin.ConfigCommand --zookeeper "$ZK_ADDR" --alter --entity-type users --entity-name "$SASL_USER" \
    --add-config "SCRAM-SHA-256=[password=$password],SCRAM-SHA-512=[password=$password]" \
    >"$KD/format.log" 2>&1 9>&- || { cat "$KD/format.log" >&2; die "kafka SCRAM credentials in ZooKeeper failed"; }
  touch "$KD/scram-users.done"
}

# zk_wait_unregistered: a broker killed with SIGKILL stays registered until
# its ZooKeeper session expires, and a new broker with its id would stop at
# "node already exists": wait for that registration to go.
zk_wait_unregistered() {
  local i
  for ((i = 0; i < ZK_SESSION_MS / 100 + 100; i++)); do
    zk_say dump | grep -qF "/brokers/ids/$NODE_ID" || return 0
    sleep 0.1
  done
  die "the broker $NODE_ID killed before is still registered in ZooKeeper"
}

# ---- a node of a cluster (kafka-cluster.sh) ----
# Read at the first start, kept in DIR/kafka/node.env, and written after
# the single-node properties above, which they override (in a properties
# file the last value of a key wins):
#   KAFKA_NODE_ID              node.id (default 1)
#   KAFKA_PROCESS_ROLES        broker,controller (default), broker or controller
#   KAFKA_CONTROLLER_PORT      the controller listener's port, claimed by the
#                              caller, so that every node knows every voter
#                              before any starts
#   KAFKA_VOTERS               controller.quorum.voters as this node sees them
#                              (ID@HOST:PORT,...; a proxy's address, say);
#                              with ZooKeeper (2.x), 0@HOST:PORT is where the
#                              brokers find it (zookeeper.connect)
#   KAFKA_CLUSTER_ID           the cluster's id, the same on every node
#   KAFKA_REPLICATION_FACTOR   default and internal topics' replication factor
#   KAFKA_MIN_ISR              min.insync.replicas (internal topics' too)
#   KAFKA_INTER_BROKER_LISTENER  the listener this node reaches the others on
#                              (default PLAINTEXT; an extra listener advertised
#                              at a proxy puts a proxy between two brokers)
# Unclean leader election stays off (Kafka's default, written out).

node_first_settings() {
  [[ -n "${KAFKA_NODE_ID:-}" ]] || return 0
  [[ "$KAFKA_NODE_ID" =~ ^[0-9]+$ ]] || die "KAFKA_NODE_ID must be a number"
  case "${KAFKA_PROCESS_ROLES:=broker,controller}" in
    broker,controller | broker | controller) ;;
    *) die "KAFKA_PROCESS_ROLES must be broker,controller, broker or controller" ;;
  esac
  [[ -n "${KAFKA_VOTERS:-}" && -n "${KAFKA_CLUSTER_ID:-}" ]] || die "a cluster node needs KAFKA_VOTERS and KAFKA_CLUSTER_ID"
  mkdir -p "$KD"
  cat >"$KD/node.env" <<EOF
NODE_ID=$KAFKA_NODE_ID
NODE_ROLES=$KAFKA_PROCESS_ROLES
NODE_CPORT=${KAFKA_CONTROLLER_PORT:-}
NODE_VOTERS=$KAFKA_VOTERS
NODE_CLUSTER_ID=$KAFKA_CLUSTER_ID
NODE_RF=${KAFKA_REPLICATION_FACTOR:-1}
NODE_MIN_ISR=${KAFKA_MIN_ISR:-1}
NODE_IBL=${KAFKA_INTER_BROKER_LISTENER:-PLAINTEXT}
EOF
  node_load_settings
}

node_load_settings() {
  local k
  [[ -f "$KD/node.env" ]] || return 0
  for k in NODE_ID NODE_ROLES NODE_CPORT NODE_VOTERS NODE_CLUSTER_ID NODE_RF NODE_MIN_ISR NODE_IBL; do
    printf -v "$k" '%s' "$(read_env "$KD/node.env" "$k")"
  done
}

# listen_ports: the ports this node binds (a broker has no controller
# listener, a controller only that one).
listen_ports() {
  case "$NODE_ROLES" in
    broker) echo "$PORT" "${XPORT[@]}" ;;
    controller) echo "$CPORT" ;;
    *) all_ports ;;
  esac
}

write_node_props() {
  [[ -f "$KD/node.env" ]] || return 0
  if [[ -n "$ZK" ]]; then
    cat >>"$PROPS" <<EOF
# a broker of a cluster with ZooKeeper (kafka-cluster.sh): these override the above
inter.broker.listener.name=$NODE_IBL
default.replication.factor=$NODE_RF
min.insync.replicas=$NODE_MIN_ISR
offsets.topic.replication.factor=$NODE_RF
transaction.state.log.replication.factor=$NODE_RF
transaction.state.log.min.isr=$NODE_MIN_ISR
unclean.leader.election.enable=false
EOF
    return 0
  fi
  local listeners
  listeners="$(sed -n 's/^listeners=//p' "$PROPS" | head -n1)"
  case "$NODE_ROLES" in
    broker) listeners="$(tr ',' '\n' <<<"$listeners" | grep -v '^CONTROLLER://' | paste -sd,)" ;;
    controller) listeners="CONTROLLER://127.0.0.1:$CPORT" ;;
  esac
  {
    echo "# a node of a cluster (kafka-cluster.sh): these override the above"
    echo "process.roles=$NODE_ROLES"
    echo "listeners=$listeners"
    echo "inter.broker.listener.name=$NODE_IBL"
    echo "controller.quorum.voters=$NODE_VOTERS"
    echo "default.replication.factor=$NODE_RF"
    echo "min.insync.replicas=$NODE_MIN_ISR"
    echo "offsets.topic.replication.factor=$NODE_RF"
    echo "transaction.state.log.replication.factor=$NODE_RF"
    echo "transaction.state.log.min.isr=$NODE_MIN_ISR"
    echo "share.coordinator.state.topic.replication.factor=$NODE_RF"
    echo "share.coordinator.state.topic.min.isr=$NODE_MIN_ISR"
    echo "unclean.leader.election.enable=false"
  } >>"$PROPS"
  # A controller advertises no client listener: Kafka 3 wants no
  # advertised.listeners on it, Kafka 4.4 refuses an empty one.
  if [[ "$NODE_ROLES" == controller ]]; then
    grep -v '^advertised\.listeners=' "$PROPS" >"$PROPS.tmp" && mv "$PROPS.tmp" "$PROPS"
  fi
}

[[ $# -ge 2 ]] || usage
cmd="$1"
setup_dirs "$2"
lock
case "$cmd" in
  start) cmd_start ;;
  stop) if zk_only; then stop_zk TERM; else stop_broker TERM; fi ;;
  kill) if zk_only; then stop_zk KILL; else stop_broker KILL; fi ;;
  status)
    if broker_pid >/dev/null || zk_only; then print_env; else echo "stopped" >&2; exit 1; fi
    ;;
  env) [[ -f "$ENVF" ]] && print_env || die "no $ENVF" ;;
  destroy)
    stop_broker TERM
    stop_zk
    # shellcheck disable=SC2046
    if load_settings; then release_ports "$DIR" $(all_ports); fi
    rm -rf "$KD" "$ENVF" "$DIR/.kafka.lock"
    ;;
  *) usage ;;
esac
