#!/usr/bin/env bash
# Do blocked clients slow the others? GET/SET throughput and respway CPU per request through
# one respway (--workers 1, 3 local shards) with no blocked client (A) and with 200 clients
# blocked in BLPOP on their own dedicated connections (B), interleaved:
#   perf/bench/blocked_clients.sh BIN [ROUNDS] [REQUESTS]
# redis-benchmark -t get -P 1 -c 50 -d 64 -r 100000 (ports 7501-7503, 7590; loopback).
set -euo pipefail
BIN=$1; ROUNDS=${2:-5}; N=${3:-300000}
D=$(mktemp -d)
for p in 7501 7502 7503; do redis-server --port $p --bind 127.0.0.1 --save "" --appendonly no --daemonize yes --pidfile $D/r$p.pid --logfile $D/r$p.log; done
cat > $D/rw.yaml <<Y
listeners: [{ name: main, address: "127.0.0.1:7590", routes: { catch_all: c } }]
clusters:
  - name: c
    dedicated_connections: 256
    shards:
      - { name: s0, endpoints: [{ address: "127.0.0.1:7501" }] }
      - { name: s1, endpoints: [{ address: "127.0.0.1:7502" }] }
      - { name: s2, endpoints: [{ address: "127.0.0.1:7503" }] }
Y
$BIN --config $D/rw.yaml --workers 1 2>$D/rw.log & RW=$!
trap 'kill $RW 2>/dev/null; for p in 7501 7502 7503; do kill $(cat $D/r$p.pid) 2>/dev/null || true; done' EXIT
for i in $(seq 100); do redis-cli -p 7590 ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-benchmark -p 7590 -t set -n 100000 -c 50 -d 64 -r 100000 -q >/dev/null 2>&1
TCK=$(getconf CLK_TCK)
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
  local t0; t0=$(awk '{print $14+$15}' /proc/$RW/stat)
  local rps; rps=$(redis-benchmark -p 7590 -t get -n $N -c 50 -d 64 -r 100000 -q 2>/dev/null | tr '\r' '\n' | grep -o 'GET: [0-9.]* requests per second' | tail -1 | awk '{print $2}')
  local t1; t1=$(awk '{print $14+$15}' /proc/$RW/stat)
  [ -n "$blocker" ] && { kill $blocker; wait $blocker 2>/dev/null || true; sleep 0.5; }
  echo "$1 $rps $(echo "($t1 - $t0) / $TCK / ($N / 1000000)" | bc -l)"
}
for r in $(seq $ROUNDS); do run A; run B; done | tee $D/out
for t in A B; do
  awk -v t=$t '$1==t {print $2}' $D/out | sort -n | awk -v t=$t '{a[NR]=$1} END {printf "%s median rps %s\n", t, a[int((NR+1)/2)]}'
  awk -v t=$t '$1==t {print $3}' $D/out | sort -n | awk -v t=$t '{a[NR]=$1} END {printf "%s median CPU-s/M %s\n", t, a[int((NR+1)/2)]}'
done
