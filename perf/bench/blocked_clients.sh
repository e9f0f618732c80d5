#!/usr/bin/env bash
# Do blocked clients slow the others? GET/SET throughput and respway CPU per request through
# one respway (--workers 1, 3 local shards) with no blocked client (A) and with 200 clients
# blocked in BLPOP on their own dedicated connections (B), interleaved:
#   perf/bench/blocked_clients.sh BIN [ROUNDS] [REQUESTS]
# redis-benchmark -t get -P 1 -c 50 -d 64 -r 100000 (ports 7501-7503, 7590; loopback).
set -euo pipefail
BIN=$1; ROUNDS=${2:-5}; N=${3:-300000}
. "$(dirname "$0")/shards.sh"
D=$(mktemp -d)
start_shards $D 7501 7502 7503
shards_yaml 7590 "dedicated_connections: 256" 7501 7502 7503 >$D/rw.yaml
$BIN --config $D/rw.yaml --workers 1 2>$D/rw.log & RW=$!
trap 'kill $RW 2>/dev/null; stop_shards $D 7501 7502 7503' EXIT
for i in $(seq 100); do redis-cli -p 7590 ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-benchmark -p 7590 -t set -n 100000 -c 50 -d 64 -r 100000 -q >/dev/null 2>&1
# 200 sockets each blocked in BLPOP on its own empty list (until killed).
cat > $D/block.py <<'P'
import socket, sys, time
socks = []
for i in range(200):
    s = socket.create_connection(("127.0.0.1", 7590))
    k = f"blocked:{{{i % 3}}}:{i}"
    s.sendall(f"*3\r\n$5\r\nBLPOP\r\n${len(k)}\r\n{k}\r\n$1\r\n0\r\n".encode())
    socks.append(s)
print("blocked", flush=True)
time.sleep(3600)
P
run() { # TAG
  local blocker=""
  if [ "$1" = B ]; then
    python3 $D/block.py > $D/block.out & blocker=$!
    for i in $(seq 100); do grep -q blocked $D/block.out 2>/dev/null && break; sleep 0.1; done
    sleep 0.5
  fi
  local t0; t0=$(cpu_ticks $RW)
  local rps; rps=$(redis-benchmark -p 7590 -t get -n $N -c 50 -d 64 -r 100000 -q 2>/dev/null | tr '\r' '\n' | grep -o 'GET: [0-9.]* requests per second' | tail -1 | awk '{print $2}')
  local t1; t1=$(cpu_ticks $RW)
  [ -n "$blocker" ] && { kill $blocker; wait $blocker 2>/dev/null || true; sleep 0.5; }
  echo "$1 $rps $(cpu_per_million $t0 $t1 $N)"
}
for r in $(seq $ROUNDS); do run A; run B; done | tee $D/out
for t in A B; do
  awk -v t=$t '$1==t {print $2}' $D/out | sort -n | awk -v t=$t '{a[NR]=$1} END {printf "%s median rps %s\n", t, a[int((NR+1)/2)]}'
  awk -v t=$t '$1==t {print $3}' $D/out | sort -n | awk -v t=$t '{a[NR]=$1} END {printf "%s median CPU-s/M %s\n", t, a[int((NR+1)/2)]}'
done
