#!/usr/bin/env bash
# xDS: installs what is missing, starts three local redis-server shards (clusters a: 7031,
# b: 7032, shadow: 7033), the management server respway-xds (ADS 127.0.0.1:18030, admin
# 127.0.0.1:18031) over a resource directory, and two sidecars fed only by it: sidecar-1
# (--zone z1, 127.0.0.1:6391) and sidecar-2 (--zone z2, 127.0.0.1:6392). Then, with
# `respway-xds apply`, it
#   0. routes `user:` to cluster a, and shows a write through one sidecar read through the other;
#   1. moves the `user:` route to cluster b;
#   2. turns on a dual_write mirror of `user:` to cluster shadow;
#   3. turns the mirror off again;
# and after each step writes through both sidecars and checks with redis-cli, asking each shard
# directly, that the change reached both. Ends with `respway-xds status` (what each sidecar
# ACKed). Exits non-zero if a check fails. Everything it starts is stopped when it exits.
#
# RESPWAY_BIN and RESPWAY_XDS_BIN name prebuilt binaries (otherwise both are built, release).
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "== installing redis-server and redis-tools"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools
fi
if [ -z "${RESPWAY_BIN:-}" ] || [ -z "${RESPWAY_XDS_BIN:-}" ]; then
  echo "== building respway and respway-xds"
  cargo build --release -q -p respway -p respway-xds
fi
RESPWAY=${RESPWAY_BIN:-target/release/respway}
XDS=${RESPWAY_XDS_BIN:-target/release/respway-xds}

A=7031 B=7032 SHADOW=7033
S1=6391 S2=6392
ADS=127.0.0.1:18030 ADMIN=127.0.0.1:18031
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

busy() { (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in $A $B $SHADOW $S1 $S2 18030 18031; do
  if busy "$port"; then echo "port $port is busy; stop what runs there first"; exit 1; fi
done
for port in $A $B $SHADOW; do
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
  pids+=($!)
done
for port in $A $B $SHADOW; do
  for _ in $(seq 50); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
done

# The resource directory: the clusters for the sidecars of zones z1 and z2, and one listener
# file per zone (so per sidecar here: each listens on its own port, both on this one host).
mkdir "$work/resources"
cat >"$work/resources/clusters.yaml" <<YAML
targets: { zones: [z1, z2] }
clusters:
  - name: a
    shards: [{ endpoints: [{ address: 127.0.0.1:$A }] }]
  - name: b
    shards: [{ endpoints: [{ address: 127.0.0.1:$B }] }]
  - name: shadow
    shards: [{ endpoints: [{ address: 127.0.0.1:$SHADOW }] }]
YAML
# listener ZONE PORT ROUTE MIRRORS: the listener file of zone ZONE, `user:` routed to ROUTE.
listener() {
  cat <<YAML
targets: { zones: [$1] }
listeners:
  - name: main
    address: 127.0.0.1:$2
    op_timeout: 1s
    routes:
      catch_all: a
      prefixes:
        - { prefix: "user:", cluster: $3, mirrors: $4 }
YAML
}
listener z1 $S1 a '[]' >"$work/resources/zone-z1.yaml"
listener z2 $S2 a '[]' >"$work/resources/zone-z2.yaml"

# `apply` needs the admin token the server was started with (a file, readable by the operator).
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/admin-token"
export RESPWAY_XDS_ADMIN_TOKEN_FILE="$work/admin-token"
"$XDS" serve --resources "$work/resources" --listen $ADS --admin $ADMIN --poll-ms 100 2>"$work/respway-xds.log" &
pids+=($!)
for _ in $(seq 50); do busy 18031 && break; sleep 0.1; done

# The sidecars: a bootstrap naming the node and the server, no static resources (each waits
# for its first configuration before it listens); --zone is the zone they tell the server,
# which picks their files.
for n in 1 2; do
  printf 'node: { id: sidecar-%s }\nxds: { server: "http://%s" }\n' "$n" "$ADS" >"$work/bootstrap-$n.yaml"
done
# One worker each, so that `INFO proxy`'s config_version tells when a change reached it.
"$RESPWAY" --bootstrap "$work/bootstrap-1.yaml" --zone z1 --workers 1 2>"$work/sidecar-1.log" &
pids+=($!)
"$RESPWAY" --bootstrap "$work/bootstrap-2.yaml" --zone z2 --workers 1 2>"$work/sidecar-2.log" &
pids+=($!)
for port in $S1 $S2; do
  for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
  if ! redis-cli -p "$port" PING >/dev/null 2>&1; then
    echo "a sidecar did not start; logs:"; cat "$work"/*.log; exit 1
  fi
done

failed=0
check() { # DESCRIPTION ACTUAL EXPECTED
  if [ "$2" = "$3" ]; then echo "   ok: $1"; else echo "   FAIL: $1: got '$2', expected '$3'"; failed=1; fi
}
version() { redis-cli -p "$1" INFO proxy | tr -d '\r' | sed -n 's/^config_version://p'; }
# step ROUTE MIRRORS: applies both listener files through respway-xds, waits for both sidecars.
step() {
  local v1 v2
  v1=$(version $S1) v2=$(version $S2)
  for n in 1 2; do
    local port=$S1; [ "$n" = 2 ] && port=$S2
    listener "z$n" "$port" "$1" "$2" >"$work/zone-z$n.yaml"
    printf '$ respway-xds apply zone-z%s.yaml   # user: -> %s, mirrors: %s\n' "$n" "$1" "$2"
    "$XDS" apply "$work/zone-z$n.yaml" --admin $ADMIN | sed 's/^/   /'
  done
  for _ in $(seq 100); do
    [ "$(version $S1)" -gt "$v1" ] && [ "$(version $S2)" -gt "$v2" ] && return 0
    sleep 0.1
  done
  echo "the change did not reach both sidecars; logs:"; cat "$work"/*.log; exit 1
}
# on PORT KEY: the key's value on shard PORT, asked directly ("" when absent), waiting up to
# 2 s for it to appear (mirrored copies are asynchronous).
on() {
  local v=""
  for _ in $(seq 20); do
    v=$(redis-cli -p "$1" --raw GET "$2")
    [ -n "$v" ] && break
    sleep 0.1
  done
  printf '%s' "$v"
}
run() { local port=$1; shift; printf '$ redis-cli -p %s %s\n' "$port" "$*"; redis-cli -p "$port" "$@" | sed 's/^/   /'; }

echo "== 0. user: -> a on both sidecars (configured by respway-xds only)"
run $S1 SET user:1 one
run $S2 GET user:1
check "user:1 written through sidecar-1 is on shard a" "$(on $A user:1)" one
check "and read through sidecar-2" "$(redis-cli -p $S2 --raw GET user:1)" one

echo "== 1. route change: user: -> b"
step b '[]'
run $S1 SET user:2 two
run $S2 SET user:3 three
check "user:2 (sidecar-1) is on shard b" "$(on $B user:2)" two
check "user:3 (sidecar-2) is on shard b" "$(on $B user:3)" three
check "neither is on shard a" "$(redis-cli -p $A EXISTS user:2 user:3)" 0

echo "== 2. mirror on: user: -> b, dual_write copies to shadow"
step b '[{ cluster: shadow, mode: dual_write }]'
run $S1 SET user:4 four
run $S2 SET user:5 five
check "user:4 (sidecar-1) is on shard b" "$(on $B user:4)" four
check "and copied to shadow" "$(on $SHADOW user:4)" four
check "user:5 (sidecar-2) is on shard b" "$(on $B user:5)" five
check "and copied to shadow" "$(on $SHADOW user:5)" five

echo "== 3. mirror off: user: -> b alone"
step b '[]'
run $S1 SET user:6 six
run $S2 SET user:7 seven
check "user:6 (sidecar-1) is on shard b" "$(on $B user:6)" six
check "user:7 (sidecar-2) is on shard b" "$(on $B user:7)" seven
sleep 0.3 # a copy, were there one, would have landed by now
check "neither is copied to shadow" "$(redis-cli -p $SHADOW EXISTS user:6 user:7)" 0

echo "== respway-xds status"
"$XDS" status --admin $ADMIN

if [ "$failed" != 0 ]; then echo "== some checks failed"; exit 1; fi
echo "== every check passed"
