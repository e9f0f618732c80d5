#!/usr/bin/env bash
# perf/bench/compare.sh: throughput and CPU cost of respway against nutcracker (twemproxy)
# and a single Redis, measured with redis-benchmark on loopback. See perf/README.md.
#
# Build respway (polling until it compiles), start 1 "direct" redis-server + 3 shard
# redis-servers, nutcracker and respway over the 3 shards, then run redis-benchmark
# interleaved over the targets, ROUNDS times, for every pipeline depth and test. Medians go
# to stdout and are appended to perf/RESULTS-archive.md (the log of every run; perf/RESULTS.md
# is the hand-written summary of the newest ones). Every process started here is stopped on
# exit (trap), everything listens on 127.0.0.1 only, and every step has a time limit.
#
# Knobs (environment variables, defaults in brackets):
#   ROUNDS [3]            interleaved rounds; the table shows the median over them
#   N_P1 [300000]         requests per run (per test) at -P 1
#   N_P16 [1500000]       requests per run (per test) at -P 16
#   PIPELINES ["1 16"]    redis-benchmark -P values
#   TESTS ["set get"]     redis-benchmark -t values, one run each (set first: it fills the keys)
#   CLIENTS [50] DATA [64] KEYSPACE [100000]   redis-benchmark -c, -d, -r
#   RESPWAY_WORKERS ["1 2"]  one respway process (and one table row) per --workers value
#   RUN_TIMEOUT [90]      seconds before one redis-benchmark run is killed (recorded as TIMEOUT)
#   BUILD [1]             0 = use the existing target/release/respway without building
#   BUILD_POLL [120] BUILD_GIVEUP [2400]   seconds between build attempts / before giving up
#   BUSY_MAX [0.25] LOAD_WAIT [600]  before measuring, wait up to LOAD_WAIT s until the machine
#                         is idle: less than BUSY_MAX cores busy over a 5 s sample of /proc/stat
#   RUN_WAIT_BUDGET [900] before each run, wait again while the machine is busy (2 s samples),
#                         at most this many seconds in total over the whole benchmark
#   APPEND [1]            0 = do not append to $RESULTS
#   RESULTS [perf/RESULTS-archive.md]  the log the section is appended to
#   KEEP [0]              1 = keep the scratch directory (logs, configs, raw per-run TSV)
#   QUICK [0]             1 = smoke test: 1 round, small N, no load wait, no append
#   PORT_BASE [7101]      first port tried for the redis-servers (then 22121, 22222, 6390, ...)
set -euo pipefail
export LC_ALL=C

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"

QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
    ROUNDS=${ROUNDS:-1}
    N_P1=${N_P1:-20000}
    N_P16=${N_P16:-100000}
    APPEND=${APPEND:-0}
    LOAD_WAIT=${LOAD_WAIT:-0}
    RUN_WAIT_BUDGET=${RUN_WAIT_BUDGET:-0}
fi
ROUNDS=${ROUNDS:-3}
N_P1=${N_P1:-300000}
N_P16=${N_P16:-1500000}
PIPELINES=${PIPELINES:-"1 16"}
TESTS=${TESTS:-"set get"}
CLIENTS=${CLIENTS:-50}
DATA=${DATA:-64}
KEYSPACE=${KEYSPACE:-100000}
RESPWAY_WORKERS=${RESPWAY_WORKERS:-"1 2"}
RUN_TIMEOUT=${RUN_TIMEOUT:-90}
BUILD=${BUILD:-1}
BUILD_POLL=${BUILD_POLL:-120}
BUILD_GIVEUP=${BUILD_GIVEUP:-2400}
BUSY_MAX=${BUSY_MAX:-0.25}
LOAD_WAIT=${LOAD_WAIT:-600}
RUN_WAIT_BUDGET=${RUN_WAIT_BUDGET:-900}
APPEND=${APPEND:-1}
KEEP=${KEEP:-0}
PORT_BASE=${PORT_BASE:-7101}
RESULTS=${RESULTS:-$ROOT/perf/RESULTS-archive.md}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
RESPWAY_BIN=$TARGET_DIR/release/respway
NUTCRACKER=${NUTCRACKER:-$(command -v nutcracker || echo /usr/sbin/nutcracker)}
HOST=127.0.0.1

log() { printf '[compare %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() {
    log "FATAL: $*"
    FAILED=1
    exit 1
}

for tool in redis-server redis-cli redis-benchmark ss timeout cargo getconf sha256sum; do
    command -v "$tool" >/dev/null || die "missing tool: $tool"
done
[[ -x $NUTCRACKER ]] || die "nutcracker not found (set NUTCRACKER=/path/to/nutcracker)"
CLK_TCK=$(getconf CLK_TCK)
NPROC=$(nproc)

# ---------------------------------------------------------------- scratch dir and cleanup
WORK=$(mktemp -d "${TMPDIR:-/tmp}/respway-bench.XXXXXX")
FAILED=0
PIDS=()
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for _ in $(seq 30); do
        local alive=0
        for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [[ $alive == 0 ]] && break
        sleep 0.1
    done
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    if [[ $KEEP == 1 || $FAILED == 1 || $rc != 0 ]]; then
        log "scratch directory kept: $WORK (logs, configs, runs.tsv)"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- 1. build (polling)
if [[ $BUILD == 1 ]]; then
    start=$SECONDS
    attempt=0
    while :; do
        attempt=$((attempt + 1))
        log "cargo build --release -p respway (attempt $attempt)"
        if timeout 1800 cargo build --release -p respway >"$WORK/build.log" 2>&1; then
            break
        fi
        if ((SECONDS - start + BUILD_POLL > BUILD_GIVEUP)); then
            tail -n 40 "$WORK/build.log" >&2
            die "respway still does not build after $((SECONDS - start)) s ($attempt attempts)"
        fi
        log "build failed; first error: $(grep -m1 -E '^error' "$WORK/build.log" || echo '?'); retrying in ${BUILD_POLL}s"
        sleep "$BUILD_POLL"
    done
    log "build ok after $((SECONDS - start)) s"
fi
[[ -x $RESPWAY_BIN ]] || die "no binary at $RESPWAY_BIN"

# ---------------------------------------------------------------- helpers
USED_PORTS=" "
# free_port BASE: sets PORT to the first port >= BASE that nothing listens on and that was
# not handed out before (runs in this shell, not in $(...), so that USED_PORTS sticks).
free_port() {
    local p=$1
    while ((p < 65535)); do
        if [[ $USED_PORTS != *" $p "* ]] && [[ -z $(ss -Htln "sport = :$p") ]]; then
            USED_PORTS+="$p "
            PORT=$p
            return 0
        fi
        p=$((p + 1))
    done
    die "no free port from $1"
}

dump_logs() { tail -n 20 "$WORK"/respway-*.stderr "$WORK/nutcracker.log" >&2 2>/dev/null || true; }

# cpu_ticks PID...: utime + stime (fields 14 and 15 of /proc/PID/stat, all threads), summed.
cpu_ticks() {
    local t=0 p s f
    for p in "$@"; do
        { s=$(<"/proc/$p/stat"); } 2>/dev/null || {
            dump_logs
            die "process $p is gone (a server died? logs above)"
        }
        s=${s##*) }          # drop "pid (comm) ": s now starts at field 3
        read -r -a f <<<"$s" # field N is f[N-3]
        t=$((t + f[11] + f[12]))
    done
    echo "$t"
}

# syscalls PID...: read + write system calls (syscr + syscw of /proc/PID/io), summed. For the
# redis-servers behind a proxy, fewer per request means the proxy batches more per write.
syscalls() {
    local t=0 p k v
    for p in "$@"; do
        while read -r k v; do
            [[ $k == syscr: || $k == syscw: ]] && t=$((t + v))
        done <"/proc/$p/io"
    done
    echo "$t"
}

# sys_ticks: "TASK IRQ" ticks of the whole machine (all CPUs) from /proc/stat: TASK is time
# charged to processes (user, nice, system), IRQ is hard + soft interrupt time, which the kernel
# (with IRQ time accounting) charges to no process; on loopback it is mostly TCP delivery.
sys_ticks() {
    local cpu user nice system idle iowait irq softirq steal rest
    read -r cpu user nice system idle iowait irq softirq steal rest </proc/stat
    echo "$((user + nice + system + steal)) $((irq + softirq))"
}

# children_cpu_ms: user+sys CPU of all waited-for children of this shell (bash `times`).
to_ms() {
    local v=${1%s} m s i f
    m=${v%%m*}
    s=${v#*m}
    i=${s%.*}
    f=${s#*.}000
    echo $((10#$m * 60000 + 10#$i * 1000 + 10#${f:0:3}))
}
# Sets CHILD_MS; must run in this shell, not in $(...): a subshell would see only its own
# children.
children_cpu_ms() {
    times >"$WORK/times.txt"
    local a b c d
    { read -r a b && read -r c d; } <"$WORK/times.txt"
    CHILD_MS=$(($(to_ms "$c") + $(to_ms "$d")))
}
load1() { cut -d' ' -f1 /proc/loadavg; }

# calls_sum CMD PORT...: cmdstat_CMD calls summed over redis-servers.
calls_sum() {
    local cmd=$1 t=0 p n
    shift
    for p in "$@"; do
        n=$(timeout 5 redis-cli -h $HOST -p "$p" info commandstats | tr -d '\r' |
            sed -n "s/^cmdstat_${cmd}:calls=\([0-9]*\),.*/\1/p")
        t=$((t + ${n:-0}))
    done
    echo "$t"
}

# wait_ready NAME PORT PID LOG: until a SET through PORT answers OK (10 s).
wait_ready() {
    local name=$1 port=$2 pid=$3 logf=$4 i
    for i in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || {
            tail -n 20 "$logf" >&2
            die "$name exited during start-up (log above)"
        }
        if [[ $(timeout 2 redis-cli -h $HOST -p "$port" set respway-bench:ready 1 2>/dev/null) == OK ]]; then
            return 0
        fi
        sleep 0.1
    done
    tail -n 20 "$logf" >&2
    die "$name not ready on port $port after 10 s"
}

median() {
    sort -g | awk '{ a[NR] = $1 } END {
        if (NR == 0) print "nan"; else if (NR % 2) print a[(NR + 1) / 2];
        else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# ---------------------------------------------------------------- 2. redis-servers
start_redis() {
    local port=$1
    redis-server --bind $HOST --port "$port" --save "" --appendonly no --dir "$WORK" \
        --dbfilename "dump-$port.rdb" --logfile "$WORK/redis-$port.log" --daemonize no \
        >/dev/null 2>&1 &
    PIDS+=($!)
    wait_ready "redis-server:$port" "$port" $! "$WORK/redis-$port.log"
    echo $! >"$WORK/redis-$port.pid"
}
free_port "$PORT_BASE"
DIRECT_PORT=$PORT
SHARD_PORTS=()
for _ in 1 2 3; do
    free_port $((PORT_BASE + 1))
    SHARD_PORTS+=("$PORT")
done
start_redis "$DIRECT_PORT"
DIRECT_PID=$(<"$WORK/redis-$DIRECT_PORT.pid")
SHARD_PIDS=()
for p in "${SHARD_PORTS[@]}"; do
    start_redis "$p"
    SHARD_PIDS+=("$(<"$WORK/redis-$p.pid")")
done
log "redis direct :$DIRECT_PORT, shards :${SHARD_PORTS[*]}"

# ---------------------------------------------------------------- 3. nutcracker
free_port 22121
NUT_PORT=$PORT
free_port 22222
NUT_STATS_PORT=$PORT
cat >"$WORK/nutcracker.yml" <<EOF
bench:
  listen: $HOST:$NUT_PORT
  hash: fnv1a_64
  distribution: ketama
  hash_tag: "{}"
  redis: true
  auto_eject_hosts: false
  server_connections: 1
  preconnect: true
  servers:
   - $HOST:${SHARD_PORTS[0]}:1 s0
   - $HOST:${SHARD_PORTS[1]}:1 s1
   - $HOST:${SHARD_PORTS[2]}:1 s2
EOF
"$NUTCRACKER" -t -c "$WORK/nutcracker.yml" >"$WORK/nutcracker-check.log" 2>&1 ||
    { cat "$WORK/nutcracker-check.log" >&2; die "nutcracker rejects its configuration"; }
"$NUTCRACKER" -c "$WORK/nutcracker.yml" -s "$NUT_STATS_PORT" -a $HOST \
    -o "$WORK/nutcracker.log" >/dev/null 2>&1 &
NUT_PID=$!
PIDS+=($NUT_PID)
wait_ready nutcracker "$NUT_PORT" $NUT_PID "$WORK/nutcracker.log"
log "nutcracker :$NUT_PORT (stats :$NUT_STATS_PORT) pid $NUT_PID"

# ---------------------------------------------------------------- 4. respway
declare -A T_PORT T_PROXY_PID T_BACKEND_PORTS T_BACKEND_PIDS
TARGETS=(direct nutcracker)
T_PORT[direct]=$DIRECT_PORT
T_PROXY_PID[direct]=""
T_BACKEND_PORTS[direct]=$DIRECT_PORT
T_BACKEND_PIDS[direct]=$DIRECT_PID
T_PORT[nutcracker]=$NUT_PORT
T_PROXY_PID[nutcracker]=$NUT_PID
T_BACKEND_PORTS[nutcracker]="${SHARD_PORTS[*]}"
T_BACKEND_PIDS[nutcracker]="${SHARD_PIDS[*]}"

RESPWAY_CMDS=()
for w in $RESPWAY_WORKERS; do
    name="respway-w$w"
    free_port 6390
    port=$PORT
    cfg="$WORK/$name.yaml"
    {
        cat <<EOF
listeners:
  - name: main
    address: $HOST:$port
    routes: { catch_all: main }
clusters:
  - name: main
    hash: { policy: ketama, key_hash: fnv1a_64 }
    hashtag: "{}"
    shards:
EOF
        for i in 0 1 2; do
            printf '      - name: s%d\n        endpoints: [ { address: "%s:%d", role: primary } ]\n' \
                "$i" $HOST "${SHARD_PORTS[$i]}"
        done
    } >"$cfg"
    "$RESPWAY_BIN" --config "$cfg" --check >"$WORK/$name-check.log" 2>&1 ||
        { cat "$WORK/$name-check.log" >&2; die "respway rejects its configuration ($cfg)"; }
    "$RESPWAY_BIN" --config "$cfg" --workers "$w" >"$WORK/$name.stdout" 2>"$WORK/$name.stderr" &
    pid=$!
    PIDS+=($pid)
    wait_ready "$name" "$port" $pid "$WORK/$name.stderr"
    TARGETS+=("$name")
    T_PORT[$name]=$port
    T_PROXY_PID[$name]=$pid
    T_BACKEND_PORTS[$name]="${SHARD_PORTS[*]}"
    T_BACKEND_PIDS[$name]="${SHARD_PIDS[*]}"
    RESPWAY_CMDS+=("target/release/respway --config $name.yaml --workers $w")
    log "$name :$port pid $pid"
done
ALL_PIDS=("${PIDS[@]}")

# ---------------------------------------------------------------- sanity: key placement
# The same keys written through nutcracker and through each respway should land on the same
# shards if both build the same ketama ring (informational; the benchmark does not depend on it).
placement() { # placement PORT: "key shard" lines after writing 300 keys through PORT
    local p
    for p in "${SHARD_PORTS[@]}"; do redis-cli -h $HOST -p "$p" flushall >/dev/null; done
    for i in $(seq 300); do printf 'SET placement:%d x\n' "$i"; done |
        timeout 20 redis-cli -h $HOST -p "$1" >/dev/null || true
    for p in "${SHARD_PORTS[@]}"; do
        redis-cli -h $HOST -p "$p" --scan --pattern 'placement:*' | sed "s/\$/ $p/"
    done | sort
}
placement "$NUT_PORT" >"$WORK/placement-nutcracker.txt"
PLACEMENT_NOTES=()
for t in "${TARGETS[@]}"; do
    [[ $t == respway-* ]] || continue
    placement "${T_PORT[$t]}" >"$WORK/placement-$t.txt"
    same=$(comm -12 "$WORK/placement-nutcracker.txt" "$WORK/placement-$t.txt" | wc -l)
    total=$(wc -l <"$WORK/placement-$t.txt")
    PLACEMENT_NOTES+=("$t: $same of 300 keys on the same shard as through nutcracker ($total of 300 stored)")
done
for p in "${SHARD_PORTS[@]}"; do redis-cli -h $HOST -p "$p" flushall >/dev/null; done

# ---------------------------------------------------------------- load
# Wait for an idle machine (other engineers may be compiling); the load average alone is a
# poor guide in a container, so sample /proc/stat.
busy_cores() { # busy_cores SECONDS: cores busy (all causes) over a sample
    local t0 i0 t1 i1
    read -r t0 i0 <<<"$(sys_ticks)"
    sleep "$1"
    read -r t1 i1 <<<"$(sys_ticks)"
    awk -v d="$((t1 + i1 - t0 - i0))" -v hz="$CLK_TCK" -v s="$1" 'BEGIN { printf "%.2f", d / hz / s }'
}
wait_start=$SECONDS
while :; do
    BUSY=$(busy_cores 5)
    awk -v b="$BUSY" -v m="$BUSY_MAX" 'BEGIN { exit !(b >= m) }' || break
    if ((SECONDS - wait_start >= LOAD_WAIT)); then
        log "machine still busy ($BUSY cores) after ${LOAD_WAIT}s: measuring anyway"
        break
    fi
    log "machine busy ($BUSY cores >= $BUSY_MAX), waiting (up to ${LOAD_WAIT}s)"
    sleep 15
done
UPTIME_BEFORE=$(uptime)
log "uptime: $UPTIME_BEFORE"

# ---------------------------------------------------------------- 5./6. benchmark runs
n_for() { if [[ $1 == 1 ]]; then echo "$N_P1"; else echo "$N_P16"; fi; }
bench_cmd() { # bench_cmd PORT P TEST N
    echo "redis-benchmark -h $HOST -p $1 -c $CLIENTS -d $DATA -r $KEYSPACE -t $3 -n $4 -P $2 -q --csv"
}

RUNS=$WORK/runs.tsv
printf 'round\tpipeline\ttest\ttarget\tn\trps\twall_s\tproxy_cpu_s\tbackend_cpu_s\tclient_cpu_s\tbackground_cpu_s\tforwarded\tload1\tstatus\tirq_cpu_s\tbackend_syscalls\n' >"$RUNS"

# wait_idle: before a run, wait while other processes keep the machine busy (our servers are
# idle between runs), within RUN_WAIT_BUDGET seconds for the whole benchmark.
RUN_WAITED=0
wait_idle() {
    local b t0=$SECONDS
    while ((RUN_WAITED + SECONDS - t0 < RUN_WAIT_BUDGET)); do
        b=$(busy_cores 2)
        awk -v b="$b" -v m="$BUSY_MAX" 'BEGIN { exit !(b >= m) }' || break
        log "machine busy ($b cores), waiting before the next run"
        sleep 3
    done
    RUN_WAITED=$((RUN_WAITED + SECONDS - t0))
}

# run_one ROUND P TEST TARGET N [warmup]
run_one() {
    local round=$1 pl=$2 test=$3 t=$4 n=$5 warm=${6:-}
    local port=${T_PORT[$t]} proxy=${T_PROXY_PID[$t]}
    local -a bports bpids
    read -r -a bports <<<"${T_BACKEND_PORTS[$t]}"
    read -r -a bpids <<<"${T_BACKEND_PIDS[$t]}"
    [[ -z $warm ]] && wait_idle
    local out=$WORK/run-$round-$pl-$test-$t.out err=$WORK/run-$round-$pl-$test-$t.err
    local c0 l p0=0 b0 a0 s0 i0 k0 w0 rc=0 w1 k1 p1=0 b1 a1 s1 i1 c1 y0 y1
    c0=$(calls_sum "$test" "${bports[@]}")
    l=$(load1)
    [[ -n $proxy ]] && p0=$(cpu_ticks "$proxy")
    b0=$(cpu_ticks "${bpids[@]}")
    y0=$(syscalls "${bpids[@]}")
    a0=$(cpu_ticks "${ALL_PIDS[@]}")
    read -r s0 i0 <<<"$(sys_ticks)"
    children_cpu_ms
    k0=$CHILD_MS
    w0=${EPOCHREALTIME/[.,]/}
    # shellcheck disable=SC2046
    timeout "$RUN_TIMEOUT" $(bench_cmd "$port" "$pl" "$test" "$n") >"$out" 2>"$err" || rc=$?
    w1=${EPOCHREALTIME/[.,]/}
    children_cpu_ms
    k1=$CHILD_MS
    read -r s1 i1 <<<"$(sys_ticks)"
    a1=$(cpu_ticks "${ALL_PIDS[@]}")
    b1=$(cpu_ticks "${bpids[@]}")
    y1=$(syscalls "${bpids[@]}")
    [[ -n $proxy ]] && p1=$(cpu_ticks "$proxy")
    c1=$(calls_sum "$test" "${bports[@]}")
    local upper rps fwd status=ok
    upper=$(tr '[:lower:]' '[:upper:]' <<<"$test")
    rps=$(tr -d '\r' <"$out" | awk -F'","' -v t="\"$upper" '$1 == t { print $2 + 0; exit }')
    rps=${rps:-0}
    fwd=$((c1 - c0))
    if ((rc == 124)); then
        status=TIMEOUT
    elif ((rc != 0)); then
        status="exit=$rc"
    elif [[ $rps == 0 ]]; then
        status=NO_RPS
    elif ((fwd != n)); then
        status="FORWARDED_${fwd}_OF_${n}"
    fi
    for p in "${ALL_PIDS[@]}"; do
        kill -0 "$p" 2>/dev/null || {
            dump_logs
            die "process $p died during the $t -P $pl $test run (logs above and in $WORK)"
        }
    done
    [[ -n $warm ]] && { log "warm-up $t -P $pl $test: $rps req/s ($status)"; return 0; }
    awk -v OFS='\t' -v r="$round" -v pl="$pl" -v te="$test" -v tg="$t" -v n="$n" -v rps="$rps" \
        -v wall="$(((w1 - w0) / 1000))" -v pc="$((p1 - p0))" -v bc="$((b1 - b0))" \
        -v ac="$((a1 - a0))" -v sc="$((s1 - s0))" -v kc="$((k1 - k0))" -v hz="$CLK_TCK" \
        -v ic="$((i1 - i0))" -v y="$((y1 - y0))" -v fwd="$fwd" -v l="$l" -v st="$status" 'BEGIN {
            bg = (sc - ac) / hz - kc / 1000; if (bg < 0) bg = 0
            print r, pl, te, tg, n, rps, wall / 1000, pc / hz, bc / hz, kc / 1000, bg, fwd, l, st, ic / hz, y
        }' >>"$RUNS"
    log "round $round -P $pl $test $t: $rps req/s in $(((w1 - w0) / 1000)) ms, proxy $((p1 - p0)) ticks, backends $((b1 - b0)) ticks ($status)"
}

# warm-up (also fills the keys that GET reads)
for pl in $PIPELINES; do
    for t in "${TARGETS[@]}"; do
        for test in $TESTS; do
            n=$(n_for "$pl")
            run_one 0 "$pl" "$test" "$t" $((n / 10 > 200000 ? 200000 : n / 10)) warm
        done
    done
done

NT=${#TARGETS[@]}
for round in $(seq "$ROUNDS"); do
    for pl in $PIPELINES; do
        for test in $TESTS; do
            # rotate the target order each round so no target always runs first
            for i in $(seq 0 $((NT - 1))); do
                t=${TARGETS[$(((i + round - 1) % NT))]}
                run_one "$round" "$pl" "$test" "$t" "$(n_for "$pl")"
            done
        done
    done
done
UPTIME_AFTER=$(uptime)
log "uptime: $UPTIME_AFTER"

# ---------------------------------------------------------------- 7. table
col() { # col PIPELINE TEST TARGET FIELD#: the values of one column of runs.tsv
    awk -F'\t' -v pl="$1" -v te="$2" -v tg="$3" -v f="$4" \
        'NR > 1 && $2 == pl && $3 == te && $4 == tg { print $f }' "$RUNS"
}
TABLE=$WORK/table.md
CHECKS=()
{
    echo "| test | pipeline | target | req/s (median of $ROUNDS) | vs direct redis | vs nutcracker | proxy CPU-s / M req | shards' CPU-s / M req | req/s min–max | kernel irq CPU-s / M req |"
    echo "|---|---|---|--:|--:|--:|--:|--:|--:|--:|"
} >"$TABLE"
for test in $TESTS; do
    for pl in $PIPELINES; do
        n=$(n_for "$pl")
        d_rps=$(col "$pl" "$test" direct 6 | median)
        n_rps=$(col "$pl" "$test" nutcracker 6 | median)
        n_cpu=$(col "$pl" "$test" nutcracker 8 | median)
        for t in "${TARGETS[@]}"; do
            rps=$(col "$pl" "$test" "$t" 6 | median)
            lo=$(col "$pl" "$test" "$t" 6 | sort -g | head -n1)
            hi=$(col "$pl" "$test" "$t" 6 | sort -g | tail -n1)
            pcpu=$(col "$pl" "$test" "$t" 8 | median)
            bcpu=$(col "$pl" "$test" "$t" 9 | median)
            icpu=$(col "$pl" "$test" "$t" 15 | median)
            awk -v te="$(tr '[:lower:]' '[:upper:]' <<<"$test")" -v pl="$pl" -v t="$t" -v rps="$rps" \
                -v d="$d_rps" -v nu="$n_rps" -v pc="$pcpu" -v bc="$bcpu" -v ic="$icpu" -v n="$n" -v lo="$lo" \
                -v hi="$hi" -v direct="$([[ $t == direct ]] && echo 1 || echo 0)" 'BEGIN {
                    m = n / 1e6
                    name = (t == "direct") ? "redis (direct)" : t
                    proxy = direct ? "–" : sprintf("%.2f", pc / m)
                    printf "| %s | %d | %s | %.0f | %.2f | %.2f | %s | %.2f | %.0f–%.0f | %.2f |\n",
                        te, pl, name, rps, (d > 0 ? rps / d : 0), (nu > 0 ? rps / nu : 0), proxy,
                        bc / m, lo, hi, ic / m }' >>"$TABLE"
            if [[ $t == respway-* ]]; then
                need=$([[ $pl == 1 ]] && echo 1.0 || echo 1.2)
                CHECKS+=("$(awk -v te="$test" -v pl="$pl" -v t="$t" -v r="$rps" -v nu="$n_rps" \
                    -v need="$need" -v pc="$pcpu" -v nc="$n_cpu" 'BEGIN {
                    x = (nu > 0) ? r / nu : 0
                    printf "%s -P %d %s: throughput %.2f× nutcracker (target ≥ %.1f×: %s); CPU/request %.2f× nutcracker (target < 1: %s)",
                        t, pl, toupper(te), x, need, (x >= need ? "met" : "NOT met"),
                        (nc > 0 ? pc / nc : 0), (pc < nc ? "met" : "NOT met") }')")
            fi
        done
    done
done

# upstream batching: redis-server read+write syscalls per 100 requests (median), per target
BATCHING=()
for pl in $PIPELINES; do
    for test in $TESTS; do
        line="-P $pl $(tr '[:lower:]' '[:upper:]' <<<"$test"):"
        for t in "${TARGETS[@]}"; do
            y=$(col "$pl" "$test" "$t" 16 | median)
            line+=" $([[ $t == direct ]] && echo "redis (direct)" || echo "$t") $(awk -v y="$y" -v n="$(n_for "$pl")" 'BEGIN { printf "%.1f", 100 * y / n }'),"
        done
        BATCHING+=("${line%,}")
    done
done

# ---------------------------------------------------------------- anomalies
NOTES=()
bad=$(awk -F'\t' 'NR > 1 && $14 != "ok"' "$RUNS")
if [[ -n $bad ]]; then
    while IFS=$'\t' read -r r pl te tg _ rps _ _ _ _ _ fwd _ st; do
        NOTES+=("run round $r -P $pl $te $tg: $st (req/s $rps, commands reaching redis $fwd)")
    done <<<"$bad"
fi
for f in "$WORK"/run-*.err; do
    if [[ -s $f ]] && grep -v -q -e '^WARNING: Could not fetch server CONFIG' -e '^$' "$f"; then
        NOTES+=("redis-benchmark stderr ($(basename "$f")): $(grep -v '^$' "$f" | sort | uniq -c | head -n3 | tr -s ' \n' ' ')")
    fi
done
for t in "${TARGETS[@]}"; do
    [[ $t == respway-* ]] || continue
    e=$WORK/$t.stderr
    nwarn=$(grep -c -E 'WARN|ERROR' "$e" || true)
    if ((nwarn > 0)); then
        NOTES+=("$t stderr: $nwarn WARN/ERROR lines, e.g. \`$(grep -m1 -E 'WARN|ERROR' "$e" | cut -c1-300)\`")
    fi
done
nut_err=$(grep -c -i -E 'error|fail' "$WORK/nutcracker.log" || true)
((nut_err > 0)) && NOTES+=("nutcracker log: $nut_err error/fail lines, e.g. \`$(grep -m1 -i -E 'error|fail' "$WORK/nutcracker.log" | cut -c1-300)\`")
NOISY=$(awk -F'\t' 'NR > 1 && $7 > 0 && $11 / $7 > 0.25 { n++ } END { print n + 0 }' "$RUNS")
((NOISY > 0)) && NOTES+=("$NOISY runs had more than 25% of a core of CPU used by other processes (see the background line above): treat those figures as noisy")
BG=$(awk -F'\t' 'NR > 1 && $7 > 0 { s += $11; w += $7; if ($11 / $7 > m) m = $11 / $7 } END {
    if (w > 0) printf "%.1f%% of one core on average, %.1f%% at most", 100 * s / w, 100 * m }' "$RUNS")
CLIENT=$(awk -F'\t' 'NR > 1 && $7 > 0 { s += $10; w += $7 } END { if (w > 0) printf "%.0f%%", 100 * s / w }' "$RUNS")
((${#NOTES[@]})) && KEEP=1

# ---------------------------------------------------------------- report
CPU_MODEL=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=$(git status --porcelain 2>/dev/null | wc -l)
BIN_SHA=$(sha256sum "$RESPWAY_BIN" | cut -c1-16)
VERSIONS="$(redis-server --version | awk '{print $1, $2, $3}'), $("$NUTCRACKER" --version 2>&1 | head -n1 | sed 's/This is //'), $(rustc --version 2>/dev/null || echo rustc ?)"
SECTION=$WORK/section.md
{
    echo
    echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — $NPROC × $CPU_MODEL"
    echo
    echo "- tree: commit $COMMIT with $DIRTY uncommitted paths; respway binary sha256 $BIN_SHA…; $VERSIONS"
    echo "- load before: \`$UPTIME_BEFORE\` ($BUSY cores busy over the 5 s before the first run)"
    echo "- load after: \`$UPTIME_AFTER\`"
    echo "- CPU used by other processes during the runs (machine task time minus ours, interrupts excluded): $BG; redis-benchmark itself: $CLIENT of one core"
    echo "- waited $RUN_WAITED s in total (budget $RUN_WAIT_BUDGET s) for other processes to quiet down before runs"
    echo "- $ROUNDS interleaved rounds (target order rotated each round) after one warm-up run per target; N = $N_P1 requests at -P 1, $N_P16 at -P 16, per test"
    echo
    cat "$TABLE"
    echo
    echo "Targets (respway vs nutcracker, from the medians above):"
    echo
    for c in "${CHECKS[@]}"; do echo "- $c"; done
    echo
    echo "Upstream batching: read + write system calls made by the redis-server(s) behind each target, per 100 requests (median; /proc/PID/io; lower = more requests per socket read/write):"
    echo
    for b in "${BATCHING[@]}"; do echo "- $b"; done
    echo
    printf 'Key placement check (300 keys written through each proxy): %s\n' \
        "$(printf '%s; ' "${PLACEMENT_NOTES[@]}" | sed 's/; $//')"
    echo
    if ((${#NOTES[@]})); then
        echo "Anomalies:"
        echo
        for nline in "${NOTES[@]}"; do echo "- $nline"; done
    else
        echo "Anomalies: none (every run's redis-benchmark exited 0, and the redis-servers executed exactly N commands of the test)."
    fi
    echo
    echo "Commands (ports as used in this run):"
    echo
    echo '```sh'
    echo "cargo build --release -p respway"
    echo "redis-server --bind $HOST --port PORT --save \"\" --appendonly no   # direct :$DIRECT_PORT, shards :${SHARD_PORTS[*]}"
    echo "nutcracker -c nutcracker.yml -s $NUT_STATS_PORT -a $HOST   # listen :$NUT_PORT, ketama + fnv1a_64 + hash_tag {} over s0..s2"
    for c in "${RESPWAY_CMDS[@]}"; do echo "$c"; done
    for pl in $PIPELINES; do
        for test in $TESTS; do echo "$(bench_cmd PORT "$pl" "$test" "$(n_for "$pl")")"; done
    done
    echo '```'
} >"$SECTION"

cat "$SECTION"
if [[ $APPEND == 1 ]]; then
    if [[ ! -f $RESULTS ]]; then
        cat >"$RESULTS" <<'EOF'
# respway benchmark log

Every section below was appended by `perf/bench/compare.sh` (see `perf/README.md`), one per
run, oldest first; the numbers are not edited by hand. Each section records the machine, its
load, the tree the binary was built from and the exact commands.

Setup: one "direct" redis-server, three shard redis-servers, nutcracker (twemproxy) and
respway over the same three shards (ketama, fnv1a_64, hash tag `{}`), all on 127.0.0.1.
redis-benchmark (`-c 50 -d 64 -r 100000`) is run against each target in turn, interleaved,
several rounds; SET and GET are separate runs so that CPU time can be attributed to each.

Columns:

- **test**: the redis-benchmark test (`-t set` or `-t get`).
- **pipeline**: redis-benchmark `-P`, requests in flight per connection.
- **target**: `redis (direct)` is one redis-server without a proxy (the ceiling);
  `nutcracker` is twemproxy 0.5 (single-threaded); `respway-wN` is respway `--workers N`.
- **req/s (median of R)**: redis-benchmark's requests per second, median over the R rounds.
- **vs direct redis / vs nutcracker**: that median divided by the direct-redis (resp.
  nutcracker) median of the same test and pipeline.
- **proxy CPU-s / M req**: CPU time (user + system, all threads, from fields 14 and 15 of
  `/proc/PID/stat`) the proxy process used during the run, in seconds per million requests;
  median over the rounds. `–` for direct redis, which has no proxy.
- **shards' CPU-s / M req**: the same for the redis-servers behind the target: the sum over
  the three shards for the proxies, the single redis-server for `redis (direct)`.
- **req/s min–max**: the spread of req/s over the rounds.
- **kernel irq CPU-s / M req**: hard + soft interrupt time of the whole machine (`/proc/stat`)
  during the run, per million requests. On loopback this is mostly TCP delivery, which the
  kernel charges to no process; a proxy adds a hop per request, so part of its cost shows up
  here rather than in the proxy column. Machine-wide, hence noisier than the other columns.

Caveats: client, proxy and redis-servers share the same cores, so a proxy that uses more CPU
also takes it from redis-benchmark and the shards; on a 2-core machine `--workers 2` competes
with them. "CPU used by other processes" is the machine's busy time during the runs minus
what the benchmark's own processes used: high values mean the figures are noisy.
EOF
    fi
    cat "$SECTION" >>"$RESULTS"
    log "appended to $RESULTS"
fi
