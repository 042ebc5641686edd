#!/usr/bin/env bash
# A schema registry on loopback for the tests: Apicurio Registry's
# pre-built distribution from Maven Central
# (io.apicurio:apicurio-registry-app:$APICURIO_VERSION:tar.gz:all, ~151
# MiB, cached outside the clone once), in-memory H2 storage, serving the
# Confluent-compatible API under /apis/ccompat/v7. It needs Java 21 or
# newer: $APICURIO_JAVA, else the newest JDK under /usr/lib/jvm, else java.
#
#   registry.sh start DIR   start, wait until it answers, print DIR/registry.env
#   registry.sh stop  DIR   stop it (SIGTERM, then SIGKILL after 20 s)
#
# DIR/registry.env: REGISTRY_PORT, OUTBOXD_REGISTRY_URL. REGISTRY_PORT in the
# environment picks the port (a restart on the same address);
# REGISTRY_START_TIMEOUT how many seconds it may take to answer (60: a
# busy machine's JVMs may need more). Idempotent.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$HERE/common.sh"

VERSION="${APICURIO_VERSION:-3.3.3}"
CACHE="${OUTBOXD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outboxd}"
APP="$CACHE/apicurio-$VERSION"

[[ $# -eq 2 ]] || { sed -n '2,16p' "$0" >&2; exit 2; }
cmd="$1"
DIR="$(abs_dir "$2")"
RD="$DIR/registry"
PIDF="$RD/registry.pid"
ENVF="$DIR/registry.env"

fetch() {
  [[ -f "$APP/quarkus-run.jar" ]] && return 0
  local tmp="$APP.tmp"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  mvn -q dependency:copy -Dartifact="io.apicurio:apicurio-registry-app:$VERSION:tar.gz:all" -DoutputDirectory="$tmp" >&2 ||
    die "mvn dependency:copy io.apicurio:apicurio-registry-app:$VERSION:tar.gz:all failed"
  tar xzf "$tmp/apicurio-registry-app-$VERSION-all.tar.gz" -C "$tmp"
  rm -f "$tmp/apicurio-registry-app-$VERSION-all.tar.gz"
  rm -rf "$APP"
  mv "$tmp" "$APP"
}

# java21: a java of version 21 or newer.
java21() {
  local j v
  for j in ${APICURIO_JAVA:-} $(ls -d /usr/lib/jvm/*/bin/java 2>/dev/null | sort -rV) "$(command -v java || true)"; do
    [[ -x "$j" ]] || continue
    v="$("$j" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)"
    if [[ -n "$v" ]] && ((v >= 21)); then
      echo "$j"
      return 0
    fi
  done
  die "Apicurio Registry needs Java 21 or newer: none found (set APICURIO_JAVA)"
}

running() {
  [[ -f "$PIDF" ]] && kill -0 "$(cat "$PIDF")" 2>/dev/null
}

case "$cmd" in
  start)
    exec 9>"$DIR/.registry.lock"
    flock 9
    if running && [[ -f "$ENVF" ]]; then
      cat "$ENVF"
      exit 0
    fi
    fetch
    mkdir -p "$RD"
    port="${REGISTRY_PORT:-$(claim_port "$DIR")}"
    java="$(java21)"
    # The management interface on a port of its own on loopback: by
    # default it binds 0.0.0.0:9000, and a second registry on the machine
    # (another test's) would exit.
    (cd "$RD" && exec setsid "$java" -Xmx512m -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port" \
      -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port=0 -Dquarkus.log.level=WARN -jar "$APP/quarkus-run.jar" >"$RD/registry.log" 2>&1) &
    echo $! >"$PIDF"
    wait_s="${REGISTRY_START_TIMEOUT:-60}"
    for ((i = 0; i < wait_s * 2; i++)); do
      if curl -sf -o /dev/null "http://127.0.0.1:$port/apis/ccompat/v7/subjects"; then
        printf 'REGISTRY_PORT=%s\nOUTBOXD_REGISTRY_URL=http://127.0.0.1:%s/apis/ccompat/v7\n' "$port" "$port" >"$ENVF"
        cat "$ENVF"
        exit 0
      fi
      running || die "Apicurio Registry exited; its log: $RD/registry.log"
      sleep 0.5
    done
    kill "$(cat "$PIDF")" 2>/dev/null || true # not left running for nobody
    die "Apicurio Registry did not answer within $wait_s s (REGISTRY_START_TIMEOUT); its log: $RD/registry.log"
    ;;
  stop)
    stop_service "$PIDF" 20 "$DIR" "$ENVF" REGISTRY_PORT
    ;;
  *)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
