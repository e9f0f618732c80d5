#!/usr/bin/env bash
# User and system (kernel) CPU per request of respway, predixy and nutcracker over the same 3
# local shards, interleaved: how much of each proxy's CPU is its own code and how much is the
# kernel's socket work, which every proxy pays for the same traffic.
#   perf/bench/user_system.sh RESPWAY_BIN PREDIXY_BIN ROUNDS N [P]
# Ports: shards 7501-7503, respway 7590 (--workers 1), predixy 7591 (1 thread), nutcracker
# 7592 (ketama, fnv1a_64, as respway's config here); loopback. Each run is redis-benchmark
# GET -c 50 -P P (default 16) -d 64 -r 100000, N requests, after a SET warm-up; user and
# system time come from /proc/PID/stat. Prints one line per run, then the medians in µs per
# request.
set -euo pipefail
RW=$1; PX=$2; ROUNDS=$3; N=$4; P=${5:-16}
. "$(dirname "$0")/shards.sh"
require_free 7501 7502 7503 7590 7591 7592
D=$(mktemp -d)
start_shards $D 7501 7502 7503
shards_yaml 7590 "$KETAMA" 7501 7502 7503 >$D/rw.yaml
predixy_conf $D 7591 7501 7502 7503 >$D/predixy.conf
cat >$D/nc.yml <<EOF
bench:
  listen: 127.0.0.1:7592
  hash: fnv1a_64
  distribution: ketama
  redis: true
  servers:
    - 127.0.0.1:7501:1 s0
    - 127.0.0.1:7502:1 s1
    - 127.0.0.1:7503:1 s2
EOF
"$RW" --config $D/rw.yaml --workers 1 2>$D/rw.log & rw=$!
"$PX" $D/predixy.conf >$D/predixy.out 2>&1 & px=$!
nutcracker -c $D/nc.yml -o $D/nc.log & nc=$!
trap 'kill $rw $px $nc 2>/dev/null || true; stop_shards $D 7501 7502 7503; rm -rf $D' EXIT
for port in 7590 7591 7592; do
  for i in $(seq 100); do redis-cli -p $port set warm 1 >/dev/null 2>&1 && break; sleep 0.1; done
  redis-benchmark -p $port -t set -n 200000 -P 16 -c 50 -d 64 -r 100000 -q >/dev/null 2>&1
done
tck=$(getconf CLK_TCK)
one() { # NAME PID PORT
  local s0 s1 rps
  s0=$(awk '{print $14, $15}' /proc/$2/stat)
  rps=$(redis-benchmark -p $3 -t get -n $N -P $P -c 50 -d 64 -r 100000 -q 2>/dev/null | tr '\r' '\n' | grep -o 'GET: [0-9.]*' | tail -1 | awk '{print $2}')
  s1=$(awk '{print $14, $15}' /proc/$2/stat)
  echo "$1 $rps $s0 $s1" | awk -v t=$tck -v n=$N '{printf "%s %.0f %.3f %.3f\n", $1, $2, ($5 - $3) / t / n * 1e6, ($6 - $4) / t / n * 1e6}'
}
for r in $(seq $ROUNDS); do
  one respway $rw 7590
  one predixy $px 7591
  one nutcracker $nc 7592
done | tee $D/out
echo "median µs per request (user, system, total) and req/s:"
med() { sort -n | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]}'; }
col() { grep "^$1 " $D/out | awk "{print $2}"; } # NAME AWK-EXPRESSION: one value per run
for name in respway predixy nutcracker; do
  printf "%-10s user %s  system %s  total %s  rps %s\n" $name \
    "$(col $name '$3' | med)" "$(col $name '$4' | med)" "$(col $name '$3 + $4' | med)" "$(col $name '$2' | med)"
done
