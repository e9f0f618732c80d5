//! Blocking commands through respway over three real shards: pops woken by writes through
//! another sidecar, the command's own timeout (not the listener's op_timeout), a client that
//! leaves while blocked, CROSSSLOT and the dedicated-connection bound, many blocked clients
//! beside a busy one, and XREAD without BLOCK.

use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::support::*;

/// Three shards and the YAML of a listener over them (`edit` changes the YAML).
fn shards_and_yaml(edit: impl Fn(String) -> String) -> (Vec<Proc>, Vec<SocketAddr>, String) {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let yaml = edit(sharded_yaml(&addrs, "{ policy: crc16_slots }", true));
    (shards, addrs, yaml)
}

/// The cluster's `dedicated_connections` set to `n`.
fn with_dedicated(yaml: String, n: usize) -> String {
    yaml.replace(
        "    connect_timeout: 500ms\n",
        &format!("    connect_timeout: 500ms\n    dedicated_connections: {n}\n"),
    )
}

/// The shard index holding `key`, found by writing it through respway.
fn shard_of(rw: SocketAddr, shards: &[SocketAddr], key: &str) -> usize {
    let mut c = RespConn::connect(rw);
    c.call(&["SET", key, "probe"]);
    let i = shards
        .iter()
        .position(|&s| RespConn::connect(s).call(&["EXISTS", key]) == Resp::Int(1))
        .expect("key on some shard");
    c.call(&["DEL", key]);
    i
}

/// Connections the shard has accepted so far (asked on `conn`, which is counted once).
fn connections_received(conn: &mut RespConn) -> u64 {
    let info = conn.call(&["INFO", "stats"]).text();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_connections_received")
}

fn bulks(items: &[&str]) -> Resp {
    Resp::Array(Some(items.iter().map(Resp::bulk).collect()))
}

/// Each blocking command waits on one sidecar and is woken by a write through another
/// sidecar over the same shards; the one that finds data answers at once.
#[test]
fn blocked_commands_are_woken_by_writes_through_another_sidecar() {
    let (_shards, addrs, yaml) = shards_and_yaml(|y| y);
    let (a, b) = (respway(&yaml, 2), respway(&yaml, 1));
    let mut writer = RespConn::connect(b.addr);

    let cases: Vec<(Vec<&str>, &str, Vec<&str>, Resp)> = vec![
        (
            vec!["BLPOP", "{q}l", "{q}l2", "5"],
            "blpop",
            vec!["LPUSH", "{q}l2", "v1"],
            bulks(&["{q}l2", "v1"]),
        ),
        (
            vec!["BRPOP", "{q}r", "5"],
            "brpop",
            vec!["RPUSH", "{q}r", "a", "b"],
            bulks(&["{q}r", "b"]),
        ),
        (
            vec!["BZPOPMIN", "{q}z", "5"],
            "bzpopmin",
            vec!["ZADD", "{q}z", "1", "m"],
            bulks(&["{q}z", "m", "1"]),
        ),
        (
            vec!["BLMOVE", "{q}src", "{q}dst", "LEFT", "RIGHT", "5"],
            "blmove",
            vec!["LPUSH", "{q}src", "x"],
            Resp::bulk("x"),
        ),
    ];
    for (cmd, name, write, want) in cases {
        let t = spawn_call(a.addr, &cmd);
        wait_blocked(&addrs, name, 1);
        assert!(!writer.call(&write).is_error(), "{write:?}");
        assert_eq!(t.join().expect("client"), want, "{cmd:?}");
    }
    assert_eq!(
        writer.call(&["LRANGE", "{q}dst", "0", "-1"]),
        bulks(&["x"]),
        "BLMOVE pushed"
    );

    // XREAD BLOCK: woken by an XADD.
    let t = spawn_call(a.addr, &["XREAD", "BLOCK", "5000", "STREAMS", "{q}s", "$"]);
    wait_blocked(&addrs, "xread", 1);
    assert_eq!(
        writer.call(&["XADD", "{q}s", "7-1", "f", "v"]),
        Resp::bulk("7-1")
    );
    assert_eq!(
        t.join().expect("client"),
        Resp::Array(Some(vec![Resp::Array(Some(vec![
            Resp::bulk("{q}s"),
            Resp::Array(Some(vec![Resp::Array(Some(vec![
                Resp::bulk("7-1"),
                bulks(&["f", "v"]),
            ]))])),
        ]))]))
    );

    // The others, with data already there (their timeouts sit elsewhere).
    let mut c = RespConn::connect(a.addr);
    writer.call(&["RPUSH", "{q}m", "1", "2", "3"]);
    writer.call(&["ZADD", "{q}zz", "1", "lo", "9", "hi"]);
    assert_eq!(
        c.call(&["BLMPOP", "1", "1", "{q}m", "LEFT"]),
        Resp::Array(Some(vec![Resp::bulk("{q}m"), bulks(&["1"])]))
    );
    assert_eq!(
        c.call(&["BRPOPLPUSH", "{q}m", "{q}m2", "1"]),
        Resp::bulk("3")
    );
    assert_eq!(
        c.call(&["BZPOPMAX", "{q}zz", "1"]),
        bulks(&["{q}zz", "hi", "9"])
    );
    assert_eq!(
        c.call(&["BZMPOP", "1", "1", "{q}zz", "MIN"]),
        Resp::Array(Some(vec![
            Resp::bulk("{q}zz"),
            Resp::Array(Some(vec![bulks(&["lo", "1"])])),
        ]))
    );
    // A session goes on after its blocking commands, in order.
    assert_eq!(c.call(&["LLEN", "{q}m"]), Resp::Int(1));
}

/// A timeout of 0.2 s with the listener's op_timeout at 50 ms: nil after about 0.2 s, not an
/// upstream timeout at 50 ms. The same in RESP3, for XREAD BLOCK, and an invalid timeout gets
/// Redis's own error.
#[test]
fn the_commands_own_timeout_is_honoured_not_op_timeout() {
    let (_shards, _addrs, yaml) =
        shards_and_yaml(|y| y.replace("op_timeout: 2s", "op_timeout: 50ms"));
    let rw = respway(&yaml, 1);
    let mut c = RespConn::connect(rw.addr);
    let start = Instant::now();
    assert_eq!(c.call(&["BLPOP", "{e}k", "0.2"]), Resp::Array(None));
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(150), "nil after {took:?}");
    assert!(took < slack(Duration::from_secs(5)), "nil after {took:?}");

    let start = Instant::now();
    assert_eq!(
        c.call(&["XREAD", "BLOCK", "200", "STREAMS", "{e}s", "$"]),
        Resp::Array(None)
    );
    assert!(start.elapsed() >= Duration::from_millis(150));

    assert_eq!(
        c.call(&["BLPOP", "{e}k", "-1"]),
        Resp::Error("ERR timeout is negative".into())
    );
    assert_eq!(
        c.call(&["BLPOP", "{e}k", "soon"]),
        Resp::Error("ERR timeout is not a float or out of range".into())
    );

    let mut r3 = RespConn::connect(rw.addr);
    assert!(!r3.call(&["HELLO", "3"]).is_error());
    let start = Instant::now();
    assert_eq!(r3.call(&["BRPOP", "{e}k", "0.2"]), Resp::Bulk(None));
    assert!(start.elapsed() >= Duration::from_millis(150));
    // The session still works after them.
    assert_eq!(c.call(&["SET", "{e}x", "1"]), Resp::Simple("OK".into()));
}

/// A client blocked in BLPOP whose socket is dropped frees its upstream connection at once
/// (the goal is within 100 ms; the test allows 1 s), and a later LPUSH is not popped for
/// nobody: the element stays in the list.
#[test]
fn a_client_that_leaves_while_blocked_frees_its_connection_and_pops_nothing() {
    let (_shards, addrs, yaml) = shards_and_yaml(|y| y);
    let rw = respway(&yaml, 1);
    for round in 0..3 {
        let mut c = RespConn::connect(rw.addr);
        c.send(&["BLPOP", "{d}k", "0"]);
        wait_blocked(&addrs, "blpop", 1);
        drop(c);
        let start = Instant::now();
        while blocked(&addrs, "blpop") > 0 {
            assert!(
                start.elapsed() < slack(Duration::from_secs(1)),
                "round {round}: the upstream connection is still blocked after {:?}",
                start.elapsed()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // The figure (`cargo test --test it leaves_while_blocked -- --nocapture`), polled every 1 ms.
        eprintln!(
            "round {round}: upstream released {:?} after the client left",
            start.elapsed()
        );
        let mut other = RespConn::connect(rw.addr);
        assert_eq!(other.call(&["LPUSH", "{d}k", "v"]), Resp::Int(1));
        assert_eq!(
            other.call(&["LLEN", "{d}k"]),
            Resp::Int(1),
            "round {round}: popped for nobody"
        );
        assert_eq!(other.call(&["DEL", "{d}k"]), Resp::Int(1));
    }
    // A blocking command after that still works.
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["BLPOP", "{d}k", "0.05"]), Resp::Array(None));
}

/// Keys on two shards answer CROSSSLOT; past `dedicated_connections` a blocking command gets
/// the clear error; mirrored routes and hot keys are refused.
#[test]
fn crossslot_the_dedicated_bound_and_refused_keys() {
    let (_shards, addrs, yaml) = shards_and_yaml(|y| with_dedicated(y, 2));
    let rw = respway(&yaml, 1);
    let a = "{a}x";
    let b = (0..100)
        .map(|i| format!("{{b{i}}}y"))
        .find(|b| shard_of(rw.addr, &addrs, b) != shard_of(rw.addr, &addrs, a))
        .expect("a key on another shard");
    let mut c = RespConn::connect(rw.addr);
    let crossslot = Resp::Error("CROSSSLOT Keys in request don't hash to the same slot".into());
    assert_eq!(c.call(&["BLPOP", a, &b, "1"]), crossslot);
    assert_eq!(c.call(&["BLMOVE", a, &b, "LEFT", "LEFT", "1"]), crossslot);
    assert_eq!(
        c.call(&["XREAD", "BLOCK", "10", "STREAMS", a, &b, "$", "$"]),
        crossslot
    );

    let t1 = spawn_call(rw.addr, &["BLPOP", "{n}k", "10"]);
    let t2 = spawn_call(rw.addr, &["BLPOP", "{n}k", "10"]);
    wait_blocked(&addrs, "blpop", 2);
    let third = c.call(&["BLPOP", "{n}k", "10"]);
    let text = third.error().unwrap_or_default();
    assert!(
        text.starts_with("ERR respway: shard ")
            && text.contains("all 2 dedicated connections")
            && text.ends_with("in use"),
        "{third:?}"
    );
    assert_eq!(c.call(&["RPUSH", "{n}k", "1", "2"]), Resp::Int(2));
    let mut got: Vec<Resp> = [t1, t2].map(|t| t.join().expect("client")).into();
    got.sort_by_key(|r| format!("{r:?}"));
    assert_eq!(got, vec![bulks(&["{n}k", "1"]), bulks(&["{n}k", "2"])]);
    // The connections went back to the pool: two more blocking commands fit again.
    assert_eq!(c.call(&["BLPOP", "{n}k", "0.01"]), Resp::Array(None));
    assert_eq!(c.call(&["BLPOP", "{n}k", "0.01"]), Resp::Array(None));
    // ... and are reused: no connect per BLPOP.
    let mut shard = RespConn::connect(addrs[shard_of(rw.addr, &addrs, "{n}probe")]);
    let before = connections_received(&mut shard);
    for _ in 0..20 {
        assert_eq!(c.call(&["BLPOP", "{n}k", "0.01"]), Resp::Array(None));
    }
    assert_eq!(
        connections_received(&mut shard),
        before,
        "new upstream connections"
    );

    let (old, new) = (redis(), redis());
    let yaml = format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes:\n      catch_all: old\n      prefixes:\n        - {{ prefix: \"m:\", cluster: old, mirrors: [ {{ cluster: new, mode: dual_write }} ] }}\nclusters:\n  - name: old\n    hot_keys:\n      - {{ prefix: HIGH_FREQ_ }}\n    shards:\n      - name: o0\n        endpoints: [ {{ address: \"{}\", role: primary }} ]\n  - name: new\n    shards:\n      - name: n0\n        endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
        old.addr, new.addr
    );
    let rw = respway(&yaml, 1);
    let mut c = RespConn::connect(rw.addr);
    for key in ["m:{k}", "HIGH_FREQ_k"] {
        let r = c.call(&["BLPOP", key, "0.01"]);
        assert!(
            r.error()
                .unwrap_or("")
                .starts_with("ERR respway: blocking commands"),
            "{key}: {r:?}"
        );
    }
    assert_eq!(c.call(&["BLPOP", "plain", "0.01"]), Resp::Array(None));
}

/// 200 clients blocked in BLPOP at once while another client runs 1,000 SET/GET through the
/// same sidecar: it keeps getting its replies (not stuck behind the blocked ones).
#[test]
fn blocked_clients_do_not_hold_up_other_clients() {
    const BLOCKED: usize = 200;
    let (_shards, addrs, yaml) = shards_and_yaml(|y| with_dedicated(y, 256));
    let rw = respway(&yaml, 1);
    let addr = rw.addr;
    let waiting: Vec<JoinHandle<Resp>> = (0..BLOCKED)
        .map(|i| spawn_call(addr, &["BLPOP", &format!("w{i}"), "8"]))
        .collect();
    wait_blocked(&addrs, "blpop", BLOCKED);
    let mut c = RespConn::connect(addr);
    let start = Instant::now();
    for i in 0..500 {
        let (k, v) = (format!("busy{i}"), format!("v{i}"));
        assert_eq!(c.call(&["SET", &k, &v]), Resp::Simple("OK".into()));
        assert_eq!(c.call(&["GET", &k]), Resp::bulk(&v));
        // Were they queued behind the blocked ones, the BLPOPs (8 s) would be over below.
        assert!(
            start.elapsed() < slack(Duration::from_secs(5)),
            "only {i} SET/GET pairs in {:?}",
            start.elapsed()
        );
    }
    assert!(blocked(&addrs, "blpop") > 0, "still blocked meanwhile");
    // Wake them all.
    let pushes: Vec<Vec<String>> = (0..BLOCKED)
        .map(|i| vec!["LPUSH".to_string(), format!("w{i}"), format!("e{i}")])
        .collect();
    c.send_pipeline(&pushes);
    for _ in 0..BLOCKED {
        assert_eq!(c.read().expect("LPUSH"), Resp::Int(1));
    }
    for (i, t) in waiting.into_iter().enumerate() {
        assert_eq!(
            t.join().expect("client"),
            bulks(&[&format!("w{i}"), &format!("e{i}")])
        );
    }
}

/// XREAD and XREADGROUP without BLOCK are forwarded like any multi-key command.
#[test]
fn xread_without_block_is_forwarded() {
    let (_shards, addrs, yaml) = shards_and_yaml(|y| y);
    let rw = respway(&yaml, 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(
        c.call(&["XADD", "{x}s", "1-1", "f", "v"]),
        Resp::bulk("1-1")
    );
    assert_eq!(
        c.call(&["XADD", "{x}t", "2-1", "g", "w"]),
        Resp::bulk("2-1")
    );
    let read = ["XREAD", "COUNT", "10", "STREAMS", "{x}s", "{x}t", "0", "0"];
    let got = c.call(&read);
    let shard = addrs[shard_of(rw.addr, &addrs, "{x}probe")];
    assert_eq!(got, RespConn::connect(shard).call(&read));
    assert!(
        matches!(&got, Resp::Array(Some(v)) if v.len() == 2),
        "{got:?}"
    );

    assert_eq!(
        c.call(&["XGROUP", "CREATE", "{x}s", "g", "0"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(
        c.call(&["XREADGROUP", "GROUP", "g", "c", "STREAMS", "{x}s", ">"]),
        Resp::Array(Some(vec![Resp::Array(Some(vec![
            Resp::bulk("{x}s"),
            Resp::Array(Some(vec![Resp::Array(Some(vec![
                Resp::bulk("1-1"),
                bulks(&["f", "v"]),
            ]))])),
        ]))]))
    );
    // Inside MULTI they run without blocking, as in Redis (tests/compat.rs compares more).
    assert_eq!(c.call(&["MULTI"]), Resp::Simple("OK".into()));
    assert_eq!(
        c.call(&["BLPOP", "{x}l", "0"]),
        Resp::Simple("QUEUED".into())
    );
    assert_eq!(
        c.call(&["EXEC"]),
        Resp::Array(Some(vec![Resp::Array(None)]))
    );
    // Streams on two shards are refused like any same-shard command.
    let b = (0..100)
        .map(|i| format!("{{b{i}}}y"))
        .find(|b| shard_of(rw.addr, &addrs, b) != shard_of(rw.addr, &addrs, "{x}s"))
        .expect("a key on another shard");
    let r = c.call(&["XREAD", "STREAMS", "{x}s", &b, "0", "0"]);
    assert!(r.error().unwrap_or("").starts_with("CROSSSLOT"), "{r:?}");
}
