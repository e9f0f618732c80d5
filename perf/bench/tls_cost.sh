#!/usr/bin/env bash
# What TLS on the client side costs respway, per request: the same respway binary, one
# plaintext listener or one TLS listener, over the same 3 local plaintext shards:
#   perf/bench/tls_cost.sh BIN [ROUNDS] [REQUESTS] [PIPELINE]
# Each round runs, against the plaintext listener then the TLS one,
#   redis-benchmark [--tls --cacert CA] -t set,get -n REQUESTS -P PIPELINE -c 50 -q
# (respway --workers 1; ports 7411-7413, 7491; loopback; a throwaway CA and server certificate
# from openssl), and prints SET and GET rps and respway's user+system CPU seconds per million
# requests over both (from /proc/PID/stat), then the medians.
set -euo pipefail
BIN=$1; ROUNDS=${2:-5}; N=${3:-1000000}; P=${4:-16}
D=$(mktemp -d)
trap 'for p in 7411 7412 7413; do kill $(cat $D/r$p.pid 2>/dev/null) 2>/dev/null || true; done; rm -rf $D' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=bench-ca \
  -keyout $D/ca.key -out $D/ca.pem 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
  -keyout $D/server.key -out $D/server.csr 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > $D/ext
openssl x509 -req -in $D/server.csr -CA $D/ca.pem -CAkey $D/ca.key -CAcreateserial -days 2 \
  -extfile $D/ext -out $D/server.pem 2>/dev/null
for p in 7411 7412 7413; do redis-server --port $p --bind 127.0.0.1 --save "" --appendonly no --daemonize yes --pidfile $D/r$p.pid --logfile $D/r$p.log; done
clusters='clusters:
  - name: c
    hash: { policy: ketama, key_hash: fnv1a_64 }
    shards:
      - { name: s0, endpoints: [{ address: "127.0.0.1:7411" }] }
      - { name: s1, endpoints: [{ address: "127.0.0.1:7412" }] }
      - { name: s2, endpoints: [{ address: "127.0.0.1:7413" }] }'
printf 'listeners: [{ name: main, address: "127.0.0.1:7491", routes: { catch_all: c } }]\n%s\n' "$clusters" > $D/plain.yaml
printf 'listeners: [{ name: main, address: "127.0.0.1:7491", tls: { cert: "%s", key: "%s" }, routes: { catch_all: c } }]\n%s\n' \
  $D/server.pem $D/server.key "$clusters" > $D/tls.yaml
TCK=$(getconf CLK_TCK)
run() { # TAG CONFIG [redis-benchmark TLS args...]
  local tag=$1 cfg=$2; shift 2
  $BIN --config $cfg --workers 1 2>$D/$tag.log & local pid=$!
  for i in $(seq 100); do redis-cli "$@" -p 7491 ping >/dev/null 2>&1 && break; sleep 0.1; done
  local t0; t0=$(awk '{print $14+$15}' /proc/$pid/stat)
  local out; out=$(redis-benchmark "$@" -p 7491 -t set,get -n $N -P $P -c 50 -q 2>/dev/null | tr '\r' '\n')
  local t1; t1=$(awk '{print $14+$15}' /proc/$pid/stat)
  kill -INT $pid; wait $pid || true
  local set get
  set=$(echo "$out" | grep -o 'SET: [0-9.]* requests per second' | tail -1 | awk '{print $2}')
  get=$(echo "$out" | grep -o 'GET: [0-9.]* requests per second' | tail -1 | awk '{print $2}')
  echo "$tag $set $get $(echo "($t1 - $t0) / $TCK / (2 * $N / 1000000)" | bc -l)"
}
for r in $(seq $ROUNDS); do
  run plain $D/plain.yaml
  run tls $D/tls.yaml --tls --cacert $D/ca.pem
done | tee $D/out
for t in plain tls; do
  med() { grep "^$t " $D/out | awk "{print \$$1}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  printf '%-5s median SET rps %.0f  GET rps %.0f  CPU-s per 1M requests %.3f\n' $t "$(med 2)" "$(med 3)" "$(med 4)"
done
