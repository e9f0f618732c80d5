#!/usr/bin/env bash
# A feature that is off costs nothing: one respway build, two processes side by side over the
# same local shards, A/B. Both: cluster `c` (shard 7641) as the catch-all and a prefix route
# `nc:` to cluster `nc` (shard 7642). ON (port 7644): `nc` has a tracked near cache, and one
# client is connected with CLIENT TRACKING on (RESP3) and has read `nc:k`. OFF (port 7643): no
# cache anywhere, no tracking client. redis-benchmark's SET and GET (-c 50 -P P
# -d 64 -r 100000, keys outside `nc:`) go to `c` on both; interleaved rounds (off, on, on,
# off); medians of req/s and of the proxy's CPU per request (user + system, /proc), --workers 1.
#   perf/bench/ab_feature_off.sh BIN ROUNDS N [P]      (P: pipeline depth, default 16)
set -euo pipefail
BIN=$1; ROUNDS=$2; N=$3; P=${4:-16}
. "$(dirname "$0")/shards.sh"
require_free 7641 7642 7643 7644
D=$(mktemp -d)
start_shards $D 7641 7642
conf() { # LISTEN_PORT CACHE_LINE
cat <<YAML
listeners:
  - name: main
    address: "127.0.0.1:$1"
    routes:
      catch_all: c
      prefixes: [{ prefix: "nc:", cluster: nc }]
clusters:
  - name: c
    shards: [{ name: s0, endpoints: [{ address: "127.0.0.1:7641" }] }]
  - name: nc
$2
    shards: [{ name: s0, endpoints: [{ address: "127.0.0.1:7642" }] }]
YAML
}
conf 7643 "" >$D/off.yaml
conf 7644 "    near_cache: { mode: tracked }" >$D/on.yaml
"$BIN" --config $D/off.yaml --workers 1 2>$D/off.log & off=$!
"$BIN" --config $D/on.yaml --workers 1 2>$D/on.log & on=$!
mkfifo $D/tracking
trap 'kill $off $on $tracker 2>/dev/null || true; stop_shards $D 7641 7642; rm -rf $D' EXIT
for port in 7643 7644; do for i in $(seq 100); do redis-cli -p $port set warm 1 2>/dev/null | grep -q OK && break; sleep 0.1; done; done
# The tracking client: RESP3, tracking on, one read under the cached prefix, then idle
# (connected) until the script ends.
redis-cli -3 -p 7644 <$D/tracking >$D/tracking.out 2>&1 & tracker=$!
exec 4>$D/tracking
printf 'CLIENT TRACKING on\nSET nc:k v\nGET nc:k\n' >&4
for i in $(seq 50); do grep -q '^v' $D/tracking.out 2>/dev/null && break; sleep 0.1; done
grep -q '^OK' $D/tracking.out || { echo "tracking client: $(cat $D/tracking.out)" >&2; exit 1; }
for r in $(seq $ROUNDS); do
  for t in set get; do ab_one $t off $off 7643; ab_one $t on $on 7644; ab_one $t on $on 7644; ab_one $t off $off 7643; done
done | tee $D/out
kill -0 $tracker 2>/dev/null || { echo "the tracking client left early" >&2; exit 1; }
ab_medians $D/out off on
