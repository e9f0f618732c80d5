#!/usr/bin/env python3
"""redis-py's RedisCluster (pinned in requirements.txt), used unchanged: walks that go node by
node over respway's emulated cluster (each node is asked for its own keys).

    python3 py_cluster_walk.py --addr HOST:PORT [--addr HOST:PORT ...] [--protocol default|2|3]

Expects an empty database behind the sidecars. Writes 1,000 string keys (`walk:N`) and 50
hashes (`walkh:N`), then checks that `scan_iter` over the cluster (every primary, one after
the other) returns each key exactly once, with MATCH, with TYPE and with neither; that `KEYS`
over every primary lists each once; that `DBSIZE` summed over the primaries, and each node's
own, count each key once (each node the keys of its slots); and that each node's `RANDOMKEY`
is a key of its slots. Prints `ok NAME` / `FAIL NAME: reason` per scenario and exits 1 if any
failed. The same script against a real Redis Cluster checks what it expects.
"""

import argparse
import collections
import sys
import traceback

from redis.cluster import ClusterNode, RedisCluster

N = 1000
H = 50


def fail(msg):
    raise AssertionError(msg)


def eq(got, want, what):
    if got != want:
        fail(f"{what}: got {got!r}, want {want!r}")


def once(keys, want, what):
    """`keys` holds each of `want` exactly once (and nothing else)."""
    twice = sorted(k for k, n in collections.Counter(keys).items() if n > 1)
    if twice:
        fail(f"{what}: {len(twice)} keys listed more than once, e.g. {twice[:5]}")
    missing = sorted(want - set(keys))
    extra = sorted(set(keys) - want)
    if missing or extra:
        fail(f"{what}: missing {missing[:5]} ({len(missing)}), extra {extra[:5]} ({len(extra)})")


def main(args):
    nodes = []
    for a in args.addr:
        host, port = a.rsplit(":", 1)
        nodes.append(ClusterNode(host, int(port)))
    kw = dict(startup_nodes=nodes, socket_timeout=5, socket_connect_timeout=5,
              decode_responses=True)
    if args.protocol != "default":
        kw["protocol"] = int(args.protocol)
    rc = RedisCluster(**kw)
    strings = {f"walk:{i}" for i in range(N)}
    hashes = {f"walkh:{i}" for i in range(H)}
    everything = strings | hashes
    primaries = rc.get_primaries()
    print(f"info {len(primaries)} primaries: "
          f"{sorted(f'{n.host}:{n.port}' for n in primaries)}", flush=True)

    def setup():
        pipe = rc.pipeline()
        for k in strings:
            pipe.set(k, "v")
        for k in hashes:
            pipe.hset(k, "f", "v")
        pipe.execute()

    def scan_iter_all():
        once(list(rc.scan_iter(count=100)), everything, "scan_iter()")

    def scan_iter_match():
        once(list(rc.scan_iter(match="walk:*", count=100)), strings, "scan_iter(match='walk:*')")

    def scan_iter_type():
        once(list(rc.scan_iter(_type="hash", count=500)), hashes, "scan_iter(_type='hash')")

    def keys_every_primary():
        once(rc.keys("walkh:*", target_nodes=RedisCluster.PRIMARIES), hashes,
             "KEYS walkh:* on every primary")

    def dbsize():
        sizes = {n.name: rc.dbsize(target_nodes=n) for n in primaries}
        eq(sum(sizes.values()), N + H, f"DBSIZE summed over the primaries {sizes}")
        for n in primaries:
            mine = sum(1 for k in everything
                       if rc.nodes_manager.get_node_from_slot(rc.keyslot(k)).name == n.name)
            eq(sizes[n.name], mine, f"DBSIZE of {n.name} (the keys of its slots)")

    def randomkey():
        for n in primaries:
            for _ in range(20):
                k = rc.randomkey(target_nodes=n)
                if k is None:
                    fail(f"RANDOMKEY of {n.name}: nil")
                owner = rc.nodes_manager.get_node_from_slot(rc.keyslot(k)).name
                eq(owner, n.name, f"the node of RANDOMKEY {k!r} of {n.name}")

    failed = 0
    for name, fn in [("setup", setup), ("scan_iter_all", scan_iter_all),
                     ("scan_iter_match", scan_iter_match), ("scan_iter_type", scan_iter_type),
                     ("keys_every_primary", keys_every_primary), ("dbsize", dbsize),
                     ("randomkey", randomkey)]:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- report and go on
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"FAIL {name}: {type(e).__name__}: {e} (at line {where.lineno})", flush=True)
            failed += 1
        else:
            print(f"ok {name}", flush=True)
    rc.close()
    return 1 if failed else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", required=True, action="append", help="HOST:PORT (repeatable)")
    p.add_argument("--protocol", choices=["default", "2", "3"], default="default")
    sys.exit(main(p.parse_args()))
