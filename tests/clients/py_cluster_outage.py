#!/usr/bin/env python3
"""redis-py's RedisCluster (pinned in requirements.txt), used unchanged, through sidecars that
announce each other while one of them is killed.

    python3 py_cluster_outage.py --addr HOST:PORT [--addr HOST:PORT ...] --after SECONDS

Starts RedisCluster from the given addresses, writes 1,000 keys and prints `ready`. Then it
runs SET and GET on those keys in a loop, one after the other, and waits for a line
`killed` on stdin (the test writes it when it has killed a sidecar). It goes on for SECONDS
after that line, then prints one summary line and exits 0:

    summary ok_before=N errors_before=N ok_after=N errors_after=N last_error_after_s=X
            ok_in_last_s=N first_error=TYPE: MESSAGE

`last_error_after_s` is how long after the `killed` line the last failed command ended (-1:
none failed), `ok_in_last_s` how many commands succeeded in the last second of the run. The
test judges the numbers. Exits 1 if RedisCluster does not start or no `killed` line comes
within 60 s.
"""

import argparse
import sys
import threading
import time

from redis.cluster import ClusterNode, RedisCluster

KEYS = 1000


def main(args):
    nodes = []
    for a in args.addr:
        host, port = a.rsplit(":", 1)
        nodes.append(ClusterNode(host, int(port)))
    try:
        rc = RedisCluster(startup_nodes=nodes, socket_timeout=2, socket_connect_timeout=1,
                          decode_responses=True)
        pipe = rc.pipeline()
        for i in range(KEYS):
            pipe.set(f"outage:{i}", str(i))
        pipe.execute()
    except Exception as e:  # noqa: BLE001 -- the point: what it says
        print(f"FAIL start: {type(e).__name__}: {e}", flush=True)
        return 1
    print("ready", flush=True)

    killed = threading.Event()
    killed_at = [None]

    def watch_stdin():
        for line in sys.stdin:
            if line.strip() == "killed":
                killed_at[0] = time.monotonic()
                killed.set()
                return

    threading.Thread(target=watch_stdin, daemon=True).start()
    started = time.monotonic()
    counts = {"ok_before": 0, "errors_before": 0, "ok_after": 0, "errors_after": 0}
    last_error = None
    first_error = ""
    oks = []
    i = 0
    while True:
        now = time.monotonic()
        if not killed.is_set() and now - started > 60:
            print("FAIL no 'killed' line within 60 s", flush=True)
            return 1
        if killed.is_set() and now - killed_at[0] >= args.after:
            break
        after = "after" if killed.is_set() else "before"
        k = f"outage:{i % KEYS}"
        i += 1
        try:
            rc.set(k, str(i))
            if rc.get(k) != str(i):
                raise AssertionError(f"GET {k} is not the value just set")
        except Exception as e:  # noqa: BLE001 -- counted
            counts[f"errors_{after}"] += 1
            if after == "after":
                last_error = time.monotonic()
                if not first_error:
                    first_error = f"{type(e).__name__}: {str(e)[:120]}"
        else:
            counts[f"ok_{after}"] += 1
            if after == "after":
                oks.append(time.monotonic())
    end = time.monotonic()
    last = -1.0 if last_error is None else last_error - killed_at[0]
    in_last_s = sum(1 for t in oks if t >= end - 1.0)
    fields = " ".join(f"{k}={v}" for k, v in counts.items())
    print(f"summary {fields} last_error_after_s={last:.3f} ok_in_last_s={in_last_s} "
          f"first_error={first_error or '-'}", flush=True)
    rc.close()
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", required=True, action="append", help="HOST:PORT (repeatable)")
    p.add_argument("--after", type=float, required=True,
                   help="seconds to go on after the 'killed' line")
    sys.exit(main(p.parse_args()))
