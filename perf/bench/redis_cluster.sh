#!/usr/bin/env bash
# A Redis Cluster behind a proxy, side by side: respway (redis_cluster upstream) and predixy
# (ClusterServerPool) over the same 3-primary cluster, and redis-benchmark --cluster straight
# to the nodes (a cluster-aware client: the baseline), in interleaved rounds.
#   perf/bench/redis_cluster.sh RESPWAY_BIN PREDIXY_BIN ROUNDS N
# Ports: nodes 7611-7613, respway 7695 (--workers 1), predixy 7696 (1 thread); loopback.
# Each run: redis-benchmark -c 50 -d 64 -r 100000, N requests, for SET, GET and MGET of 10
# keys (spread over slots and nodes: the proxies split it; no cluster-aware baseline), at
# -P 1 and -P 16. Proxy CPU per request from /proc/PID/stat (user + system).
# Prints one line per run (test pipeline target req/s µs-per-request), then the medians.
set -euo pipefail
RW=$1; PX=$2; ROUNDS=$3; N=$4
. "$(dirname "$0")/shards.sh"
NODES=(7611 7612 7613)
require_free "${NODES[@]}" 7695 7696
D=$(mktemp -d)
for p in "${NODES[@]}"; do
  mkdir -p $D/$p
  redis-server --port $p --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --cluster-enabled yes --cluster-config-file $D/$p/nodes.conf --dir $D/$p \
    --pidfile $D/r$p.pid --logfile $D/r$p.log
done
cleanup() {
  kill ${rw:-} ${px:-} 2>/dev/null || true
  stop_shards $D "${NODES[@]}"
  rm -rf $D
}
trap cleanup EXIT
for p in "${NODES[@]}"; do
  for i in $(seq 50); do redis-cli -p $p ping >/dev/null 2>&1 && break; sleep 0.1; done
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${NODES[@]}") --cluster-yes >$D/create.log
for i in $(seq 100); do
  redis-cli -p 7611 cluster info | grep -q cluster_state:ok && break; sleep 0.1
done
cat >$D/rw.yaml <<EOF
listeners: [{ name: main, address: "127.0.0.1:7695", routes: { catch_all: c } }]
clusters:
  - name: c
    redis_cluster: { seeds: ["127.0.0.1:7611"] }
EOF
{
  predixy_head $D 7696
  printf 'ClusterServerPool {\n    RefreshInterval 1\n    Servers {\n'
  printf '        + 127.0.0.1:%s\n' "${NODES[@]}"
  printf '    }\n}\n'
} >$D/px.conf
"$RW" --config $D/rw.yaml --workers 1 2>$D/rw.log & rw=$!
"$PX" $D/px.conf >$D/px.out 2>&1 & px=$!
for port in 7695 7696; do
  for i in $(seq 100); do redis-cli -p $port set warm 1 2>/dev/null | grep -q OK && break; sleep 0.1; done
done
redis-benchmark --cluster -p 7611 -t set -n 200000 -r 100000 -d 64 -q >/dev/null 2>&1
tck=$(getconf CLK_TCK)
one() { # TEST P NAME PID PORT
  local t=$1 p=$2 name=$3 pid=$4 port=$5 s0=0 s1=0 rps args=()
  read -r -a args <<<"$(bench_args $t)"
  [ "$name" = cluster ] && args=(--cluster "${args[@]}")
  [ -n "$pid" ] && s0=$(cpu_ticks $pid)
  rps=$(redis-benchmark -p $port -n $N -P $p -c 50 -d 64 -r 100000 -q "${args[@]}" 2>/dev/null \
    | tr '\r' '\n' | grep -oE ': [0-9.]+ requests per second' | tail -1 | awk '{print $2}' || true)
  [ -n "$pid" ] && s1=$(cpu_ticks $pid)
  echo "$t $p $name ${rps:-0} $s0 $s1" | awk -v t=$tck -v n=$N \
    '{printf "%s %s %s %.0f %.3f\n", $1, $2, $3, $4, ($6 - $5) / t / n * 1e6}'
}
for r in $(seq $ROUNDS); do
  for p in 1 16; do
    for t in set get mget; do
      if [ $t != mget ]; then one $t $p cluster "" 7611; fi
      one $t $p respway $rw 7695
      one $t $p predixy $px 7696
    done
  done
done | tee $D/out
echo "medians: test pipeline target req/s proxy-µs-per-request (cluster: redis-benchmark --cluster, no proxy)"
med() { sort -n | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]}'; }
for p in 1 16; do
  for t in set get mget; do
    for name in cluster respway predixy; do
      grep -q "^$t $p $name " $D/out || continue
      printf "%-6s P%-3s %-8s %s %s\n" $t $p $name \
        "$(grep "^$t $p $name " $D/out | awk '{print $4}' | med)" \
        "$(grep "^$t $p $name " $D/out | awk '{print $5}' | med)"
    done
  done
done
redis-cli -p 7695 info proxy | grep redis_cluster_ || true
