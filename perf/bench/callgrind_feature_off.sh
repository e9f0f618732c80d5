#!/usr/bin/env bash
# The configurations of ab_feature_off.sh under callgrind, for an instruction count per
# request that a loaded machine does not change:
#   perf/bench/callgrind_feature_off.sh BIN off|on set|get N
# Both: cluster `c` as the catch-all and a prefix route `nc:` to cluster `nc`. ON: `nc` has a
# tracked near cache, and one RESP3 client is connected with CLIENT TRACKING on and has read
# `nc:k`; OFF: no cache anywhere, no tracking client. redis-benchmark -c 10 -P 1 -d 64 -r 10000 (keys outside
# `nc:`, so on `c` in both). Prints "off|on set|get N instructions"; per request = (count at N2
# - count at N1) / (N2 - N1), which removes start-up and shutdown. Ports 7651-7654.
set -euo pipefail
BIN=$1; MODE=$2; T=$3; N=$4
. "$(dirname "$0")/shards.sh"
require_free 7651 7652 7653
D=$(mktemp -d)
start_shards $D 7651 7652
# The same routes and clusters either way; ON adds the near cache (and the tracking client).
cache=""; [ "$MODE" = on ] && cache="    near_cache: { mode: tracked }"
cat >$D/rw.yaml <<YAML
listeners:
  - name: main
    address: "127.0.0.1:7653"
    routes: { catch_all: c, prefixes: [{ prefix: "nc:", cluster: nc }] }
clusters:
  - name: c
    shards: [{ name: s0, endpoints: [{ address: "127.0.0.1:7651" }] }]
  - name: nc
$cache
    shards: [{ name: s0, endpoints: [{ address: "127.0.0.1:7652" }] }]
YAML
valgrind --tool=callgrind --callgrind-out-file=$D/cg.out "$BIN" --config $D/rw.yaml --workers 1 2>$D/vg.log & VG=$!
tracker=
trap 'kill $tracker 2>/dev/null || true; kill -INT $VG 2>/dev/null || true; stop_shards $D 7651 7652; rm -rf $D' EXIT
for i in $(seq 100); do redis-cli -p 7653 ping >/dev/null 2>&1 && break; sleep 0.2; done
if [ "$MODE" = on ]; then
  mkfifo $D/tracking
  redis-cli -3 -p 7653 <$D/tracking >$D/tracking.out 2>&1 & tracker=$!
  exec 4>$D/tracking
  printf 'CLIENT TRACKING on\nSET nc:k v\nGET nc:k\n' >&4
  for i in $(seq 100); do grep -q '^v' $D/tracking.out 2>/dev/null && break; sleep 0.2; done
  grep -q '^OK' $D/tracking.out || { echo "tracking client: $(cat $D/tracking.out)" >&2; exit 1; }
fi
redis-benchmark -p 7653 -c 10 -n $N -t $T -P 1 -d 64 -r 10000 -q >/dev/null 2>&1 || true
if [ -n "$tracker" ]; then kill -0 $tracker || { echo "the tracking client left early" >&2; exit 1; }; fi
kill -INT $VG; wait $VG || true
[ -n "${CG_KEEP:-}" ] && cp $D/cg.out "$CG_KEEP"
grep -h "^summary:" $D/cg.out | awk -v m=$MODE -v t=$T -v n=$N '{print m, t, n, $2}'
