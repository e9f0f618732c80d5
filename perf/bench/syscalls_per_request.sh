#!/usr/bin/env bash
# Syscalls, context switches and CPU time of respway per request, or a CPU profile with kernel
# time in it, over 1 or 3 local shards:
#   perf/bench/syscalls_per_request.sh BIN SHARDS P N TAG
# SHARDS 1 or 3 (ports 7401-7403, respway on 7490, --workers 1; loopback); redis-benchmark GET
# -c 50 -P P -d 64 -r 100000, N requests, after a SET warm-up. T=set|mset|mget (default get;
# mget = MGET of 10 random keys, as the side-by-side kit sends it). Needs Linux perf (Debian's
# linux-perf): the tracepoint and software events used here work where hardware counters are
# "not supported" (as on this project's VMs).
#   default: perf stat of EV (default raw_syscalls:sys_enter,context-switches,task-clock),
#            printed per request; EV=syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,...
#            splits the syscalls by name.
#   REC=1:   perf record -e cpu-clock -g into /tmp/perf.TAG.data (read it with
#            perf report -i /tmp/perf.TAG.data --no-children --sort sym -g none).
set -euo pipefail
BIN=$1; S=$2; P=$3; N=$4; TAG=$5
. "$(dirname "$0")/shards.sh"
require_free 7401 7402 7403 7490
D=$(mktemp -d)
start_shards $D 7401 7402 7403
ports=(7401 7402 7403)
shards_yaml 7490 "$KETAMA" "${ports[@]:0:$S}" >$D/rw.yaml
"$BIN" --config $D/rw.yaml --workers 1 2>/dev/null & pid=$!
for i in $(seq 100); do redis-cli -p 7490 ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-benchmark -p 7490 -t set -n 100000 -P 16 -c 50 -d 64 -r 100000 -q >/dev/null 2>&1
if [ "${REC:-0}" = 1 ]; then
  perf record -e cpu-clock -F 2000 -g -p $pid -o /tmp/perf.$TAG.data 2>/dev/null & pp=$!
else
  perf stat -e "${EV:-raw_syscalls:sys_enter,context-switches,task-clock}" -p $pid -o $D/stat 2>/dev/null & pp=$!
fi
sleep 0.5
redis-benchmark -p 7490 -n $N -P $P -c 50 -d 64 -r 100000 -q $(bench_args ${T:-get}) 2>/dev/null | tr '\r' '\n' | grep -o '[^:]*: [0-9.]* requests per second' | tail -1 || true
kill -INT $pp; wait $pp 2>/dev/null || true
kill -INT $pid; wait $pid || true
if [ "${REC:-0}" != 1 ]; then
  # task-clock is printed in msec: per request it is shown in msec too.
  awk -v n=$N '/sys_enter|context-switches|task-clock/ {gsub(",","",$1); printf "%-34s %10.4f per request\n", $2, $1/n}' $D/stat
fi
stop_shards $D 7401 7402 7403
sleep 1
rm -rf $D
