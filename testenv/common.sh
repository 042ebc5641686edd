# shellcheck shell=bash
# Shared helpers for pg.sh, kafka.sh and services.sh. Sourced, not executed.

# Registry of loopback ports handed out by these scripts. A claim is a file
# named after the port, created atomically (noclobber), containing the owning
# state directory, so parallel test packages never pick the same port.
OUTBOXD_PORT_REGISTRY="${OUTBOXD_PORT_REGISTRY:-/tmp/outboxd-ports}"

die() { echo "error: $*" >&2; exit 1; }
log() { echo "[$(basename "$0")] $*" >&2; }

# abs_dir DIR: create DIR and print its absolute path.
abs_dir() {
  [[ -n "${1:-}" ]] || die "missing DIR argument"
  mkdir -p "$1"
  (cd "$1" && pwd -P)
}

# port_listening PORT: true when something accepts TCP on 127.0.0.1:PORT.
port_listening() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# port_bound PORT: true when a socket is bound/listening on PORT (any state).
port_bound() {
  if command -v ss >/dev/null 2>&1; then
    [[ -n "$(ss -Htan "( sport = :$1 )" 2>/dev/null)" ]] && return 0
    return 1
  fi
  port_listening "$1"
}

# claim_port OWNER_DIR: prints a free loopback port (range 20000-32767, below
# the Linux ephemeral range so client sockets don't squat on it between
# restarts) and records the claim for OWNER_DIR.
claim_port() {
  local owner="$1" p i
  mkdir -p "$OUTBOXD_PORT_REGISTRY" 2>/dev/null || true
  chmod 1777 "$OUTBOXD_PORT_REGISTRY" 2>/dev/null || true
  for ((i = 0; i < 200; i++)); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 12768))
    port_bound "$p" && continue
    if (set -o noclobber; echo "$owner" >"$OUTBOXD_PORT_REGISTRY/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  die "could not find a free loopback port"
}

# release_ports OWNER_DIR PORT...: drop claims held by OWNER_DIR.
release_ports() {
  local owner="$1" p f
  shift
  for p in "$@"; do
    [[ -n "$p" ]] || continue
    f="$OUTBOXD_PORT_REGISTRY/$p"
    if [[ -f "$f" && "$(cat "$f" 2>/dev/null)" == "$owner" ]]; then
      rm -f "$f"
    fi
  done
}

# read_env FILE KEY: prints KEY's value from a KEY=VALUE file (empty if absent).
read_env() {
  [[ -f "$1" ]] || return 0
  sed -n "s/^$2=//p" "$1" | tail -n1
}

# maven_fetch LIB DEPENDENCIES: copies the runtime jars of DEPENDENCIES (the
# <dependency> elements of a POM) from Maven Central into LIB, once: a LIB
# holding .complete is left alone. Atomic: an interrupted fetch leaves no
# LIB behind.
maven_fetch() {
  local lib="$1" deps="$2" work
  [[ -f "$lib/.complete" ]] && return 0
  mkdir -p "$(dirname "$lib")"
  work="$(mktemp -d "$(dirname "$lib")/fetch.XXXXXX")"
  cat >"$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>outboxd</groupId>
  <artifactId>fetch</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>$deps</dependencies>
</project>
POM
  rm -rf "$lib.tmp"
  if ! mvn -q -B -f "$work/pom.xml" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$lib.tmp" >&2; then
    rm -rf "$work" "$lib.tmp"
    return 1
  fi
  rm -rf "$work" "$lib"
  mv "$lib.tmp" "$lib"
  touch "$lib/.complete"
}

# stop_service PIDF SECONDS DIR ENVF PORT_VAR: stop the process group led
# by the pid in PIDF (a setsid'd service: SIGTERM, then SIGKILL after
# SECONDS), release the port ENVF names in PORT_VAR (claimed for DIR), and
# remove PIDF and ENVF.
stop_service() {
  local pidf="$1" secs="$2" dir="$3" envf="$4" var="$5" pid i
  if [[ -f "$pidf" ]] && kill -0 "$(cat "$pidf")" 2>/dev/null; then
    pid="$(cat "$pidf")"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < secs * 5; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  if [[ -f "$envf" ]]; then
    release_ports "$dir" "$(read_env "$envf" "$var")"
  fi
  rm -f "$pidf" "$envf"
}
