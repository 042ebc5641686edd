#!/usr/bin/env bash
# Fetches the Apache Kafka broker jars (kafka_2.13, KRaft) and a logging
# backend from Maven Central into a cache folder outside the clone, once.
# Prints the folder holding the jars. Idempotent: a second run downloads nothing.
set -euo pipefail

KAFKA_VERSION="${KAFKA_VERSION:-4.1.1}"
SLF4J_VERSION="${SLF4J_VERSION:-1.7.36}"
CACHE="${OUTBOXD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outboxd}"
LIB="$CACHE/kafka-$KAFKA_VERSION/lib"

if [[ -f "$LIB/.complete" ]]; then
  echo "$LIB"
  exit 0
fi

mkdir -p "$CACHE"
work="$(mktemp -d "$CACHE/fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT

cat >"$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>outboxd</groupId>
  <artifactId>kafka-broker-fetch</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-simple</artifactId>
      <version>$SLF4J_VERSION</version>
    </dependency>
  </dependencies>
</project>
POM

rm -rf "$LIB.tmp"
mvn -q -B -f "$work/pom.xml" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$LIB.tmp" >&2
rm -rf "$LIB"
mv "$LIB.tmp" "$LIB"
touch "$LIB/.complete"
echo "$LIB"
