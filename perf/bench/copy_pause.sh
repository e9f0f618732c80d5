#!/usr/bin/env bash
# Copy mode's write pause with `respway-xds reshard --copy`, against the keyspace's size:
#   perf/bench/copy_pause.sh KEYS [WRITES_PER_SEC] [VALUE_BYTES]
# (ports 7521-7524, 7531-7532, 7541-7546; loopback; release builds: run
#  `cargo build --release -p respway -p respway-xds -p respway-perf` first).
# Four redis-servers: cluster `old` (a, b) and cluster `new` (c, d), ketama. KEYS keys of
# VALUE_BYTES bytes (default 16) are made on old's shards (DEBUG POPULATE, half on each, named a:N and b:N), a
# management server (respway-xds serve) feeds two sidecars (2 workers, admin endpoints), and
# respway-perf writes WRITES_PER_SEC SETs per second (default 1000, open loop, uniform over
# KEYS keys) through the first sidecar for the whole run. Then one `reshard start --copy
# --yes` moves the catch-all from old to new. Prints the command's phase lines, its catch-up
# rounds and the write pause it measured (from the pause's push to every sidecar's ACK of the
# resumed writes), the total time, and the load's refused writes.
set -euo pipefail
cd "$(dirname "$0")/../.."
KEYS=${1:?KEYS}
RATE=${2:-1000}
SIZE=${3:-16}
BIN=target/release
DIR=$(mktemp -d)
PORTS=(7521 7522 7523 7524)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for p in "${PORTS[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT
for p in "${PORTS[@]}"; do
  redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --enable-debug-command local --logfile "$DIR/$p.log" --dir "$DIR"
done
for p in "${PORTS[@]}"; do
  for _ in $(seq 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
half=$((KEYS / 2))
redis-cli -p 7521 debug populate "$half" a "$SIZE" >/dev/null
redis-cli -p 7522 debug populate "$((KEYS - half))" b "$SIZE" >/dev/null
echo "keys on old: $(( $(redis-cli -p 7521 dbsize) + $(redis-cli -p 7522 dbsize) ))"
shard() { printf '      - { name: %s, endpoints: [{ address: "127.0.0.1:%s" }] }\n' "$1" "$2"; }
mkdir -p "$DIR/res"
{
  printf 'clusters:\n  - name: old\n    hash: { policy: ketama }\n    shards:\n'
  shard a 7521; shard b 7522
  printf '  - name: new\n    hash: { policy: ketama }\n    shards:\n'
  shard c 7523; shard d 7524
} >"$DIR/clusters.yaml"
for i in 1 2; do
  printf 'targets: { zones: [z%s] }\nlisteners:\n  - name: main\n    address: 127.0.0.1:753%s\n    routes: { catch_all: old }\n' \
    "$i" "$i" >"$DIR/zone-z$i.yaml"
  printf 'node: { id: sidecar-%s, zone: z%s }\nxds: { server: "http://127.0.0.1:7541" }\n' \
    "$i" "$i" >"$DIR/boot-$i.yaml"
done
cp "$DIR"/clusters.yaml "$DIR"/zone-z*.yaml "$DIR/res/"
head -c 24 /dev/urandom | base64 >"$DIR/token"
export RESPWAY_XDS_ADMIN_TOKEN_FILE="$DIR/token"
$BIN/respway-xds serve --resources "$DIR/res" --listen 127.0.0.1:7541 --admin 127.0.0.1:7542 \
  --poll-ms 50 >"$DIR/xds.log" 2>&1 &
PIDS+=($!)
for i in 1 2; do
  RUST_LOG=warn $BIN/respway --bootstrap "$DIR/boot-$i.yaml" --workers 2 \
    --admin "127.0.0.1:754$((i + 2))" >"$DIR/sidecar-$i.log" 2>&1 &
  PIDS+=($!)
done
for p in 7531 7532; do
  for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
$BIN/respway-perf run -t 127.0.0.1:7531 --mode open --rate "$RATE" --commands set=1 \
  --keyspace "$KEYS" --key-prefix w: --value-size "$SIZE" -d 3600s -n 100000000 \
  >"$DIR/load.log" 2>&1 &
LOAD=$!
PIDS+=($LOAD)
sleep 2
start=$(date +%s.%N)
$BIN/respway-xds reshard start --copy --yes --admin 127.0.0.1:7542 --listener main \
  --file "$DIR/clusters.yaml" --file "$DIR/zone-z1.yaml" --file "$DIR/zone-z2.yaml" \
  --from old --to new --state "$DIR/state.json" >"$DIR/reshard.out" 2>"$DIR/reshard.err" || {
  cat "$DIR/reshard.out" "$DIR/reshard.err"; exit 1; }
end=$(date +%s.%N)
grep -E '^(phase|every sidecar.s copies|checking|write pause|done|backfill: scanned|cleanup: cleanup)' "$DIR/reshard.out"
awk -v s="$start" -v e="$end" 'BEGIN { printf "reshard --copy: %.1f s in all\n", e - s }'
kill -INT "$LOAD" 2>/dev/null || true
sleep 1
echo "keys on old: $(( $(redis-cli -p 7521 dbsize) + $(redis-cli -p 7522 dbsize) )), on new: $(( $(redis-cli -p 7523 dbsize) + $(redis-cli -p 7524 dbsize) ))"
grep -iE 'errors|refused|requests' "$DIR/load.log" | head -5 || true
