#!/usr/bin/env python3
"""redis-py (pinned in requirements.txt) pub/sub, used unchanged.

    python3 pubsub.py --addr SUB_HOST:PORT --pub-addr PUB_HOST:PORT [--protocol default|2|3]

Subscribes through `--addr` (channels and a pattern) with redis-py's PubSub, publishes through
`--pub-addr` (another sidecar, or the same server), and checks every message arrives exactly
once and in order per channel. Prints `ok NAME` / `FAIL NAME: reason`; exits 1 on a failure.
"""

import argparse
import sys
import time
import traceback

import redis


def client(addr, protocol):
    host, port = addr.rsplit(":", 1)
    kw = dict(host=host, port=int(port), socket_timeout=5, socket_connect_timeout=5)
    if protocol != "default":
        kw["protocol"] = int(protocol)
    return redis.Redis(**kw)


def text(v):
    return v.decode() if isinstance(v, bytes) else v


def messages(ps, n, limit=10.0):
    got = []
    deadline = time.monotonic() + limit
    while len(got) < n and time.monotonic() < deadline:
        m = ps.get_message(ignore_subscribe_messages=True, timeout=0.5)
        if m is not None:
            got.append(m)
    return got


def channels_and_pattern(args):
    sub = client(args.addr, args.protocol)
    pub = client(args.pub_addr, args.protocol)
    ps = sub.pubsub()
    chans = [f"news:{i}" for i in range(10)]
    ps.subscribe(*chans)
    ps.psubscribe("news:*")
    # The confirmations (10 + 1) come first.
    confirmed = 0
    deadline = time.monotonic() + 5
    while confirmed < 11 and time.monotonic() < deadline:
        m = ps.get_message(timeout=0.5)
        if m is not None and m["type"] in ("subscribe", "psubscribe"):
            confirmed += 1
    if confirmed != 11:
        raise AssertionError(f"{confirmed} confirmations of 11")
    for n in range(20):
        for c in chans:
            receivers = pub.publish(c, f"{c}#{n}")
            if receivers != 2:
                raise AssertionError(f"PUBLISH {c}: {receivers} receivers, want 2")
    got = messages(ps, 400)
    if len(got) != 400:
        raise AssertionError(f"{len(got)} messages of 400")
    direct, by_pattern = {}, {}
    for m in got:
        if m["type"] == "message":
            direct.setdefault(text(m["channel"]), []).append(text(m["data"]))
        elif m["type"] == "pmessage":
            if text(m["pattern"]) != "news:*":
                raise AssertionError(f"pattern {m['pattern']!r}")
            by_pattern.setdefault(text(m["channel"]), []).append(text(m["data"]))
        else:
            raise AssertionError(f"unexpected {m!r}")
    for c in chans:
        want = [f"{c}#{n}" for n in range(20)]
        if direct.get(c) != want or by_pattern.get(c) != want:
            raise AssertionError(f"{c}: {direct.get(c)} / {by_pattern.get(c)}")
    if messages(ps, 1, limit=0.5):
        raise AssertionError("a message more than published")
    ps.unsubscribe()
    ps.punsubscribe()
    ps.close()


def sharded(args):
    sub = client(args.addr, args.protocol)
    pub = client(args.pub_addr, args.protocol)
    ps = sub.pubsub()
    ps.ssubscribe("orders")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        m = ps.get_sharded_message(timeout=0.5)
        if m is not None and m["type"] == "ssubscribe":
            break
    else:
        raise AssertionError("no ssubscribe confirmation")
    if pub.spublish("orders", "o1") != 1:
        raise AssertionError("SPUBLISH receivers")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        m = ps.get_sharded_message(ignore_subscribe_messages=True, timeout=0.5)
        if m is not None:
            if (m["type"], text(m["channel"]), text(m["data"])) != ("smessage", "orders", "o1"):
                raise AssertionError(f"{m!r}")
            break
    else:
        raise AssertionError("no smessage")
    ps.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--pub-addr", required=True)
    ap.add_argument("--protocol", default="default")
    args = ap.parse_args()
    failed = False
    for name, f in [("channels_and_pattern", channels_and_pattern), ("sharded", sharded)]:
        try:
            f(args)
            print(f"ok {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - report every scenario
            failed = True
            print(f"FAIL {name}: {e}", flush=True)
            traceback.print_exc()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
