#!/usr/bin/env bash
# Throughput and respway CPU per request by worker count, over 3 local shards:
#   perf/bench/workers.sh BIN [ROUNDS] [REQUESTS] [WORKER COUNTS...]   (default: 3 1000000 1 2)
# Each round runs redis-benchmark GET at -P 1 and -P 16 (-c 50 -d 64 -r 100000) against
# respway --workers N for each N in turn (ports 7501-7503, 7590; loopback), and prints rps and
# respway's user+system CPU seconds per million requests (from /proc/PID/stat), then medians.
set -euo pipefail
BIN=$1; ROUNDS=${2:-3}; N=${3:-1000000}; shift 3 || true
COUNTS=("$@"); [ ${#COUNTS[@]} -gt 0 ] || COUNTS=(1 2)
. "$(dirname "$0")/shards.sh"
D=$(mktemp -d)
start_shards $D 7501 7502 7503
shards_yaml 7590 "$KETAMA" 7501 7502 7503 >$D/rw.yaml
for r in $(seq $ROUNDS); do
  for w in "${COUNTS[@]}"; do
    $BIN --config $D/rw.yaml --workers $w 2>$D/rw.log & pid=$!
    for i in $(seq 100); do redis-cli -p 7590 ping >/dev/null 2>&1 && break; sleep 0.1; done
    redis-benchmark -p 7590 -t set -n 200000 -P 16 -c 50 -d 64 -r 100000 -q >/dev/null 2>&1
    for P in 1 16; do
      n=$N; [ $P = 1 ] && n=$((N / 4))
      t0=$(cpu_ticks $pid)
      rps=$(redis-benchmark -p 7590 -t get -n $n -P $P -c 50 -d 64 -r 100000 -q 2>/dev/null | tr '\r' '\n' | grep -o 'GET: [0-9.]* requests per second' | tail -1 | awk '{print $2}')
      t1=$(cpu_ticks $pid)
      echo "w$w P$P $rps $(cpu_per_million $t0 $t1 $n)"
    done
    kill -INT $pid; wait $pid || true
  done
done | tee $D/out
stop_shards $D 7501 7502 7503
for w in "${COUNTS[@]}"; do for P in 1 16; do
  grep "^w$w P$P " $D/out | awk '{print $3}' | sort -n | awk -v t="w$w P$P" '{a[NR]=$1} END {printf "%s median rps %.0f  ", t, a[int((NR+1)/2)]}'
  grep "^w$w P$P " $D/out | awk '{print $4}' | sort -n | awk '{a[NR]=$1} END {printf "median CPU-s per 1M %.3f\n", a[int((NR+1)/2)]}'
done; done
rm -rf $D
