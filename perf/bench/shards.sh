# Sourced by the bench scripts (not run): local shards, respway's config over them, and CPU
# time from /proc. Each script keeps its own ports, so two can run at once.

# require_free PORT...: stops the script when something already listens on a port (a process
# left from an earlier run), with a message that says so. Before 0d4ec82 a respway left over
# silently took part of the load of a new one on its port (SO_REUSEPORT); respway now refuses
# a port in use itself, and older builds are still measured with these scripts.
require_free() {
  local p
  for p in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "port $p is already in use (a process left from an earlier run?)" >&2
      exit 1
    fi
  done
}

# start_shards DIR PORT...: one redis-server per port (no persistence, loopback), pid and log
# files in DIR. $SHARD_WRAP, when set, prefixes the command (e.g. "taskset -c 1").
start_shards() {
  local dir=$1 p; shift
  for p in "$@"; do
    ${SHARD_WRAP:-} redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
      --pidfile "$dir/r$p.pid" --logfile "$dir/r$p.log"
  done
}

# stop_shards DIR PORT...: stops what start_shards started.
stop_shards() {
  local dir=$1 p; shift
  local pids=() pid i
  for p in "$@"; do
    pid=$(cat "$dir/r$p.pid" 2>/dev/null) || continue
    kill "$pid" 2>/dev/null && pids+=("$pid")
  done
  # Gone before the caller removes DIR (a shard writes its log as it shuts down).
  for pid in "${pids[@]}"; do
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
}

# shards_yaml LISTEN_PORT CLUSTER_LINE SHARD_PORT...: a respway config with one listener on
# LISTEN_PORT whose catch-all is cluster c, with shards s0, s1, ... at the ports, and
# CLUSTER_LINE (e.g. "hash: { policy: ketama, key_hash: fnv1a_64 }"; empty: none) in c.
shards_yaml() {
  local listen=$1 line=$2 i=0 p; shift 2
  echo "listeners: [{ name: main, address: \"127.0.0.1:$listen\", routes: { catch_all: c } }]"
  echo "clusters:"
  echo "  - name: c"
  [ -n "$line" ] && echo "    $line"
  echo "    shards:"
  for p in "$@"; do
    echo "      - { name: s$i, endpoints: [{ address: \"127.0.0.1:$p\" }] }"
    i=$((i + 1))
  done
}

# KETAMA: twemproxy's placement, what the bench scripts measure by default.
KETAMA="hash: { policy: ketama, key_hash: fnv1a_64 }"

# cpu_ticks PID: user + system CPU of the process so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# user_ticks PID: user CPU of the process so far (no kernel time), in clock ticks.
user_ticks() { awk '{print $14}' "/proc/$1/stat"; }

# cpu_per_million T0 T1 N: CPU seconds per million requests from two cpu_ticks readings.
cpu_per_million() { echo "($2 - $1) / $(getconf CLK_TCK) / ($3 / 1000000)" | bc -l; }

# predixy_head DIR PORT: the start of a predixy config listening on PORT with one worker
# thread, its log in DIR, and the authority block its write mode needs (a pool follows).
predixy_head() {
  cat <<EOF
Name bench-predixy
Bind 127.0.0.1:$2
WorkerThreads 1
ClientTimeout 0
Log $1/predixy.log
LogVerbSample 0
LogDebugSample 0
LogInfoSample 10000
LogNoticeSample 1
LogWarnSample 1
LogErrorSample 1
Authority {
    Auth {
        Mode write
    }
}
EOF
}

# predixy_conf DIR PORT SHARD_PORT...: a predixy config over plain instances: a standalone
# pool of one group per shard (crc16, modula).
predixy_conf() {
  local dir=$1 port=$2 p i=0; shift 2
  predixy_head "$dir" "$port"
  cat <<EOF
StandaloneServerPool {
    Hash crc16
    Distribution modula
    MasterReadPriority 100
    RefreshMethod fixed
    ServerTimeout 2
    ServerFailureLimit 10
    ServerRetryTimeout 1
EOF
  for p in "$@"; do
    printf '    Group g%d {\n        + 127.0.0.1:%s\n    }\n' $i "$p"
    i=$((i + 1))
  done
  echo "}"
}

# redis-benchmark's arguments for test T: mget = MGET of 10 random keys (as the side-by-side
# kit sends it: redis-benchmark has no MGET test of its own); anything else = -t T.
bench_args() {
  case $1 in
    mget) echo MGET key:__rand_int__ key:__rand_int__ key:__rand_int__ key:__rand_int__ key:__rand_int__ \
      key:__rand_int__ key:__rand_int__ key:__rand_int__ key:__rand_int__ key:__rand_int__ ;;
    *) echo -t "$1" ;;
  esac
}

# ab_one T NAME PID PORT: one redis-benchmark run of T (set or get; -c 50 -d 64 -r 100000,
# $N requests, pipeline $P) against PORT, printed as "T NAME req/s µs-of-PID's-CPU-per-request"
# (user + system, /proc). The A/B scripts' measurement.
ab_one() { local t=$1 name=$2 pid=$3 port=$4 s0 s1 rps
  s0=$(cpu_ticks $pid)
  rps=$(redis-benchmark -p $port -t $t -n $N -P $P -c 50 -d 64 -r 100000 -q 2>/dev/null | tr '\r' '\n' | grep -oE ': [0-9.]+ requests per second' | tail -1 | awk '{print $2}')
  s1=$(cpu_ticks $pid)
  echo "$t $name $rps $s0 $s1" | awk -v t=$(getconf CLK_TCK) -v n=$N '{printf "%s %s %.0f %.3f\n", $1, $2, $3, ($5 - $4) / t / n * 1e6}'
}

# ab_medians FILE NAME...: per command (set, get) and NAME, the medians of FILE's ab_one lines:
# "T NAME req/s µs-per-request".
ab_medians() { local file=$1 t name; shift
  med() { sort -n | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]}'; }
  for t in set get; do for name in "$@"; do
    printf "%-4s %-4s %s %s\n" $t $name "$(grep "^$t $name " $file | awk '{print $3}' | med)" "$(grep "^$t $name " $file | awk '{print $4}' | med)"
  done; done
}
