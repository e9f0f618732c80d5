#!/usr/bin/env bash
# callgrind instruction count of respway over 3 local shards for N redis-benchmark requests:
#   perf/bench/callgrind_per_request.sh BIN get|set|mget10 N TAG   (ports 7301-7303, 7390; loopback)
# mget10 is MGET of 10 random keys (key:__rand_int__), which respway splits over the shards.
# Per request = (count at N2 - count at N1) / (N2 - N1), which removes start-up and shutdown.
# P=16 pipelines (default 1); C=1 clients (default 10); RW_ARGS="--hot-key-sample 0 ..." adds respway flags.
set -euo pipefail
mkdir -p "${CG_DIR:-/tmp/cg}"
BIN=$1; T=$2; N=$3; TAG=$4
. "$(dirname "$0")/shards.sh"
require_free 7301 7302 7303 7390
start_shards ${CG_DIR:-/tmp/cg} 7301 7302 7303
shards_yaml 7390 "$KETAMA" 7301 7302 7303 >${CG_DIR:-/tmp/cg}/rw.yaml
sleep 0.5
valgrind --tool=callgrind --callgrind-out-file=${CG_DIR:-/tmp/cg}/cg.$TAG.$T.$N.out $BIN --config ${CG_DIR:-/tmp/cg}/rw.yaml --workers 1 ${RW_ARGS:-} 2>${CG_DIR:-/tmp/cg}/vg.$TAG.log &
VG=$!
for i in $(seq 100); do redis-cli -p 7390 ping >/dev/null 2>&1 && break; sleep 0.2; done
if [ "$T" = mget10 ]; then
  redis-benchmark -p 7390 -c ${C:-10} -n $N -P ${P:-1} -r 10000 -q MGET $(for i in $(seq 10); do printf 'key:__rand_int__ '; done) >/dev/null 2>&1 || true
else
  redis-benchmark -p 7390 -c ${C:-10} -n $N -t $T -P ${P:-1} -d 64 -r 10000 -q >/dev/null 2>&1 || true
fi
kill -INT $VG; wait $VG || true
stop_shards ${CG_DIR:-/tmp/cg} 7301 7302 7303
sleep 0.3
grep -h "^summary:" ${CG_DIR:-/tmp/cg}/cg.$TAG.$T.$N.out | awk -v t=$TAG -v T=$T -v n=$N '{print t, T, n, $2}'
