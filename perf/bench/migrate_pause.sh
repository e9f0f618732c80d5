#!/usr/bin/env bash
# How long MIGRATE holds its source shard for one big key (move mode sends one per key whose
# owner changes; Redis runs it synchronously, so the source serves nothing else meanwhile):
#   perf/bench/migrate_pause.sh [MB ...]   (default 1 8 32 64; ports 7401-7402; loopback)
# Prints, per size, the median of 3 MIGRATEs of a string of that many MiB, and ms per MiB, as
# the source's SLOWLOG measures it (the time the source spent in the command).
set -euo pipefail
SIZES=${*:-1 8 32 64}
DIR=$(mktemp -d)
trap 'redis-cli -p 7401 shutdown nosave >/dev/null 2>&1 || true; redis-cli -p 7402 shutdown nosave >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT
for p in 7401 7402; do
  redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --logfile "$DIR/$p.log" --dir "$DIR" --slowlog-log-slower-than 0
done
for _ in $(seq 50); do redis-cli -p 7402 ping >/dev/null 2>&1 && break; sleep 0.1; done
for mb in $SIZES; do
  head -c $((mb * 1024 * 1024)) /dev/zero | tr '\0' x >"$DIR/value"
  times=()
  for _ in 1 2 3; do
    redis-cli -p 7401 -x SET big <"$DIR/value" >/dev/null
    redis-cli -p 7401 SLOWLOG RESET >/dev/null
    redis-cli -p 7401 MIGRATE 127.0.0.1 7402 big 0 60000 >/dev/null
    # The newest entry is MIGRATE's: id, time, microseconds, arguments...
    times+=($(redis-cli -p 7401 SLOWLOG GET 1 | sed -n 3p))
    redis-cli -p 7402 DEL big >/dev/null
  done
  median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 2p)
  awk -v mb="$mb" -v us="$median" 'BEGIN { printf "%d MiB: %.1f ms (%.2f ms per MiB)\n", mb, us / 1000, us / 1000 / mb }'
done
