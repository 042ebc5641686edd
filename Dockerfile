# syntax=docker/dockerfile:1
#
# outboxd container image: the static binary, CA certificates and nothing
# else, running as the numeric non-root user 65532.
#
# Public build (compiles in a golang stage, runs on a pinned distroless base):
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t outboxd .
#
# Offline build from a binary built on the host (no registry needed: the
# golang stage is never built, and scratch is not pulled). `make image` does
# this with podman, and the container test runs exactly that:
#
#   make dist        # dist/outboxd (static) + dist/ca-certificates.crt
#   podman build --format docker --build-arg BINARY=dist --build-arg BASE_IMAGE=scratch -t outboxd .
#
# --format docker keeps the HEALTHCHECK (the OCI image format has no field
# for it; podman's default format is OCI and drops it with a warning).
#
# Run it (the default configuration is examples/outboxd.yaml, set through
# environment variables; mount your own file over /etc/outboxd/outboxd.yaml
# to change anything else):
#
#   docker run --rm -e KM0_DSN=postgres://... -e KAFKA_BROKERS=kafka:9092 -p 9597:9597 outboxd

# The Go toolchain for the public build (go.mod asks for 1.26).
ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm
# The base of the final image. distroless/static:nonroot has CA certificates,
# tzdata and /etc/passwd with nonroot=65532; `scratch` works as well (the CA
# bundle is copied in below and the user is numeric). The digest is the one
# public Dockerfiles pinned in 2026-08 for this tag; refresh it with
# `crane digest gcr.io/distroless/static-debian12:nonroot` (not reachable
# from the machines this was written on, so not re-checked there).
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab
# Where the binary comes from: `build` compiles it in the golang stage,
# `dist` takes dist/outboxd and dist/ca-certificates.crt from the context.
ARG BINARY=build

FROM ${GO_IMAGE} AS build
WORKDIR /src
# Dependencies first, so they are cached across source-only changes.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/outboxd/outboxd.Version=${VERSION}" \
      -o /out/outboxd ./cmd/outboxd && \
    cp /etc/ssl/certs/ca-certificates.crt /out/

FROM scratch AS dist
COPY dist/outboxd dist/ca-certificates.crt /out/

FROM ${BINARY} AS binary

FROM ${BASE_IMAGE}
ARG VERSION=dev
LABEL org.opencontainers.image.title="outboxd" \
      org.opencontainers.image.description="Transactional-outbox events from PostgreSQL logical replication to Kafka" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=binary /out/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=binary /out/outboxd /outboxd
COPY examples/outboxd.yaml /etc/outboxd/outboxd.yaml
# All interfaces inside the container, so a published port and the
# orchestrator's probes reach /healthz /readyz /status /metrics.
ENV OUTBOXD_HEALTH_LISTEN=0.0.0.0:9597
EXPOSE 9597
USER 65532:65532
# Liveness, from inside the container (no curl in scratch or distroless):
# outboxd health reads health.listen from the same file `run` uses. A
# standby instance (another one holds the slot) is healthy, not ready.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/outboxd", "health", "-c", "/etc/outboxd/outboxd.yaml"]
# SIGTERM finishes the open transaction and confirms it (pipeline.shutdown_timeout, 30 s):
# give `docker stop` more than that (--time 40).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/outboxd"]
CMD ["run", "-c", "/etc/outboxd/outboxd.yaml"]
