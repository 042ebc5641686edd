#!/usr/bin/env bash
# Makes a Python virtual environment holding testenv/python/requirements.txt
# (the CloudEvents SDK, confluent-kafka) in a cache folder outside the
# clone, once, and prints its python. Idempotent: a second run installs
# nothing (the folder is named by the requirements' hash).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$HERE/common.sh"
CACHE="${OUTBOXD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outboxd}"
REQ="$HERE/python/requirements.txt"
PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || die "no $PY: install python3 and python3-venv"
VENV="$CACHE/python-$(sha256sum "$REQ" | cut -c1-12)"
if [[ ! -f "$VENV/.done" ]]; then
  rm -rf "$VENV.tmp"
  "$PY" -m venv "$VENV.tmp" >&2 || die "python3 -m venv failed: install python3-venv"
  "$VENV.tmp/bin/pip" install -q --disable-pip-version-check -r "$REQ" >&2 || die "pip install -r $REQ failed"
  rm -rf "$VENV"
  mv "$VENV.tmp" "$VENV"
  # A moved venv keeps its old path in its scripts; bin/python is a
  # symlink and works from anywhere.
  touch "$VENV/.done"
fi
echo "$VENV/bin/python"
