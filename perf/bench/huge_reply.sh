#!/usr/bin/env bash
# A 1,000,000-element LRANGE through respway against the same LRANGE sent to Redis directly:
#   perf/bench/huge_reply.sh "BIN..." [ROUNDS] [ELEMENTS] [WIDTH]
# One redis-server on 127.0.0.1:7511 holds list `big` of ELEMENTS (default 1,000,000)
# elements of WIDTH (default 10) bytes; each respway binary (`--workers 1`, one shard, on
# 127.0.0.1:7591) is started in turn. Per round, for each target (direct first, then every
# binary), `huge_reply.py` sends `LRANGE big 0 -1` 3 times on one connection and keeps the
# median time (request written -> last reply byte). Prints every round, then per target the
# median over the rounds, its ratio to direct, and respway's CPU seconds per LRANGE (utime +
# stime from /proc/PID/stat over the whole run of that binary, divided by its LRANGEs).
# Loopback only; everything started is stopped on exit.
set -euo pipefail
BINS=($1); ROUNDS=${2:-5}; N=${3:-1000000}; W=${4:-10}
HERE=$(cd "$(dirname "$0")" && pwd)
D=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  kill "$(cat $D/r.pid 2>/dev/null)" 2>/dev/null || true
  for i in $(seq 50); do redis-cli -p 7511 ping >/dev/null 2>&1 || break; sleep 0.1; done
  rm -rf "$D"
}
trap cleanup EXIT
redis-server --port 7511 --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
  --pidfile $D/r.pid --logfile $D/r.log
for i in $(seq 50); do redis-cli -p 7511 ping >/dev/null 2>&1 && break; sleep 0.1; done
# Load the list: ELEMENTS values of WIDTH bytes, RPUSHed in batches of 1000 by a Lua loop.
redis-cli -p 7511 eval "
  for b = 0, math.floor(($N - 1) / 1000) do
    local t = {}
    for i = b * 1000, math.min(b * 1000 + 999, $N - 1) do t[#t + 1] = string.format('%0${W}d', i) end
    redis.call('RPUSH', KEYS[1], unpack(t))
  end
  return redis.call('LLEN', KEYS[1])" 1 big >/dev/null
[ "$(redis-cli -p 7511 llen big)" = "$N" ] || { echo "list not loaded" >&2; exit 1; }
cat > $D/rw.yaml <<Y
listeners: [{ name: main, address: "127.0.0.1:7591", op_timeout: 120s, routes: { catch_all: c } }]
clusters:
  - name: c
    shards:
      - { name: s0, endpoints: [{ address: "127.0.0.1:7511" }] }
Y
TCK=$(getconf CLK_TCK)
med() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
one() { # TAG PORT -> median of 3 LRANGEs
  python3 $HERE/huge_reply.py "$1" "$2" big $N $W 3 2>>$D/crc | awk '{print $3}' | med
}
: > $D/out
declare -A CPU
for b in "${!BINS[@]}"; do CPU[$b]=0; done
for r in $(seq $ROUNDS); do
  echo "direct $r $(one direct 7511)" | tee -a $D/out
  for b in "${!BINS[@]}"; do
    ${BINS[$b]} --config $D/rw.yaml --workers 1 2>$D/rw$b.log & pid=$!; PIDS+=($pid)
    for i in $(seq 100); do redis-cli -p 7591 ping >/dev/null 2>&1 && break; sleep 0.1; done
    t0=$(awk '{print $14+$15}' /proc/$pid/stat)
    echo "bin$b $r $(one bin$b 7591)" | tee -a $D/out
    t1=$(awk '{print $14+$15}' /proc/$pid/stat)
    CPU[$b]=$((${CPU[$b]} + t1 - t0))
    kill -INT $pid; wait $pid || true; PIDS=()
  done
done
# Every target sent the same bytes.
[ "$(awk '{print $3, $5}' $D/crc | sort -u | wc -l)" = 1 ] || { echo "replies differ:" >&2; cat $D/crc >&2; exit 1; }
echo "reply: $(awk '{print "crc32", $3, $5, "bytes"}' $D/crc | sort -u)"
d=$(grep '^direct ' $D/out | awk '{print $3}' | med)
printf 'direct              median %.4f s\n' $d
for b in "${!BINS[@]}"; do
  m=$(grep "^bin$b " $D/out | awk '{print $3}' | med)
  printf 'bin%d %-40s median %.4f s  %.2fx direct  respway CPU %.4f s per LRANGE\n' $b "${BINS[$b]}" $m \
    "$(echo "$m / $d" | bc -l)" "$(echo "${CPU[$b]} / $TCK / (3 * $ROUNDS)" | bc -l)"
done
