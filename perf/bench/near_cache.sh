#!/usr/bin/env bash
# The near cache's cost and gain, side by side over one local shard: direct redis-server,
# respway with the cache (tracked mode), respway without it, and predixy, interleaved rounds.
#   perf/bench/near_cache.sh RESPWAY_BIN PREDIXY_BIN ROUNDS N
# Ports: shard 7601, respway with the cache 7690, without 7691 (both --workers 1), predixy 7692
# (1 thread); loopback. Each run is redis-benchmark GET -c 50 -P 16 -d 64, N requests:
#   hit:  one key (-r absent): every read after the first is served by the cache;
#   miss: -r 100000000 over keys that do not exist: (almost) every read is a miss for the
#         cache (a fill whose nil is kept and never read again).
# Proxy CPU per request from /proc/PID/stat (user + system). Prints one line per run
# (cell target req/s µs-per-request), then the medians.
set -euo pipefail
RW=$1; PX=$2; ROUNDS=$3; N=$4
. "$(dirname "$0")/shards.sh"
require_free 7601 7690 7691 7692
D=$(mktemp -d)
start_shards $D 7601
shards_yaml 7690 "near_cache: { mode: tracked }" 7601 >$D/cached.yaml
shards_yaml 7691 "" 7601 >$D/plain.yaml
predixy_conf $D 7692 7601 >$D/predixy.conf
"$RW" --config $D/cached.yaml --workers 1 2>$D/cached.log & cached=$!
"$RW" --config $D/plain.yaml --workers 1 2>$D/plain.log & plain=$!
"$PX" $D/predixy.conf >$D/predixy.out 2>&1 & px=$!
trap 'kill $cached $plain $px 2>/dev/null || true; stop_shards $D 7601; rm -rf $D' EXIT
for port in 7690 7691 7692; do
  for i in $(seq 100); do redis-cli -p $port set warm 1 >/dev/null 2>&1 && break; sleep 0.1; done
done
redis-cli -p 7601 set key:__rand_int__ "$(head -c 64 /dev/zero | tr '\0' x)" >/dev/null
shard=$(cat $D/r7601.pid)
tck=$(getconf CLK_TCK)
one() { # CELL NAME PID PORT ARGS...
  local cell=$1 name=$2 pid=$3 port=$4 s0 s1 rps; shift 4
  s0=$(awk '{print $14 + $15}' /proc/$pid/stat)
  rps=$(redis-benchmark -p $port -t get -n $N -P 16 -c 50 -d 64 "$@" -q 2>/dev/null | tr '\r' '\n' | grep -o 'GET: [0-9.]*' | tail -1 | awk '{print $2}')
  s1=$(awk '{print $14 + $15}' /proc/$pid/stat)
  echo "$cell $name $rps $s0 $s1" | awk -v t=$tck -v n=$N '{printf "%s %s %.0f %.3f\n", $1, $2, $3, ($5 - $4) / t / n * 1e6}'
}
for r in $(seq $ROUNDS); do
  one hit direct $shard 7601
  one hit cached $cached 7690
  one hit plain $plain 7691
  one hit predixy $px 7692
  one miss direct $shard 7601 -r 100000000
  one miss cached $cached 7690 -r 100000000
  one miss plain $plain 7691 -r 100000000
  one miss predixy $px 7692 -r 100000000
done | tee $D/out
echo "medians: cell target req/s proxy-µs-per-request (direct: the shard's own CPU)"
med() { sort -n | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]}'; }
for cell in hit miss; do
  for name in direct cached plain predixy; do
    printf "%-5s %-8s %s %s\n" $cell $name \
      "$(grep "^$cell $name " $D/out | awk '{print $3}' | med)" \
      "$(grep "^$cell $name " $D/out | awk '{print $4}' | med)"
  done
done
redis-cli -p 7690 info nearcache | grep nearcache_
