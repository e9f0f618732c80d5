#!/usr/bin/env bash
# The tests on a fresh machine, as root or as a user: installs what they need when it is
# missing (redis-server, redis-tools, nutcracker, protobuf-compiler, prometheus,
# prometheus-redis-exporter, node/npm, redis-redisearch, etcd-server; with sudo only when not root), the pinned client
# libraries (tests/clients/setup.sh), then runs `cargo test --workspace`.
#   tests/run.sh              install what is missing, then test
#   tests/run.sh --deps-only  install what is missing, no tests (.ci/run uses it)
# RESPWAY_TEST_SLACK=N multiplies the tests' timed upper bounds by N instead of 3 (a slower or
# busier machine; respway-testkit's timing module).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
command -v nutcracker >/dev/null || [ -x /usr/sbin/nutcracker ] || need+=(nutcracker)
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v prometheus >/dev/null || need+=(prometheus)
command -v prometheus-redis-exporter >/dev/null || need+=(prometheus-redis-exporter)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
# RediSearch 1.2, a real module whose commands respway learns from the shards (tests/learned_commands.rs).
[ -e /usr/lib/redis/modules/redisearch.so ] || need+=(redis-redisearch)
# etcd, the shared store of several respway-xds replicas (xds/tests/etcd_store.rs).
command -v etcd >/dev/null || need+=(etcd-server)
if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null; then
  SUDO=(sudo)
else
  SUDO=(none)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "${SUDO[*]}" = none ]; then
    echo "tests/run.sh: missing ${need[*]}, and not root without sudo: install them, then run again" >&2
    exit 1
  fi
  echo "== installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" apt-get install -y -qq "${need[@]}"
fi
# The Debian packages may start system services (a redis on 6379, ...); the tests use their
# own free ports, so they do not matter, but do not let them hold memory.
if [ "${SUDO[*]}" != none ] && command -v service >/dev/null; then
  for s in redis-server etcd prometheus prometheus-node-exporter prometheus-redis-exporter; do
    "${SUDO[@]}" service "$s" stop >/dev/null 2>&1 || true
  done
fi

echo "== pinned client libraries (redis-py, node-redis, ioredis) for tests/clients.rs"
tests/clients/setup.sh

[ "${1:-}" = "--deps-only" ] && exit 0
echo "== tests"
cargo test --workspace
