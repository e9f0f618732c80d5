#!/usr/bin/env bash
# Runs the standard comparison scenarios (perf/scenarios/) with respway-perf compare and
# writes each one's result.json, latency.svg and timeline.svg to perf/results/<scenario>/,
# then prints a markdown report (tables, commands, load) on stdout.
#
#   perf/bench/scenarios.sh                          # all five, ~12 min on 2 cores
#   SCENARIOS="uniform zipf-hot" perf/bench/scenarios.sh
#
# Needs target/release/respway (BUILD=1 builds it and respway-perf first). Every process a
# scenario starts is stopped when it ends (respway-perf compare owns them).
set -euo pipefail
cd "$(dirname "$0")/../.."
SCENARIOS=${SCENARIOS:-"uniform pipelined zipf-hot mget-heavy open-loop"}
OUT=${OUT:-perf/results}
P=target/release/respway-perf
if [[ ${BUILD:-0} == 1 || ! -x $P ]]; then
    cargo build --release -p respway-perf -p respway >&2
fi
[[ -x target/release/respway ]] || { echo "target/release/respway is missing: BUILD=1" >&2; exit 2; }
echo "respway binary sha256 $(sha256sum target/release/respway | cut -c1-16)…, $(redis-server --version | awk '{print $3}'), $(nutcracker --version 2>&1 | head -n1 | sed 's/This is //'); tree $(git rev-parse --short HEAD 2>/dev/null) with $(git status --porcelain 2>/dev/null | wc -l) uncommitted paths"
for s in $SCENARIOS; do
    echo
    echo "### $s"
    echo
    echo "\`$P compare --scenario perf/scenarios/$s.yaml --out $OUT/$s --markdown\` ($(date -u '+%Y-%m-%d %H:%M UTC'), load before: $(cut -d' ' -f1-3 /proc/loadavg))"
    echo
    "$P" compare --scenario "perf/scenarios/$s.yaml" --out "$OUT/$s" --markdown
    echo
    echo "Plots: [latency by percentile]($(basename "$OUT")/$s/latency.svg), [throughput and p99 over time]($(basename "$OUT")/$s/timeline.svg)."
done
