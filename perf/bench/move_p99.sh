#!/usr/bin/env bash
# Client latency while move mode reshards, against the same load without a migration:
#   perf/bench/move_p99.sh   (ports 7411-7415; loopback; builds respway --release)
# Four redis-servers; respway (2 workers) serves, in turn:
#   before: the old cluster (2 ketama shards) alone;
#   move:   catch_all old with { cluster: new, mode: move } (new: the 2 old shards + 2 more),
#           100,000 keys preloaded on the old shards, so about half of them move on first use
#           and every command on a key whose owner changes sends a MIGRATE first (NOKEY once
#           the key moved);
#   after:  the new cluster (4 shards) alone.
# For each, redis-benchmark SET and GET over 100,000 random keys, 50 clients, -P 1 and -P 16,
# prints p50/p99 (ms) and requests per second. Each phase starts from a freshly preloaded
# keyspace.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p respway
DIR=$(mktemp -d)
PORTS=(7411 7412 7413 7414)
PROXY=7415
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
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
shard() { printf '      - name: s%s\n        endpoints: [ { address: "127.0.0.1:%s", role: primary } ]\n' "$1" "$2"; }
config() { # catch_all, mirrors
  {
    printf 'listeners:\n  - name: l\n    address: 127.0.0.1:%s\n    routes:\n      catch_all: %s\n%s' "$PROXY" "$1" "$2"
    printf 'clusters:\n  - name: old\n    hash: { policy: ketama }\n    shards:\n'
    shard 0 7411; shard 1 7412
    printf '  - name: new\n    hash: { policy: ketama }\n    shards:\n'
    shard 0 7411; shard 1 7412; shard 2 7413; shard 3 7414
  } >"$DIR/respway.yaml"
}
serve() {
  [ -n "$pid" ] && kill "$pid" && wait "$pid" 2>/dev/null || true
  target/release/respway --config "$DIR/respway.yaml" --workers 2 2>>"$DIR/respway.log" &
  pid=$!
  for _ in $(seq 50); do redis-cli -p "$PROXY" ping >/dev/null 2>&1 && break; sleep 0.1; done
}
preload() {
  for p in "${PORTS[@]}"; do redis-cli -p "$p" flushall >/dev/null; done
  config old ""
  serve
  redis-benchmark -p "$PROXY" -t set -r 100000 -n 400000 -c 50 -P 16 -q >/dev/null
}
bench() { # label
  for P in 1 16; do
    for t in set get; do
      redis-benchmark -p "$PROXY" -t "$t" -r 100000 -n $((P == 1 ? 200000 : 1000000)) -c 50 -P "$P" --csv \
        | awk -F'"' -v l="$1" -v P="$P" 'NR == 2 { printf "%-7s P=%-2s %-4s %9.0f req/s  p50 %6.3f ms  p99 %6.3f ms\n", l, P, $2, $4, $10, $14 }'
    done
  done
}
preload; bench before
preload; config old $'      catch_all_mirrors:\n        - { cluster: new, mode: move }\n'; serve; bench move
echo "keys on the 2 added shards after the move run: $(( $(redis-cli -p 7413 dbsize) + $(redis-cli -p 7414 dbsize) ))"
preload; config new ""; serve; bench after
