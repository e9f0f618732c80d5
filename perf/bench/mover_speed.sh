#!/usr/bin/env bash
# The background mover's speed (respway-compare --move), keys and MB per second:
#   perf/bench/mover_speed.sh VALUE_BYTES KEYS_PER_SHARD [RUNS] [MOVER FLAGS...]
# (ports 7511-7514; loopback; uses target/release/respway-compare, build it first).
# Four redis-servers, ketama 2 -> 4 shards keeping the 2 old ones (a, b -> a, b, c, d); each
# run: KEYS_PER_SHARD SETs of VALUE_BYTES-byte values on each old shard, then one mover run,
# rate limit off. Prints per run the keys moved (DBSIZE of c + d), the wall time, keys/s and
# MB/s of values moved.
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZE=${1:?VALUE_BYTES}
N=${2:?KEYS_PER_SHARD}
RUNS=${3:-3}
shift $(($# < 3 ? $# : 3))
DIR=$(mktemp -d)
PORTS=(7511 7512 7513 7514)
cleanup() {
  for p in "${PORTS[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT
for p in "${PORTS[@]}"; do
  redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --logfile "$DIR/$p.log" --dir "$DIR"
done
for p in "${PORTS[@]}"; do
  for _ in $(seq 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
shard() { printf '      - { name: %s, endpoints: [{ address: "127.0.0.1:%s" }] }\n' "$1" "$2"; }
{
  printf 'listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes: { catch_all: old }\n'
  printf 'clusters:\n  - name: old\n    hash: { policy: ketama }\n    shards:\n'
  shard a 7511; shard b 7512
  printf '  - name: new\n    hash: { policy: ketama }\n    shards:\n'
  shard a 7511; shard b 7512; shard c 7513; shard d 7514
} >"$DIR/c.yaml"
VALUE=$(head -c "$SIZE" /dev/zero | tr '\0' x)
for run in $(seq "$RUNS"); do
  for p in "${PORTS[@]}"; do redis-cli -p "$p" flushall >/dev/null; done
  redis-benchmark -p 7511 -n "$N" -r 1000000000 -P 64 -q SET "a:__rand_int__" "$VALUE" >/dev/null
  redis-benchmark -p 7512 -n "$N" -r 1000000000 -P 64 -q SET "b:__rand_int__" "$VALUE" >/dev/null
  before=$(( $(redis-cli -p 7511 dbsize) + $(redis-cli -p 7512 dbsize) ))
  start=$(date +%s.%N)
  target/release/respway-compare --config "$DIR/c.yaml" --source old --target new --move \
    --rate 100000000 --count 1000 "$@" >"$DIR/out" 2>/dev/null || true
  end=$(date +%s.%N)
  moved=$(( $(redis-cli -p 7513 dbsize) + $(redis-cli -p 7514 dbsize) ))
  awk -v k="$moved" -v b="$before" -v s="$start" -v e="$end" -v sz="$SIZE" -v out="$(cat "$DIR/out")" \
    'BEGIN { t = e - s; printf "run: %d of %d keys moved in %.2f s: %.0f keys/s, %.1f MB/s of values (%s)\n", k, b, t, k / t, k * sz / t / 1e6, out }'
done
