# outboxd. `make test` is what CI runs (through .ci/run).
GO ?= go

.PHONY: build test unit demo clean

# The version `outboxd version` and outboxd_build_info report.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS = -s -w -X github.com/outboxd/outboxd.Version=$(VERSION)

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/outboxd ./cmd/outboxd

# Unit tests and the integration tests against a real PostgreSQL 15 and a
# real Apache Kafka, both started (and removed) by the test environment
# (testenv/: its Go package and its scripts); then the integration tests
# again on PostgreSQL 18 (testenv/pg-fetch.sh fetches it once).
test: test-kubernetes
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 28m ./...
	OUTBOXD_PG_VERSION=18 $(GO) test -count=1 -timeout 28m ./integration/

# deploy/kubernetes/*.yaml, and deploy/helm/outboxd rendered by Helm 4's own
# engine, decoded strictly into the Kubernetes API types, in a module of its
# own (outboxd's module depends on neither).
.PHONY: test-kubernetes
test-kubernetes:
	cd deploy/kubernetes/validate && $(GO) vet ./... && $(GO) test -count=1 ./...

# outboxd's preset: debezium against the real Debezium 3.6.1 (its PostgreSQL
# connector in the embedded engine, the outbox EventRouter, Kafka Connect's
# converters) on the same rows, record by record. Fetches ~40 MB from Maven
# Central into ~/.cache/outboxd once (tools/debezium/fetch.sh); about 1-2
# minutes. `make test` runs the documented-shape test instead.
.PHONY: test-debezium
test-debezium:
	OUTBOXD_DEBEZIUM=1 $(GO) test -count=1 -timeout 15m -run 'TestDebeziumCompare' -v ./integration/ | grep -v '^=== '

# Unit tests only: no PostgreSQL, no Kafka (the integration package says it skips).
unit:
	$(GO) test -count=1 -short ./...

# Starts both services, runs outboxd on the km0 comandes schema, inserts a
# few orders and prints what a consumer reads.
demo:
	bash tools/demo/demo.sh

clean:
	rm -rf bin dist

# The offline image build (see the Dockerfile): a static binary and the
# host's CA bundle in dist/, then the image FROM scratch with no registry.
# IMAGE_BUILD=docker build works too, where Docker runs.
IMAGE ?= outboxd:$(VERSION)
IMAGE_BUILD ?= podman build --format docker
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt

.PHONY: dist image
dist:
	mkdir -p dist
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o dist/outboxd ./cmd/outboxd
	cp $(CA_BUNDLE) dist/ca-certificates.crt

image: dist
	$(IMAGE_BUILD) --build-arg BINARY=dist --build-arg BASE_IMAGE=$${BASE_IMAGE:-scratch} --build-arg VERSION=$(VERSION) -t $(IMAGE) .

# Benchmarks print numbers; they are not tests (docs/reports/PERFORMANCE.md). Needs
# the same tools as `make test`; starts and removes its own PostgreSQL and
# Kafka; about 7 minutes with the defaults. Scale with ROWS=500000 REPEATS=5
# DURATION=20s; more flags in BENCH_ARGS (go run ./tools/bench -h). Its steady
# phase prints outboxd's CPU per event at STEADY=200,2000 events/s
# (transactions of 1-10 rows), its idle CPU and the top of a CPU profile.
.PHONY: bench
bench:
	$(GO) run ./tools/bench -rows $${ROWS:-500000} -repeats $${REPEATS:-3} -duration $${DURATION:-5s} \
		-rates $${RATES:-500,2000,10000} -steady $${STEADY:-200,2000} -out $${OUT:-bench-out} $(BENCH_ARGS)

# How cost grows with the work (issue 15, docs/reports/PERFORMANCE.md): drain rate
# and CPU per event against carrega size (200 B to 200 KB), topic partitions
# (1, 6, 60), routes (1 or 4 tables) and pgoutput's binary option (for
# pg_recvlogical: outboxd reads text), and
# latency against offered rate up to saturation, each beside pg_recvlogical
# on the same backlog; tables and SVG plots in bench-out/ (OUT=docs/reports/cost
# to replace the published ones). About 20 minutes with the defaults. Sizes in
# BENCH_ARGS: -cost-sweeps size,rate -cost-sizes 200,20000 -cost-rows 100000
# -cost-mb 100 -cost-rates ...
.PHONY: bench-cost
bench-cost:
	$(GO) run ./tools/bench -cost -repeats $${REPEATS:-3} -duration $${DURATION:-5s} -out $${OUT:-bench-out} $(BENCH_ARGS)

# Fault-injection scenarios (issue 4): kill -9, broker and PostgreSQL
# outages, network cuts and blackholes, a 500,000-row transaction, SIGTERM,
# a dropped slot; and on a three-broker cluster (issue 12) a leader killed,
# a controlled shutdown, two brokers down, a broker cut off, partitions
# added. Prints the table of docs/reports/CHAOS.md; takes about 25 minutes.
# CHAOS_ARGS="-short" or "-only 1,7" for a subset.
.PHONY: chaos
chaos:
	$(GO) run ./tools/chaos -keep-logs $(CHAOS_ARGS)

# PostgreSQL 14, 15, 16, 17 and 18 (testenv/pg-fetch.sh fetches 14, 16, 17 and 18
# once): the integration suite (the failover test included) and the chaos
# suite's PostgreSQL restarts (scenario 3) on each; then the Kafka-side
# integration tests on Apache Kafka 2.8.2 (ZooKeeper), 3.6.2, 3.9.1, 4.1.1
# and 4.4.0 (testenv/kafka-fetch.sh fetches each once); writes
# docs/reports/MATRIX.md. About 50 minutes. MATRIX_ARGS="-versions 16,17
# -chaos 3,1 -kafka 3.9.1" for others; -versions "" or -kafka "" leaves that
# axis's part of the file as it was.
.PHONY: matrix
matrix:
	$(GO) run ./tools/matrix $(MATRIX_ARGS)
