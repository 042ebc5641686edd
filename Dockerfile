# syntax=docker/dockerfile:1
#
# outboxd container image: a static binary on distroless, running as nonroot.
#
#   docker build -t outboxd .
#   docker run --rm -e KM0_DSN=... -e KAFKA_BROKERS=... \
#     -e OUTBOXD_HEALTH_LISTEN=0.0.0.0:8080 -p 8080:8080 outboxd
#
# The default command runs /etc/outboxd/outboxd.yaml, which is a copy of
# examples/outboxd.yaml (configured through environment variables); mount
# your own file over it to change anything else.
#
# Note: no Docker engine runs on the machine where this file was written, so
# it has not been built there. It is kept deliberately plain.

FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first, so they are cached across source-only changes.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/outboxd ./cmd/outboxd

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/outboxd /outboxd
COPY examples/outboxd.yaml /etc/outboxd/outboxd.yaml
# /healthz /readyz /status /metrics, when OUTBOXD_HEALTH_LISTEN=0.0.0.0:8080
EXPOSE 8080
USER nonroot:nonroot
ENTRYPOINT ["/outboxd"]
CMD ["run", "-c", "/etc/outboxd/outboxd.yaml"]
