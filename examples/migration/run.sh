#!/usr/bin/env bash
# Online resharding in move mode, with the guided command: installs what is missing, starts
# four redis-server shards (7021-7024), the management server respway-xds (ADS
# 127.0.0.1:18040, admin 127.0.0.1:18041) and two sidecars fed by it (sidecar-1 on
# 127.0.0.1:6393, sidecar-2 on 127.0.0.1:6394). Cluster `old` is ketama over the first two
# shards, cluster `new` over all four (the two old ones kept): growing 2 -> 4, only the keys
# whose owner changes move. Then it
#   0. writes 2,000 keys of every type through sidecar-1 (strings with a TTL, hashes, lists,
#      sets, counters);
#   1. starts a bounded INCR load through both sidecars and, meanwhile, runs
#      `respway-xds reshard start`: plan, prepare_move and move mode pushed and ACKed by both
#      sidecars, the background mover, the final placement pushed and ACKed;
#   2. checks, asking the shards directly and through the sidecars: every key readable with
#      its value and TTL, the counter equal to the INCRs acknowledged (none lost, none twice),
#      nothing left to move (`respway-compare --move --plan` moves 0), and keys on all four
#      shards.
# Exits non-zero if a check fails. Everything it starts is stopped when it exits.
# (Copy mode, between two separate clusters, is examples/migration/copy.sh.)
#
# RESPWAY_BIN, RESPWAY_XDS_BIN and RESPWAY_COMPARE_BIN name prebuilt binaries (otherwise all
# three are built, release; respway-xds runs the respway-compare found next to it).
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "== installing redis-server and redis-tools"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools
fi
if [ -z "${RESPWAY_BIN:-}" ] || [ -z "${RESPWAY_XDS_BIN:-}" ] || [ -z "${RESPWAY_COMPARE_BIN:-}" ]; then
  echo "== building respway, respway-compare and respway-xds"
  cargo build --release -q -p respway -p respway-xds
fi
RESPWAY=$(realpath "${RESPWAY_BIN:-target/release/respway}")
XDS=$(realpath "${RESPWAY_XDS_BIN:-target/release/respway-xds}")
COMPARE=$(realpath "${RESPWAY_COMPARE_BIN:-target/release/respway-compare}")

SHARDS=(7021 7022 7023 7024)
S1=6393 S2=6394
ADS=127.0.0.1:18040 ADMIN=127.0.0.1:18041
KEYS=2000
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

busy() { (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in "${SHARDS[@]}" $S1 $S2 18040 18041; do
  if busy "$port"; then echo "port $port is busy; stop what runs there first"; exit 1; fi
done
for port in "${SHARDS[@]}"; do
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
  pids+=($!)
done
for port in "${SHARDS[@]}"; do
  for _ in $(seq 50); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
done

# The resource files (the operator's copies, also written into the server's directory): the
# clusters, and one listener file per sidecar (each listens on its own port on this host).
mkdir "$work/resources"
shard() { printf '      - { name: s%s, endpoints: [{ address: "127.0.0.1:%s" }] }\n' "$1" "$2"; }
{
  echo "targets: { zones: [z1, z2] }"
  echo "clusters:"
  echo "  - name: old"
  echo "    hash: { policy: ketama }"
  echo "    shards:"
  shard 0 7021; shard 1 7022
  echo "  - name: new"
  echo "    hash: { policy: ketama }"
  echo "    shards:"
  shard 0 7021; shard 1 7022; shard 2 7023; shard 3 7024
} >"$work/clusters.yaml"
listener() { # ZONE PORT
  printf 'targets: { zones: [%s] }\nlisteners:\n  - name: main\n    address: 127.0.0.1:%s\n    op_timeout: 1s\n    routes:\n      catch_all: old\n' "$1" "$2"
}
listener z1 $S1 >"$work/zone-z1.yaml"
listener z2 $S2 >"$work/zone-z2.yaml"
cp "$work/clusters.yaml" "$work/zone-z1.yaml" "$work/zone-z2.yaml" "$work/resources/"

head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/admin-token"
export RESPWAY_XDS_ADMIN_TOKEN_FILE="$work/admin-token"
"$XDS" serve --resources "$work/resources" --listen $ADS --admin $ADMIN --poll-ms 100 2>"$work/respway-xds.log" &
pids+=($!)
for _ in $(seq 50); do busy 18041 && break; sleep 0.1; done
for n in 1 2; do
  printf 'node: { id: sidecar-%s }\nxds: { server: "http://%s" }\n' "$n" "$ADS" >"$work/bootstrap-$n.yaml"
done
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
counts() { for p in "${SHARDS[@]}"; do printf '%s:%s ' "$p" "$(redis-cli -p "$p" DBSIZE)"; done; echo; }

echo "== 0. $KEYS keys of every type through sidecar-1, on the old placement (2 shards)"
for i in $(seq 1 $((KEYS / 5))); do
  echo "SET user:$i v$i EX 3600"
  echo "HSET cart:$i item $i qty 1"
  echo "RPUSH feed:$i a b c"
  echo "SADD tags:$i x y"
  echo "INCRBY count:$i $i"
done >"$work/preload.txt"
redis-cli -p $S1 <"$work/preload.txt" >/dev/null
echo "   keys per shard: $(counts)"

echo "== 1. an INCR load through both sidecars, and meanwhile: respway-xds reshard start"
load() { # PORT OUT: INCRs until the reshard is done; prints one reply per line
  while [ ! -e "$work/done" ]; do redis-cli -p "$1" INCR hits 2>&1; done >"$2"
}
load $S1 "$work/load-1.txt" &
l1=$!
load $S2 "$work/load-2.txt" &
l2=$!
pids+=($l1 $l2)
printf '$ respway-xds reshard start --admin %s --listener main --file clusters.yaml --file zone-z1.yaml --file zone-z2.yaml --from old --to new --state reshard.json --yes\n' $ADMIN
rc=0
(cd "$work" && "$XDS" reshard start --admin $ADMIN --listener main \
  --file clusters.yaml --file zone-z1.yaml --file zone-z2.yaml \
  --from old --to new --state reshard.json --yes) 2>&1 | sed 's/^/   /' || rc=$?
touch "$work/done"
wait $l1 $l2 || true
check "respway-xds reshard exit status" "$rc" 0

echo "== 2. checks"
echo "   keys per shard: $(counts)"
acked=$(cat "$work/load-1.txt" "$work/load-2.txt" | grep -cE '^[0-9]+$' || true)
refused=$(cat "$work/load-1.txt" "$work/load-2.txt" | grep -c 'TRYAGAIN' || true)
echo "   INCR hits: $acked acknowledged, $refused refused while keys were about to move (run nowhere)"
check "hits counts every acknowledged INCR once" "$(redis-cli -p $S2 GET hits)" "$acked"
bad=0
for i in $(seq 1 $((KEYS / 5))); do
  printf 'GET user:%s\nTTL user:%s\nHGET cart:%s qty\nLLEN feed:%s\nSCARD tags:%s\nGET count:%s\n' "$i" "$i" "$i" "$i" "$i" "$i"
done >"$work/read.txt"
redis-cli -p $S2 <"$work/read.txt" >"$work/read.out"
i=0
while read -r v && read -r ttl && read -r qty && read -r llen && read -r scard && read -r cnt; do
  i=$((i + 1))
  if [ "$v" != "v$i" ] || [ "$ttl" -le 0 ] || [ "$qty" != 1 ] || [ "$llen" != 3 ] || [ "$scard" != 2 ] || [ "$cnt" != "$i" ]; then
    bad=$((bad + 1))
  fi
done <"$work/read.out"
check "every key read through sidecar-2 has its value and TTL" "$bad keys wrong of $i" "0 keys wrong of $((KEYS / 5))"
total=0
for p in "${SHARDS[@]}"; do total=$((total + $(redis-cli -p "$p" DBSIZE))); done
check "the shards hold each key once" "$total" "$((KEYS + 1))"
check "the added shards hold keys" "$([ "$(redis-cli -p 7023 DBSIZE)" -gt 0 ] && [ "$(redis-cli -p 7024 DBSIZE)" -gt 0 ] && echo yes)" yes
cat "$work/clusters.yaml" "$work/zone-z1.yaml" | grep -v '^targets' >"$work/check.yaml"
plan=$("$COMPARE" --config "$work/check.yaml" --source old --target new --move --plan 2>/dev/null | tail -1)
echo "   $ respway-compare --source old --target new --move --plan: $plan"
check "nothing is left to move" "$(sed -n 's/.*move \([0-9]*\),.*/\1/p' <<<"$plan")" 0

if [ "$failed" != 0 ]; then echo "== some checks failed"; exit 1; fi
echo "== every check passed"
