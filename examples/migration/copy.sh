#!/usr/bin/env bash
# Online migration between two clusters (copy mode): installs what is missing, starts two "old" shards (7021-7022), three "new"
# shards (7023-7025) and respway (127.0.0.1:6382), then walks the `user:` route through the
# migration playbook, one config edit + SIGHUP per step, showing where writes and reads land:
#   0. before: the route serves `old`, the mirror is inactive (forward);
#   1. dual_write: writes go to old (which answers) and are copied to new;
#   2. backfill old → new with respway-compare --repair (every type, with its TTL; what
#      differs is copied, verified, and copied again until it settles), then compare again;
#   3. the write pause: old as route with new as read_only mirror (writes refused), wait
#      until every copy is applied (INFO mirror), then --repair --prune finds no difference;
#   4. route on new, old as read_only mirror: reads from new, writes still refused;
#   5. route on new, dual_write to old: writes resume on new, old gets copies (rollback);
#   6. route on new, mirror forward: done, old gets nothing.
# (Move mode, for shards kept inside one deployment, is examples/migration/run.sh.)
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

OLD=(7021 7022)
NEW=(7023 7024 7025)
PROXY=6382
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

for port in "${OLD[@]}" "${NEW[@]}" "$PROXY"; do
  if redis-cli -p "$port" PING >/dev/null 2>&1; then echo "port $port is busy; stop what runs there first"; exit 1; fi
done
for port in "${OLD[@]}" "${NEW[@]}"; do
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
  pids+=($!)
done
for port in "${OLD[@]}" "${NEW[@]}"; do
  for _ in $(seq 50); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
done

# respway serves a copy of the config, which each step edits before sending SIGHUP.
config="$work/respway.yaml"
cp examples/migration/respway.yaml "$config"
# One worker, so that `INFO proxy`'s config_version tells when the reload reached it.
target/release/respway --config "$config" --workers 1 2>"$work/respway.log" &
respway=$!
pids+=($respway)
for _ in $(seq 50); do redis-cli -p "$PROXY" PING >/dev/null 2>&1 && break; sleep 0.1; done
version=1

run() { printf '$ redis-cli -p %s %s\n' "$PROXY" "$*"; redis-cli -p "$PROXY" "$@"; }
# step ROUTE_CLUSTER MIRROR: rewrites the `# route` and `# mirror` lines, reloads, waits.
step() {
  sed -i -e "s|^\( *cluster: \)[a-z]*\( *# route\)$|\1$1\2|" \
         -e "s|^\( *- \){.*}\( *# mirror\)$|\1$2\2|" "$config"
  echo "   config now: $(grep -E '# (route|mirror)$' "$config" | sed -e 's/ *#.*//' -e 's/^ *//' | paste -sd' ')"
  kill -HUP "$respway"
  version=$((version + 1))
  for _ in $(seq 50); do
    v=$(redis-cli -p "$PROXY" INFO proxy | tr -d '\r' | sed -n 's/^config_version://p')
    [ "$v" = "$version" ] && return 0
    sleep 0.1
  done
  echo "reload did not take effect; respway's log:"; cat "$work/respway.log"; exit 1
}
# Keys held by each shard of old and new (asked of the shards directly).
where() {
  sleep 0.3 # mirrored copies are asynchronous
  for port in "${OLD[@]}"; do printf '   old %s: %s\n' "$port" "$(redis-cli -p "$port" --scan | sort | paste -sd' ')"; done
  for port in "${NEW[@]}"; do printf '   new %s: %s\n' "$port" "$(redis-cli -p "$port" --scan | sort | paste -sd' ')"; done
}
resetstats() { for port in "${OLD[@]}" "${NEW[@]}"; do redis-cli -p "$port" CONFIG RESETSTAT >/dev/null; done; }
calls() { redis-cli -p "$1" INFO commandstats | tr -d '\r' | sed -n "s/^cmdstat_$2:calls=\([0-9]*\),.*/\1/p" | grep . || echo 0; }
# GET/SET calls per side since the last resetstats.
traffic() {
  sleep 0.3 # mirrored copies are asynchronous
  local port g=0 s=0
  for port in "${OLD[@]}"; do g=$((g + $(calls "$port" get))); s=$((s + $(calls "$port" set))); done
  printf '   old: GET calls=%s SET calls=%s\n' "$g" "$s"
  g=0 s=0
  for port in "${NEW[@]}"; do g=$((g + $(calls "$port" get))); s=$((s + $(calls "$port" set))); done
  printf '   new: GET calls=%s SET calls=%s\n' "$g" "$s"
}
compare() {
  printf '$ respway-compare --config %s --source old --target new\n' "$(basename "$config")"
  local rc=0
  target/release/respway-compare --config "$config" --source old --target new 2>/dev/null || rc=$?
  echo "   (exit $rc)"
}

echo "== 0. before the migration: user: → old, mirror to new inactive (forward)"
for i in 1 2 3 4 5 6; do redis-cli -p "$PROXY" SET "user:$i" "v$i" >/dev/null; done
echo "   SET user:1 .. user:6 through respway"
where

echo "== 1. dual_write: old answers, writes are copied to new"
step old '{ cluster: new, mode: dual_write }'
run SET user:1 v1-updated
run SET user:7 v7
run GET user:1
where
run INFO mirror
compare

echo "== 2. backfill old → new: respway-compare --repair copies each key that differs"
printf '$ respway-compare --config %s --source old --target new --repair\n' "$(basename "$config")"
rc=0
target/release/respway-compare --config "$config" --source old --target new --repair 2>/dev/null || rc=$?
echo "   (exit $rc)"
where
compare

echo "== 3. the write pause: old answers reads, writes are refused, the copies drain"
step old '{ cluster: new, mode: read_only }'
run SET user:2 v2-updated || true
for _ in $(seq 50); do
  # INFO mirror: every copy queued is applied or failed.
  line=$(redis-cli -p "$PROXY" INFO mirror | tr -d '\r' | grep '^mirror_new:' || true)
  m=$(sed -n 's/.*mirrored=\([0-9]*\).*/\1/p' <<<"$line")
  a=$(sed -n 's/.*applied=\([0-9]*\).*/\1/p' <<<"$line")
  f=$(sed -n 's/.*,failed=\([0-9]*\).*/\1/p' <<<"$line")
  [ -n "$m" ] && [ "$m" = $((a + f)) ] && break
  sleep 0.1
done
echo "   $line"
echo "   (every copy applied: mirrored = applied + failed; now the last pass must find no difference)"
printf '$ respway-compare --config %s --source old --target new --repair --prune\n' "$(basename "$config")"
rc=0
target/release/respway-compare --config "$config" --source old --target new --repair --prune 2>/dev/null || rc=$?
echo "   (exit $rc)"
[ "$rc" = 0 ] || { echo "the clusters still differ during the pause"; exit 1; }

echo "== 4. route on new, old as read_only mirror: reads from new, writes still refused"
step new '{ cluster: old, mode: read_only }'
resetstats
for i in 1 2 3 4 5 6 7; do redis-cli -p "$PROXY" GET "user:$i" >/dev/null; done
run GET user:2
run SET user:3 v3-updated || true
echo "   7 GETs and 1 refused SET through respway, then calls per side:"
traffic

echo "== 5. route on new, dual_write to old: writes resume on new, old gets copies (rollback)"
step new '{ cluster: old, mode: dual_write }'
resetstats
run SET user:3 v3-updated
run GET user:3
echo "   calls per side:"
traffic

echo "== 6. done: route on new, mirror forward (inactive)"
step new '{ cluster: old, mode: forward }'
resetstats
run SET user:8 v8
run GET user:8
echo "   calls per side:"
traffic
where
