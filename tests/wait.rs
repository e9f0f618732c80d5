//! WAIT and WAITAOF through respway over real shards, each a primary with a replica (a
//! `redis-server --replicaof` process): the count of replicas that acknowledged the client's
//! writes on every shard, a stopped replica (SIGSTOP) capping the answer while other clients
//! are served, Redis's own errors, a client that leaves while waiting, WAITAOF on a 7.0
//! server, MULTI and subscriber mode, shards without replicas, mirror clusters left out, the
//! dedicated-connection bound, pattern subscribers not seeing the nudge, and redis-py.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;

/// A primary and its replica.
struct Shard {
    primary: Proc,
    replica: Proc,
}

/// `n` primaries, each with one replica that has finished its first sync.
fn shards_with_replicas(n: usize) -> Vec<Shard> {
    let shards: Vec<Shard> = (0..n)
        .map(|_| {
            // No 5 s wait for more replicas before the first (diskless) sync.
            let primary = redis_with(&["--repl-diskless-sync-delay", "0"]);
            let port = primary.addr.port().to_string();
            let replica = redis_with(&["--replicaof", "127.0.0.1", &port]);
            Shard { primary, replica }
        })
        .collect();
    for s in &shards {
        in_sync(s.primary.addr);
    }
    shards
}

/// Waits (60 s at most: a first sync on a loaded machine is slow) until a write on the
/// primary at `addr` is acknowledged by its replica.
fn in_sync(addr: SocketAddr) {
    let mut c = RespConn::connect(addr);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        c.call(&["SET", "__sync", "1"]);
        if c.call(&["WAIT", "1", "1000"]) == Resp::Int(1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica of {addr} never synced"
        );
    }
    c.call(&["DEL", "__sync"]);
}

/// A listener over these shards (`crc16_slots`), the replicas listed as replica endpoints
/// (respway must not send WAIT to them: a replica refuses it). `extra` is appended to the
/// cluster block (e.g. `dedicated_connections`).
fn yaml_over(shards: &[Shard], extra: &str) -> String {
    let mut y = String::from(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    op_timeout: 2s\n    routes:\n      catch_all: main\nclusters:\n  - name: main\n    hash: { policy: crc16_slots }\n    connect_timeout: 500ms\n",
    );
    y.push_str(extra);
    y.push_str("    shards:\n");
    for (i, s) in shards.iter().enumerate() {
        y.push_str(&format!(
            "      - name: s{i}\n        endpoints:\n          - {{ address: \"{}\", role: primary }}\n          - {{ address: \"{}\", role: replica }}\n",
            s.primary.addr, s.replica.addr
        ));
    }
    y
}

fn primaries(shards: &[Shard]) -> Vec<SocketAddr> {
    shards.iter().map(|s| s.primary.addr).collect()
}

fn ok() -> Resp {
    Resp::Simple("OK".into())
}

/// After a write through respway, WAIT answers how many replicas acknowledged it on every
/// shard (1 here), in RESP2 and RESP3, from the `redis` crate, pipelined behind the write
/// and in order with the commands after it; `WAIT 0 0` answers at once. The nudge WAIT
/// sends first leaves no key on any shard.
#[test]
fn wait_counts_the_replicas_that_acknowledged_on_every_shard() {
    let shards = shards_with_replicas(3);
    let rw = respway(&yaml_over(&shards, ""), 1);
    let mut c = RespConn::connect(rw.addr);
    for i in 0..10 {
        assert_eq!(c.call(&["SET", &format!("k{i}"), "v"]), ok());
    }
    assert_eq!(c.call(&["WAIT", "1", "2000"]), Resp::Int(1));
    assert_eq!(c.call(&["wait", "1", "0"]), Resp::Int(1));
    // Pipelined: the write, WAIT, and a read after it, answered in order.
    c.send_pipeline(&[
        vec!["SET", "p", "1"],
        vec!["WAIT", "1", "2000"],
        vec!["GET", "p"],
    ]);
    assert_eq!(c.read().expect("SET"), ok());
    assert_eq!(c.read().expect("WAIT"), Resp::Int(1));
    assert_eq!(c.read().expect("GET"), Resp::bulk("1"));
    // WAIT 0 0 does not block (0 or 1: the replica may not have acknowledged yet).
    let r = c.call(&["WAIT", "0", "0"]);
    assert!(matches!(r, Resp::Int(0 | 1)), "{r:?}");

    let mut r3 = RespConn::connect(rw.addr);
    assert!(!r3.call(&["HELLO", "3"]).is_error());
    assert_eq!(r3.call(&["SET", "r3", "v"]), ok());
    assert_eq!(r3.call(&["WAIT", "1", "2000"]), Resp::Int(1));

    let mut rc = sync_client(rw.addr);
    let _: () = redis::cmd("SET")
        .arg("crate")
        .arg("v")
        .query(&mut rc)
        .unwrap();
    let n: i64 = redis::cmd("WAIT").arg(1).arg(2000).query(&mut rc).unwrap();
    assert_eq!(n, 1);

    // Only the client's keys are on the shards (and their replicas): the nudge wrote none.
    let keys: u64 = primaries(&shards).iter().map(|&a| dbsize(a)).sum();
    assert_eq!(keys, 13);
    // The replicas were never asked: they refuse WAIT, and nothing was sent to them.
    for s in &shards {
        assert_eq!(commandstat(s.replica.addr, "wait"), 0);
    }
}

/// One shard's replica stopped (SIGSTOP): WAIT answers 0 at its timeout, and while a WAIT
/// without timeout is blocked another client's commands are served. After SIGCONT the
/// blocked WAIT answers 1, and so do new ones.
#[test]
fn a_stopped_replica_caps_the_answer_while_others_are_served() {
    let shards = shards_with_replicas(3);
    let rw = respway(&yaml_over(&shards, ""), 1);
    let addrs = primaries(&shards);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["SET", "before", "v"]), ok());
    assert_eq!(c.call(&["WAIT", "1", "2000"]), Resp::Int(1));

    shards[1].replica.signal("-STOP");
    assert_eq!(c.call(&["SET", "k", "v"]), ok());
    assert_eq!(c.call(&["WAIT", "1", "300"]), Resp::Int(0));

    // Blocked until the replica acknowledges; another client is served meanwhile.
    let waiting = spawn_call(rw.addr, &["WAIT", "1", "0"]);
    wait_blocked(&addrs[1..2], "wait", 1);
    let mut other = RespConn::connect(rw.addr);
    for i in 0..50 {
        let k = format!("o{i}");
        assert_eq!(other.call(&["SET", &k, "x"]), ok());
        assert_eq!(other.call(&["GET", &k]), Resp::bulk("x"));
    }
    assert_eq!(other.call(&["GET", "k"]), Resp::bulk("v"));
    assert_eq!(blocked(&addrs[1..2], "wait"), 1, "still waiting meanwhile");

    shards[1].replica.signal("-CONT");
    assert_eq!(waiting.join().expect("client"), Resp::Int(1));
    // Each attempt waits up to 2 s; the replica is back, so the first one should do.
    let mut got = Resp::Int(0);
    for _ in 0..15 {
        got = c.call(&["WAIT", "1", "2000"]);
        if got == Resp::Int(1) {
            break;
        }
    }
    assert_eq!(got, Resp::Int(1));
}

/// Bad arguments get Redis's own errors (the shards answer them), the same text a plain
/// redis-server gives; a wrong argument count gets Redis's arity error.
#[test]
fn bad_arguments_get_redis_own_errors() {
    let shards = shards_with_replicas(2);
    let rw = respway(&yaml_over(&shards, ""), 1);
    let mut c = RespConn::connect(rw.addr);
    let mut plain = RespConn::connect(shards[0].primary.addr);
    let cases: [(&[&str], &str); 6] = [
        (&["WAIT", "1", "-1"], "ERR timeout is negative"),
        (
            &["WAIT", "1", "soon"],
            "ERR timeout is not an integer or out of range",
        ),
        (
            &["WAIT", "1", "1.5"],
            "ERR timeout is not an integer or out of range",
        ),
        (
            &["WAIT", "x", "0"],
            "ERR value is not an integer or out of range",
        ),
        (
            &["WAIT", "1"],
            "ERR wrong number of arguments for 'wait' command",
        ),
        (
            &["WAIT", "1", "0", "2"],
            "ERR wrong number of arguments for 'wait' command",
        ),
    ];
    for (args, want) in cases {
        assert_eq!(c.call(args), Resp::Error(want.into()), "{args:?}");
        assert_eq!(plain.call(args), Resp::Error(want.into()), "plain {args:?}");
    }
    // The session goes on.
    assert_eq!(c.call(&["SET", "k", "v"]), ok());
    assert_eq!(c.call(&["WAIT", "1", "2000"]), Resp::Int(1));
}

/// A client that leaves while blocked in WAIT (more replicas asked for than there are, no
/// timeout: every shard blocks) has its dedicated connections closed at once, so the shards
/// stop waiting for it. Later WAITs reuse the pooled connections.
#[test]
fn a_client_that_leaves_while_waiting_frees_every_shard() {
    let shards = shards_with_replicas(3);
    let rw = respway(&yaml_over(&shards, ""), 1);
    let addrs = primaries(&shards);
    for _round in 0..3 {
        let mut c = RespConn::connect(rw.addr);
        c.send(&["WAIT", "5", "0"]);
        wait_blocked(&addrs, "wait", 3);
        drop(c);
        wait_unblocked(&addrs, "wait");
    }
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["SET", "k", "v"]), ok());
    assert_eq!(c.call(&["WAIT", "1", "2000"]), Resp::Int(1));
    // A WAIT Redis answered gave its connections back: no new connection per WAIT.
    let mut shard = RespConn::connect(addrs[0]);
    let info = |s: &mut RespConn| -> u64 {
        s.call(&["INFO", "stats"])
            .text()
            .lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("total_connections_received")
    };
    let before = info(&mut shard);
    for _ in 0..20 {
        assert_eq!(c.call(&["WAIT", "1", "2000"]), Resp::Int(1));
    }
    assert_eq!(info(&mut shard), before, "new upstream connections");
}

/// WAITAOF on Redis 7.0 (which does not know it): the shard's own unknown-command error,
/// not respway's. (On 7.2 or later: a two-element array, the minimum over the shards.)
#[test]
fn waitaof_answers_what_the_shards_say() {
    let shards = shards_with_replicas(2);
    let rw = respway(&yaml_over(&shards, ""), 1);
    let mut c = RespConn::connect(rw.addr);
    let args = ["WAITAOF", "0", "1", "100"];
    let direct = RespConn::connect(shards[0].primary.addr).call(&args);
    let got = c.call(&args);
    match &direct {
        Resp::Error(e) => {
            assert!(e.starts_with("ERR unknown command 'WAITAOF'"), "{e}");
            assert_eq!(got, direct);
        }
        _ => assert!(
            matches!(&got, Resp::Array(Some(v)) if v.len() == 2),
            "{got:?}"
        ),
    }
    assert_eq!(
        c.call(&["WAITAOF", "0", "1"]),
        Resp::Error("ERR wrong number of arguments for 'waitaof' command".into())
    );
    assert_eq!(c.call(&["PING"]), Resp::Simple("PONG".into()));
}

/// Inside MULTI, WAIT is refused like the other blocking commands and EXEC aborts; in RESP2
/// subscriber mode it is not allowed, as in Redis.
#[test]
fn wait_inside_multi_or_subscribed_is_refused() {
    let shards = shards_with_replicas(2);
    let rw = respway(&yaml_over(&shards, ""), 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["MULTI"]), ok());
    assert_eq!(c.call(&["SET", "{t}a", "1"]), Resp::Simple("QUEUED".into()));
    assert_eq!(
        c.call(&["WAIT", "1", "0"]),
        Resp::Error("ERR respway: 'WAIT' is not allowed inside a transaction".into())
    );
    assert_eq!(
        c.call(&["EXEC"]),
        Resp::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    assert_eq!(c.call(&["EXISTS", "{t}a"]), Resp::Int(0));

    let mut s = RespConn::connect(rw.addr);
    s.send(&["SUBSCRIBE", "ch"]);
    assert!(matches!(
        s.read().expect("confirmation"),
        Resp::Array(Some(_))
    ));
    let r = s.call(&["WAIT", "1", "0"]);
    assert!(
        r.error()
            .unwrap_or("")
            .starts_with("ERR Can't execute 'wait'"),
        "{r:?}"
    );
}

/// Shards without replicas: WAIT answers 0 (at its timeout when it asks for one). Past the
/// cluster's `dedicated_connections` a WAIT gets the same clear error as the blocking
/// commands; once the blocked client leaves, WAIT fits again.
#[test]
fn shards_without_replicas_and_the_dedicated_bound() {
    let procs: Vec<Proc> = (0..2).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = procs.iter().map(|p| p.addr).collect();
    let yaml = sharded_yaml(&addrs, "{ policy: crc16_slots }", true).replace(
        "    connect_timeout: 500ms\n",
        "    connect_timeout: 500ms\n    dedicated_connections: 1\n",
    );
    let rw = respway(&yaml, 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["SET", "k", "v"]), ok());
    assert_eq!(c.call(&["WAIT", "0", "0"]), Resp::Int(0));
    assert_eq!(c.call(&["WAIT", "1", "100"]), Resp::Int(0));

    let mut blocker = RespConn::connect(rw.addr);
    blocker.send(&["WAIT", "1", "0"]);
    wait_blocked(&addrs, "wait", 2);
    let r = c.call(&["WAIT", "1", "100"]);
    let text = r.error().unwrap_or_default();
    assert!(
        text.starts_with("ERR respway: shard ")
            && text.contains("all 1 dedicated connections")
            && text.ends_with("in use"),
        "{r:?}"
    );
    drop(blocker);
    wait_unblocked(&addrs, "wait");
    // The bound frees once the closed connections' tasks end.
    let mut got = Resp::Int(-1);
    for _ in 0..100 {
        got = c.call(&["WAIT", "1", "50"]);
        if got == Resp::Int(0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(got, Resp::Int(0));
}

/// WAIT asks the clusters the routes send to (a prefix route's cluster too) that the client
/// wrote to, not mirror clusters: a mirror without replicas does not cap the answer, a routed
/// cluster without replicas does once written to.
#[test]
fn routed_clusters_are_asked_mirror_clusters_are_not() {
    let shards = shards_with_replicas(2);
    let mirror = redis();
    let side = redis();
    let mut yaml = yaml_over(&shards, "");
    yaml = yaml.replace(
        "      catch_all: main\n",
        "      catch_all: main\n      catch_all_mirrors:\n        - { cluster: shadow, mode: dual_write }\n",
    );
    yaml.push_str(&format!(
        "  - name: shadow\n    shards:\n      - name: m0\n        endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
        mirror.addr
    ));
    let rw = respway(&yaml, 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["SET", "k", "v"]), ok());
    assert_eq!(c.call(&["WAIT", "1", "2000"]), Resp::Int(1));
    assert_eq!(commandstat(mirror.addr, "wait"), 0);
    drop(c);
    drop(rw);

    // A prefix route to a cluster without replicas: it is asked, and caps the answer.
    let mut yaml = yaml_over(&shards, "");
    yaml = yaml.replace(
        "      catch_all: main\n",
        "      catch_all: main\n      prefixes:\n        - { prefix: \"side:\", cluster: side }\n",
    );
    yaml.push_str(&format!(
        "  - name: side\n    shards:\n      - name: x0\n        endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
        side.addr
    ));
    let rw = respway(&yaml, 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["SET", "k", "v"]), ok());
    assert_eq!(
        c.call(&["WAIT", "1", "2000"]),
        Resp::Int(1),
        "not written to: not asked"
    );
    assert_eq!(commandstat(side.addr, "wait"), 0);
    assert_eq!(c.call(&["SET", "side:k", "v"]), ok());
    assert_eq!(c.call(&["WAIT", "1", "100"]), Resp::Int(0));
    assert_eq!(commandstat(side.addr, "wait"), 1);
}

/// The nudge before each WAIT is an `SPUBLISH`, which pattern subscribers do not get: a
/// client subscribed to `*` through respway sees only the messages published after the
/// WAIT (one marker per shard; on each shard a nudge, had it been delivered, would have
/// come first on the same upstream subscription).
#[test]
fn pattern_subscribers_do_not_see_the_nudge() {
    let shards = shards_with_replicas(3);
    let rw = respway(&yaml_over(&shards, ""), 1);
    let addrs = primaries(&shards);
    // A channel name on each shard (a channel is placed like a key of the same name).
    let mut c = RespConn::connect(rw.addr);
    let mut markers: Vec<Option<String>> = vec![None; addrs.len()];
    for i in 0..200 {
        let name = format!("mark{i}");
        assert_eq!(c.call(&["SET", &name, "x"]), ok());
        let at = addrs
            .iter()
            .position(|&a| RespConn::connect(a).call(&["EXISTS", &name]) == Resp::Int(1))
            .expect("on some shard");
        assert_eq!(c.call(&["DEL", &name]), Resp::Int(1));
        markers[at].get_or_insert(name);
        if markers.iter().all(Option::is_some) {
            break;
        }
    }
    let markers: Vec<String> = markers.into_iter().map(|m| m.expect("a channel")).collect();

    let mut sub = RespConn::connect(rw.addr);
    sub.send(&["PSUBSCRIBE", "*"]);
    assert!(matches!(
        sub.read().expect("confirmation"),
        Resp::Array(Some(_))
    ));
    // The pattern is subscribed on every primary before anything is published.
    let start = Instant::now();
    while !addrs
        .iter()
        .all(|&a| RespConn::connect(a).call(&["PUBSUB", "NUMPAT"]) == Resp::Int(1))
    {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "pattern never subscribed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for _ in 0..3 {
        assert_eq!(c.call(&["SET", "k", "v"]), ok());
        assert_eq!(c.call(&["WAIT", "1", "2000"]), Resp::Int(1));
    }
    for m in &markers {
        assert_eq!(c.call(&["PUBLISH", m, "end"]), Resp::Int(1));
    }
    let mut got = Vec::new();
    while got.len() < markers.len() {
        match sub.read().expect("message") {
            Resp::Array(Some(v)) if v.len() == 4 => got.push(v[2].text()),
            other => panic!("not a pmessage: {other:?}"),
        }
    }
    got.sort();
    let mut want = markers.clone();
    want.sort();
    assert_eq!(got, want, "only the markers, no nudge");
}

/// redis-py, unchanged (the version `tests/clients/requirements.txt` pins): `r.wait(1, 2000)`
/// after a write answers 1 through respway.
#[test]
fn redis_py_wait_answers_the_count() {
    let shards = shards_with_replicas(2);
    let rw = respway(&yaml_over(&shards, ""), 1);
    let script = format!(
        "import redis\n\
         r = redis.Redis(host='{}', port={}, socket_timeout=10)\n\
         r.set('py', 'v')\n\
         n = r.wait(1, 2000)\n\
         assert n == 1, n\n\
         print('ok wait', n)\n",
        rw.addr.ip(),
        rw.addr.port()
    );
    let (ok, out) = run_bounded("python3", &["-c", &script]);
    assert!(
        ok,
        "redis-py WAIT failed ({SETUP} if redis is missing):\n{out}"
    );
}

/// A key through respway that lands on shard `i` (found on its primary).
fn key_on(rw: SocketAddr, shards: &[Shard], i: usize) -> String {
    let mut c = RespConn::connect(rw);
    let mut direct = RespConn::connect(shards[i].primary.addr);
    (0..1000)
        .map(|n| format!("on{i}:{n}"))
        .find(|k| {
            assert_eq!(c.call(&["SET", k, "v"]), ok());
            direct.call(&["EXISTS", k]) == Resp::Int(1)
        })
        .expect("a key of the shard")
}

/// WAIT asks only the primaries this client wrote to since its last WAIT: with shard 0's
/// primary frozen, a client whose keys are all on shard 1 gets shard 1's count within its
/// timeout (as from one Redis), not a stall on shard 0. A second WAIT with no write between
/// asks the same primaries; a transaction makes the next WAIT ask every primary.
#[test]
fn wait_asks_only_the_primaries_the_client_wrote_to() {
    let shards = shards_with_replicas(2);
    let rw = respway(&yaml_over(&shards, ""), 1);
    let k1 = key_on(rw.addr, &shards, 1);
    shards[0].primary.signal("-STOP");
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["SET", &k1, "w"]), ok());
    let started = Instant::now();
    assert_eq!(c.call(&["WAIT", "1", "100"]), Resp::Int(1));
    assert_eq!(
        c.call(&["WAIT", "1", "100"]),
        Resp::Int(1),
        "the same primaries"
    );
    eprintln!(
        "WAIT 1 100 twice with shard 0 frozen: {:?}",
        started.elapsed()
    );
    // A transaction's primaries are not followed: every primary is asked, the frozen one too.
    assert_eq!(c.call(&["MULTI"]), ok());
    assert_eq!(c.call(&["SET", &k1, "x"]), Resp::Simple("QUEUED".into()));
    assert!(matches!(c.call(&["EXEC"]), Resp::Array(Some(_))));
    let r = c.call(&["WAIT", "1", "100"]);
    assert!(r.is_error(), "the frozen primary was asked: {r:?}");
    shards[0].primary.signal("-CONT");
}
