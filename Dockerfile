# syntax=docker/dockerfile:1
#
# respway and respway-xds in one small image.
#
#   docker build -t respway .
#   docker run --rm -v "$PWD/respway.yaml:/etc/respway/respway.yaml:ro" -p 9901:9901 respway
#   docker run --rm --entrypoint respway-xds respway serve --resources /etc/respway-xds \
#       --listen 0.0.0.0:18000 --admin 0.0.0.0:18001
#
# The default command reads /etc/respway/respway.yaml (mount it: the image ships no config),
# serves the admin endpoint on 0.0.0.0:9901 and logs JSON lines. A listener on 127.0.0.1 is
# reachable only inside the container's network namespace: right for a Kubernetes sidecar
# (the app shares the pod's localhost), not for `docker run -p`.
#
# tests/packaging.rs checks this file's shape (stages, USER, EXPOSE, the CMD's flags); it
# does not build it.

FROM rust:1-bookworm AS builder
# The generated protobuf code is checked in (xds/src/gen), so a release build needs no protoc;
# it is installed anyway so that the workspace's tests could also run in this stage.
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# `--locked`: exactly the versions of Cargo.lock. The cache mounts keep the registry and
# target/ between builds (BuildKit); the binaries are copied out of the cached target/.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p respway -p respway-xds \
 && mkdir -p /out \
 && cp target/release/respway target/release/respway-xds /out/

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 respway \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin respway \
 && mkdir -p /etc/respway
COPY --from=builder /out/respway /out/respway-xds /usr/local/bin/
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001
# 6380: the RESP listener of the default config; 9901: the admin endpoint (/metrics, /ready,
# /healthz). respway-xds, when run from this image, listens where its flags say (18000 and
# 18001 in the examples).
EXPOSE 6380 9901
# SIGTERM (Docker's and Kubernetes' stop signal) drains for --drain-time-s (5 s by default)
# and exits 0.
ENTRYPOINT ["respway"]
CMD ["--config", "/etc/respway/respway.yaml", "--admin", "0.0.0.0:9901", "--admin-allow-non-loopback", "--log-format", "json"]
