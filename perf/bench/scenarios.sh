#!/usr/bin/env bash
# Runs the standard comparison scenarios (perf/scenarios/) with respway-perf compare and
# writes each one's result.json, latency.svg and timeline.svg to perf/results/<scenario>/,
# then prints a markdown report (tables, commands, load) on stdout.
#
#   perf/bench/scenarios.sh                          # all six, ~14 min on 2 cores
#   SCENARIOS="uniform zipf-hot" perf/bench/scenarios.sh
#
# Needs target/release/respway and respway-xds (BUILD=1 builds them and respway-perf first). Every process a
# scenario starts is stopped when it ends (respway-perf compare owns them).
set -euo pipefail
cd "$(dirname "$0")/../.."
SCENARIOS=${SCENARIOS:-"uniform pipelined zipf-hot mget-heavy open-loop xds-push"}
OUT=${OUT:-perf/results}
P=target/release/respway-perf
if [[ ${BUILD:-0} == 1 || ! -x $P ]]; then
    cargo build --release -p respway-perf -p respway -p respway-xds >&2
fi
for b in respway respway-xds; do [[ -x target/release/$b ]] || { echo "target/release/$b is missing: BUILD=1" >&2; exit 2; }; done
BUSY_MAX=${BUSY_MAX:-0.3}
WAIT_BUDGET=${WAIT_BUDGET:-900}
busy() { # cores used by everything over 2 s
    local a b
    a=($(head -n1 /proc/stat)); sleep 2; b=($(head -n1 /proc/stat))
    awk -v u=$((b[1] + b[2] + b[3] + b[6] + b[7] - a[1] - a[2] - a[3] - a[6] - a[7])) \
        -v t=$((b[1] + b[2] + b[3] + b[4] + b[5] + b[6] + b[7] - a[1] - a[2] - a[3] - a[4] - a[5] - a[6] - a[7])) \
        -v n="$(nproc)" 'BEGIN { printf "%.2f", (t > 0 ? u / t * n : 0) }'
}
WAITED=0
wait_quiet() { # before each scenario: wait (within WAIT_BUDGET s in all) for < BUSY_MAX busy cores
    local t0=$SECONDS b
    while ((WAITED + SECONDS - t0 < WAIT_BUDGET)); do
        b=$(busy)
        awk -v b="$b" -v m="$BUSY_MAX" 'BEGIN { exit !(b > m) }' || break
        echo "machine busy ($b cores), waiting" >&2
        sleep 3
    done
    WAITED=$((WAITED + SECONDS - t0))
}
echo "respway binary sha256 $(sha256sum target/release/respway | cut -c1-16)…, $(redis-server --version | awk '{print $3}'), $(nutcracker --version 2>&1 | head -n1 | sed 's/This is //'); tree $(git rev-parse --short HEAD 2>/dev/null) with $(git status --porcelain 2>/dev/null | wc -l) uncommitted paths"
for s in $SCENARIOS; do
    wait_quiet
    echo
    echo "### $s"
    echo
    echo "\`$P compare --scenario perf/scenarios/$s.yaml --out $OUT/$s --markdown\` ($(date -u '+%Y-%m-%d %H:%M UTC'), load before: $(cut -d' ' -f1-3 /proc/loadavg))"
    echo
    "$P" compare --scenario "perf/scenarios/$s.yaml" --out "$OUT/$s" --markdown
    echo
    echo "Plots: [latency by percentile]($(basename "$OUT")/$s/latency.svg), [throughput and p99 over time]($(basename "$OUT")/$s/timeline.svg)."
done
