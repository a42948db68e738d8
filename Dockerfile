# delayproxy image: a static Go binary on distroless/static (CA certificates
# and tzdata included, no shell), running as the distroless "nonroot" user
# (uid 65532).
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t delayproxy .
#   docker run -d --name delayproxy \
#     -e DELAYPROXY_UPSTREAM=amqp://user:pass@rabbitmq:5672/ \
#     -e DELAYPROXY_ADMIN_TOKEN="$(openssl rand -hex 32)" \
#     -v delayproxy-data:/data -p 5673:5673 -p 15673:15673 delayproxy
#
# It builds with BuildKit and with the classic builder (Docker 20.10's
# default, docker-compose v1): no RUN --mount, no FROM --platform. Behind a
# module mirror, pass --build-arg GOPROXY=https://mirror.example/ (and
# GOSUMDB, e.g. off, when the mirror does not serve the checksum database).
# A multi-platform build (docker buildx build --platform linux/arm64,...)
# compiles under emulation: slower, same result.
#
# The HTTP side (/metrics, /healthz, /readyz, /api/) listens on 0.0.0.0:15673
# inside the container so that a published port and Prometheus can reach it.
# Because the admin API can cancel messages, delayproxy refuses to start on a
# non-loopback address without a token: set DELAYPROXY_ADMIN_TOKEN or mount a
# secret and set DELAYPROXY_ADMIN_TOKEN_FILE. /metrics and the probes never
# need the token. To keep HTTP private to the container instead, set
# DELAYPROXY_HTTP_ADDR=127.0.0.1:15673 (the HEALTHCHECK still works).
#
# Configure the container through DELAYPROXY_* variables rather than flags:
# the HEALTHCHECK runs `delayproxy healthcheck`, which sees the environment
# but not the main process's flags. It probes /healthz: healthy means the
# process serves, not that RabbitMQ is reachable (/readyz says that).
#
# Shutdown waits up to DELAYPROXY_SHUTDOWN_GRACE (30s); give `docker stop`
# more than that (docker stop -t 40, compose stop_grace_period: 40s).

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
ARG GOPROXY
ARG GOSUMDB
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/delayproxy/delayproxy.Version=${VERSION}" \
      -o /out/delayproxy ./cmd/delayproxy \
 && mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/delayproxy /usr/local/bin/delayproxy
# An empty /data owned by nonroot: a new named volume copies it, so the
# store is writable without running as root.
COPY --from=build --chown=65532:65532 /out/data /data
ENV DELAYPROXY_DATA_DIR=/data \
    DELAYPROXY_LISTEN=:5673 \
    DELAYPROXY_HTTP_ADDR=0.0.0.0:15673
VOLUME /data
USER 65532:65532
EXPOSE 5673 15673
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["/usr/local/bin/delayproxy", "healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/delayproxy"]
