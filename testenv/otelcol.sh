#!/usr/bin/env bash
# An OpenTelemetry Collector on loopback for the tests: testenv/otelcol/, the
# Collector's OTLP receiver and the contrib file exporter built from their Go
# modules (once per version of testenv/otelcol/, cached outside the clone),
# receiving OTLP/HTTP and writing every span it gets to DIR/otelcol/spans.json
# (OTLP JSON, one export per line).
#
#   otelcol.sh start DIR   build if needed, start, wait until it answers, print DIR/otelcol.env
#   otelcol.sh stop  DIR   stop it (SIGTERM, then SIGKILL after 10 s)
#
# DIR/otelcol.env: OTELCOL_PORT, OTELCOL_ENDPOINT (http://127.0.0.1:PORT),
# OTELCOL_SPANS (the file). Idempotent.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$HERE/common.sh"

CACHE="${OUTBOXD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outboxd}"
SRC="$HERE/otelcol"

[[ $# -eq 2 ]] || { sed -n '2,13p' "$0" >&2; exit 2; }
cmd="$1"
DIR="$(abs_dir "$2")"
CD="$DIR/otelcol"
PIDF="$CD/otelcol.pid"
ENVF="$DIR/otelcol.env"

# build prints the collector's binary, built once per content of testenv/otelcol/.
build() {
  local sum bin
  sum="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" | sha256sum | cut -c1-16)"
  bin="$CACHE/otelcol-$sum"
  if [[ ! -x "$bin" ]]; then
    mkdir -p "$CACHE"
    (exec 8>"$CACHE/.otelcol.lock"; flock 8
      if [[ ! -x "$bin" ]]; then
        log "building the OpenTelemetry Collector (testenv/otelcol, once per machine)"
        (cd "$SRC" && CGO_ENABLED=0 go build -trimpath -o "$bin.tmp" .) >&2 || die "go build testenv/otelcol failed"
        mv "$bin.tmp" "$bin"
      fi)
  fi
  echo "$bin"
}

running() {
  [[ -f "$PIDF" ]] && kill -0 "$(cat "$PIDF")" 2>/dev/null
}

case "$cmd" in
  build)
    build
    ;;
  start)
    exec 9>"$DIR/.otelcol.lock"
    flock 9
    if running && [[ -f "$ENVF" ]]; then
      cat "$ENVF"
      exit 0
    fi
    bin="$(build)"
    mkdir -p "$CD"
    port="${OTELCOL_PORT:-$(claim_port "$DIR")}"
    cat >"$CD/config.yaml" <<YAML
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:$port
exporters:
  file:
    path: $CD/spans.json
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
YAML
    (cd "$CD" && exec setsid "$bin" --config "$CD/config.yaml" >"$CD/otelcol.log" 2>&1) &
    echo $! >"$PIDF"
    for ((i = 0; i < 100; i++)); do
      # The receiver takes an empty export: it listens.
      code="$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' -d '{}' "http://127.0.0.1:$port/v1/traces" || true)"
      if [[ "$code" == 200 ]]; then
        printf 'OTELCOL_PORT=%s\nOTELCOL_ENDPOINT=http://127.0.0.1:%s\nOTELCOL_SPANS=%s\n' "$port" "$port" "$CD/spans.json" >"$ENVF"
        cat "$ENVF"
        exit 0
      fi
      running || die "the collector exited; its log: $CD/otelcol.log"
      sleep 0.2
    done
    die "the collector did not answer within 20 s; its log: $CD/otelcol.log"
    ;;
  stop)
    stop_service "$PIDF" 10 "$DIR" "$ENVF" OTELCOL_PORT
    ;;
  *)
    sed -n '2,13p' "$0" >&2
    exit 2
    ;;
esac
