#!/usr/bin/env bash
# Cost of a configuration swap on the hot path: redis-benchmark GET -P 16 throughput through
# respway with no swaps vs with a reload (SIGHUP -> validate, compile, swap) every 100 ms,
# interleaved over 3 rounds. Loopback only; everything started is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p respway
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
ports=(7201 7202 7203)
for p in "${ports[@]}"; do
  redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
  pids+=($!)
done
cat > "$work/respway.yaml" <<YAML
listeners:
  - name: main
    address: 127.0.0.1:6391
    routes: { catch_all: main }
clusters:
  - name: main
    shards:
      - endpoints: [ { address: "127.0.0.1:7201" } ]
      - endpoints: [ { address: "127.0.0.1:7202" } ]
      - endpoints: [ { address: "127.0.0.1:7203" } ]
YAML
for p in "${ports[@]}"; do for _ in $(seq 50); do redis-cli -p "$p" PING >/dev/null 2>&1 && break; sleep 0.1; done; done
target/release/respway --config "$work/respway.yaml" --workers 1 2>"$work/respway.log" &
rpid=$!
pids+=($rpid)
for _ in $(seq 50); do redis-cli -p 6391 PING >/dev/null 2>&1 && break; sleep 0.1; done
bench() { redis-benchmark -p 6391 -c 50 -d 64 -r 100000 -t get -n 1000000 -P 16 -q --csv | tail -1 | cut -d, -f2 | tr -d '"'; }
echo "round,no_swaps_rps,swap_every_100ms_rps,reloads"
for round in 1 2 3; do
  quiet=$(bench)
  ( while true; do kill -HUP "$rpid"; sleep 0.1; done ) &
  hup=$!
  busy=$(bench)
  kill "$hup"; wait "$hup" 2>/dev/null || true
  reloads=$(grep -c "configuration reloaded" "$work/respway.log" || true)
  echo "$round,$quiet,$busy,$reloads"
done
grep -E "refused|ERROR" "$work/respway.log" | head -3 || true
