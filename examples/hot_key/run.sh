#!/usr/bin/env bash
# Hot keys: installs what is missing, starts four local redis-server shards (7011-7014) and
# respway (127.0.0.1:6381) with a hot-key rule for the prefix HIGH_FREQ_, then shows that
# - a write of HIGH_FREQ_menu through respway lands on every shard (asked of each directly),
#   while an ordinary key lands on one;
# - 100 reads of HIGH_FREQ_menu through respway are spread over the four shards
#   (INFO commandstats of each shard), while 100 reads of an ordinary key all hit one shard;
# - respway counts both (INFO hotkeys).
# Everything it starts is stopped when it exits.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "== installing redis-server and redis-tools"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools
fi
echo "== building respway"
cargo build --release -q -p respway

SHARDS=(7011 7012 7013 7014)
PROXY=6381
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

for port in "${SHARDS[@]}" "$PROXY"; do
  if redis-cli -p "$port" PING >/dev/null 2>&1; then echo "port $port is busy; stop what runs there first"; exit 1; fi
done
for port in "${SHARDS[@]}"; do
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
  pids+=($!)
done
for port in "${SHARDS[@]}"; do
  for _ in $(seq 50); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
done
target/release/respway --config examples/hot_key/respway.yaml --workers 2 2>"$work/respway.log" &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$PROXY" PING >/dev/null 2>&1 && break; sleep 0.1; done

run() { printf '$ redis-cli -p %s %s\n' "$PROXY" "$*"; redis-cli -p "$PROXY" "$@"; }
# `cmdstat_get:calls=N,...` of one shard, as just the number.
gets() { redis-cli -p "$1" INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_get:calls=\([0-9]*\),.*/\1/p' | grep . || echo 0; }
resetstats() { for port in "${SHARDS[@]}"; do redis-cli -p "$port" CONFIG RESETSTAT >/dev/null; done; }

echo "== writes through respway"
run SET HIGH_FREQ_menu "soup,salad,pie"
run SET user:42 alice
echo "== where they landed (GET asked of each shard directly)"
for port in "${SHARDS[@]}"; do
  printf 'shard %s: HIGH_FREQ_menu=%-16s user:42=%s\n' "$port" \
    "$(redis-cli -p "$port" --no-raw GET HIGH_FREQ_menu)" "$(redis-cli -p "$port" --no-raw GET user:42)"
done

echo "== 100 GET HIGH_FREQ_menu through respway (one client connection), then GET calls per shard"
resetstats
redis-cli -p "$PROXY" -r 100 GET HIGH_FREQ_menu >/dev/null
for port in "${SHARDS[@]}"; do printf 'shard %s: cmdstat_get calls=%s\n' "$port" "$(gets "$port")"; done

echo "== 100 GET HIGH_FREQ_menu over 100 separate connections (each starts its rotation at a random shard)"
resetstats
for _ in $(seq 100); do redis-cli -p "$PROXY" GET HIGH_FREQ_menu >/dev/null; done
for port in "${SHARDS[@]}"; do printf 'shard %s: cmdstat_get calls=%s\n' "$port" "$(gets "$port")"; done

echo "== for contrast: 100 GET user:42 (an ordinary key) through respway"
resetstats
redis-cli -p "$PROXY" -r 100 GET user:42 >/dev/null
for port in "${SHARDS[@]}"; do printf 'shard %s: cmdstat_get calls=%s\n' "$port" "$(gets "$port")"; done

echo "== respway's own counters"
run INFO hotkeys
