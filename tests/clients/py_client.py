#!/usr/bin/env python3
"""redis-py (pinned in requirements.txt), used unchanged, against one address.

    python3 py_client.py --addr 127.0.0.1:PORT [--protocol default|2|3] [--proxy]

Prints one line per scenario (`ok NAME`, `FAIL NAME: reason`, `skip NAME: reason`) and exits
1 if any scenario failed. `--protocol default` constructs the client with no `protocol`
argument at all (redis-py 8.1.0 then says HELLO 3). `--proxy` adds what only a sharding
proxy can do (`tx_crossslot`); a single plain redis-server is not a cluster.

The clients are the library's defaults except for a socket timeout, so that a scenario that
gets no answer fails alone instead of stalling the whole run.
"""

import argparse
import sys
import traceback

import redis

# Hash tags that crc16_slots puts on three different shards of three (Redis Cluster slots
# 15495, 3300 and 7365 of the even split 0-5460 / 5461-10922 / 10923-16383); tests/clients.rs
# checks that they do before it runs this script through respway.
CROSS_TAGS = ["a", "b", "c"]
# Keys for EVALSHA: tags 1, 2, 3 as named in the brief, plus a, b, c so every shard is hit.
ES_KEYS = ["es:{1}", "es:{2}", "es:{3}", "es:{a}", "es:{b}", "es:{c}"]

GET_SCRIPT = "return redis.call('GET', KEYS[1])"


def fail(msg):
    raise AssertionError(msg)


def eq(got, want, what):
    if got != want:
        fail(f"{what}: got {got!r}, want {want!r}")


def text(v):
    return v.decode() if isinstance(v, bytes) else v


class Run:
    def __init__(self, args):
        host, port = args.addr.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.protocol = args.protocol
        self.proxy = args.proxy
        self.r = self.client()
        self.negotiated = None

    def client(self, **extra):
        kw = dict(host=self.host, port=self.port, socket_timeout=5, socket_connect_timeout=5)
        if self.protocol != "default":
            kw["protocol"] = int(self.protocol)
        kw.update(extra)
        return redis.Redis(**kw)

    def negotiated_protocol(self):
        """The RESP version of a live connection of the client: its HELLO answer when it sent
        HELLO, else 2."""
        pool = self.r.connection_pool
        conn = pool.get_connection()
        try:
            conn.connect()
            meta = conn.handshake_metadata
            if meta:
                return int(meta.get(b"proto", meta.get("proto")))
            return int(conn.protocol)
        finally:
            pool.release(conn)

    # --- scenarios -------------------------------------------------------------------------

    def pipeline(self):
        r = self.r
        keys = [f"p:{i}" for i in range(200)]
        r.delete(*keys)
        pipe = r.pipeline(transaction=False)
        for i, k in enumerate(keys):
            pipe.set(k, f"v{i}")
        for k in keys:
            pipe.get(k)
        res = pipe.execute()
        eq(len(res), 400, "reply count")
        for i in range(200):
            eq(res[i], True, f"SET {keys[i]}")
            eq(res[200 + i], f"v{i}".encode(), f"GET {keys[i]}")
        r.delete(*keys)

    def mget_mset(self):
        r = self.r
        keys = [f"m:{i}" for i in range(20)]
        missing = ["m:missing:1", "m:missing:2"]
        r.delete(*keys, *missing)
        eq(r.mset({k: f"val{i}" for i, k in enumerate(keys)}), True, "MSET")
        asked = keys[:3] + [missing[0]] + keys[3:] + [missing[1]]
        got = r.mget(asked)
        want = [None if k in missing else f"val{keys.index(k)}".encode() for k in asked]
        eq(got, want, "MGET")
        r.delete(*keys)

    def tx_commit(self):
        r = self.r
        r.delete("{tx}a", "{tx}b")
        pipe = r.pipeline(transaction=True)
        pipe.set("{tx}a", 1)
        pipe.incr("{tx}a")
        pipe.set("{tx}b", "x")
        eq(pipe.execute(), [True, 2, True], "EXEC results")
        eq(r.get("{tx}a"), b"2", "{tx}a after EXEC")
        eq(r.get("{tx}b"), b"x", "{tx}b after EXEC")
        r.delete("{tx}a", "{tx}b")

    def tx_crossslot(self):
        r = self.r
        keys = [f"{{{t}}}cross" for t in CROSS_TAGS]
        r.delete(*keys)
        pipe = r.pipeline(transaction=True)
        for k in keys:
            pipe.set(k, 1)
        try:
            res = pipe.execute()
        except redis.ResponseError as e:
            err = str(e)
        else:
            fail(f"EXEC over {keys} did not raise: {res!r}")
        for k in keys:
            eq(r.get(k), None, f"{k} after the refused transaction (error was: {err})")

    def watch_conflict(self):
        r = self.r
        other = self.client()
        r.set("{w}k", "orig")
        with r.pipeline(transaction=True) as pipe:
            pipe.watch("{w}k")
            eq(other.set("{w}k", "changed"), True, "SET from the second client")
            pipe.multi()
            pipe.set("{w}k", "mine")
            try:
                res = pipe.execute()
            except redis.WatchError:
                pass
            else:
                fail(f"EXEC after a conflicting write did not raise WatchError: {res!r}")
        eq(r.get("{w}k"), b"changed", "{w}k after the aborted transaction")
        other.close()
        r.delete("{w}k")

    def lock(self):
        r = self.r
        r.delete("lk:{1}")
        lk = r.lock("lk:{1}", timeout=5)
        eq(lk.acquire(blocking=False), True, "acquire")
        eq(lk.owned(), True, "owned after acquire")
        eq(lk.locked(), True, "locked after acquire")
        lk.extend(5)  # a Lua script too
        lk.release()  # a Lua script (EVALSHA, SCRIPT LOAD on NOSCRIPT)
        eq(lk.locked(), False, "locked after release")
        eq(r.get("lk:{1}"), None, "lock key after release")

    def evalsha(self):
        r = self.r
        sha = r.script_load(GET_SCRIPT)
        eq(len(sha), 40, f"SCRIPT LOAD sha {sha!r}")
        r.delete(*ES_KEYS)
        for k in ES_KEYS:
            r.set(k, f"v-{k}")
        for k in ES_KEYS:
            eq(r.evalsha(sha, 1, k), f"v-{k}".encode(), f"EVALSHA for {k}")
        eq(r.script_exists(sha), [True], "SCRIPT EXISTS")
        r.delete(*ES_KEYS)

    def select_db1(self):
        r0 = self.r
        r1 = self.client(db=1)
        r0.delete("sel:k")
        r1.delete("sel:k")
        eq(r1.set("sel:k", "one"), True, "SET in db 1")
        eq(r0.get("sel:k"), None, "GET in db 0")
        eq(r1.get("sel:k"), b"one", "GET in db 1")
        eq(r1.delete("sel:k"), 1, "DEL in db 1")
        r1.close()

    def wants_resp3(self):
        """True when the client asks for RESP3: explicitly, or by the library's default."""
        if self.protocol == "default":
            return redis.utils.DEFAULT_RESP_VERSION == 3
        return self.protocol == "3"

    def resp3_types(self):
        r = self.r
        eq(self.negotiated_protocol(), 3, "negotiated RESP version")
        r.delete("h:{t}", "s:{t}", "z:{t}")
        r.hset("h:{t}", "f", "v")
        r.sadd("s:{t}", "a", "b")
        r.zadd("z:{t}", {"m": 1.5})
        # What the application sees (with redis-py's default response shapes).
        eq(r.hgetall("h:{t}"), {b"f": b"v"}, "HGETALL")
        eq(r.smembers("s:{t}"), {b"a", b"b"}, "SMEMBERS")
        score = r.zscore("z:{t}", "m")
        eq((type(score), score), (float, 1.5), "ZSCORE")
        # What came on the wire: the RESP3 parser's own types, before any response callback
        # (a map is a dict and a double a float; on RESP2 they would be an array and a bulk).
        pool = r.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_command("HGETALL", "h:{t}")
            eq(conn.read_response(), {b"f": b"v"}, "raw HGETALL (map)")
            conn.send_command("SMEMBERS", "s:{t}")
            raw = conn.read_response()
            # redis-py's RESP3 parser reads a set reply (~) as a list, "for predictability".
            eq((type(raw), sorted(raw)), (list, [b"a", b"b"]), "raw SMEMBERS (set as list)")
            conn.send_command("ZSCORE", "z:{t}", "m")
            raw = conn.read_response()
            eq((type(raw), raw), (float, 1.5), "raw ZSCORE (double)")
        finally:
            pool.release(conn)
        r.delete("h:{t}", "s:{t}", "z:{t}")

    def connection(self):
        r = self.r
        eq(r.ping(), True, "PING")
        eq(r.echo("hello"), b"hello", "ECHO")
        # CLIENT SETNAME/GETNAME on one connection (a pool may hand out another one).
        pool = r.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_command("CLIENT", "SETNAME", "respway-py")
            eq(text(conn.read_response()), "OK", "CLIENT SETNAME")
            conn.send_command("CLIENT", "GETNAME")
            eq(text(conn.read_response()), "respway-py", "CLIENT GETNAME")
        finally:
            pool.release(conn)
        cid = r.client_id()
        if type(cid) is not int:
            fail(f"CLIENT ID is not an integer: {cid!r}")
        t = r.time()
        eq(len(t), 2, f"TIME {t!r} length")
        info = r.info("server")
        if "redis_version" not in info:
            fail(f"INFO server has no redis_version: {sorted(info)[:10]!r}")

    # --- driver ----------------------------------------------------------------------------

    def main(self):
        failed = 0
        try:
            self.negotiated = self.negotiated_protocol()
            print(f"info redis-py {redis.__version__} protocol={self.protocol} "
                  f"negotiated RESP{self.negotiated}", flush=True)
        except Exception as e:  # noqa: BLE001 -- every scenario will say more
            print(f"info redis-py {redis.__version__}: first connection failed: "
                  f"{type(e).__name__}: {e}", flush=True)
        scenarios = [
            ("pipeline", None),
            ("mget_mset", None),
            ("tx_commit", None),
            ("tx_crossslot", None if self.proxy else "needs --proxy (a sharded cluster)"),
            ("watch_conflict", None),
            ("lock", None),
            ("evalsha", None),
            ("select_db1", None),
            ("resp3_types", None if self.wants_resp3() else "the client asked for RESP2"),
            ("connection", None),
        ]
        for name, skip in scenarios:
            if skip:
                print(f"skip {name}: {skip}", flush=True)
                continue
            try:
                getattr(self, name)()
            except Exception as e:  # noqa: BLE001 -- report and go on
                where = traceback.extract_tb(e.__traceback__)[-1]
                print(f"FAIL {name}: {type(e).__name__}: {e} "
                      f"(at {where.filename.rsplit('/', 1)[-1]}:{where.lineno})", flush=True)
                failed += 1
            else:
                print(f"ok {name}", flush=True)
        return 1 if failed else 0


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", required=True, help="HOST:PORT")
    p.add_argument("--protocol", choices=["default", "2", "3"], default="default")
    p.add_argument("--proxy", action="store_true", help="also run the proxy-only scenarios")
    return p.parse_args()


if __name__ == "__main__":
    sys.exit(Run(parse()).main())
