#!/usr/bin/env python3
"""redis-py (pinned in requirements.txt), used unchanged: SCAN through one address.

    python3 py_scan.py --addr 127.0.0.1:PORT [--protocol default|2|3]

Writes 3,000 string keys and 100 hashes, then checks that `scan_iter` (with MATCH, COUNT
and TYPE, and with none) returns every one of them, and that KEYS and DBSIZE agree. Prints
`ok NAME` / `FAIL NAME: reason` per scenario and exits 1 if any failed.
"""

import argparse
import sys
import traceback

import redis

N = 3000
H = 100


def fail(msg):
    raise AssertionError(msg)


def eq(got, want, what):
    if got != want:
        fail(f"{what}: got {got!r}, want {want!r}")


def main(args):
    host, port = args.addr.rsplit(":", 1)
    kw = dict(host=host, port=int(port), socket_timeout=5, socket_connect_timeout=5,
              decode_responses=True)
    if args.protocol != "default":
        kw["protocol"] = int(args.protocol)
    r = redis.Redis(**kw)
    strings = {f"scan:{i}" for i in range(N)}
    hashes = {f"scanh:{i}" for i in range(H)}

    def setup():
        pipe = r.pipeline(transaction=False)
        for k in strings:
            pipe.set(k, "v")
        for k in hashes:
            pipe.hset(k, "f", "v")
        pipe.execute()

    def scan_iter_match():
        got = list(r.scan_iter(match="scan:*", count=100))
        eq(set(got), strings, "scan_iter(match='scan:*')")
        # Each key once on this cluster (no hot keys here).
        eq(len(got), N, "scan_iter(match='scan:*') length")

    def scan_iter_all():
        got = set(r.scan_iter())
        missing = (strings | hashes) - got
        eq(sorted(missing)[:5], [], "keys scan_iter() missed")

    def scan_iter_type():
        eq(set(r.scan_iter(_type="hash", count=500)), hashes, "scan_iter(_type='hash')")

    def keys_dbsize():
        eq(set(r.keys("scanh:*")), hashes, "KEYS scanh:*")
        if r.dbsize() < N + H:
            fail(f"DBSIZE {r.dbsize()} < {N + H}")

    failed = 0
    for name, fn in [("setup", setup), ("scan_iter_match", scan_iter_match),
                     ("scan_iter_all", scan_iter_all), ("scan_iter_type", scan_iter_type),
                     ("keys_dbsize", keys_dbsize)]:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- report and go on
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"FAIL {name}: {type(e).__name__}: {e} (at line {where.lineno})", flush=True)
            failed += 1
        else:
            print(f"ok {name}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", required=True, help="HOST:PORT")
    p.add_argument("--protocol", choices=["default", "2", "3"], default="default")
    sys.exit(main(p.parse_args()))
