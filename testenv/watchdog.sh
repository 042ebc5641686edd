#!/usr/bin/env bash
# The services a test process started die with it, however it dies
# (testenv's watchdog.go starts this once per process, in a session of its
# own).
#
#   watchdog.sh <PIPE
#
# Standard input is a pipe whose writing end only the test process holds.
# Its lines:
#   + SCRIPT VERB DIR   when the pipe ends, run testenv/SCRIPT VERB DIR
#   - SCRIPT VERB DIR   forget that line (the test process did it itself)
# The pipe ends when the test process exits, panics (go test -timeout) or
# is killed, even by SIGKILL: the kernel closes its end. Then this runs the
# lines not forgotten, newest first (e.g. services.sh down DIR: PostgreSQL
# and Kafka stop and their data goes), logs what it did to
# ${TMPDIR:-/tmp}/outboxd-watchdog.log, and exits. SIGINT and SIGHUP (a
# Ctrl-C or a closed terminal reach the test's whole process group) are
# ignored: the pipe's end is the one signal.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
trap '' INT HUP

todo=()
while IFS= read -r line; do
  case "$line" in
    "+ "*) todo+=("${line#+ }") ;;
    "- "*)
      for i in "${!todo[@]}"; do
        if [[ "${todo[$i]}" == "${line#- }" ]]; then unset 'todo[i]'; fi
      done
      ;;
  esac
done

((${#todo[@]} > 0)) || exit 0
exec >>"${TMPDIR:-/tmp}/outboxd-watchdog.log" 2>&1
echo "$(date -u +%FT%TZ) watchdog $$: the test process is gone; stopping what it left running"
idx=("${!todo[@]}")
for ((k = ${#idx[@]} - 1; k >= 0; k--)); do
  i="${idx[$k]}"
  read -r script verb dir <<<"${todo[$i]}"
  case "$script" in
    */* | "") echo "not a testenv script: ${todo[$i]}"; continue ;;
  esac
  echo "$(date -u +%FT%TZ) $script $verb $dir"
  bash "$HERE/$script" "$verb" "$dir" </dev/null || echo "$script $verb $dir failed"
done
echo "$(date -u +%FT%TZ) watchdog $$: done"
