#!/usr/bin/env bash
# Fetches the Apache Kafka broker jars (kafka_2.13 KAFKA_VERSION, default
# 4.1.1; 2.x brings the ZooKeeper it depends on, which kafka.sh runs beside
# it) and a logging backend from Maven Central into a cache folder outside
# the clone, once. Prints the folder holding the jars. Idempotent: a second
# run downloads nothing. The tests pick the version with
# OUTBOXD_KAFKA_VERSION (testenv.Options.KafkaVersion): 2.8.2, 3.6.2, 3.9.1,
# 4.1.1 and 4.4.0 are the ones `make matrix` runs.
set -euo pipefail

KAFKA_VERSION="${KAFKA_VERSION:-4.1.1}"
SLF4J_VERSION="${SLF4J_VERSION:-1.7.36}"
CACHE="${OUTBOXD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outboxd}"
LIB="$CACHE/kafka-$KAFKA_VERSION/lib"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$HERE/common.sh"

maven_fetch "$LIB" "
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>$SLF4J_VERSION</version></dependency>"
echo "$LIB"
