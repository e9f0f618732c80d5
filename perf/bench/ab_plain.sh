#!/usr/bin/env bash
# Two respway builds over one local shard, A/B: SET and GET -c 50 -P P -d 64 -r 100000, N
# requests per run, interleaved rounds (old, new, new, old); medians of req/s and of the proxy's
# CPU per request (user + system, /proc). Ports: shard 7631, OLD 7632, NEW 7633 (--workers 1).
#   perf/bench/ab_plain.sh OLD_BIN NEW_BIN ROUNDS N [P]      (P: pipeline depth, default 16)
set -euo pipefail
OLD=$1; NEW=$2; ROUNDS=$3; N=$4; P=${5:-16}
. "$(dirname "$0")/shards.sh"
require_free 7631 7632 7633
D=$(mktemp -d)
start_shards $D 7631
shards_yaml 7632 "" 7631 >$D/old.yaml
shards_yaml 7633 "" 7631 >$D/new.yaml
"$OLD" --config $D/old.yaml --workers 1 2>$D/old.log & old=$!
"$NEW" --config $D/new.yaml --workers 1 2>$D/new.log & new=$!
trap 'kill $old $new 2>/dev/null || true; stop_shards $D 7631; rm -rf $D' EXIT
for port in 7632 7633; do for i in $(seq 100); do redis-cli -p $port set warm 1 2>/dev/null | grep -q OK && break; sleep 0.1; done; done
for r in $(seq $ROUNDS); do
  for t in set get; do ab_one $t old $old 7632; ab_one $t new $new 7633; ab_one $t new $new 7633; ab_one $t old $old 7632; done
done | tee $D/out
ab_medians $D/out old new
