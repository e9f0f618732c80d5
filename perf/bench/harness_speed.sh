#!/usr/bin/env bash
# Is respway-perf fast enough not to be the bottleneck? Runs redis-benchmark and
# respway-perf, interleaved, against one redis-server with the same connections, pipeline
# depth and command (GET of existing keys, 3-byte values), and prints the median
# requests/s of each and their ratio.
#
# Part 2: the same two tools, same flags, interleaved, against `respway-perf sink` (a RESP
# "null server" answering every command with a 3-byte bulk string, far cheaper per request
# than redis-server), so the client is the bottleneck: it prints each tool's median req/s
# against the sink, its CPU-s per million requests, how busy the sink was, and the headline
# "respway-perf against the sink / redis-benchmark against redis-server" per pipeline depth
# (the harness can drive >= 1.5x what redis-benchmark reaches against one redis-server).
#
#   perf/bench/harness_speed.sh                 # P=1 and P=16, 3 rounds
#   PIPELINES="1" ROUNDS=5 THREADS=2 perf/bench/harness_speed.sh
#   ROUNDS=1 PIPELINES=16 N_P16=1000000 perf/bench/harness_speed.sh   # a quick look
#
# Everything on 127.0.0.1; the redis-server and the sink it starts are stopped on exit.
# Before each run it waits (at most WAIT_BUDGET s in all) until other processes use less
# than BUSY_MAX cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
PIPELINES=${PIPELINES:-"1 16"}
CLIENTS=${CLIENTS:-50}
THREADS=${THREADS:-1}
N_P1=${N_P1:-500000}
N_P16=${N_P16:-3000000}
BUSY_MAX=${BUSY_MAX:-0.3}
WAIT_BUDGET=${WAIT_BUDGET:-600}
P=${P:-target/release/respway-perf}
[[ -x $P ]] || cargo build --release -p respway-perf
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
DIR=$(mktemp -d)
redis-server --bind 127.0.0.1 --port "$PORT" --save "" --appendonly no --dir "$DIR" >"$DIR/redis.log" 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; wait $RPID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done

busy() { # cores used by everything over 1 s
    local a b
    a=($(head -n1 /proc/stat)); sleep 1; b=($(head -n1 /proc/stat))
    awk -v u=$((b[1] + b[2] + b[3] + b[6] + b[7] - a[1] - a[2] - a[3] - a[6] - a[7])) \
        -v t=$((b[1] + b[2] + b[3] + b[4] + b[5] + b[6] + b[7] - a[1] - a[2] - a[3] - a[4] - a[5] - a[6] - a[7])) \
        -v n="$(nproc)" 'BEGIN { printf "%.2f", (t > 0 ? u / t * n : 0) }'
}
WAITED=0
wait_quiet() {
    local t0=$SECONDS b
    while ((WAITED + SECONDS - t0 < WAIT_BUDGET)); do
        b=$(busy)
        awk -v b="$b" -v m="$BUSY_MAX" 'BEGIN { exit !(b > m) }' || break
        echo "  (machine busy: $b cores; waiting)" >&2
        sleep 2
    done
    WAITED=$((WAITED + SECONDS - t0))
}
cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# The same kind of keys for both: redis-benchmark's key:000000NNNNNN and respway-perf's key:N,
# 100 000 each, 3-byte values.
redis-benchmark -p "$PORT" -t set -r 100000 -n 1000000 -P 16 -d 3 -q >/dev/null 2>&1
"$P" run -t "127.0.0.1:$PORT" --keyspace 100000 --commands set=1 --value-size 3 --preload -n 1 -d 1s >/dev/null 2>&1
echo "redis-server :$PORT, $(redis-cli -p "$PORT" dbsize) keys; $(nproc) cores; $(uptime)"

# Every measurement: RES / CPU / BUSY[server,pipeline,tool] collect each round's req/s, the
# tool's CPU-s per million requests and the server's % of a core.
declare -A RES CPU BUSY
# measure SERVER_NAME PORT PID: all rounds, both tools, interleaved (alternating which goes first).
measure() {
    local srv=$1 port=$2 pid=$3 round pl n tool rps c0 c1 w0 w1 per_m busy_pct
    for round in $(seq "$ROUNDS"); do
        for pl in $PIPELINES; do
            n=$([[ $pl == 1 ]] && echo "$N_P1" || echo "$N_P16")
            for tool in redis-benchmark respway-perf; do
                if (( round % 2 == 0 )); then tool=$([[ $tool == redis-benchmark ]] && echo respway-perf || echo redis-benchmark); fi
                wait_quiet
                c0=$(cpu "$pid")
                w0=$(date +%s.%N)
                if [[ $tool == redis-benchmark ]]; then
                    rps=$(/usr/bin/time -f "%U %S" -o "$DIR/time" redis-benchmark -p "$port" -c "$CLIENTS" -P "$pl" -t get -r 100000 -n "$n" --csv 2>/dev/null |
                        tr -d '\r' | awk -F'","' '$1 == "\"GET" { printf "%.0f\n", $2 }') # %.0f: not 1.0582e+06
                else
                    rps=$(/usr/bin/time -f "%U %S" -o "$DIR/time" "$P" run -t "127.0.0.1:$port" --keyspace 100000 --commands get=1 --value-size 3 \
                        -c "$CLIENTS" -P "$pl" --threads "$THREADS" -n "$n" -d 60s 2>/dev/null |
                        awk '/req\/s/ { for (i = 1; i <= NF; i++) if ($(i+1) == "req/s;") print $i }')
                fi
                w1=$(date +%s.%N)
                c1=$(cpu "$pid")
                rps=${rps:-0}
                per_m=$(awk -v c="$(awk '{ print $1 + $2 }' "$DIR/time")" -v n="$n" 'BEGIN { printf "%.2f", c / n * 1e6 }')
                busy_pct=$(awk -v t=$((c1 - c0)) -v hz="$(getconf CLK_TCK)" -v w0="$w0" -v w1="$w1" 'BEGIN { printf "%.0f", 100 * t / hz / (w1 - w0) }')
                echo "round $round -P $pl $tool -> $srv: $rps req/s; its own CPU $per_m s per M requests; $srv busy $busy_pct% of a core; load $(cut -d' ' -f1 /proc/loadavg)"
                RES[$srv,$pl,$tool]+="$rps "
                CPU[$srv,$pl,$tool]+="$per_m "
                BUSY[$srv,$pl,$tool]+="$busy_pct "
            done
        done
    done
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
range() { tr ' ' '\n' | grep -v '^$' | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { print (lo == hi ? lo : lo "–" hi) }'; }

# Part 1: against one redis-server.
measure redis-server "$PORT" "$RPID"
echo
echo "| pipeline | redis-benchmark req/s (median of $ROUNDS) | respway-perf req/s (median of $ROUNDS) | ratio |"
echo "|--:|--:|--:|--:|"
for pl in $PIPELINES; do
    a=$(median <<<"${RES[redis-server,$pl,redis-benchmark]}")
    b=$(median <<<"${RES[redis-server,$pl,respway-perf]}")
    awk -v p="$pl" -v a="$a" -v b="$b" 'BEGIN { printf "| %d | %.0f | %.0f | %.2f |\n", p, a, b, (a > 0 ? b / a : 0) }'
done
echo
echo "The tool's own CPU includes respway-perf's request generation (done before its clock starts)."
echo "commands: redis-benchmark -p PORT -c $CLIENTS -P PIPELINE -t get -r 100000 -n N --csv"
echo "          $P run -t 127.0.0.1:PORT --keyspace 100000 --commands get=1 --value-size 3 -c $CLIENTS -P PIPELINE --threads $THREADS -n N -d 60s"
echo "N = $N_P1 at -P 1, $N_P16 otherwise; waited $WAITED s for a quiet machine; $(uptime)"

# ---------------------------------------------------------------------------------------
# Part 2: the same tools and flags against respway-perf's sink. The sink costs far less CPU
# per request than redis-server, so what each tool reaches here is its own ceiling.
npl=$(wc -w <<<"$PIPELINES")
SINK_SECS=$((WAIT_BUDGET + ROUNDS * npl * 2 * 90 + 120)) # a bound well past the runs
"$P" sink --listen 127.0.0.1:0 --duration "${SINK_SECS}s" >"$DIR/sink.out" 2>"$DIR/sink.log" &
SPID=$!
trap 'kill $SPID $RPID 2>/dev/null; wait $SPID $RPID 2>/dev/null; rm -rf "$DIR"' EXIT
SADDR=
for _ in $(seq 100); do
    SADDR=$(head -n1 "$DIR/sink.out" 2>/dev/null || true)
    [[ -n $SADDR ]] && break
    sleep 0.05
done
[[ -n $SADDR ]] || { echo "the sink did not start: $(cat "$DIR/sink.log")" >&2; exit 1; }
echo
echo "sink $SADDR (pid $SPID, reply \$3 xxx); $(uptime)"
measure sink "${SADDR##*:}" "$SPID"
echo
echo "Against the sink (medians of $ROUNDS; CPU-s/M and sink busy: range over the rounds):"
echo
echo "| pipeline | redis-benchmark → redis-server req/s | redis-benchmark → sink req/s | respway-perf → sink req/s | client CPU-s / M req: redis-benchmark, respway-perf (sink) | sink busy, % of a core: redis-benchmark, respway-perf | respway-perf → sink / redis-benchmark → redis-server |"
echo "|--:|--:|--:|--:|--:|--:|--:|"
for pl in $PIPELINES; do
    base=$(median <<<"${RES[redis-server,$pl,redis-benchmark]}")
    a=$(median <<<"${RES[sink,$pl,redis-benchmark]}")
    b=$(median <<<"${RES[sink,$pl,respway-perf]}")
    awk -v p="$pl" -v base="$base" -v a="$a" -v b="$b" \
        -v ca="$(range <<<"${CPU[sink,$pl,redis-benchmark]}")" -v cb="$(range <<<"${CPU[sink,$pl,respway-perf]}")" \
        -v sa="$(range <<<"${BUSY[sink,$pl,redis-benchmark]}")" -v sb="$(range <<<"${BUSY[sink,$pl,respway-perf]}")" \
        'BEGIN { printf "| %d | %.0f | %.0f | %.0f | %s, %s | %s%%, %s%% | **%.2f** |\n", p, base, a, b, ca, cb, sa, sb, (base > 0 ? b / base : 0) }'
done
echo
echo "commands: $P sink --listen 127.0.0.1:0 --duration ${SINK_SECS}s"
echo "          redis-benchmark -p SINK_PORT -c $CLIENTS -P PIPELINE -t get -r 100000 -n N --csv"
echo "          $P run -t 127.0.0.1:SINK_PORT --keyspace 100000 --commands get=1 --value-size 3 -c $CLIENTS -P PIPELINE --threads $THREADS -n N -d 60s"
echo "The sink answers every command with \$3\\r\\nxxx\\r\\n (the same reply as GET of a 3-byte value); it is not a Redis."
echo "waited $WAITED s in all for a quiet machine; $(uptime)"
