# outboxd. `make test` is what CI runs (through .ci/run).
GO ?= go

.PHONY: build test unit demo clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o bin/outboxd ./cmd/outboxd

# Unit tests and the integration tests against a real PostgreSQL 15 and a
# real Apache Kafka, both started (and removed) by integration/*.sh.
test:
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 20m ./...

# Unit tests only: no PostgreSQL, no Kafka (the integration package says it skips).
unit:
	$(GO) test -count=1 -short ./...

# Starts both services, runs outboxd on the km0 comandes schema, inserts a
# few orders and prints what a consumer reads.
demo:
	bash integration/demo.sh

clean:
	rm -rf bin

# Benchmarks print numbers; they are not tests. Needs the same tools as `make test`.
.PHONY: bench
bench:
	$(GO) run ./integration/cmd/drain-bench -rows $${ROWS:-200000}
