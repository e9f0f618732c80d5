#!/usr/bin/env python3
"""What following another replica's sidecars costs a respway-xds replica (issue 47).

Starts a one-member etcd on loopback and a "watcher" replica (`respway-xds serve --store
etcd://.../PREFIX --replica watcher`, no sidecar of its own), then runs the fan-out
benchmark against the same prefix (`fanout --clients N --rounds R --store ...`): its server
is another replica, whose N sidecars' rows (`PREFIX/nodes/fanout/NODE_ID`) it writes to
etcd and rewrites at each push. Every 100 ms the watcher's VmRSS and CPU time are sampled,
and every --metrics-every seconds (1) its `respway_xds_fleet_nodes_connected` (`GET
/metrics`, which builds the whole fleet's status: polled often, it adds its own copies of
every row to the RSS measured). Printed:

  - the watcher's RSS before the rows, with all N listed, and after the rounds: the cost
    per followed row;
  - how long from the first row it lists until it lists all N;
  - its CPU time over the run (the rows of the initial sync and of each push);
  - etcd's CPU time.

    perf/bench/fleet_rows.py target/release/respway-xds target/release/examples/fanout \
        [--clients 10000] [--rounds 3] [--metrics-every 1.0]

Loopback only. python3 stdlib only (and etcd). Every process it starts is stopped on exit.
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def fleet_nodes(admin):
    try:
        with urllib.request.urlopen(f"http://{admin}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("respway_xds_fleet_nodes_connected "):
                    return int(float(line.split()[1]))
    except OSError:
        pass
    return None


def wait_port(port, what, within=20):
    end = time.time() + within
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen on {port} within {within} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("xds")
    ap.add_argument("fanout")
    ap.add_argument("--clients", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--metrics-every", type=float, default=1.0)
    a = ap.parse_args()
    if not shutil.which("etcd"):
        sys.exit("etcd is not installed (Debian: etcd-server)")
    work = tempfile.mkdtemp(prefix="fleet-rows-")
    procs = []
    try:
        client, peer = free_port(), free_port()
        etcd = subprocess.Popen(
            ["etcd", "--name", "f", "--data-dir", f"{work}/etcd",
             "--listen-client-urls", f"http://127.0.0.1:{client}",
             "--advertise-client-urls", f"http://127.0.0.1:{client}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"f=http://127.0.0.1:{peer}",
             "--log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(etcd)
        wait_port(client, "etcd")
        url = f"etcd://127.0.0.1:{client}/rows{os.getpid()}"
        admin_port = free_port()
        admin = f"127.0.0.1:{admin_port}"
        os.makedirs(f"{work}/watcher")
        watcher = subprocess.Popen(
            [a.xds, "serve", "--resources", f"{work}/watcher",
             "--listen", f"127.0.0.1:{free_port()}", "--admin", admin,
             "--store", url, "--replica", "watcher"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(watcher)
        wait_port(admin_port, "the watcher's admin endpoint")
        time.sleep(1)
        rss0, cpu0, etcd_cpu0 = rss_kib(watcher.pid), cpu_s(watcher.pid), cpu_s(etcd.pid)
        fan = subprocess.Popen(
            [a.fanout, "--clients", str(a.clients), "--rounds", str(a.rounds), "--store", url],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(fan)
        samples = []  # (t, rss KiB, cpu s, nodes)
        start = time.time()
        asked = 0.0
        while fan.poll() is None and time.time() - start < 600:
            t = time.time() - start
            nodes = None
            if t >= asked:
                nodes, asked = fleet_nodes(admin), t + a.metrics_every
            samples.append((t, rss_kib(watcher.pid), cpu_s(watcher.pid), nodes))
            time.sleep(0.1)
        out = fan.stdout.read()
        print(out, end="")
        rss_end, cpu_end, etcd_cpu = rss_kib(watcher.pid), cpu_s(watcher.pid), cpu_s(etcd.pid)
        first = next((s for s in samples if s[3]), None)
        full = next((s for s in samples if s[3] is not None and s[3] >= a.clients), None)
        rss_full = max((s[1] for s in samples if full and s[0] >= full[0]), default=0)
        print(f"watcher: RSS before the rows {rss0 / 1024:.1f} MiB")
        if first and full:
            print(f"watcher: lists its first row {first[0]:.2f} s into the run, all "
                  f"{a.clients} {full[0] - first[0]:.2f} s later")
            print(f"watcher: peak RSS once all {a.clients} rows are listed {rss_full / 1024:.1f} MiB "
                  f"({(rss_full - rss0) / a.clients:.2f} KiB per row); after the rounds "
                  f"{rss_end / 1024:.1f} MiB ({(rss_end - rss0) / a.clients:.2f} KiB per row)")
        else:
            print(f"watcher: never listed all {a.clients} rows "
                  f"(last sample: {samples[-1][3] if samples else None})")
        print(f"watcher: CPU over the run {cpu_end - cpu0:.2f} s; etcd's {etcd_cpu - etcd_cpu0:.2f} s")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
