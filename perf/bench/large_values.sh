#!/usr/bin/env bash
# SET/GET of large values through respway (1 shard and 3 shards) against Redis directly, and
# against predixy and nutcracker in front of the same shards when their binaries are given:
#   perf/bench/large_values.sh "BIN..." [ROUNDS] [SIZES]
#   PREDIXY=/path/to/predixy NUTCRACKER=nutcracker perf/bench/large_values.sh ...
# SIZES defaults to "4096 65536 1048576". Per round, size and target (direct first), one
#   redis-benchmark -p PORT -t set,get -d SIZE -n N -c 50 -P 1 -r 1000 -q
# with N = 100000 (4 KiB), 20000 (64 KiB), 2000 (1 MiB) (scaled for other sizes), and the
# proxy's utime+stime from /proc/PID/stat over the run. Prints each run, then per size and
# target the median SET and GET rps, their ratio to direct, and the proxy's CPU µs per request
# and per MiB of values moved. Proxies run with one worker thread each.
# Ports (loopback only): shards 7521-7523, respway 7591 (1 shard) / 7592 (3 shards) (one
# binary at a time), predixy 7593 / 7594, nutcracker 7595 / 7596. Everything started here is
# stopped on exit.
set -euo pipefail
BINS=($1); ROUNDS=${2:-3}; SIZES=${3:-"4096 65536 1048576"}
PREDIXY=${PREDIXY:-}; NUTCRACKER=${NUTCRACKER:-}
D=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  [ -s $D/nc1.pid ] && kill "$(cat $D/nc1.pid)" 2>/dev/null || true
  [ -s $D/nc3.pid ] && kill "$(cat $D/nc3.pid)" 2>/dev/null || true
  for p in 7521 7522 7523; do kill "$(cat $D/r$p.pid 2>/dev/null)" 2>/dev/null || true; done
  for p in 7521 7522 7523; do for i in $(seq 50); do redis-cli -p $p ping >/dev/null 2>&1 || break; sleep 0.1; done; done
  rm -rf "$D"
}
trap cleanup EXIT
for p in 7521 7522 7523; do
  redis-server --port $p --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --pidfile $D/r$p.pid --logfile $D/r$p.log
done
for p in 7521 7522 7523; do for i in $(seq 50); do redis-cli -p $p ping >/dev/null 2>&1 && break; sleep 0.1; done; done
for n in 1 3; do
  port=$((7590 + (n + 1) / 2))
  {
    echo "listeners: [{ name: main, address: \"127.0.0.1:$port\", routes: { catch_all: c } }]"
    echo "clusters:"
    echo "  - name: c"
    echo "    hash: { policy: ketama, key_hash: fnv1a_64 }"
    echo "    shards:"
    for s in $(seq 0 $((n - 1))); do echo "      - { name: s$s, endpoints: [{ address: \"127.0.0.1:$((7521 + s))\" }] }"; done
  } > $D/rw$n.yaml
  {
    printf 'Bind 127.0.0.1:%s\nWorkerThreads 1\nClientTimeout 0\nLog %s/predixy%s.log\n' $((7592 + (n + 1) / 2)) $D $n
    printf 'LogVerbSample 0\nLogDebugSample 0\nLogInfoSample 0\nLogNoticeSample 0\nLogWarnSample 1\nLogErrorSample 1\n'
    printf 'Authority {\n    Auth {\n        Mode write\n    }\n}\n'
    printf 'StandaloneServerPool {\n    Hash crc16\n    Distribution modula\n    MasterReadPriority 100\n'
    printf '    StaticSlaveReadPriority 0\n    DynamicSlaveReadPriority 0\n    RefreshMethod fixed\n'
    printf '    ServerTimeout 2\n    ServerFailureLimit 10\n    ServerRetryTimeout 1\n'
    for s in $(seq 0 $((n - 1))); do printf '    Group g%s {\n        + 127.0.0.1:%s\n    }\n' $s $((7521 + s)); done
    echo "}"
  } > $D/predixy$n.conf
  {
    printf 'p:\n  listen: 127.0.0.1:%s\n  hash: fnv1a_64\n  distribution: ketama\n  redis: true\n' $((7594 + (n + 1) / 2))
    printf '  preconnect: true\n  server_connections: 1\n  timeout: 10000\n  servers:\n'
    for s in $(seq 0 $((n - 1))); do printf '   - 127.0.0.1:%s:1 s%s\n' $((7521 + s)) $s; done
  } > $D/nc$n.yml
done
TCK=$(getconf CLK_TCK)
wait_port() { for i in $(seq 100); do redis-cli -p $1 ping >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "port $1 not serving" >&2; exit 1; }
requests() { case $1 in 4096) echo 100000 ;; 65536) echo 20000 ;; 1048576) echo 2000 ;; *) echo $((400000000 / $1 < 1000 ? 1000 : 400000000 / $1)) ;; esac; }
bench() { # TAG PORT SIZE PID(or -) -> "TAG SIZE set_rps get_rps cpu_ticks"
  local tag=$1 port=$2 size=$3 pid=$4 n t0=0 t1=0 out
  n=$(requests $size)
  redis-cli -p 7521 flushall >/dev/null; redis-cli -p 7522 flushall >/dev/null; redis-cli -p 7523 flushall >/dev/null
  [ "$pid" != - ] && t0=$(awk '{print $14+$15}' /proc/$pid/stat)
  out=$(redis-benchmark -p $port -t set,get -d $size -n $n -c 50 -P 1 -r 1000 -q 2>/dev/null | tr '\r' '\n')
  [ "$pid" != - ] && t1=$(awk '{print $14+$15}' /proc/$pid/stat)
  echo "$tag $size $(echo "$out" | grep -o 'SET: [0-9.]*' | tail -1 | awk '{print $2}') $(echo "$out" | grep -o 'GET: [0-9.]*' | tail -1 | awk '{print $2}') $((t1 - t0)) $n"
}
for r in $(seq $ROUNDS); do
  for size in $SIZES; do
    bench direct 7521 $size - | tee -a $D/out
    for n in 1 3; do
      for b in "${!BINS[@]}"; do
        ${BINS[$b]} --config $D/rw$n.yaml --workers 1 2>$D/rw.log & pid=$!; PIDS=($pid)
        wait_port $((7590 + (n + 1) / 2))
        bench "bin$b/$n" $((7590 + (n + 1) / 2)) $size $pid | tee -a $D/out
        kill -INT $pid; wait $pid || true; PIDS=()
      done
      if [ -n "$PREDIXY" ]; then
        setsid "$PREDIXY" $D/predixy$n.conf >$D/predixy.out 2>&1 </dev/null & pid=$!; PIDS=($pid)
        wait_port $((7592 + (n + 1) / 2))
        bench "predixy/$n" $((7592 + (n + 1) / 2)) $size $pid | tee -a $D/out
        kill $pid; wait $pid 2>/dev/null || true; PIDS=()
      fi
      if [ -n "$NUTCRACKER" ]; then
        $NUTCRACKER -d -c $D/nc$n.yml -p $D/nc$n.pid -o $D/nc$n.log -s $((22300 + n)) -a 127.0.0.1
        for i in $(seq 50); do [ -s $D/nc$n.pid ] && break; sleep 0.1; done
        wait_port $((7594 + (n + 1) / 2))
        bench "nutcracker/$n" $((7594 + (n + 1) / 2)) $size $(cat $D/nc$n.pid) | tee -a $D/out
        kill "$(cat $D/nc$n.pid)"; rm -f $D/nc$n.pid; sleep 0.2
      fi
    done
  done
done
echo
med() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-14s %8s %10s %10s %7s %7s %12s %12s\n' target size "SET rps" "GET rps" "SET/dir" "GET/dir" "CPU-µs/req" "CPU-ms/MiB"
for size in $SIZES; do
  ds=$(awk -v s=$size '$1 == "direct" && $2 == s {print $3}' $D/out | med)
  dg=$(awk -v s=$size '$1 == "direct" && $2 == s {print $4}' $D/out | med)
  for tag in $(awk '{print $1}' $D/out | awk '!seen[$0]++'); do
    s=$(awk -v t=$tag -v s=$size '$1 == t && $2 == s {print $3}' $D/out | med)
    g=$(awk -v t=$tag -v s=$size '$1 == t && $2 == s {print $4}' $D/out | med)
    c=$(awk -v t=$tag -v s=$size -v k=$TCK '$1 == t && $2 == s {printf "%.12f\n", $5 / k / (2 * $6)}' $D/out | med)
    printf '%-14s %8s %10.0f %10.0f %7.2f %7.2f %12.1f %12.2f\n' $tag $size $s $g \
      "$(echo "$s / $ds" | bc -l)" "$(echo "$g / $dg" | bc -l)" "$(echo "$c * 1000000" | bc -l)" \
      "$(echo "$c * 1000 * 1048576 / $size" | bc -l)"
  done
done
for b in "${!BINS[@]}"; do echo "bin$b = ${BINS[$b]}"; done
