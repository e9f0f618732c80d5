#!/usr/bin/env python3
"""Generate respway-filters' Redis command table (filters/src/command_table.rs) and COMMANDS.md.

The table is taken from a real redis-server's own `COMMAND` reply (names, arity, flags,
legacy first/last/step, ACL categories, key specs and subcommands), so it matches the
server exactly. The proxy's class of every command (see `CommandClass` in command.rs) is
decided here by the rules in `classify()`, and embedded in the generated file.

Usage (from anywhere; paths are relative to this script):

    python3 filters/scripts/gen_command_table.py            # regenerate the table
    python3 filters/scripts/gen_command_table.py --check    # exit 1 if either file is out of date

What it does: starts `redis-server --port 0 --unixsocket <tmp>/redis.sock` (no TCP, no
persistence) in a temporary directory, runs `redis-cli -3 --json COMMAND` and a list of
`COMMAND GETKEYS` probes against it, stops the server, renders Rust source, pipes it
through `rustfmt --edition 2021` and writes (or, with --check, compares) the result. It
also renders COMMANDS.md at the repository root: one row per command and subcommand with
its class and what respway does with it (`describe()`), plus the Redis 7.2 additions a
7.0 server does not list (`REDIS_72_EXTRAS`); --check compares that file too. The 7.2
commands respway serves (`REDIS_72_COMMANDS`: `WAITAOF`) are added to the server's list,
so they are in the table as well.

Needs python3 (no third-party packages), redis-server, redis-cli and rustfmt on PATH
(or given by --redis-server / --redis-cli / $RUSTFMT). `--dump-json FILE` saves the raw
server data; `--input-json FILE` renders from such a file without starting a server.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT_DIR = Path(__file__).resolve().parent
DEFAULT_OUTPUT = SCRIPT_DIR.parent / "src" / "command_table.rs"
DEFAULT_MARKDOWN = SCRIPT_DIR.parent.parent / "COMMANDS.md"

# ---------------------------------------------------------------------------------------
# Flags: every flag name Redis 7.0 can report in COMMAND, in Redis's reply order, with the
# name of the respway constant (bit i = 1 << i). Must match the constants in command.rs.
# ---------------------------------------------------------------------------------------
FLAGS = [
    ("write", "WRITE"),
    ("readonly", "READONLY"),
    ("denyoom", "DENYOOM"),
    ("module", "MODULE"),
    ("admin", "ADMIN"),
    ("pubsub", "PUBSUB"),
    ("noscript", "NOSCRIPT"),
    ("blocking", "BLOCKING"),
    ("loading", "LOADING"),
    ("stale", "STALE"),
    ("skip_monitor", "SKIP_MONITOR"),
    ("skip_slowlog", "SKIP_SLOWLOG"),
    ("asking", "ASKING"),
    ("fast", "FAST"),
    ("no_auth", "NO_AUTH"),
    ("no_mandatory_keys", "NO_MANDATORY_KEYS"),
    ("no_async_loading", "NO_ASYNC_LOADING"),
    ("no_multi", "NO_MULTI"),
    ("movablekeys", "MOVABLE_KEYS"),
    ("allow_busy", "ALLOW_BUSY"),
]
FLAG_CONST = dict(FLAGS)

# ---------------------------------------------------------------------------------------
# Classification rules (documented in command.rs). Applied in this order, first match wins:
#   1. PROXY: answered by respway itself (a container's subcommands inherit it);
#   2. SPLIT: split per shard and merged;
#   2b. TRANSACTION: MULTI / EXEC / DISCARD / WATCH / UNWATCH (a dedicated connection);
#   2c. FANOUT: SCRIPT and FUNCTION subcommands sent to every shard (or one);
#   2d. BLOCKING, WAIT, PUBSUB, KEYSPACE: blocking commands (WAIT / WAITAOF on every
#       primary), pub/sub, keyspace-wide commands;
#   3. UNSUPPORTED: commands a sharding proxy still cannot serve (by name);
#   4. `blocking`, `pubsub` or `admin` flag -> Unsupported;
#   5. no keys at all -> Unsupported (cluster-wide, connection or server commands);
#   6. key spec that can only ever name one key -> Single;
#   7. anything else (several keys, numkeys, optional STORE key...) -> SameShard.
# ---------------------------------------------------------------------------------------
PROXY = {
    "ping": "Ping",
    "echo": "Echo",
    "quit": "Quit",
    "select": "Select",
    "hello": "Hello",
    "command": "Command",
    "client": "Client",
    "info": "Info",
    "auth": "Auth",
    "time": "Time",
    "reset": "Reset",
    "readonly": "ReadMode",
    "readwrite": "ReadMode",
    "slowlog": "Slowlog",
    "latency": "Latency",
}

TRANSACTION = {"multi", "exec", "discard", "watch", "unwatch"}

FANOUT = {
    "script|load": "ScriptLoad",
    "script|exists": "ScriptExists",
    "script|flush": "ScriptFlush",
    "function|load": "FunctionWrite",
    "function|delete": "FunctionWrite",
    "function|flush": "FunctionWrite",
    "function|restore": "FunctionWrite",
    "function|list": "FunctionRead",
    "function|dump": "FunctionRead",
    "script|kill": "Kill",
    "function|kill": "Kill",
}

# Blocking commands: each runs on a dedicated connection (src/session/blocking.rs). XREAD and
# XREADGROUP block only with BLOCK; without it they are forwarded as usual.
BLOCKING = {
    "blpop", "brpop", "blmove", "brpoplpush", "blmpop", "bzpopmin", "bzpopmax", "bzmpop",
    "xread", "xreadgroup",
}

# WAIT / WAITAOF: blocking too (the session orders them the same way), but sent to every
# primary of every routed cluster, each on a dedicated connection (src/session/wait.rs).
WAIT = {"wait", "waitaof"}

# Pub/sub (src/pubsub.rs).
PUBSUB = {
    "subscribe": "Subscribe",
    "unsubscribe": "Unsubscribe",
    "psubscribe": "Psubscribe",
    "punsubscribe": "Punsubscribe",
    "ssubscribe": "Ssubscribe",
    "sunsubscribe": "Sunsubscribe",
    "publish": "Publish",
    "spublish": "Spublish",
    "pubsub|channels": "Channels",
    "pubsub|shardchannels": "ShardChannels",
    "pubsub|numsub": "NumSub",
    "pubsub|shardnumsub": "ShardNumSub",
    "pubsub|numpat": "NumPat",
}

# Keyspace-wide commands, over every shard of the catch-all cluster (src/session/keyspace.rs).
KEYSPACE = {
    "scan": "Scan",
    "keys": "Keys",
    "dbsize": "Dbsize",
    "randomkey": "RandomKey",
    "flushdb": "Flush",
    "flushall": "Flush",
}

SPLIT = {
    "mget": "Mget",
    "mset": "Mset",
    "del": "SumInt",
    "unlink": "SumInt",
    "exists": "SumInt",
    "touch": "SumInt",
}

UNSUPPORTED = {
    "move": "moves a key to another database of one server",
    "migrate": "moves keys between servers",
    "restore-asking": "Redis Cluster internal",
}

# Single-key commands whose other "keys" are patterns the proxy cannot route (SORT_RO's
# BY/GET patterns): routed by their one real key.
SINGLE_KEY_OVERRIDE = {"sort_ro"}

# ---------------------------------------------------------------------------------------
# COMMAND GETKEYS probes: argv lists sent to the live server; the answers are embedded as
# test vectors (#[cfg(test)]) so `key_indices` is checked against Redis's own key finder.
# Every argument is distinct so key names map back to their indices.
# ---------------------------------------------------------------------------------------
GETKEYS_PROBES = [
    ["get", "k1"],
    ["set", "k1", "v1", "EX", "10"],
    ["mset", "k1", "v1", "k2", "v2", "k3", "v3"],
    ["msetnx", "k1", "v1", "k2", "v2"],
    ["mget", "k1", "k2", "k3"],
    ["del", "k1", "k2", "k3", "k4"],
    ["exists", "k1"],
    ["blpop", "k1", "k2", "0"],
    ["rename", "k1", "k2"],
    ["lmove", "k1", "k2", "LEFT", "RIGHT"],
    ["bitop", "AND", "k1", "k2", "k3"],
    ["lcs", "k1", "k2", "LEN"],
    ["sinterstore", "k1", "k2", "k3"],
    ["pfcount", "k1", "k2"],
    ["eval", "return 1", "2", "k1", "k2", "a1", "a2"],
    ["eval", "return 1", "0", "a1"],
    ["eval", "return 1", "0"],
    ["evalsha_ro", "0123456789abcdef0123456789abcdef01234567", "1", "k1", "a1"],
    ["fcall", "f1", "2", "k1", "k2"],
    ["zunionstore", "k1", "2", "k2", "k3", "WEIGHTS", "1", "2"],
    ["zinterstore", "k1", "1", "k2"],
    ["zdiffstore", "k1", "3", "k2", "k3", "k4"],
    ["zunion", "2", "k1", "k2", "WITHSCORES"],
    ["zintercard", "2", "k1", "k2", "LIMIT", "5"],
    ["sintercard", "3", "k1", "k2", "k3"],
    ["lmpop", "2", "k1", "k2", "LEFT", "COUNT", "3"],
    ["zmpop", "1", "k1", "MIN"],
    ["blmpop", "0", "2", "k1", "k2", "LEFT"],
    ["bzmpop", "1.5", "1", "k1", "MAX"],
    ["georadius", "k1", "1", "2", "3", "m"],
    ["georadius", "k1", "1", "2", "3", "m", "STORE", "k2"],
    ["georadius", "k1", "1", "2", "3", "m", "store", "k2", "STOREDIST", "k3"],
    ["georadiusbymember", "k1", "m1", "3", "km", "COUNT", "5", "STOREDIST", "k2"],
    ["georadius_ro", "k1", "1", "2", "3", "m"],
    ["sort", "k1"],
    ["sort", "k1", "BY", "p1", "LIMIT", "0", "10", "GET", "p2", "STORE", "k2"],
    ["sort", "k1", "STORE", "k2", "store", "k3"],
    ["sort", "k1", "GET", "store", "ALPHA"],
    ["sort_ro", "k1", "BY", "p1"],
    ["xread", "COUNT", "2", "STREAMS", "k1", "k2", "0", "1"],
    ["xread", "BLOCK", "0", "streams", "k1", "$"],
    ["xreadgroup", "GROUP", "g1", "c1", "NOACK", "STREAMS", "k1", ">"],
    ["xreadgroup", "GROUP", "STREAMS", "c1", "STREAMS", "k1", "k2", "0", "1"],
    ["migrate", "h1", "6379", "k1", "0", "5000"],
    ["migrate", "h1", "6379", "", "0", "5000", "COPY", "AUTH", "keys", "KEYS", "k1", "k2"],
    ["migrate", "h1", "6379", "", "0", "5000", "AUTH2", "u1", "p1", "KEYS", "k1"],
    ["object", "encoding", "k1"],
    ["OBJECT", "FREQ", "k1"],
    ["memory", "usage", "k1", "SAMPLES", "5"],
    ["xinfo", "stream", "k1", "FULL"],
    ["xgroup", "create", "k1", "g1", "$", "MKSTREAM"],
    ["xgroup", "createconsumer", "k1", "g1", "c1"],
    ["pfdebug", "GETREG", "k1"],
    ["copy", "k1", "k2", "REPLACE"],
    ["geosearchstore", "k1", "k2", "FROMMEMBER", "m1", "BYRADIUS", "1", "m"],
    ["zrangestore", "k1", "k2", "0", "-1"],
    ["watch", "k1", "k2"],
]

# Probes whose answer from COMMAND GETKEYS is an error (numkeys out of range, ...). The
# Rust test checks that key_indices() rejects them too.
GETKEYS_ERROR_PROBES = [
    ["eval", "return 1", "3", "k1", "k2"],
    ["eval", "return 1", "-1", "k1"],
    ["zunionstore", "k1", "5", "k2"],
    ["lmpop", "3", "k1", "LEFT"],
    ["sintercard", "4", "k1", "k2"],
]


# ---------------------------------------------------------------------------------------
# Talking to redis-server
# ---------------------------------------------------------------------------------------
class Redis:
    def __init__(self, server: str, cli: str):
        self.server = server
        self.cli = cli
        self.dir = tempfile.mkdtemp(prefix="respway-gen-cmd-")
        self.sock = os.path.join(self.dir, "redis.sock")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Redis":
        log = open(os.path.join(self.dir, "redis.log"), "wb")
        self.proc = subprocess.Popen(
            [
                self.server,
                "--port", "0",
                "--unixsocket", self.sock,
                "--unixsocketperm", "700",
                "--dir", self.dir,
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--loglevel", "warning",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + 15
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"redis-server exited early; see {self.dir}/redis.log")
            if os.path.exists(self.sock):
                r = subprocess.run(
                    [self.cli, "-s", self.sock, "PING"], capture_output=True, text=True
                )
                if r.returncode == 0 and r.stdout.strip() == "PONG":
                    return self
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not come up within 15s")
            time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def json(self, *args: str):
        """Runs one command; returns its reply as JSON, or {"error": text} for an error
        reply (which redis-cli prints as plain text, exit code 0)."""
        r = subprocess.run(
            [self.cli, "-s", self.sock, "-3", "--json", *args],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise SystemExit(f"redis-cli {' '.join(args)} failed: {r.stderr.strip()}")
        try:
            return json.loads(r.stdout)
        except json.JSONDecodeError:
            text = r.stdout.strip()
            if text.startswith("error:"):
                return {"error": json.loads(text.removeprefix("error:"))}
            raise SystemExit(f"redis-cli {' '.join(args)}: unexpected output {text!r}")

    def raw(self, *args: str) -> str:
        r = subprocess.run(
            [self.cli, "-s", self.sock, *args], capture_output=True, text=True
        )
        if r.returncode != 0:
            raise SystemExit(f"redis-cli {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout


def collect(server: str, cli: str) -> dict:
    with Redis(server, cli) as r:
        version = None
        for line in r.raw("INFO", "server").splitlines():
            if line.startswith("redis_version:"):
                version = line.split(":", 1)[1].strip()
        if version is None:
            raise SystemExit("INFO server has no redis_version")
        commands = r.json("COMMAND")
        getkeys = []
        for argv in GETKEYS_PROBES + GETKEYS_ERROR_PROBES:
            reply = r.json("COMMAND", "GETKEYS", *argv)
            getkeys.append({"argv": argv, "reply": reply})
    return {"redis_version": version, "command": commands, "getkeys": getkeys}


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------
class Cmd:
    def __init__(self, raw: list, parent: "Cmd | None" = None):
        (
            self.name,
            self.arity,
            self.flags,
            self.first,
            self.last,
            self.step,
            self.acl,
            self.tips,
            self.specs,
            subs,
        ) = raw
        self.parent = parent
        for f in self.flags:
            if f not in FLAG_CONST:
                raise SystemExit(f"{self.name}: unknown flag {f!r}; add it to FLAGS and command.rs")
        if parent is not None:
            if not self.name.startswith(parent.name + "|"):
                raise SystemExit(f"subcommand {self.name} of {parent.name} has no prefix")
            if subs:
                raise SystemExit(f"{self.name}: nested subcommands are not supported")
        self.subs = sorted((Cmd(s, self) for s in subs), key=lambda c: c.name)
        self.keyspec = derive_keyspec(self)
        self.cls, self.reason = classify(self)


def spec_positions(spec: dict, argc: int) -> list[int]:
    """Key positions of one simple (index + range) key spec for an argv of argc items."""
    bs, fk = spec["begin_search"], spec["find_keys"]
    assert bs["type"] == "index" and fk["type"] == "range"
    first = bs["spec"]["index"]
    last_rel = fk["spec"]["lastkey"]
    step = fk["spec"]["keystep"]
    assert fk["spec"]["limit"] == 0
    last = first + last_rel if last_rel >= 0 else argc + last_rel
    return [i for i in range(first, last + 1, step) if i < argc]


def legacy_positions(first: int, last: int, step: int, argc: int) -> list[int]:
    if first == 0:
        return []
    last = last if last >= 0 else argc + last
    return [i for i in range(first, last + 1, step) if i < argc]


def derive_keyspec(c: Cmd) -> tuple:
    """Turn Redis's key specs into one `KeySpec` variant (as a tuple), or fail loudly."""
    specs = c.specs
    kinds = [(s["begin_search"]["type"], s["find_keys"]["type"]) for s in specs]
    movable = "movablekeys" in c.flags
    if not specs:
        if c.first != 0:
            raise SystemExit(f"{c.name}: legacy key range but no key specs")
        return ("None",)
    if not movable:
        # The legacy (first, last, step) must describe exactly the keys of the key specs.
        if any(k != ("index", "range") for k in kinds):
            raise SystemExit(f"{c.name}: non-movable command with complex key specs")
        lo = abs(c.arity)
        for argc in range(lo, lo + 9):
            if c.arity > 0 and argc != c.arity:
                continue
            a = sorted({p for s in specs for p in spec_positions(s, argc)})
            b = legacy_positions(c.first, c.last, c.step, argc)
            if a != b:
                raise SystemExit(f"{c.name}: key specs {a} != legacy range {b} at argc {argc}")
        return ("Range", c.first, c.last, c.step)

    def index_range(s: dict, index: int, lastkey: int) -> bool:
        bs, fk = s["begin_search"], s["find_keys"]
        return (
            bs["type"] == "index"
            and bs["spec"]["index"] == index
            and fk["type"] == "range"
            and fk["spec"] == {"lastkey": lastkey, "keystep": 1, "limit": 0}
        )

    def keynum(s: dict) -> tuple[int, int] | None:
        bs, fk = s["begin_search"], s["find_keys"]
        if bs["type"] != "index" or fk["type"] != "keynum":
            return None
        if fk["spec"]["keynumidx"] != 0 or fk["spec"]["keystep"] != 1:
            return None
        return bs["spec"]["index"], fk["spec"]["firstkey"]

    # EVAL, LMPOP, SINTERCARD, ZUNION...: numkeys then the keys.
    if len(specs) == 1 and keynum(specs[0]):
        idx, off = keynum(specs[0])
        return ("NumKeys", idx, off, False)
    # ZUNIONSTORE, ZINTERSTORE, ZDIFFSTORE: destination at 1, then numkeys at 2.
    if len(specs) == 2 and index_range(specs[0], 1, 0) and keynum(specs[1]):
        idx, off = keynum(specs[1])
        if idx != 2:
            raise SystemExit(f"{c.name}: extra first key must sit right before numkeys")
        return ("NumKeys", idx, off, True)
    # GEORADIUS, GEORADIUSBYMEMBER: key at 1, optional STORE/STOREDIST destination.
    if (
        len(specs) == 3
        and index_range(specs[0], 1, 0)
        and [s["begin_search"]["type"] for s in specs[1:]] == ["keyword", "keyword"]
        and sorted(s["begin_search"]["spec"]["keyword"] for s in specs[1:])
        == ["STORE", "STOREDIST"]
    ):
        starts = {s["begin_search"]["spec"]["startfrom"] for s in specs[1:]}
        if len(starts) != 1 or min(starts) <= 1:
            raise SystemExit(f"{c.name}: unexpected STORE keyword search {starts}")
        return ("StoreOption", starts.pop())
    # SORT / SORT_RO: key at 1, then BY/GET patterns (and STORE for SORT) as "unknown".
    if index_range(specs[0], 1, 0) and all(k == ("unknown", "unknown") for k in kinds[1:]):
        if c.name in SINGLE_KEY_OVERRIDE:
            return ("Range", 1, 1, 1)
        if c.name == "sort":
            return ("Sort",)
    # XREAD, XREADGROUP: keys after STREAMS, as many as the IDs that follow them.
    if (
        len(specs) == 1
        and kinds[0] == ("keyword", "range")
        and specs[0]["begin_search"]["spec"]["keyword"] == "STREAMS"
        and specs[0]["find_keys"]["spec"] == {"lastkey": -1, "keystep": 1, "limit": 2}
    ):
        return ("Streams",)
    # MIGRATE: key at 3, or (with an empty key there) the keys after KEYS.
    if (
        c.name == "migrate"
        and len(specs) == 2
        and index_range(specs[0], 3, 0)
        and specs[1]["begin_search"]["spec"].get("keyword") == "KEYS"
    ):
        return ("Migrate",)
    raise SystemExit(f"{c.name}: unknown key spec shape {json.dumps(specs)}; teach derive_keyspec")


def max_keys(ks: tuple) -> int | None:
    """Most keys the spec can name (None = unbounded)."""
    if ks[0] == "None":
        return 0
    if ks[0] == "Range":
        _, first, last, step = ks
        return len(range(first, last + 1, step)) if last >= 0 else None
    return None


def classify(c: Cmd) -> tuple[str, str]:
    top = c.parent.name if c.parent else c.name
    if top in PROXY:
        return f"CommandClass::Proxy(ProxyCommand::{PROXY[top]})", "answered by the proxy"
    if c.name in SPLIT:
        return f"CommandClass::Split(SplitKind::{SPLIT[c.name]})", "split per shard and merged"
    if c.name in TRANSACTION:
        return "CommandClass::Transaction", "transaction, on a dedicated connection"
    if c.name in FANOUT:
        return f"CommandClass::Fanout(FanoutKind::{FANOUT[c.name]})", "sent to every shard"
    if c.name in BLOCKING:
        return "CommandClass::Blocking", "blocking, on a dedicated connection"
    if c.name in WAIT:
        return (
            "CommandClass::Blocking",
            "blocking, on a dedicated connection to every primary of every routed cluster",
        )
    if c.name in PUBSUB:
        return f"CommandClass::PubSub(PubSubKind::{PUBSUB[c.name]})", "pub/sub"
    if c.name in KEYSPACE:
        return f"CommandClass::Keyspace(KeyspaceKind::{KEYSPACE[c.name]})", "keyspace-wide"
    if c.name in UNSUPPORTED:
        return "CommandClass::Unsupported", UNSUPPORTED[c.name]
    for flag in ("blocking", "pubsub", "admin"):
        if flag in c.flags:
            return "CommandClass::Unsupported", f"`{flag}` flag"
    n = max_keys(c.keyspec)
    if n == 0:
        return "CommandClass::Unsupported", "no keys"
    if n == 1:
        return "CommandClass::Single", "one key"
    return "CommandClass::SameShard", "several keys, all on one shard"


# ---------------------------------------------------------------------------------------
# COMMANDS.md: what respway does with every command (the phrases mirror src/session/local.rs,
# src/session/conn/mod.rs, src/session/fanout.rs, src/session/tx.rs and filters/src/multi_key.rs; keep them in step)
# ---------------------------------------------------------------------------------------

# Commands Redis 7.2 added that a 7.0 server does not list, so they are not in the
# generated table: (name, class shown, what respway does). Hand-maintained; an entry the
# server does list is skipped (the server's own entry is classified as usual).
REDIS_72_EXTRAS = [
    (
        "client|no-touch",
        "Proxy",
        "answered locally: `on`/`off` accepted, no effect (resolved by the `CLIENT` container)",
    ),
    (
        "client|setinfo",
        "Proxy",
        "answered locally: `LIB-NAME`/`LIB-VER` kept for `CLIENT INFO` (resolved by the "
        "`CLIENT` container)",
    ),
    (
        "cluster|myshardid",
        "Unsupported",
        "refused, as the rest of `CLUSTER`; with the listener's `cluster_emulation`: answered "
        "locally, this sidecar's shard id",
    ),
]

# Commands Redis 7.2 added that respway serves, so they belong in the generated table too:
# their `COMMAND` reply as a 7.2 server gives it (`COMMAND INFO name` with `redis-cli -3
# --json`), added to a 7.0 server's list, which does not have them (a server that lists
# them wins). Their COMMANDS.md rows are marked hand-maintained like REDIS_72_EXTRAS.
REDIS_72_COMMANDS = [
    [
        "waitaof", 4, ["noscript"], 0, 0, 0, ["@slow", "@connection"],
        ["request_policy:all_shards", "response_policy:agg_min"], [], [],
    ],
]


def add_72_commands(data: dict) -> None:
    """Adds the REDIS_72_COMMANDS the server does not list to `data["command"]`, and their
    names to `data["hand_added"]`."""
    listed = {raw[0] for raw in data["command"]}
    added = [raw for raw in REDIS_72_COMMANDS if raw[0] not in listed]
    data["command"] = data["command"] + added
    data["hand_added"] = [raw[0] for raw in added]


# CLIENT subcommands that `fn client` (src/session/local.rs) answers; the others are refused.
CLIENT_LOCAL = {
    "client|getname": "answered locally: this client's name",
    "client|id": "answered locally: this client's id",
    "client|info": "answered locally: this client's line",
    "client|list": "answered locally: this client only (no arguments)",
    "client|no-evict": "answered locally: `on`/`off` accepted, no effect",
    "client|setname": "answered locally: names this client",
    "client|tracking": "answered locally: client-side caching through the sidecar (RESP3 "
    "pushes on the client's own connection; `REDIRECT` and RESP2 refused)",
    "client|caching": "answered locally: `yes`/`no` for the next command (`OPTIN`/`OPTOUT`)",
    "client|trackinginfo": "answered locally: this client's tracking flags and prefixes",
    "client|getredir": "answered locally: -1 without tracking, 0 with it (no redirect)",
}

PROXY_PHRASE = {
    "Ping": "answered locally: `PONG` or the message",
    "Echo": "answered locally",
    "Quit": "answered locally: `+OK`, then the connection is closed",
    "Select": "answered locally: per-client database, up to the cluster's `databases`",
    "Hello": "answered locally: protocol 2 or 3, `AUTH`, `SETNAME`",
    "Auth": "answered locally: checked against the listener's password",
    "Time": "answered locally: the proxy's clock",
    "Reset": "answered locally: RESP2, database 0, no name, authentication reset",
    "ReadMode": "accepted, no effect",
    "Info": "answered locally: proxy sections + `# Keyspace` summed over the shards' primaries",
    "Command": "forwarded to the first primary of the catch-all cluster (Redis's own reply)",
    "Slowlog": "answered locally: respway's slow log (GET [count], LEN, RESET, HELP), merged over workers",
    "Latency": "answered locally: HISTOGRAM from respway's per-command latency; LATEST empty and RESET 0 (no latency monitor); others refused",
}

SPLIT_PHRASE = {
    "Mget": "split per shard; values merged in key order",
    "Mset": "split per shard; `+OK` when every shard says OK (not atomic across shards)",
    "SumInt": "split per shard; counts summed",
}

TRANSACTION_PHRASE = {
    "multi": "starts a transaction; its first command with keys pins the session to that shard",
    "exec": "runs on the pinned connection; `-EXECABORT` after a `-CROSSSLOT`",
    "discard": "sent on the pinned connection",
    "watch": "pins the session to the keys' shard at once",
    "unwatch": "sent on the pinned connection",
}

FANOUT_PHRASE = {
    "ScriptLoad": "sent to every endpoint of every routed cluster; the SHA1 when all agree",
    "ScriptExists": "sent to every endpoint of every routed cluster; 1 only where all have it",
    "ScriptFlush": "sent to every endpoint of every routed cluster; `OK` when all are",
    "FunctionWrite": "sent to every primary; the first reply when all succeed",
    "FunctionRead": "sent to the first primary of the catch-all cluster",
    "Kill": "sent to every endpoint of every routed cluster on connections of their own (a \
busy shard answers nothing else); `OK` when one killed a script, else the first error \
(`-NOTBUSY` when none runs)",
}

BLOCKING_PHRASE = (
    "on a dedicated connection to the primary of the keys' shard (all on one, else "
    "`-CROSSSLOT`); its own timeout is honoured"
)

WAIT_PHRASE = (
    "on a dedicated connection to every primary of every routed cluster, after an "
    "`SPUBLISH` that moves the connection's replication offset past the client's writes; "
    "the smallest answer over the shards; its own timeout is honoured"
)

PUBSUB_PHRASE = {
    "Subscribe": "the channel lives on the shard its name hashes to; one upstream "
    "subscription per worker and shard, fanned out to local subscribers",
    "Unsubscribe": "drops this client's channel subscriptions",
    "Psubscribe": "subscribed on every primary of every routed cluster; each message "
    "delivered once",
    "Punsubscribe": "drops this client's pattern subscriptions",
    "Ssubscribe": "as `SUBSCRIBE`, on the channel's shard",
    "Sunsubscribe": "drops this client's shard-channel subscriptions",
    "Publish": "sent to the shard the channel hashes to",
    "Spublish": "sent to the shard the channel hashes to",
    "Channels": "every primary's channels, merged without duplicates",
    "ShardChannels": "every primary's shard channels, merged without duplicates",
    "NumSub": "each channel asked at its shard",
    "ShardNumSub": "each channel asked at its shard",
    "NumPat": "the largest count over the primaries (every pattern is on every one)",
}

KEYSPACE_PHRASE = {
    "Scan": "every shard in turn; the cursor encodes the shard and the shard's cursor",
    "Keys": "every primary, merged; refused past the listener's `keys_max`",
    "Dbsize": "every primary, summed",
    "RandomKey": "a random primary (the next ones if it is empty)",
    "Flush": "every primary, when the listener's `admin_commands` allows it",
}

# What a listener with `cluster_emulation` answers instead of refusing (src/session/cluster_emulation.rs);
# the other CLUSTER subcommands stay refused, with respway's reason.
CLUSTER_EMULATED = {
    "asking": "`+OK`",
    "cluster": "see its subcommands",
    "cluster|slots": "answered locally: the announced sidecars (or this one) owning every slot",
    "cluster|shards": "answered locally: a shard per node, each a healthy primary",
    "cluster|nodes": "answered locally: a line per node, this sidecar `myself`",
    "cluster|info": "answered locally: `cluster_state:ok`, every slot assigned",
    "cluster|keyslot": "answered locally: Redis's CRC16 slot, with `{hashtags}`",
    "cluster|myid": "answered locally: this sidecar's node id (derived from its address)",
    "cluster|replicas": "answered locally: none (every node is a primary)",
    "cluster|slaves": "answered locally: none (every node is a primary)",
    "cluster|links": "answered locally: none (no cluster bus)",
    "cluster|help": "answered locally: the subcommands answered",
    "cluster|countkeysinslot": "refused by name (the shards keep no slots)",
    "cluster|getkeysinslot": "refused by name (the shards keep no slots)",
}
CLUSTER_NOT_EMULATED = "refused by name (it would change a cluster)"

SCRIPTS = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}

# Unsupported today, planned: nothing (issue 12 built pub/sub, blocking and keyspace).
PLANNED_NAMES: set[str] = set()

CLASS_DOC = [
    ("Single", "forwarded to the shard that owns the key."),
    (
        "Split",
        "`MGET`, `MSET`, `DEL`, `UNLINK`, `EXISTS`, `TOUCH`: split into one sub-command per "
        "shard, replies merged (`MGET` in key order, `MSET` one `+OK`, sums for "
        "`DEL`/`UNLINK`/`EXISTS`/`TOUCH`). `MSET` is not atomic across shards.",
    ),
    (
        "SameShard",
        "all keys must hash to one shard (use `{hashtags}`), else `-CROSSSLOT Keys in request "
        "don't hash to the same slot`. `EVAL`/`EVALSHA`/`FCALL` (and their `_RO` forms) are "
        "routed by their keys; with no keys they are refused unless the listener's "
        "`allow_keyless_scripts` is set.",
    ),
    (
        "Transaction",
        "`MULTI` `EXEC` `DISCARD` `WATCH` `UNWATCH`: the session is pinned to a dedicated "
        "connection to the one shard all the transaction's keys hash to; a key on another "
        "shard answers `-CROSSSLOT Keys in request don't hash to the same slot` and `EXEC` "
        "then `-EXECABORT`; keys on a mirrored route or under a hot-key prefix are refused "
        "inside a transaction.",
    ),
    (
        "Fanout",
        "`SCRIPT LOAD` / `EXISTS` / `FLUSH` go to every endpoint of every routed cluster "
        "(`EXISTS` answers 1 only where all have the script); `FUNCTION LOAD` / `DELETE` / "
        "`FLUSH` / `RESTORE` to every primary; `FUNCTION LIST` / `DUMP` to the first primary "
        "of the catch-all cluster.",
    ),
    (
        "Blocking",
        "`BLPOP` `BRPOP` `BLMOVE` `BRPOPLPUSH` `BLMPOP` `BZPOPMIN` `BZPOPMAX` `BZMPOP`, and "
        "`XREAD`/`XREADGROUP` with `BLOCK`: each runs on a dedicated connection to the primary "
        "of the one shard all its keys hash to (else `-CROSSSLOT`), from the endpoint's pool "
        "of `dedicated_connections`; the command's own timeout is honoured (0 blocks "
        "forever) and a client that leaves while blocked has the connection closed at once. "
        "`WAIT` / `WAITAOF` run the same way on every primary of every routed cluster at "
        "once and answer the smallest count.",
    ),
    (
        "PubSub",
        "a channel lives on the shard its name hashes to (prefix routes, hashtags and hasher "
        "as for keys); patterns are subscribed on every primary of every routed cluster. "
        "Subscriptions share one upstream connection per worker and shard.",
    ),
    (
        "Keyspace",
        "`SCAN` (cursor = shard and shard cursor), `KEYS` (size guard `keys_max`), `DBSIZE` "
        "(sum), `RANDOMKEY`, `FLUSHDB`/`FLUSHALL` (only with the listener's "
        "`admin_commands`) over every primary of every routed cluster; on a connection to "
        "a sidecar that cluster emulation announces, `SCAN`, `KEYS`, `DBSIZE` and "
        "`RANDOMKEY` cover only the keys of its slots.",
    ),
    (
        "Proxy",
        "answered by respway itself: `PING`, `ECHO`, `QUIT`, `SELECT` (per-client database, "
        "up to the cluster's `databases`), `HELLO` (2 and 3), `AUTH`, `TIME`, `RESET`, "
        "`READONLY`/`READWRITE` (accepted no-ops), `CLIENT SETNAME`/`GETNAME`/`ID`/`INFO`/"
        "`LIST` (this client only)/`SETINFO`/`NO-EVICT`/`NO-TOUCH`/`TRACKING`/`CACHING`/"
        "`TRACKINGINFO`/`GETREDIR` (client-side caching, RESP3), `INFO` (proxy sections + "
        "`# Keyspace` summed over the shards' "
        "primaries); `COMMAND` and its subcommands are forwarded to the first primary of the "
        "catch-all cluster, so the reply is Redis's own. Other `CLIENT` subcommands answer "
        "`-ERR command 'client|x' is not supported by respway`.",
    ),
    (
        "Unsupported",
        "refused with `-ERR command 'X' is not supported by respway` (X as the client sent "
        "it); the connection stays open. The last column gives the generator's reason. "
        "`CLUSTER` and `ASKING` are answered instead by a listener with `cluster_emulation`.",
    ),
]


def class_name(cls: str) -> str:
    """`CommandClass::Split(SplitKind::Mget)` -> `Split`."""
    return cls.removeprefix("CommandClass::").split("(")[0]


def class_kind(cls: str) -> str:
    """`CommandClass::Split(SplitKind::Mget)` -> `Mget` (empty without a kind)."""
    if "(" not in cls:
        return ""
    return cls.split("(", 1)[1].rstrip(")").split("::")[-1]


# SORT / SORT_RO: BY and GET patterns read keys on the sorted key's shard (src/session/conn/mod.rs,
# filters/src/sort_patterns.rs).
SORT_PATTERNS = (
    "; a `BY`/`GET` pattern whose keys may be on another shard is refused as Redis Cluster "
    "refuses it (`-ERR BY option of SORT denied in Cluster mode ...`): put a `{hashtag}` "
    "before its `*`"
)


def describe(c: Cmd) -> str:
    """One phrase: what respway does with `c` at runtime."""
    phrase = describe_class(c)
    if c.name == "asking" or c.name == "cluster" or c.name.startswith("cluster|"):
        emulated = CLUSTER_EMULATED.get(c.name, CLUSTER_NOT_EMULATED)
        phrase += f"; with the listener's `cluster_emulation`: {emulated}"
    if c.name in ("sort", "sort_ro"):
        phrase += SORT_PATTERNS
    return phrase


def describe_class(c: Cmd) -> str:
    """[`describe`] by the command's class alone."""
    cls, kind = class_name(c.cls), class_kind(c.cls)
    top = c.parent.name if c.parent else c.name
    if cls == "Single":
        return "forwarded to the shard that owns the key"
    if cls == "Split":
        return SPLIT_PHRASE[kind]
    if cls == "SameShard":
        if c.name in SCRIPTS:
            return (
                "routed by its keys (all on one shard, else `-CROSSSLOT`); no keys: refused "
                "unless `allow_keyless_scripts`"
            )
        return "all keys on one shard (hashtags), else `-CROSSSLOT`"
    if cls == "Transaction":
        return TRANSACTION_PHRASE[c.name]
    if cls == "Fanout":
        return FANOUT_PHRASE[kind]
    if cls == "Blocking":
        if c.name in WAIT:
            phrase = WAIT_PHRASE
            if c.name == "waitaof":
                phrase += " (element-wise: local, replicas)"
            return phrase
        if c.name in ("xread", "xreadgroup"):
            return BLOCKING_PHRASE + "; without `BLOCK` forwarded as usual"
        return BLOCKING_PHRASE
    if cls == "PubSub":
        return PUBSUB_PHRASE[kind]
    if cls == "Keyspace":
        return KEYSPACE_PHRASE[kind]
    if cls == "Proxy":
        if kind == "Client":
            if c.name in CLIENT_LOCAL:
                return CLIENT_LOCAL[c.name]
            sub = c.name.split("|", 1)[1] if c.parent else "x"
            what = "unknown subcommand: " if c.parent is None else ""
            return f"{what}refused: `-ERR command 'client|{sub}' is not supported by respway`"
        return PROXY_PHRASE[kind]
    if cls == "Unsupported":
        reason = c.reason
        if reason == "no keys":
            reason = "no keys (cluster-wide)"
        return f"refused: {reason}"
    raise SystemExit(f"{c.name}: no description for class {c.cls}; teach describe()")


def md_name(name: str) -> str:
    return name.upper().replace("|", " ")


def md_cell(text: str) -> str:
    # A `|` splits a GFM table cell even inside a code span, unless escaped.
    return text.replace("|", "\\|")


def render_markdown(data: dict) -> str:
    version = data["redis_version"]
    cmds = sorted((Cmd(raw) for raw in data["command"]), key=lambda c: c.name)
    listed = {c.name for c in cmds} | {s.name for c in cmds for s in c.subs}
    by_name = {c.name: c for c in cmds}
    # rows: (sort key, name, class, phrase)
    hand = set(data.get("hand_added", []))
    rows = []
    for c in cmds:
        phrase = describe(c)
        if c.name in hand:
            phrase += " *(Redis 7.2; hand-maintained)*"
        rows.append(((c.name, ""), c.name, class_name(c.cls), phrase))
        for s in c.subs:
            rows.append(((c.name, s.name), s.name, class_name(s.cls), describe(s)))
    extras = [e for e in REDIS_72_EXTRAS if e[0] not in listed]
    for name, cls, phrase in extras:
        parent = name.split("|", 1)[0] if "|" in name else None
        if parent is not None and parent not in by_name:
            raise SystemExit(f"REDIS_72_EXTRAS: {name}: no container {parent!r} in the table")
        key = (parent, name) if parent else (name, "")
        rows.append((key, name, cls, phrase + " *(Redis 7.2; hand-maintained)*"))
    rows.sort(key=lambda r: r[0])

    counts: dict[str, int] = {}
    for _, _, cls, _ in rows:
        counts[cls] = counts.get(cls, 0) + 1
    order = [name for name, _ in CLASS_DOC]
    summary = ", ".join(f"{counts[k]} {k}" for k in order if k in counts)
    if "none" in counts:
        summary += f", {counts['none']} unknown"

    out = []
    out.append(
        "<!-- @generated by filters/scripts/gen_command_table.py. Do not edit by hand: change\n"
        "     the script and rerun `python3 filters/scripts/gen_command_table.py`. -->\n\n"
    )
    out.append("# What respway does with every Redis command\n\n")
    out.append(
        f"Generated from the `COMMAND` reply of redis-server {version} by "
        "`filters/scripts/gen_command_table.py`, from the same rules as "
        "`filters/src/command_table.rs`. Regenerate both with\n\n"
        "    python3 filters/scripts/gen_command_table.py\n\n"
        "(`--check` fails when either file is stale).\n\n"
    )
    hand_names = sorted(hand) + [e[0] for e in extras]
    if hand_names:
        out.append(
            f"Commands added in Redis 7.2 that a {version} server does not list are kept by hand "
            "in the script (`REDIS_72_COMMANDS`, in the table too, and `REDIS_72_EXTRAS`) and "
            "marked *(Redis 7.2; hand-maintained)*: "
            + ", ".join(f"`{md_name(n)}`" for n in hand_names)
            + ".\n\n"
        )
    out.append(
        "A container's own row (`CLIENT`, `OBJECT`, `XINFO`, ...) is what an unknown "
        "subcommand gets: it resolves to the container.\n\n"
        f"{len(rows)} rows: {summary}.\n\n"
    )
    out.append("## Classes\n\n")
    for name, doc in CLASS_DOC:
        out.append(f"- **{name}**: {doc}\n")
    out.append("\n## Commands\n\n")
    out.append("| Command | Class | What respway does |\n")
    out.append("|---|---|---|\n")
    for _, name, cls, phrase in rows:
        cls_cell = "—" if cls == "none" else cls
        out.append(f"| `{md_cell(md_name(name))}` | {cls_cell} | {md_cell(phrase)} |\n")
    return "".join(out)


# ---------------------------------------------------------------------------------------
# Perfect hash over the top-level names (must match `phf_*` in command.rs)
# ---------------------------------------------------------------------------------------
M64 = (1 << 64) - 1
PHF_BUCKET_BITS = 6
PHF_SLOT_BITS = 9
PHF_EMPTY = 0xFFFF


def fnv1a(name: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in name:
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def fmix64(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    x ^= x >> 33
    return x


def phf_bucket(h: int) -> int:
    return fmix64(h) >> (64 - PHF_BUCKET_BITS)


def phf_slot(h: int, seed: int) -> int:
    return fmix64(h ^ ((seed * 0x9E3779B97F4A7C15) & M64)) & ((1 << PHF_SLOT_BITS) - 1)


def build_phf(names: list[str]) -> tuple[list[int], list[int]]:
    """Hash-and-displace: one seed per bucket so that every name gets its own slot."""
    if len(names) >= (1 << PHF_SLOT_BITS):
        raise SystemExit("too many commands for the perfect hash; raise PHF_SLOT_BITS")
    hashes = [fnv1a(n.encode()) for n in names]
    buckets: list[list[int]] = [[] for _ in range(1 << PHF_BUCKET_BITS)]
    for i, h in enumerate(hashes):
        buckets[phf_bucket(h)].append(i)
    seeds = [0] * len(buckets)
    slots = [PHF_EMPTY] * (1 << PHF_SLOT_BITS)
    order = sorted(range(len(buckets)), key=lambda b: (-len(buckets[b]), b))
    for b in order:
        members = buckets[b]
        if not members:
            continue
        for seed in range(0x10000):
            wanted = [phf_slot(hashes[i], seed) for i in members]
            if len(set(wanted)) == len(wanted) and all(slots[s] == PHF_EMPTY for s in wanted):
                seeds[b] = seed
                for i, s in zip(members, wanted):
                    slots[s] = i
                break
        else:
            raise SystemExit(f"no perfect-hash seed for bucket {b}; raise PHF_SLOT_BITS")
    return seeds, slots


# ---------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------
def rs_str(s: str) -> str:
    return json.dumps(s)  # names, flags and categories are plain ASCII


def rs_strs(items: list[str]) -> str:
    return "&[" + ", ".join(rs_str(s) for s in items) + "]"


def rs_flags(flags: list[str]) -> str:
    consts = [FLAG_CONST[name] for name, _ in FLAGS if name in flags]
    return " | ".join(consts) if consts else "0"


def rs_keyspec(ks: tuple) -> str:
    kind = ks[0]
    if kind == "None":
        return "KeySpec::None"
    if kind == "Range":
        return f"KeySpec::Range {{ first: {ks[1]}, last: {ks[2]}, step: {ks[3]} }}"
    if kind == "NumKeys":
        return (
            f"KeySpec::NumKeys {{ numkeys_index: {ks[1]}, first_offset: {ks[2]}, "
            f"extra_first_key: {'true' if ks[3] else 'false'} }}"
        )
    if kind == "StoreOption":
        return f"KeySpec::StoreOption {{ search_from: {ks[1]} }}"
    return f"KeySpec::{kind}"


def static_name(c: Cmd) -> str:
    return "SUB_" + c.name.upper().replace("-", "_").replace("|", "_")


def rs_cmd(c: Cmd, hand: bool = False) -> str:
    subs = f"&{static_name(c)}" if c.subs else "&[]"
    note = " (Redis 7.2; hand-maintained in the script's REDIS_72_COMMANDS)" if hand else ""
    return (
        f"    // {c.name}: {c.reason}{note}\n"
        "    CommandInfo {\n"
        f"        name: {rs_str(c.name)},\n"
        f"        arity: {c.arity},\n"
        f"        flags: {rs_flags(c.flags)},\n"
        f"        flag_names: {rs_strs(c.flags)},\n"
        f"        legacy_range: ({c.first}, {c.last}, {c.step}),\n"
        f"        acl_categories: {rs_strs(c.acl)},\n"
        f"        keys: {rs_keyspec(c.keyspec)},\n"
        f"        class: {c.cls},\n"
        f"        subcommands: {subs},\n"
        "    },\n"
    )


def render(data: dict) -> str:
    version = data["redis_version"]
    cmds = sorted((Cmd(raw) for raw in data["command"]), key=lambda c: c.name)
    names = [c.name for c in cmds]
    if len(set(names)) != len(names):
        raise SystemExit("duplicate command names")
    seeds, slots = build_phf(names)
    max_len = max(len(n) for n in names)

    out = []
    out.append(
        f"""// @generated by filters/scripts/gen_command_table.py from the `COMMAND` reply of
// redis-server {version}. Do not edit by hand: change the rules in the script and rerun
//
//     python3 filters/scripts/gen_command_table.py
//
// (needs redis-server, redis-cli and rustfmt on PATH). CI runs the same script with
// `--check`, which fails when this file is out of date.

use super::*;

/// Version of the redis-server this table was generated from.
pub(super) const REDIS_VERSION: &str = {rs_str(version)};

/// Length of the longest top-level command name.
pub(super) const MAX_NAME_LEN: usize = {max_len};

/// log2 of the number of perfect-hash buckets (`PHF_SEEDS.len()`).
pub(super) const PHF_BUCKET_BITS: u32 = {PHF_BUCKET_BITS};

/// Per-bucket seeds of the perfect hash over the top-level names.
pub(super) static PHF_SEEDS: [u16; {len(seeds)}] = [{", ".join(str(s) for s in seeds)}];

/// An empty perfect-hash slot (past the end of `COMMANDS`).
const E: u16 = u16::MAX;

/// Perfect-hash slots: index into `COMMANDS`, or `E` when empty.
pub(super) static PHF_SLOTS: [u16; {len(slots)}] = [{", ".join("E" if s == PHF_EMPTY else str(s) for s in slots)}];

/// Every top-level command, sorted by name.
pub(super) static COMMANDS: [CommandInfo; {len(cmds)}] = [
"""
    )
    hand = set(data.get("hand_added", []))
    for c in cmds:
        out.append(rs_cmd(c, c.name in hand))
    out.append("];\n")
    for c in cmds:
        if not c.subs:
            continue
        out.append(f"\n/// Subcommands of `{c.name.upper()}`, sorted by name.\n")
        out.append(f"static {static_name(c)}: [CommandInfo; {len(c.subs)}] = [\n")
        for s in c.subs:
            out.append(rs_cmd(s))
        out.append("];\n")

    # COMMAND GETKEYS answers as test vectors.
    out.append(
        "\n/// `COMMAND GETKEYS` answers of the live server: (argv, key indices), or\n"
        "/// `None` when the server rejected the arguments.\n"
        "#[cfg(test)]\n"
        "pub(super) static GETKEYS_VECTORS: &[(&[&str], Option<&[usize]>)] = &[\n"
    )
    for probe in data["getkeys"]:
        argv, reply = probe["argv"], probe["reply"]
        if isinstance(reply, list):
            idx = []
            for k in reply:
                hits = [i for i, a in enumerate(argv) if a == k and i > 0]
                if len(hits) != 1:
                    raise SystemExit(f"probe {argv}: key {k!r} is ambiguous; make args distinct")
                idx.append(hits[0])
            ans = "Some(&[" + ", ".join(str(i) for i in idx) + "])"
        else:
            ans = "None"
        out.append(f"    ({rs_strs(argv)}, {ans}),\n")
    out.append("];\n")
    return "".join(out)


def rustfmt(text: str) -> str:
    exe = os.environ.get("RUSTFMT") or shutil.which("rustfmt")
    if not exe:
        raise SystemExit("rustfmt not found (install it or set $RUSTFMT)")
    r = subprocess.run(
        [exe, "--edition", "2021", "--emit", "stdout"],
        input=text,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise SystemExit(f"rustfmt failed:\n{r.stderr}")
    return r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a file is out of date")
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="file to write/check")
    ap.add_argument(
        "--markdown", type=Path, default=DEFAULT_MARKDOWN, help="COMMANDS.md to write/check"
    )
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--redis-cli", default="redis-cli")
    ap.add_argument("--input-json", type=Path, help="render from a --dump-json file")
    ap.add_argument("--dump-json", type=Path, help="save the raw server data here")
    args = ap.parse_args()

    if args.input_json:
        data = json.loads(args.input_json.read_text())
    else:
        for exe in (args.redis_server, args.redis_cli):
            if not shutil.which(exe):
                raise SystemExit(f"{exe} not found")
        data = collect(args.redis_server, args.redis_cli)
    if args.dump_json:
        args.dump_json.write_text(json.dumps(data, indent=1) + "\n")
    add_72_commands(data)

    outputs = [
        (args.output, rustfmt(render(data))),
        (args.markdown, render_markdown(data)),
    ]
    if args.check:
        stale = []
        for path, text in outputs:
            old = path.read_text() if path.exists() else ""
            if old == text:
                print(f"{path}: up to date (redis-server {data['redis_version']})")
                continue
            diff = difflib.unified_diff(
                old.splitlines(True), text.splitlines(True), str(path), "regenerated"
            )
            sys.stdout.writelines(list(diff)[:200])
            stale.append(path)
        for path in stale:
            print(f"\n{path} is out of date; run {sys.argv[0]} without --check")
        return 1 if stale else 0
    for path, text in outputs:
        path.write_text(text)
        print(f"wrote {path} (redis-server {data['redis_version']})")
    return 0

if __name__ == "__main__":
    sys.exit(main())
