#!/usr/bin/env python3
"""redis-py's RedisCluster (pinned in requirements.txt), used unchanged, through respway's
cluster emulation.

    python3 py_cluster.py --addr HOST:PORT [--addr HOST:PORT ...] [--protocol default|2|3]
    python3 py_cluster.py --addr HOST:PORT --refused

The client starts from the given addresses (its startup nodes) and must see exactly them as
the cluster's primaries (every slot covered). Prints one line per scenario (`ok NAME`,
`FAIL NAME: reason`) and exits 1 if any failed. With `--refused` it expects RedisCluster not
to start, prints `refused TYPE: MESSAGE` and exits 0 (1 if it started).
"""

import argparse
import sys
import time
import traceback

import redis
from redis.cluster import ClusterNode, RedisCluster

KEYS = 1000


def fail(msg):
    raise AssertionError(msg)


def eq(got, want, what):
    if got != want:
        fail(f"{what}: got {got!r}, want {want!r}")


class Run:
    def __init__(self, args):
        self.addrs = []
        for a in args.addr:
            host, port = a.rsplit(":", 1)
            self.addrs.append((host, int(port)))
        self.protocol = args.protocol
        self.rc = None

    def client(self):
        kw = dict(
            startup_nodes=[ClusterNode(h, p) for h, p in self.addrs],
            socket_timeout=5,
            socket_connect_timeout=5,
            decode_responses=True,
        )
        if self.protocol != "default":
            kw["protocol"] = int(self.protocol)
        return RedisCluster(**kw)

    # --- scenarios -------------------------------------------------------------------------

    def topology(self):
        nodes = sorted((n.host, n.port) for n in self.rc.get_primaries())
        eq(nodes, sorted(self.addrs), "primaries")
        eq(self.rc.get_replicas(), [], "replicas")
        for slot in (0, 8191, 8192, 16383):
            node = self.rc.nodes_manager.get_node_from_slot(slot)
            if node is None:
                fail(f"slot {slot} has no node")

    def set_get(self):
        rc = self.rc
        for i in range(50):
            eq(rc.set(f"sg:{i}", f"v{i}"), True, f"SET sg:{i}")
        for i in range(50):
            eq(rc.get(f"sg:{i}"), f"v{i}", f"GET sg:{i}")

    def pipeline(self):
        rc = self.rc
        keys = [f"p:{i}" for i in range(200)]
        pipe = rc.pipeline()
        for i, k in enumerate(keys):
            pipe.set(k, i)
        for k in keys:
            pipe.get(k)
        got = pipe.execute()
        eq(got[:200], [True] * 200, "pipelined SETs")
        eq(got[200:], [str(i) for i in range(200)], "pipelined GETs")

    def mget_many_slots(self):
        rc = self.rc
        keys = [f"m:{i}" for i in range(300)]
        slots = {rc.keyslot(k) for k in keys}
        if len(slots) < 100:
            fail(f"the keys span only {len(slots)} slots")
        replies = rc.mset_nonatomic({k: k.upper() for k in keys})
        if not replies or not all(r is True for r in replies):
            fail(f"MSET over many slots: {replies!r}")
        eq(rc.mget_nonatomic(keys), [k.upper() for k in keys], "MGET over many slots")

    def transaction(self):
        rc = self.rc
        rc.delete("{tx}:a", "{tx}:n")
        with rc.pipeline(transaction=True) as p:
            p.set("{tx}:a", "1").incr("{tx}:n").incr("{tx}:n").get("{tx}:a")
            # redis-py 8.1 leaves SET's reply in a cluster transaction as "OK" (not True).
            got = [True if r == "OK" else r for r in p.execute()]
            eq(got, [True, 1, 2, "1"], "MULTI/EXEC on one hashtag")
        eq(rc.get("{tx}:n"), "2", "after EXEC")

    def pubsub(self):
        rc = self.rc
        ps = rc.pubsub()
        try:
            ps.subscribe("news")
            deadline = time.monotonic() + 5
            msg = None
            while msg is None or msg["type"] != "subscribe":
                if time.monotonic() > deadline:
                    fail("no subscribe confirmation")
                msg = ps.get_message(timeout=0.2)
            receivers = rc.publish("news", "hello")
            eq(receivers, 1, "PUBLISH receivers")
            msg = None
            while msg is None:
                if time.monotonic() > deadline:
                    fail("no message")
                msg = ps.get_message(ignore_subscribe_messages=True, timeout=0.2)
            eq((msg["channel"], msg["data"]), ("news", "hello"), "message")
        finally:
            ps.close()

    def keyspace(self):
        rc = self.rc
        keys = [f"ks:{i}" for i in range(KEYS)]
        pipe = rc.pipeline()
        for k in keys:
            pipe.set(k, f"={k}")
        eq(pipe.execute(), [True] * KEYS, "SET of every key")
        eq(rc.mget_nonatomic(keys), [f"={k}" for k in keys], "every key read back")
        # And one by one, each read by the node that owns its slot.
        for k in keys[:: KEYS // 100]:
            eq(rc.get(k), f"={k}", f"GET {k}")

    # --- driver ----------------------------------------------------------------------------

    def refused(self):
        try:
            rc = self.client()
        except Exception as e:  # noqa: BLE001 -- the point: what it says
            print(f"refused {type(e).__name__}: {e}", flush=True)
            return 0
        print(f"FAIL refused: RedisCluster started with {len(rc.get_nodes())} nodes",
              flush=True)
        rc.close()
        return 1

    def main(self):
        print(f"info redis-py {redis.__version__} protocol={self.protocol}", flush=True)
        try:
            self.rc = self.client()
        except Exception as e:  # noqa: BLE001
            print(f"FAIL start: {type(e).__name__}: {e}", flush=True)
            return 1
        failed = 0
        for name in ["topology", "set_get", "pipeline", "mget_many_slots", "transaction",
                     "pubsub", "keyspace"]:
            try:
                getattr(self, name)()
            except Exception as e:  # noqa: BLE001 -- report and go on
                where = traceback.extract_tb(e.__traceback__)[-1]
                print(f"FAIL {name}: {type(e).__name__}: {e} "
                      f"(at {where.filename.rsplit('/', 1)[-1]}:{where.lineno})", flush=True)
                failed += 1
            else:
                print(f"ok {name}", flush=True)
        self.rc.close()
        return 1 if failed else 0


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", required=True, action="append", help="HOST:PORT (repeatable)")
    p.add_argument("--protocol", choices=["default", "2", "3"], default="default")
    p.add_argument("--refused", action="store_true",
                   help="expect RedisCluster not to start, and print why")
    return p.parse_args()


if __name__ == "__main__":
    args = parse()
    run = Run(args)
    sys.exit(run.refused() if args.refused else run.main())
