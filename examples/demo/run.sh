#!/usr/bin/env bash
# The demo: installs what is missing, starts three local redis-server shards (7001-7003) and
# respway (127.0.0.1:6380) over them, runs a few redis-cli commands through respway, and
# shows on which shard each key landed. Everything it starts is stopped when it exits.
#
# It needs the ports 6380 and 7001-7003 on 127.0.0.1 free (checked first). The first release
# build of respway takes about 6 minutes on a quiet 2-core machine (much longer on a loaded
# one); cargo shows its progress. RESPWAY_BIN=PATH uses that respway binary instead.
set -euo pipefail
cd "$(dirname "$0")/../.."

PORTS="6380 7001 7002 7003"
for port in $PORTS; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "demo: port $port on 127.0.0.1 is in use; the demo needs 6380 (respway) and 7001-7003 (Redis shards) free." >&2
    echo "demo: stop what listens there (see: ss -ltnp 'sport = :$port') and run it again." >&2
    exit 1
  fi
done

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "== installing redis-server and redis-tools"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "demo: redis-server is missing; install redis-server and redis-tools as root" >&2; exit 1; }
    SUDO=sudo
  fi
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools
fi
if [ -n "${RESPWAY_BIN:-}" ]; then
  respway=$RESPWAY_BIN
else
  echo "== building respway (release; the first build takes about 6 minutes on 2 cores, then seconds)"
  cargo build --release -p respway
  respway=target/release/respway
fi

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

for port in 7001 7002 7003; do
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
  pids+=($!)
done
for port in 7001 7002 7003; do
  for _ in $(seq 50); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
done
"$respway" --config examples/demo/respway.yaml --workers 2 2>"$work/respway.log" &
pids+=($!)
for _ in $(seq 50); do redis-cli -p 6380 PING >/dev/null 2>&1 && break; sleep 0.1; done
if ! redis-cli -p 6380 PING >/dev/null 2>&1; then
  echo "demo: respway did not start; its log:" >&2; cat "$work/respway.log" >&2; exit 1
fi

run() { printf '$ redis-cli -p 6380 %s\n' "$*"; redis-cli -p 6380 "$@"; }
echo "== through respway"
run SET user:1 alice
run SET user:2 bob
run SET user:3 carol
run MSET '{cart:7}:items' 3 '{cart:7}:total' 42
run MGET user:1 user:2 user:3 '{cart:7}:total'
run INCR visits
run DEL user:3 nokey
run RENAME '{cart:7}:items' '{cart:7}:count'
run RENAME user:1 user:2      # keys on different shards: refused
run KEYS '*'                  # keyspace-wide: every shard asked, keys merged
run INFO proxy | head -4
echo "== where the keys went (asked of each shard directly)"
for port in 7001 7002 7003; do
  printf 'shard on %s: %s\n' "$port" "$(redis-cli -p "$port" --no-raw KEYS '*' | tr '\n' ' ')"
done
