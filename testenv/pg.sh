#!/usr/bin/env bash
# Throwaway PostgreSQL cluster (15 unless PG_VERSION says 14, 16 or 17) on loopback
# for tests, the demo and benchmarks.
#
#   pg.sh start   DIR                    create (once) + start, print env
#   pg.sh stop    DIR [fast|immediate]   stop, keep data (default fast)
#   pg.sh restart DIR [fast|immediate]   stop, start again on the same port
#   pg.sh status  DIR                    exit 0 when running (prints env)
#   pg.sh env     DIR                    print DIR/pg.env
#   pg.sh destroy DIR                    stop and remove DIR/pg, DIR/pg.env
#   pg.sh standby DIR PRIMARY_DIR        create (once) + start a physical streaming
#                                        standby of PRIMARY_DIR's cluster, print env
#   pg.sh promote DIR                    promote a standby; wait until it writes
#   pg.sh kill    DIR                    kill -9 the postmaster and its children
#
# The cluster lives in DIR/pg (the data directory, also holding server.log).
# DIR/pg.env gets PGHOST, PGPORT, PGUSER, OUTBOXD_PG_DSN, PGDATA_DIR.
# The postgres role connects over TCP without password (trust); every other
# role needs a SCRAM password. wal_level=logical, fsync=off.
# PG_WAL_LEVEL (default logical) sets wal_level when the cluster is created,
# e.g. PG_WAL_LEVEL=replica for a test of outboxd's preflight check.
# PG_COMMIT_TS=on (read when the cluster is created) sets
# track_commit_timestamp = on (a standby inherits it from its primary).
# PG_SSL=on (read when the cluster is created) turns ssl on with the server
# certificate of DIR/pki (pki.sh: a throwaway CA of this DIR, 127.0.0.1 and
# localhost) and makes pg_hba.conf hostssl-only: postgres trusted over TLS,
# the role outboxd by its client certificate (CN outboxd, method cert), every
# other role by SCRAM password; no connection without TLS. OUTBOXD_PG_DSN
# then says sslmode=verify-full and sslrootcert, and pg.env gets the PKI's
# files (TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE, TLS_OTHER_CA_FILE, ...).
# All subcommands are idempotent. Run as root, the server runs as the
# `postgres` OS user. PG_BINDIR overrides the PostgreSQL binaries folder;
# PG_VERSION (14, 15, 16, 17) picks one through pg-fetch.sh. Both are read
# when the cluster is created and kept (DIR/pg.bindir) for every later
# subcommand. Client tools (pg_isready, psql) come from the same folder
# when it has them (Debian's), else from Debian's newest.
# High availability (see the standby subcommand below): the standby's
# settings, and the primary's on PostgreSQL 17, are in outboxd-ha.conf in
# each data directory, apart from outboxd.conf.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$HERE/common.sh"

usage() {
  sed -n '2,37p' "$0" >&2
  exit 2
}

find_bindir() {
  local d
  if [[ -n "${PG_BINDIR:-}" ]]; then echo "$PG_BINDIR"; return; fi
  if [[ -n "${PG_VERSION:-}" ]]; then bash "$HERE/pg-fetch.sh" "$PG_VERSION"; return; fi
  if command -v pg_config >/dev/null 2>&1; then
    d="$(pg_config --bindir 2>/dev/null || true)"
    if [[ -x "$d/initdb" ]]; then echo "$d"; return; fi
  fi
  for d in /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
    if [[ -x "$d/initdb" ]]; then echo "$d"; return; fi
  done
  die "PostgreSQL server binaries (initdb) not found; set PG_BINDIR"
}


# find_client_bindir: pg_isready and psql, which the zonky builds lack.
# Both talk to any server version the tests run.
find_client_bindir() {
  local d
  for d in "$BINDIR" $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV); do
    if [[ -x "$d/pg_isready" && -x "$d/psql" ]]; then
      CLIENT_BINDIR="$d"
      return
    fi
  done
  die "pg_isready and psql not found (apt-get install postgresql-client)"
}
case "${PG_WAL_LEVEL:-logical}" in
  logical | replica) ;;
  *) die "PG_WAL_LEVEL must be logical or replica, not ${PG_WAL_LEVEL}" ;;
esac
case "${PG_SSL:-off}" in
  on | off) ;;
  *) die "PG_SSL must be on or off, not ${PG_SSL}" ;;
esac
case "${PG_COMMIT_TS:-off}" in
  on | off) ;;
  *) die "PG_COMMIT_TS must be on or off, not ${PG_COMMIT_TS}" ;;
esac

# as_pg CMD...: run CMD as the postgres OS user when we are root.
as_pg() {
  if [[ $EUID -eq 0 ]]; then
    (cd / && runuser -u postgres -- "$@")
  else
    "$@"
  fi
}

setup_dirs() {
  DIR="$(abs_dir "$1")"
  PGD="$DIR/pg"
  ENVF="$DIR/pg.env"
  CONF="$PGD/outboxd.conf"
}

lock() {
  exec 9>"$DIR/.pg.lock"
  flock 9
}

initialized() { [[ -f "$PGD/.outboxd-ready" ]]; }

running() {
  initialized || return 1
  as_pg "$BINDIR/pg_ctl" -D "$PGD" status >/dev/null 2>&1
}

conf_get() { # KEY
  [[ -f "$CONF" ]] || return 0
  sed -n "s/^$1 = '\{0,1\}\([^']*\)'\{0,1\}\$/\1/p" "$CONF" | tail -n1
}

sock_dir_for() {
  # Unix socket paths are limited to 107 bytes; fall back to a short /tmp dir.
  if (( ${#PGD} + 20 < 100 )); then
    echo "$PGD"
  else
    echo "/tmp/outboxd-pg-$(printf '%s' "$PGD" | md5sum | cut -c1-12)"
  fi
}

ensure_sock_dir() {
  local s
  s="$(conf_get unix_socket_directories)"
  [[ -n "$s" && "$s" != "$PGD" ]] || return 0
  mkdir -p "$s"
  if [[ $EUID -eq 0 ]]; then chown postgres:postgres "$s"; fi
  chmod 0700 "$s"
}

write_conf() { # PORT
  local sock
  sock="$(sock_dir_for)"
  cat >"$CONF" <<EOF
# written by testenv/pg.sh
listen_addresses = '127.0.0.1'
port = $1
unix_socket_directories = '$sock'
wal_level = ${PG_WAL_LEVEL:-logical}
max_replication_slots = 16
max_wal_senders = 16
fsync = off
password_encryption = 'scram-sha-256'
logging_collector = off
log_min_messages = warning
track_commit_timestamp = ${PG_COMMIT_TS:-off}
EOF
  if [[ "${PG_SSL:-off}" == on ]]; then
    cat >>"$CONF" <<EOF
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
ssl_ca_file = 'root.crt'
EOF
  fi
  if [[ $EUID -eq 0 ]]; then chown postgres:postgres "$CONF"; fi
}

# install_tls: the server's certificate and key, and the CA its clients'
# certificates must chain to, from DIR/pki into the data directory (the
# key readable by the server's OS user only, as PostgreSQL demands).
install_tls() {
  local f
  bash "$HERE/pki.sh" make "$DIR" >/dev/null 9>&-
  cp "$DIR/pki/server.pem" "$PGD/server.crt"
  cp "$DIR/pki/server.key" "$PGD/server.key"
  cp "$DIR/pki/ca.pem" "$PGD/root.crt"
  for f in server.crt server.key root.crt; do
    chmod 0600 "$PGD/$f"
    if [[ $EUID -eq 0 ]]; then chown postgres:postgres "$PGD/$f"; fi
  done
}

write_hba() {
  if [[ "${PG_SSL:-off}" == on ]]; then
    cat >"$PGD/pg_hba.conf" <<'EOF'
# written by testenv/pg.sh (PG_SSL=on): TLS only
local   all          postgres                   trust
hostssl all          postgres   127.0.0.1/32    trust
hostssl replication  postgres   127.0.0.1/32    trust
hostssl all          outboxd    127.0.0.1/32    cert
hostssl replication  outboxd    127.0.0.1/32    cert
hostssl all          all        127.0.0.1/32    scram-sha-256
hostssl replication  all        127.0.0.1/32    scram-sha-256
EOF
    return
  fi
  cat >"$PGD/pg_hba.conf" <<'EOF'
# written by testenv/pg.sh
local   all          postgres                   trust
host    all          postgres   127.0.0.1/32    trust
host    replication  postgres   127.0.0.1/32    trust
host    all          all        127.0.0.1/32    scram-sha-256
host    replication  all        127.0.0.1/32    scram-sha-256
EOF
}


# new_data_dir: an empty $PGD the server's OS user owns.
new_data_dir() {
  if [[ -d "$PGD" ]]; then
    log "removing half-initialized $PGD"
    rm -rf "$PGD"
  fi
  mkdir -p "$PGD"
  chmod 0700 "$PGD"
  if [[ $EUID -eq 0 ]]; then
    chown postgres:postgres "$PGD"
    # The server (postgres user) must be able to traverse DIR.
    if ! runuser -u postgres -- test -x "$DIR"; then chmod o+x "$DIR"; fi
    runuser -u postgres -- test -w "$PGD" ||
      die "postgres OS user cannot reach $PGD (a parent folder is not traversable: chmod o+x it)"
  fi
}

init_cluster() {
  local port
  new_data_dir
  as_pg "$BINDIR/initdb" -D "$PGD" -U postgres -A trust -E UTF8 --locale=C \
    --no-sync >"$DIR/pg-initdb.log" 2>&1 ||
    { cat "$DIR/pg-initdb.log" >&2; die "initdb failed"; }
  rm -f "$DIR/pg-initdb.log"
  port="$(claim_port "$DIR")"
  write_conf "$port"
  echo "include 'outboxd.conf'" >>"$PGD/postgresql.conf"
  write_hba
  if [[ "${PG_SSL:-off}" == on ]]; then install_tls; fi
  touch "$PGD/.outboxd-ready"
  if [[ $EUID -eq 0 ]]; then chown postgres:postgres "$PGD/.outboxd-ready"; fi
  echo "$BINDIR" >"$DIR/pg.bindir"
}

write_env() {
  local port tls="sslmode=disable"
  port="$(conf_get port)"
  if [[ "$(conf_get ssl)" == on ]]; then tls="sslmode=verify-full&sslrootcert=$DIR/pki/ca.pem"; fi
  {
    cat <<EOF
PGHOST=127.0.0.1
PGPORT=$port
PGUSER=postgres
OUTBOXD_PG_DSN='postgres://postgres@127.0.0.1:$port/postgres?$tls'
PGDATA_DIR=$PGD
EOF
    if [[ "$(conf_get ssl)" == on ]]; then cat "$DIR/pki/pki.env"; fi
  } >"$ENVF"
  cat "$ENVF"
}

start_server() {
  local attempt port
  for attempt in 1 2 3; do
    ensure_sock_dir
    if as_pg "$BINDIR/pg_ctl" -D "$PGD" -l "$PGD/server.log" -w -t 60 start \
      >/dev/null 2>"$DIR/pg-ctl.err" 9>&-; then
      rm -f "$DIR/pg-ctl.err"
      break
    fi
    # A port collision before the first successful start: pick another port.
    if [[ ! -f "$PGD/.outboxd-started" ]] &&
      grep -qE 'could not (bind|create listen)|already in use' "$PGD/server.log" 2>/dev/null &&
      (( attempt < 3 )); then
      port="$(conf_get port)"
      log "port $port is taken, picking another"
      write_conf "$(claim_port "$DIR")"
      release_ports "$DIR" "$port"
      continue
    fi
    cat "$DIR/pg-ctl.err" >&2 || true
    echo "---- tail of $PGD/server.log ----" >&2
    tail -n 30 "$PGD/server.log" >&2 || true
    die "PostgreSQL failed to start"
  done
  port="$(conf_get port)"
  local i
  for ((i = 0; i < 300; i++)); do
    if "$CLIENT_BINDIR/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres; then
      touch "$PGD/.outboxd-started"
      return 0
    fi
    sleep 0.1
  done
  tail -n 30 "$PGD/server.log" >&2 || true
  die "PostgreSQL did not become ready on 127.0.0.1:$port"
}

cmd_start() {
  if running; then write_env; return; fi
  initialized || init_cluster
  start_server
  write_env
}

cmd_stop() { # MODE
  local mode="${1:-fast}"
  case "$mode" in fast | immediate | smart) ;; *) die "bad stop mode: $mode" ;; esac
  running || return 0
  as_pg "$BINDIR/pg_ctl" -D "$PGD" -m "$mode" -w -t 60 stop >/dev/null 9>&- ||
    { running && die "PostgreSQL did not stop"; }
}

cmd_destroy() {
  local sock port
  if initialized && running; then
    as_pg "$BINDIR/pg_ctl" -D "$PGD" -m fast -w -t 10 stop >/dev/null 2>&1 9>&- ||
      as_pg "$BINDIR/pg_ctl" -D "$PGD" -m immediate -w -t 30 stop >/dev/null 2>&1 9>&- || true
  fi
  # Last resort: a postmaster still running on this data directory.
  if [[ -f "$PGD/postmaster.pid" ]]; then
    local pid
    pid="$(head -n1 "$PGD/postmaster.pid" 2>/dev/null || true)"
    if [[ -n "$pid" ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$PGD"; then
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
    fi
  fi
  sock="$(conf_get unix_socket_directories)"
  port="$(conf_get port)"
  [[ -z "$port" ]] && port="$(read_env "$ENVF" PGPORT)"
  release_ports "$DIR" "$port"
  if [[ -n "$sock" && "$sock" == /tmp/outboxd-pg-* ]]; then rm -rf "$sock"; fi
  rm -rf "$PGD" "$ENVF" "$DIR/pg-ctl.err" "$DIR/pg-initdb.log"
}

# ---- high availability: a physical streaming standby, promotion, a crash ----

# psql_at PORT SQL: one statement as postgres, unaligned, tuples only.
psql_at() {
  "$CLIENT_BINDIR/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$1" -U postgres -d postgres -c "$2"
}

# include_ha: postgresql.conf includes outboxd-ha.conf (once).
include_ha() { # PGDATA
  grep -qF "include_if_exists 'outboxd-ha.conf'" "$1/postgresql.conf" ||
    echo "include_if_exists 'outboxd-ha.conf'" >>"$1/postgresql.conf"
}

# base_backup PRIMARY_PGD PRIMARY_PORT SLOT: a base backup of the primary
# into $PGD, its WAL reserved by the physical slot SLOT. pg_basebackup when
# the binaries have it (Debian's); otherwise (the zonky builds carry only
# initdb, pg_ctl and postgres) the documented low-level API: backup start,
# a copy of the data directory, backup stop, its backup_label.
base_backup() {
  local ppgd="$1" pport="$2" slot="$3" major label rc
  if [[ -x "$BINDIR/pg_basebackup" ]]; then
    log "base backup with pg_basebackup"
    as_pg "$BINDIR/pg_basebackup" -h 127.0.0.1 -p "$pport" -U postgres -D "$PGD" -X stream -S "$slot" -c fast --no-sync \
      >"$DIR/pg-basebackup.log" 2>&1 9>&- || { cat "$DIR/pg-basebackup.log" >&2; die "pg_basebackup failed"; }
    rm -f "$DIR/pg-basebackup.log"
  else
    log "base backup with the low-level API (no pg_basebackup among $BINDIR)"
    major="$(cat "$ppgd/PG_VERSION")"
    local start_sql="SELECT pg_backup_start('outboxd standby', true)"
    local stop_sql="SELECT translate(encode(convert_to(labelfile, 'UTF8'), 'base64'), E'\n', '') FROM pg_backup_stop(false)"
    if ((major < 15)); then
      start_sql="SELECT pg_start_backup('outboxd standby', true, false)"
      stop_sql="SELECT translate(encode(convert_to(labelfile, 'UTF8'), 'base64'), E'\n', '') FROM pg_stop_backup(false, false)"
    fi
    # One session from backup start to backup stop (a non-exclusive backup
    # ends with its session).
    coproc BACKUP { "$CLIENT_BINDIR/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pport" -U postgres -d postgres 2>&1; }
    echo "$start_sql;" >&"${BACKUP[1]}"
    read -r -t 120 label <&"${BACKUP[0]}" || die "backup start on port $pport: no answer"
    [[ "$label" =~ ^[0-9A-F]+/[0-9A-F]+$ ]] || die "backup start on port $pport: $label"
    rc=0
    tar -C "$ppgd" --warning=no-file-changed --warning=no-file-removed \
      --exclude=./postmaster.pid --exclude=./postmaster.opts --exclude=./server.log \
      --exclude=./.outboxd-started --exclude='./.s.PGSQL.*' --exclude='./pg_wal/*' --exclude='./pg_replslot/*' \
      --exclude='./pg_stat_tmp/*' -cf - . | tar -C "$PGD" -xf - || rc=$?
    ((rc <= 1)) || die "copying $ppgd failed (tar status $rc)"
    mkdir -p "$PGD/pg_wal/archive_status"
    echo "$stop_sql;" >&"${BACKUP[1]}"
    read -r -t 120 label <&"${BACKUP[0]}" || die "backup stop on port $pport: no answer"
    base64 -d <<<"$label" >"$PGD/backup_label" || die "backup stop on port $pport: $label"
    exec {BACKUP[1]}>&-
    wait "$BACKUP_PID" 2>/dev/null || true
    if [[ $EUID -eq 0 ]]; then chown -R postgres:postgres "$PGD"; fi
  fi
}

# cmd_standby PRIMARY_DIR: a physical streaming standby of PRIMARY_DIR's
# cluster in DIR. Its WAL comes through a physical slot on the primary
# (primary_slot_name), hot_standby_feedback is on, and on PostgreSQL 17 it
# synchronises the primary's failover slots (sync_replication_slots; the
# slot sync worker needs dbname in primary_conninfo) while the primary
# waits for it before logical walsenders send anything
# (synchronized_standby_slots): a logical slot never gets ahead of it.
cmd_standby() {
  local pdir ppgd pport port slot major
  if running; then write_env; return; fi
  if ! initialized; then
    pdir="$(abs_dir "$1")"
    ppgd="$pdir/pg"
    [[ -f "$ppgd/.outboxd-ready" ]] || die "no primary cluster in $pdir (pg.sh start it first)"
    [[ -f "$pdir/pg.bindir" ]] && BINDIR="$(cat "$pdir/pg.bindir")"
    pport="$(read_env "$pdir/pg.env" PGPORT)"
    [[ -n "$pport" ]] || die "$pdir/pg.env has no PGPORT"
    major="$(cat "$ppgd/PG_VERSION")"
    new_data_dir
    port="$(claim_port "$DIR")"
    slot="outboxd_standby_$port"
    psql_at "$pport" "SELECT pg_create_physical_replication_slot('$slot', true) WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = '$slot')" >/dev/null
    base_backup "$ppgd" "$pport" "$slot"
    # The primary's commit timestamps: kept on the standby, and after its
    # promotion.
    if grep -q '^track_commit_timestamp = on' "$ppgd/outboxd.conf"; then PG_COMMIT_TS=on; fi
    write_conf "$port"
    include_ha "$PGD"
    {
      echo "# written by testenv/pg.sh standby: a physical standby of 127.0.0.1:$pport"
      echo "primary_conninfo = 'host=127.0.0.1 port=$pport user=postgres dbname=postgres application_name=$slot'"
      echo "primary_slot_name = '$slot'"
      echo "hot_standby_feedback = on"
      if ((major >= 17)); then
        echo "sync_replication_slots = on"
        echo "synchronized_standby_slots = ''" # the primary's, copied in the backup, names a slot this server lacks
      fi
    } >"$PGD/outboxd-ha.conf"
    touch "$PGD/standby.signal"
    rm -f "$PGD/server.log" "$PGD/.outboxd-started"
    if [[ $EUID -eq 0 ]]; then chown postgres:postgres "$PGD/outboxd-ha.conf" "$PGD/standby.signal" "$CONF"; fi
    if ((major >= 17)); then
      include_ha "$ppgd"
      echo "synchronized_standby_slots = '$slot' # written by testenv/pg.sh standby" >"$ppgd/outboxd-ha.conf"
      if [[ $EUID -eq 0 ]]; then chown postgres:postgres "$ppgd/outboxd-ha.conf"; fi
      psql_at "$pport" "SELECT pg_reload_conf()" >/dev/null
    fi
    echo "$BINDIR" >"$DIR/pg.bindir"
    touch "$PGD/.outboxd-ready"
  fi
  start_server
  wait_streaming
  write_env
}

# wait_streaming: the standby receives WAL from its primary.
wait_streaming() {
  local port i
  port="$(conf_get port)"
  for ((i = 0; i < 600; i++)); do
    [[ "$(psql_at "$port" "SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'" 2>/dev/null)" == 1 ]] && return 0
    sleep 0.1
  done
  tail -n 30 "$PGD/server.log" >&2 || true
  die "the standby on port $port does not stream from its primary"
}

cmd_promote() {
  running || die "no running server in $PGD"
  as_pg "$BINDIR/pg_ctl" -D "$PGD" -w -t 60 promote >/dev/null 9>&- || die "promotion failed"
}

# cmd_kill: SIGKILL to the postmaster and every child of it at once, as a
# machine failure would leave it: no shutdown checkpoint, no goodbye to
# clients or standbys. The data directory stays (start recovers it).
cmd_kill() {
  local pid pids
  [[ -f "$PGD/postmaster.pid" ]] || return 0
  pid="$(head -n1 "$PGD/postmaster.pid" 2>/dev/null || true)"
  [[ -n "$pid" ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$PGD" || return 0
  pids="$pid $(ps -o pid= --ppid "$pid" | tr '\n' ' ')"
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  # Dead once it is gone or a zombie (its sockets are closed by then; the
  # reaping is its parent's business).
  local i state
  for ((i = 0; i < 100; i++)); do
    state="$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null || true)"
    [[ -z "$state" || "$state" == Z ]] && return 0
    sleep 0.05
  done
  die "postmaster $pid survived SIGKILL"
}

[[ $# -ge 2 ]] || usage
cmd="$1"
setup_dirs "$2"
lock
# The binaries the cluster was created with, whatever the environment says now.
if [[ -f "$DIR/pg.bindir" ]]; then BINDIR="$(cat "$DIR/pg.bindir")"; else BINDIR="$(find_bindir)"; fi
find_client_bindir
case "$cmd" in
  start) cmd_start ;;
  stop) cmd_stop "${3:-fast}" ;;
  restart)
    initialized || die "no cluster in $PGD (run start first)"
    cmd_stop "${3:-fast}"
    start_server
    write_env
    ;;
  status)
    if running; then cat "$ENVF" 2>/dev/null || write_env; else echo "stopped" >&2; exit 1; fi
    ;;
  env) [[ -f "$ENVF" ]] && cat "$ENVF" || die "no $ENVF" ;;
  destroy) cmd_destroy; rm -f "$DIR/.pg.lock" "$DIR/pg.bindir" ;;
  standby) [[ $# -ge 3 ]] || usage; cmd_standby "$3" ;;
  promote) cmd_promote ;;
  kill) cmd_kill ;;
  *) usage ;;
esac
