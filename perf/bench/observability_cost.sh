#!/usr/bin/env bash
# Throughput and proxy CPU per request of two respway builds, interleaved, over 3 local shards:
#   perf/bench/observability_cost.sh BIN_A BIN_B [ROUNDS] [REQUESTS] [-- EXTRA ARGS FOR B]
# Each round runs redis-benchmark GET -P 16 (P=1 sets another depth; T=set|mset|mget another
# command, mget = MGET of 10 keys) -c 50 -d 64 -r 100000 against A and B
# (respway --workers 1; ports 7401-7403, 7490; loopback), and prints rps and respway's
# user+system CPU seconds per million requests and its user part alone (from /proc/PID/stat),
# then the medians and paired ratios. User time is what a change to respway's own code moves;
# kernel time also moves with how requests batch into writes, which varies more.
# PIN=1 puts respway on CPU 0 and the shards and redis-benchmark on CPU 1 (taskset), so the
# two builds do not share a core with the load they serve: steadier CPU-per-request figures.
set -euo pipefail
A=$1; B=$2; ROUNDS=${3:-5}; N=${4:-2000000}; shift 4 || true
[ "${1:-}" = "--" ] && shift
EXTRA_B=("$@")
. "$(dirname "$0")/shards.sh"
require_free 7401 7402 7403 7490
D=$(mktemp -d)
RW_PIN=(); LOAD_PIN=()
if [ "${PIN:-0}" = 1 ]; then RW_PIN=(taskset -c 0); LOAD_PIN=(taskset -c 1); fi
SHARD_WRAP="${LOAD_PIN[*]}" start_shards $D 7401 7402 7403
shards_yaml 7490 "$KETAMA" 7401 7402 7403 >$D/rw.yaml
run() { # BIN TAG ARGS...
  local bin=$1 tag=$2; shift 2
  "${RW_PIN[@]}" $bin --config $D/rw.yaml --workers 1 "$@" 2>$D/$tag.log & local pid=$!
  for i in $(seq 100); do redis-cli -p 7490 ping >/dev/null 2>&1 && break; sleep 0.1; done
  "${LOAD_PIN[@]}" redis-benchmark -p 7490 -t set -n 200000 -P 16 -c 50 -d 64 -r 100000 -q >/dev/null 2>&1
  local t0 u0; t0=$(cpu_ticks $pid); u0=$(user_ticks $pid)
  local rps; rps=$("${LOAD_PIN[@]}" redis-benchmark -p 7490 -n $N -P ${P:-16} -c 50 -d 64 -r 100000 -q $(bench_args ${T:-get}) 2>/dev/null | tr '\r' '\n' | grep -o ': [0-9.]* requests per second' | tail -1 | awk '{print $2}')
  local t1 u1; t1=$(cpu_ticks $pid); u1=$(user_ticks $pid)
  kill -INT $pid; wait $pid || true
  echo "$tag $rps $(cpu_per_million $t0 $t1 $N) $(cpu_per_million $u0 $u1 $N)"
}
# Rounds alternate which build runs first (A B, then B A, ...): the second run of a round
# was measured ~1.7% dearer in CPU per request whichever build it was (60 + 60 rounds of
# off/on and on/off), so a fixed order would add that to the difference.
for r in $(seq $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then
    run $A A
    run $B B "${EXTRA_B[@]}"
  else
    run $B B "${EXTRA_B[@]}"
    run $A A
  fi
done | tee $D/out
stop_shards $D 7401 7402 7403
for t in A B; do
  grep "^$t " $D/out | awk '{print $2}' | sort -n | awk '{a[NR]=$1} END {printf "'$t' median rps %.0f  ", a[int((NR+1)/2)]}'
  grep "^$t " $D/out | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {printf "median CPU-s per 1M requests %.3f  ", a[int((NR+1)/2)]}'
  grep "^$t " $D/out | awk '{print $4}' | sort -n | awk '{a[NR]=$1} END {printf "(user %.3f)\n", a[int((NR+1)/2)]}'
done
# Paired ratios B/A per round (the r-th A with the r-th B): mean ± standard error.
awk '$1 == "A" {ra[++na] = $2; ca[na] = $3; ua[na] = $4} $1 == "B" {rb[++nb] = $2; cb[nb] = $3; ub[nb] = $4}
  END {
    n = (na < nb) ? na : nb
    for (i = 1; i <= n; i++) { x = rb[i] / ra[i]; y = cb[i] / ca[i]; z = ub[i] / ua[i]; sx += x; sxx += x * x; sy += y; syy += y * y; sz += z; szz += z * z }
    mx = sx / n; my = sy / n; mz = sz / n
    ex = sqrt((sxx / n - mx * mx) * n / (n - 1) / n); ey = sqrt((syy / n - my * my) * n / (n - 1) / n); ez = sqrt((szz / n - mz * mz) * n / (n - 1) / n)
    printf "paired B/A over %d rounds: throughput %.4f ± %.4f, CPU per request %.4f ± %.4f, user CPU per request %.4f ± %.4f (mean ± standard error)\n", n, mx, ex, my, ey, mz, ez
  }' $D/out
rm -rf $D
