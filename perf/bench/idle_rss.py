#!/usr/bin/env python3
"""What an idle client connection costs respway in RSS (issue 9).

Starts one redis-server and, for every measurement, a fresh respway (--workers 1) in
front of it, then:

  a  connect N clients, nothing sent
  b  connect N clients, each sends PING and reads +PONG
  c  connect N clients, each sends SET key <64 B> and GET key, reads both replies
  d  churn: ROUNDS rounds of (open CHURN_N clients, PING each, close all)
  e  connect N clients, each sends GET of a 16 KiB value and reads it

For a-c: respway's VmRSS (from /proc/PID/status) after startup and one warm-up
connection, again 2 s after the N clients are connected (and served), and again 2 s
after all of them are closed and respway has closed its side. The per-connection cost
is (RSS_connected - RSS_before) / N. For d: RSS 2 s after the last round.

Each mode runs --repeat times (a fresh respway each time); medians are printed, and
with --json every run is written out.

    perf/bench/idle_rss.py target/release/respway [--env MALLOC_ARENA_MAX=1] \
        [--env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2] [--repeat 3]

Loopback only. python3 stdlib only. Every process it starts is stopped on exit.
"""

import argparse
import json
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BATCH = 500  # connections opened (or served) before waiting for respway to catch up


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        target = 1 << 20
    else:
        target = hard
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def status(pid):
    """VmRSS, RssAnon, VmHWM in KiB from /proc/PID/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM", "Threads"):
                out[k] = int(v.split()[0])
    return out


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_port(port, proc, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} not listening after {timeout}s")


def wait_fds(pid, pred, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        n = fd_count(pid)
        if pred(n):
            return n
        if time.monotonic() > deadline:
            raise RuntimeError(f"respway fd count {n}: timed out waiting for {what}")
        time.sleep(0.01)


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise RuntimeError(f"connection closed after {buf!r}")
        buf += chunk
    return buf


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


PING = resp("PING")
VALUE = b"v" * 64
BIG_VALUE = b"b" * 16384  # mode e: one 16 KiB reply each


def expect(s, want):
    got = recv_exact(s, len(want))
    if got != want:
        raise RuntimeError(f"expected {want!r}, got {got!r}")


class SourceAddrs:
    """Hands out a fresh 127.x.y.z source address per group of connections, so that the
    client-side TIME_WAIT sockets of earlier groups never exhaust the ephemeral ports."""

    def __init__(self):
        self.n = random.randrange(1 << 16) << 8

    def next(self):
        self.n += 1
        x = (self.n % ((1 << 24) - 2)) + 1
        return f"127.{(x >> 16) & 255}.{(x >> 8) & 255}.{x & 255 or 1}"


def open_clients(pid, port, n, src, base_fds):
    """Opens n connections in batches, waiting after each batch until respway has
    accepted all of them (its fd count), so the 1024-deep accept queue never overflows."""
    socks = []
    while len(socks) < n:
        for _ in range(min(BATCH, n - len(socks))):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.bind((src, 0))
            s.settimeout(10.0)
            s.connect(("127.0.0.1", port))
            socks.append(s)
        want = base_fds + len(socks)
        wait_fds(pid, lambda c: c >= want, f"{want} fds (accepted clients)")
    return socks


def serve_clients(socks, mode, tag):
    for i in range(0, len(socks), BATCH):
        batch = socks[i : i + BATCH]
        if mode == "ping":
            for s in batch:
                s.sendall(PING)
            for s in batch:
                expect(s, b"+PONG\r\n")
        elif mode == "setget":
            for j, s in enumerate(batch):
                s.sendall(resp("SET", f"idle:{tag}:{i + j}", VALUE))
            for s in batch:
                expect(s, b"+OK\r\n")
            for j, s in enumerate(batch):
                s.sendall(resp("GET", f"idle:{tag}:{i + j}"))
            for s in batch:
                expect(s, b"$64\r\n" + VALUE + b"\r\n")
        elif mode == "big":
            for s in batch:
                s.sendall(resp("GET", "idle:big"))
            for s in batch:
                expect(s, b"$16384\r\n" + BIG_VALUE + b"\r\n")


def close_clients(pid, socks, base_fds):
    for s in socks:
        s.close()
    socks.clear()
    wait_fds(pid, lambda c: c <= base_fds, f"fds back to {base_fds} (clients closed)")


class Respway:
    def __init__(self, binary, redis_port, env, logdir):
        self.port = free_port()
        self.cfg = os.path.join(logdir, f"respway-{self.port}.yaml")
        with open(self.cfg, "w") as f:
            f.write(
                "listeners:\n"
                "  - name: main\n"
                f"    address: 127.0.0.1:{self.port}\n"
                "    routes:\n"
                "      catch_all: main\n"
                "clusters:\n"
                "  - name: main\n"
                "    shards:\n"
                "      - name: s0\n"
                "        endpoints:\n"
                f'          - {{ address: "127.0.0.1:{redis_port}", role: primary }}\n'
            )
        penv = dict(os.environ)
        penv.update(env)
        self.log = open(os.path.join(logdir, f"respway-{self.port}.log"), "wb")
        self.proc = subprocess.Popen(
            [binary, "--config", self.cfg, "--workers", "1"],
            env=penv,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.pid = self.proc.pid
        wait_port(self.port, self.proc)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()


def warm_up(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10.0) as s:
        s.sendall(PING)
        expect(s, b"+PONG\r\n")
        s.sendall(resp("SET", "idle:warm", VALUE))
        expect(s, b"+OK\r\n")
        s.sendall(resp("SET", "idle:big", BIG_VALUE))
        expect(s, b"+OK\r\n")


def kib(v):
    return round(v, 2)


def measure_idle(binary, redis_port, env, logdir, mode, n, src, settle):
    rw = Respway(binary, redis_port, env, logdir)
    socks = []
    try:
        warm_up(rw.port)
        time.sleep(settle)
        base_fds = wait_fds(rw.pid, lambda c: True, "")
        before = status(rw.pid)
        socks = open_clients(rw.pid, rw.port, n, src.next(), base_fds)
        serve_clients(socks, mode, rw.port)
        time.sleep(settle)
        connected = status(rw.pid)
        close_clients(rw.pid, socks, base_fds)
        time.sleep(settle)
        after = status(rw.pid)
        if rw.proc.poll() is not None:
            raise RuntimeError(f"respway exited with {rw.proc.returncode}")
        return {
            "mode": mode,
            "n": n,
            "rss_before_kib": before["VmRSS"],
            "rss_connected_kib": connected["VmRSS"],
            "rss_after_close_kib": after["VmRSS"],
            "anon_before_kib": before["RssAnon"],
            "anon_connected_kib": connected["RssAnon"],
            "anon_after_close_kib": after["RssAnon"],
            "hwm_kib": after["VmHWM"],
            "threads": connected["Threads"],
            "kib_per_conn": kib((connected["VmRSS"] - before["VmRSS"]) / n),
            "anon_kib_per_conn": kib((connected["RssAnon"] - before["RssAnon"]) / n),
            "after_close_minus_before_kib": after["VmRSS"] - before["VmRSS"],
        }
    finally:
        for s in socks:
            s.close()
        rw.stop()


def measure_churn(binary, redis_port, env, logdir, n, rounds, src, settle):
    rw = Respway(binary, redis_port, env, logdir)
    socks = []
    try:
        warm_up(rw.port)
        time.sleep(settle)
        base_fds = wait_fds(rw.pid, lambda c: True, "")
        before = status(rw.pid)
        per_round = []
        for r in range(rounds):
            socks = open_clients(rw.pid, rw.port, n, src.next(), base_fds)
            serve_clients(socks, "ping", rw.port)
            close_clients(rw.pid, socks, base_fds)
            per_round.append(status(rw.pid)["VmRSS"])
        time.sleep(settle)
        after = status(rw.pid)
        if rw.proc.poll() is not None:
            raise RuntimeError(f"respway exited with {rw.proc.returncode}")
        return {
            "mode": "churn",
            "n": n,
            "rounds": rounds,
            "rss_before_kib": before["VmRSS"],
            "rss_after_churn_kib": after["VmRSS"],
            "anon_after_churn_kib": after["RssAnon"],
            "hwm_kib": after["VmHWM"],
            "rss_per_round_kib": per_round,
            "after_churn_minus_before_kib": after["VmRSS"] - before["VmRSS"],
        }
    finally:
        for s in socks:
            s.close()
        rw.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", help="respway binary, e.g. target/release/respway")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VAL",
                    help="environment variable for respway (repeatable)")
    ap.add_argument("-n", type=int, default=10_000, help="idle clients for modes a-c")
    ap.add_argument("--churn-n", type=int, default=5_000, help="clients per churn round")
    ap.add_argument("--rounds", type=int, default=20, help="churn rounds")
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode (fresh respway each)")
    ap.add_argument("--modes", default="a,b,c,d", help="subset of a,b,c,d,e")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds to wait before each RSS read")
    ap.add_argument("--redis-server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    ap.add_argument("--json", help="write every run's figures to this file")
    args = ap.parse_args()

    env = {}
    for kv in args.env:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            ap.error(f"--env wants KEY=VAL, got {kv!r}")
        env[k] = v
    if "LD_PRELOAD" in env and not all(os.path.exists(p) for p in env["LD_PRELOAD"].split(":") if p):
        ap.error(f"LD_PRELOAD names a missing file: {env['LD_PRELOAD']}")

    soft, hard = raise_nofile()
    need = max(args.n, args.churn_n) + 64
    if soft < need:
        sys.exit(f"RLIMIT_NOFILE is {soft} (hard {hard}); {need} needed")
    binary = os.path.abspath(args.binary)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    label = " ".join(f"{k}={v}" for k, v in env.items()) or "glibc default"
    print(f"# {label}: {binary}, N={args.n}, churn {args.rounds} x {args.churn_n}, "
          f"repeat {args.repeat}, RLIMIT_NOFILE {soft}", flush=True)

    logdir = tempfile.mkdtemp(prefix="idle_rss.")
    redis_port = free_port()
    redis = subprocess.Popen(
        [args.redis_server, "--port", str(redis_port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    src = SourceAddrs()
    runs = []
    try:
        wait_port(redis_port, redis)
        for rep in range(args.repeat):
            for m in modes:
                if m == "d":
                    r = measure_churn(binary, redis_port, env, logdir, args.churn_n,
                                      args.rounds, src, args.settle)
                    print(f"  run {rep + 1} d churn: RSS before {r['rss_before_kib']} KiB, "
                          f"after churn {r['rss_after_churn_kib']} KiB, "
                          f"peak {r['hwm_kib']} KiB", flush=True)
                else:
                    mode = {"a": "connect", "b": "ping", "c": "setget", "e": "big"}[m]
                    r = measure_idle(binary, redis_port, env, logdir, mode, args.n, src,
                                     args.settle)
                    print(f"  run {rep + 1} {m} {mode}: {r['kib_per_conn']} KiB/conn "
                          f"(anon {r['anon_kib_per_conn']}), RSS {r['rss_before_kib']} -> "
                          f"{r['rss_connected_kib']} -> after close {r['rss_after_close_kib']} KiB",
                          flush=True)
                r["repeat"] = rep
                r["env"] = env
                runs.append(r)
    finally:
        redis.send_signal(signal.SIGKILL)
        redis.wait()
        shutil.rmtree(logdir, ignore_errors=True)

    summary = {}
    print(f"# medians over {args.repeat} run(s), {label}")
    for m in modes:
        if m == "d":
            rs = [r for r in runs if r["mode"] == "churn"]
            s = {k: statistics.median(r[k] for r in rs)
                 for k in ("rss_before_kib", "rss_after_churn_kib", "hwm_kib")}
            print(f"d churn: RSS before {s['rss_before_kib']} KiB, after churn "
                  f"{s['rss_after_churn_kib']} KiB, peak {s['hwm_kib']} KiB")
        else:
            mode = {"a": "connect", "b": "ping", "c": "setget", "e": "big"}[m]
            rs = [r for r in runs if r["mode"] == mode]
            s = {k: statistics.median(r[k] for r in rs)
                 for k in ("kib_per_conn", "anon_kib_per_conn", "rss_before_kib",
                           "rss_connected_kib", "rss_after_close_kib", "hwm_kib")}
            print(f"{m} {mode}: {s['kib_per_conn']} KiB/conn (anon {s['anon_kib_per_conn']}), "
                  f"RSS before {s['rss_before_kib']}, connected {s['rss_connected_kib']}, "
                  f"after close {s['rss_after_close_kib']} KiB")
        summary[m] = s
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "binary": binary, "n": args.n, "churn_n": args.churn_n,
                       "rounds": args.rounds, "summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
