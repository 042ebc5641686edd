#!/usr/bin/env bash
# Fetches Debezium's embedded engine and PostgreSQL connector (and a logging
# backend) from Maven Central into a cache folder outside the clone, once,
# and compiles DebeziumOutbox.java against them. Prints the folder holding
# the jars and the class. Idempotent: a second run downloads nothing.
set -euo pipefail

DEBEZIUM_VERSION="${DEBEZIUM_VERSION:-3.6.1.Final}"
SLF4J_VERSION="${SLF4J_VERSION:-1.7.36}"  # the API Debezium 3.6 brings is 1.7
CACHE="${OUTBOXD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outboxd}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LIB="$CACHE/debezium-$DEBEZIUM_VERSION/lib-slf4j-$SLF4J_VERSION"
CLASSES="$CACHE/debezium-$DEBEZIUM_VERSION/classes"

# shellcheck source=../../testenv/common.sh
. "$HERE/../../testenv/common.sh"
maven_fetch "$LIB" "
    <dependency><groupId>io.debezium</groupId><artifactId>debezium-embedded</artifactId><version>$DEBEZIUM_VERSION</version></dependency>
    <dependency><groupId>io.debezium</groupId><artifactId>debezium-connector-postgres</artifactId><version>$DEBEZIUM_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>$SLF4J_VERSION</version></dependency>"

# Compiled again whenever the source changes.
sum="$(sha256sum "$HERE/DebeziumOutbox.java" | cut -c1-16)"
if [[ ! -f "$CLASSES/$sum/DebeziumOutbox.class" ]]; then
  rm -rf "$CLASSES/$sum.tmp"
  mkdir -p "$CLASSES/$sum.tmp"
  javac -nowarn -cp "$LIB/*" -d "$CLASSES/$sum.tmp" "$HERE/DebeziumOutbox.java" >&2
  rm -rf "$CLASSES/$sum"
  mv "$CLASSES/$sum.tmp" "$CLASSES/$sum"
fi
echo "$LIB/*:$CLASSES/$sum"
