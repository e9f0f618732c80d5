#!/usr/bin/env bash
# Syscalls and CPU of the 3 shards per request behind respway and behind predixy: how many
# requests each proxy puts in one write to a shard (the shard reads once per batch).
#   perf/bench/shard_syscalls.sh RESPWAY_BIN PREDIXY_BIN N [P]
# Ports: shards 7601-7603, respway 7690 (--workers 1, ketama fnv1a_64), predixy 7691 (1
# thread, crc16 modula); loopback. redis-benchmark GET -c 50 -P P (default 16) -d 64
# -r 100000, N requests per proxy, after a SET warm-up; perf stat counts the shards'
# read/write/epoll_wait syscalls (tracepoints, which work where hardware counters do not).
set -euo pipefail
RW=$1; PX=$2; N=$3; P=${4:-16}
. "$(dirname "$0")/shards.sh"
require_free 7601 7602 7603 7690 7691
D=$(mktemp -d)
start_shards $D 7601 7602 7603
shards_yaml 7690 "$KETAMA" 7601 7602 7603 >$D/rw.yaml
predixy_conf $D 7691 7601 7602 7603 >$D/predixy.conf
"$RW" --config $D/rw.yaml --workers 1 2>$D/rw.log & rw=$!
"$PX" $D/predixy.conf >$D/predixy.out 2>&1 & px=$!
trap 'kill $rw $px 2>/dev/null || true; stop_shards $D 7601 7602 7603; rm -rf $D' EXIT
sleep 1
pids=$(cat $D/r7601.pid),$(cat $D/r7602.pid),$(cat $D/r7603.pid)
for port in 7690 7691; do
  for i in $(seq 100); do redis-cli -p $port set warm 1 >/dev/null 2>&1 && break; sleep 0.1; done
  redis-benchmark -p $port -t set -n 200000 -P 16 -c 50 -d 64 -r 100000 -q >/dev/null 2>&1
done
for port in 7690 7691; do
  name=respway; [ $port = 7691 ] && name=predixy
  perf stat -e syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_epoll_wait,task-clock -p $pids -o $D/stat 2>/dev/null & pp=$!
  sleep 0.3
  rps=$(redis-benchmark -p $port -t get -n $N -P $P -c 50 -d 64 -r 100000 -q 2>/dev/null | tr '\r' '\n' | grep -o 'GET: [0-9.]*' | tail -1 | awk '{print $2}')
  kill -INT $pp; wait $pp 2>/dev/null || true
  awk -v n=$N -v name=$name -v rps=$rps '/sys_enter|task-clock/ {gsub(",","",$1); printf "%s %s rps  shards %s %.4f per request\n", name, rps, $2, $1/n}' $D/stat
done
