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
tck=$(getconf CLK_TCK)
one() { local t=$1 name=$2 pid=$3 port=$4 s0 s1 rps
  s0=$(cpu_ticks $pid)
  rps=$(redis-benchmark -p $port -t $t -n $N -P $P -c 50 -d 64 -r 100000 -q 2>/dev/null | tr '\r' '\n' | grep -oE ': [0-9.]+ requests per second' | tail -1 | awk '{print $2}')
  s1=$(cpu_ticks $pid)
  echo "$t $name $rps $s0 $s1" | awk -v t=$tck -v n=$N '{printf "%s %s %.0f %.3f\n", $1, $2, $3, ($5 - $4) / t / n * 1e6}'
}
for r in $(seq $ROUNDS); do
  for t in set get; do one $t old $old 7632; one $t new $new 7633; one $t new $new 7633; one $t old $old 7632; done
done | tee $D/out
med() { sort -n | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]}'; }
for t in set get; do for name in old new; do
  printf "%-4s %-4s %s %s\n" $t $name "$(grep "^$t $name " $D/out | awk '{print $3}' | med)" "$(grep "^$t $name " $D/out | awk '{print $4}' | med)"
done; done
