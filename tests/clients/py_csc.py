#!/usr/bin/env python3
"""redis-py (pinned in requirements.txt) client-side caching through respway, used unchanged.

    python3 py_csc.py --addr RESPWAY_HOST:PORT --shard SHARD_HOST:PORT

Reads through `--addr` with `protocol=3` and `cache_config=CacheConfig()` (redis-py sends
`CLIENT TRACKING ON` and keeps replies until an `invalidate` push names their keys), writes
directly on the shard behind it (`--shard`), through another client of respway, and through
the caching client itself, and checks that repeated reads are answered by the client's cache
(the shard sees no more GETs) and that every write is seen. Prints `ok NAME` / `FAIL NAME:
reason`; exits 1 on a failure.
"""

import argparse
import sys
import time
import traceback

import redis
from redis.cache import CacheConfig


def client(addr, **kw):
    host, port = addr.rsplit(":", 1)
    return redis.Redis(host=host, port=int(port), socket_timeout=5, socket_connect_timeout=5, **kw)


def gets(shard):
    return shard.info("commandstats").get("cmdstat_get", {}).get("calls", 0)


def seen(r, key, want, limit=2.0):
    """True once `r.get(key)` answers `want` (polled every 10 ms for at most `limit` s)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if r.get(key) == want:
            return True
        time.sleep(0.01)
    return False


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--addr", required=True)
    p.add_argument("--shard", required=True)
    a = p.parse_args()
    failures = 0
    r = client(a.addr, protocol=3, cache_config=CacheConfig())
    other = client(a.addr)
    shard = client(a.shard)
    key = "csc:key"

    def check(name, fn):
        nonlocal failures
        try:
            fn()
            print(f"ok {name}")
        except Exception as e:  # noqa: BLE001 - every failure is reported by name
            failures += 1
            print(f"FAIL {name}: {e!r}")
            traceback.print_exc()

    def served_by_the_cache():
        shard.set(key, "v1")
        assert r.get(key) == b"v1"
        before = gets(shard)
        for _ in range(20):
            assert r.get(key) == b"v1"
        after = gets(shard)
        assert after == before, f"the shard saw {after - before} GETs for 20 cached reads"

    def a_direct_write_is_seen():
        assert r.get(key) == b"v1"
        shard.set(key, "v2")
        assert seen(r, key, b"v2"), "the shard's write was never seen"

    def a_write_through_another_client_is_seen():
        assert r.get(key) == b"v2"
        other.set(key, "v3")
        assert seen(r, key, b"v3"), "the other client's write was never seen"

    def the_clients_own_write_is_seen_at_once():
        assert r.get(key) == b"v3"
        r.set(key, "v4")
        assert r.get(key) == b"v4", "read after the client's own write"

    def a_flush_empties_the_cache():
        r.set("csc:other", "x")
        assert r.get("csc:other") == b"x"
        assert r.get(key) == b"v4"
        other.flushdb()
        assert seen(r, key, None), "FLUSHDB was never seen"
        assert r.get("csc:other") is None

    check("served_by_the_cache", served_by_the_cache)
    check("a_direct_write_is_seen", a_direct_write_is_seen)
    check("a_write_through_another_client_is_seen", a_write_through_another_client_is_seen)
    check("the_clients_own_write_is_seen_at_once", the_clients_own_write_is_seen_at_once)
    check("a_flush_empties_the_cache", a_flush_empties_the_cache)
    r.close()
    other.close()
    shard.close()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
