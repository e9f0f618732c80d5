#!/usr/bin/env bash
# Zone-local reads: installs what is missing, starts a redis-server primary (7031, zone z2)
# with two replicas (7032 in z1, 7033 in z2; `--replicaof 127.0.0.1 7031`) and respway
# (127.0.0.1:6383) with `--zone z1` and `read_policy: zone_local`, then shows with
# `INFO commandstats` of each instance that
# - writes through respway go to the primary, reads to the z1 replica only;
# - with the z1 replica stopped, reads fall back to the other replica (zone_fallback:
#   any_replica), never to the primary while a replica is healthy.
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

PRIMARY=7031
LOCAL=7032   # replica in z1, the sidecar's zone
REMOTE=7033  # replica in z2
ALL=("$PRIMARY" "$LOCAL" "$REMOTE")
PROXY=6383
declare -A NAME=([$PRIMARY]="primary    z2" [$LOCAL]="replica    z1" [$REMOTE]="replica    z2")
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

for port in "${ALL[@]}" "$PROXY"; do
  if redis-cli -p "$port" PING >/dev/null 2>&1; then echo "port $port is busy; stop what runs there first"; exit 1; fi
done
declare -A PID
for port in "${ALL[@]}"; do
  replica=()
  [ "$port" != "$PRIMARY" ] && replica=(--replicaof 127.0.0.1 "$PRIMARY")
  mkdir -p "$work/$port"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work/$port" "${replica[@]}" >/dev/null &
  pids+=($!)
  PID[$port]=$!
done
for port in "$LOCAL" "$REMOTE"; do
  for _ in $(seq 100); do
    redis-cli -p "$port" INFO replication 2>/dev/null | grep -q '^master_link_status:up' && break
    sleep 0.1
  done
done
target/release/respway --config examples/zone_local/respway.yaml --zone z1 --workers 2 2>"$work/respway.log" &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$PROXY" PING >/dev/null 2>&1 && break; sleep 0.1; done

run() { printf '$ redis-cli -p %s %s\n' "$PROXY" "$*"; redis-cli -p "$PROXY" "$@"; }
calls() { redis-cli -p "$1" INFO commandstats | tr -d '\r' | sed -n "s/^cmdstat_$2:calls=\([0-9]*\),.*/\1/p" | grep . || echo 0; }
resetstats() { for port in "$@"; do redis-cli -p "$port" CONFIG RESETSTAT >/dev/null; done; }
table() {
  for port in "$@"; do
    printf '   %s %s: SET calls=%-3s GET calls=%s\n' "$port" "${NAME[$port]}" "$(calls "$port" set)" "$(calls "$port" get)"
  done
}
# Waits until both replicas have what the primary has (WAIT is not proxied).
synced() {
  local want; want=$(redis-cli -p "$PRIMARY" INFO replication | tr -d '\r' | sed -n 's/^master_repl_offset://p')
  for _ in $(seq 50); do
    local ok=1
    for port in "$@"; do
      [ "$(redis-cli -p "$port" INFO replication | tr -d '\r' | sed -n 's/^slave_repl_offset://p')" -ge "$want" ] || ok=0
    done
    [ "$ok" = 1 ] && return 0
    sleep 0.1
  done
}

resetstats "${ALL[@]}"
echo "== 10 SETs through respway (respway --zone z1)"
for i in $(seq 10); do redis-cli -p "$PROXY" SET "item:$i" "v$i" >/dev/null; done
synced "$LOCAL" "$REMOTE"
run GET item:7
echo "== 100 more GETs through respway (10 keys x 10, one connection per key)"
for i in $(seq 10); do redis-cli -p "$PROXY" -r 10 GET "item:$i" >/dev/null; done
echo "   INFO commandstats of each instance (a replica's SET calls are the replication stream):"
table "${ALL[@]}"

echo "== stopping the z1 replica ($LOCAL); 100 more GETs"
kill "${PID[$LOCAL]}"; wait "${PID[$LOCAL]}" 2>/dev/null || true
resetstats "$PRIMARY" "$REMOTE"
for i in $(seq 10); do redis-cli -p "$PROXY" -r 10 GET "item:$i"; done >"$work/replies"
echo "   error replies (reads sent before the dead connection was noticed): $(grep -c '^ERR' "$work/replies" || true)"
grep -m1 '^ERR' "$work/replies" | sed 's/^/   e.g. /' || true
table "$PRIMARY" "$REMOTE"
