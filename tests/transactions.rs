//! Transactions through respway over three real shards: the replies Redis itself gives, a
//! CROSSSLOT that applies nothing, WATCH conflicts, a client that leaves mid-transaction, and
//! a steady rate of transactions that opens no new upstream connection.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;

fn three_shards() -> (Vec<Proc>, Vec<SocketAddr>, Respway) {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let rw = respway(&sharded_yaml(&addrs, "{ policy: crc16_slots }", true), 1);
    (shards, addrs, rw)
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

fn run(addr: SocketAddr, cmds: &[Vec<&str>]) -> Vec<Resp> {
    let mut c = RespConn::connect(addr);
    c.send_pipeline(cmds);
    cmds.iter().map(|_| c.read().expect("reply")).collect()
}

/// Every reply of these single-shard transactions equals a plain redis-server's.
#[test]
fn transactions_answer_as_redis_does() {
    let (_shards, _addrs, rw) = three_shards();
    let plain = redis();
    let cmds: Vec<Vec<&str>> = vec![
        vec!["MULTI"],
        vec!["SET", "{t}a", "1"],
        vec!["INCR", "{t}a"],
        vec!["MGET", "{t}a", "{t}b"],
        vec!["PING"],
        vec!["EXEC"],
        vec!["GET", "{t}a"],
        // Nothing queued.
        vec!["MULTI"],
        vec!["EXEC"],
        // Only key-less commands.
        vec!["MULTI"],
        vec!["PING"],
        vec!["ECHO", "hi"],
        vec!["EXEC"],
        // DISCARD.
        vec!["MULTI"],
        vec!["SET", "{t}a", "discarded"],
        vec!["DISCARD"],
        vec!["GET", "{t}a"],
        // Errors that do not abort, and one that does.
        vec!["MULTI"],
        vec!["MULTI"],
        vec!["WATCH", "{t}a"],
        vec!["SET", "{t}a"],
        vec!["SET", "{t}a", "aborted"],
        vec!["EXEC"],
        vec!["GET", "{t}a"],
        // Outside a transaction.
        vec!["EXEC"],
        vec!["DISCARD"],
        vec!["UNWATCH"],
        // A runtime error inside EXEC is only that command's.
        vec!["MULTI"],
        vec!["SET", "{t}s", "x"],
        vec!["LPUSH", "{t}s", "y"],
        vec!["GET", "{t}s"],
        vec!["EXEC"],
        // WATCH, no conflict.
        vec!["WATCH", "{t}a", "{t}b"],
        vec!["GET", "{t}a"],
        vec!["MULTI"],
        vec!["SET", "{t}b", "2"],
        vec!["EXEC"],
        vec!["MGET", "{t}a", "{t}b"],
    ];
    let want = run(plain.addr, &cmds);
    let got = run(rw.addr, &cmds);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "reply {i} to {:?}", cmds[i]);
    }
}

/// A transaction whose keys hash to two shards: the second key gets CROSSSLOT, EXEC aborts,
/// and neither shard has either key.
#[test]
fn crossslot_aborts_and_applies_nothing() {
    let (_shards, addrs, rw) = three_shards();
    let a = "{a}x";
    let b = (0..100)
        .map(|i| format!("{{b{i}}}y"))
        .find(|b| shard_of(rw.addr, &addrs, b) != shard_of(rw.addr, &addrs, a))
        .expect("a key on another shard");
    let replies = run(
        rw.addr,
        &[
            vec!["MULTI"],
            vec!["SET", a, "1"],
            vec!["SET", &b, "1"],
            vec!["INCR", a],
            vec!["EXEC"],
        ],
    );
    assert_eq!(replies[0], Resp::Simple("OK".into()));
    assert_eq!(replies[1], Resp::Simple("QUEUED".into()));
    assert_eq!(
        replies[2],
        Resp::Error("CROSSSLOT Keys in request don't hash to the same slot".into())
    );
    assert_eq!(replies[3], Resp::Simple("QUEUED".into()));
    assert_eq!(
        replies[4],
        Resp::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    for s in &addrs {
        let mut c = RespConn::connect(*s);
        assert_eq!(
            c.call(&["EXISTS", a, &b]),
            Resp::Int(0),
            "nothing applied on {s}"
        );
    }
    // A keyed command after a key-less start pins to its shard; one of another shard then
    // aborts too.
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(
        c.call(&["WATCH", a, &b])
            .error()
            .map(|e| e.starts_with("CROSSSLOT")),
        Some(true)
    );
}

/// WATCH pins the session; a write by another client makes EXEC answer a null array.
/// Keys of one transaction routed to two clusters get the refusal every other kind of
/// command gets for that (the chain's and the blocking commands' text), not CROSSSLOT, which
/// is about two shards of one cluster; EXEC aborts and nothing is applied.
#[test]
fn keys_of_two_clusters_abort_with_the_one_text_for_it() {
    let (a, b) = (redis(), redis());
    let yaml = format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes:\n      catch_all: a\n      prefixes:\n        - {{ prefix: \"b:\", cluster: b }}\nclusters:\n  - name: a\n    shards:\n      - name: a0\n        endpoints: [ {{ address: \"{}\", role: primary }} ]\n  - name: b\n    shards:\n      - name: b0\n        endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
        a.addr, b.addr
    );
    let rw = respway(&yaml, 1);
    let replies = run(
        rw.addr,
        &[
            vec!["MULTI"],
            vec!["SET", "x", "1"],
            vec!["SET", "b:y", "1"],
            vec!["EXEC"],
            vec!["MGET", "x", "b:y"],
        ],
    );
    let two_clusters =
        Resp::Error("ERR respway: keys in request route to different clusters".into());
    assert_eq!(replies[2], two_clusters);
    assert_eq!(
        replies[3],
        Resp::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    assert_eq!(replies[4], two_clusters, "the chain says the same");
    for s in [a.addr, b.addr] {
        assert_eq!(
            RespConn::connect(s).call(&["EXISTS", "x", "b:y"]),
            Resp::Int(0)
        );
    }
}

#[test]
fn watch_conflict_aborts_the_transaction() {
    let (_shards, _addrs, rw) = three_shards();
    let mut c = RespConn::connect(rw.addr);
    let mut other = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["SET", "{w}k", "orig"]), Resp::Simple("OK".into()));
    assert_eq!(c.call(&["WATCH", "{w}k"]), Resp::Simple("OK".into()));
    assert_eq!(c.call(&["GET", "{w}k"]), Resp::bulk("orig"));
    assert_eq!(
        other.call(&["SET", "{w}k", "changed"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(c.call(&["MULTI"]), Resp::Simple("OK".into()));
    assert_eq!(
        c.call(&["SET", "{w}k", "mine"]),
        Resp::Simple("QUEUED".into())
    );
    assert_eq!(c.call(&["EXEC"]), Resp::Array(None));
    assert_eq!(c.call(&["GET", "{w}k"]), Resp::bulk("changed"));
    // UNWATCH ends a watch without a transaction.
    assert_eq!(c.call(&["WATCH", "{w}k"]), Resp::Simple("OK".into()));
    assert_eq!(c.call(&["UNWATCH"]), Resp::Simple("OK".into()));
    assert_eq!(
        other.call(&["SET", "{w}k", "again"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(c.call(&["MULTI"]), Resp::Simple("OK".into()));
    assert_eq!(
        c.call(&["SET", "{w}k", "mine"]),
        Resp::Simple("QUEUED".into())
    );
    assert_eq!(
        c.call(&["EXEC"]),
        Resp::Array(Some(vec![Resp::Simple("OK".into())]))
    );
}

/// Connections the shard has accepted so far (asked on `conn`, which is counted once).
fn connections_received(conn: &mut RespConn) -> u64 {
    let info = conn.call(&["INFO", "stats"]).text();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_connections_received")
}

/// A client that leaves in the middle of a transaction applies nothing, and the dedicated
/// connection is cleaned and reused by the next transaction (no new connection).
#[test]
fn client_leaving_mid_transaction_applies_nothing() {
    let (_shards, addrs, rw) = three_shards();
    let mut shard = RespConn::connect(addrs[shard_of(rw.addr, &addrs, "{h}probe")]);
    // Warm up: one transaction opens the dedicated connection.
    let ok = run(
        rw.addr,
        &[vec!["MULTI"], vec!["SET", "{h}a", "0"], vec!["EXEC"]],
    );
    assert_eq!(ok[2], Resp::Array(Some(vec![Resp::Simple("OK".into())])));
    // Settle: the warm-up's connection is in the pool (no state to wait on) before counting.
    std::thread::sleep(Duration::from_millis(200));
    let before = connections_received(&mut shard);
    for i in 0..20 {
        let mut c = RespConn::connect(rw.addr);
        assert_eq!(c.call(&["MULTI"]), Resp::Simple("OK".into()));
        let v = format!("left{i}");
        assert_eq!(c.call(&["SET", "{h}a", &v]), Resp::Simple("QUEUED".into()));
        assert!(c.call(&["WATCH", "{h}a"]).is_error(), "WATCH inside MULTI");
        drop(c);
        // Time for respway to clean the abandoned transaction's connection and give it back
        // to the pool before the next client takes one (no state shows it).
        std::thread::sleep(Duration::from_millis(20));
    }
    // Time for an abandoned EXEC to run, which none may.
    std::thread::sleep(Duration::from_millis(200));
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(
        c.call(&["GET", "{h}a"]),
        Resp::bulk("0"),
        "no abandoned EXEC ran"
    );
    let r = run(
        rw.addr,
        &[vec!["MULTI"], vec!["INCR", "{h}a"], vec!["EXEC"]],
    );
    assert_eq!(
        r[2],
        Resp::Array(Some(vec![Resp::Int(1)])),
        "next transaction is clean"
    );
    // The shared connection of the new sessions existed already; the dedicated one is reused.
    assert_eq!(
        connections_received(&mut shard),
        before,
        "no new upstream connection"
    );
}

/// `clients` clients each running `rate` transactions per second for `secs`; returns how
/// many ran.
fn transaction_load(addr: SocketAddr, clients: usize, rate: u64, secs: u64) -> u64 {
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = RespConn::connect(addr);
                let start = Instant::now();
                let mut n = 0u64;
                while start.elapsed() < Duration::from_secs(secs) && n < secs * rate {
                    c.send_pipeline(&[
                        vec!["MULTI"],
                        vec!["INCR", "{rate}n"],
                        vec!["INCR", "{rate}m"],
                        vec!["EXEC"],
                    ]);
                    for _ in 0..3 {
                        c.read().expect("reply");
                    }
                    match c.read().expect("EXEC") {
                        Resp::Array(Some(v)) if v.len() == 2 => {}
                        other => panic!("EXEC: {other:?}"),
                    }
                    n += 1;
                    // Pace to the rate.
                    let due = Duration::from_micros(n * 1_000_000 / rate);
                    if let Some(wait) = due.checked_sub(start.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
                n
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("client")).sum()
}

/// 1,000 transactions per second on one hashtag for 10 s: after a warm-up at the same
/// concurrency the shard accepts no new connection (no connect/close per MULTI).
#[test]
fn steady_transactions_open_no_new_upstream_connections() {
    let (_shards, addrs, rw) = three_shards();
    let mut shard = RespConn::connect(addrs[shard_of(rw.addr, &addrs, "{rate}probe")]);
    let warm = transaction_load(rw.addr, 4, 250, 1);
    // Settle: the warm-up's connections are in the pool (no state to wait on) before counting.
    std::thread::sleep(Duration::from_millis(200));
    let before = connections_received(&mut shard);
    let done = transaction_load(rw.addr, 4, 250, 10);
    assert!(done >= 5000, "only {done} transactions ran in 10 s");
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(
        c.call(&["GET", "{rate}m"]).text(),
        (warm + done).to_string()
    );
    assert_eq!(
        connections_received(&mut shard),
        before,
        "{done} transactions opened new upstream connections"
    );
}

/// Inside a transaction, keys of a mirrored route and hot keys are refused and the
/// transaction aborts (one EXEC cannot reach another cluster or every shard); nothing is
/// applied on either cluster. Outside a transaction the same keys work as usual.
#[test]
fn mirrored_routes_and_hot_keys_are_refused_inside_transactions() {
    let (old, new) = (redis(), redis());
    let yaml = format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes:\n      catch_all: old\n      prefixes:\n        - {{ prefix: \"m:\", cluster: old, mirrors: [ {{ cluster: new, mode: dual_write }} ] }}\nclusters:\n  - name: old\n    hot_keys:\n      - {{ prefix: HIGH_FREQ_ }}\n    shards:\n      - name: o0\n        endpoints: [ {{ address: \"{}\", role: primary }} ]\n  - name: new\n    shards:\n      - name: n0\n        endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
        old.addr, new.addr
    );
    let rw = respway(&yaml, 1);
    for key in ["m:{k}", "HIGH_FREQ_k"] {
        let replies = run(
            rw.addr,
            &[
                vec!["MULTI"],
                vec!["SET", "plain", "1"],
                vec!["SET", key, "1"],
                vec!["EXEC"],
            ],
        );
        assert_eq!(replies[1], Resp::Simple("QUEUED".into()), "{key}");
        assert!(
            replies[2].error().unwrap_or("").starts_with("ERR respway:"),
            "{key}: {:?}",
            replies[2]
        );
        assert_eq!(
            replies[3],
            Resp::Error("EXECABORT Transaction discarded because of previous errors.".into()),
            "{key}"
        );
        for s in [old.addr, new.addr] {
            let mut c = RespConn::connect(s);
            assert_eq!(
                c.call(&["EXISTS", "plain", key]),
                Resp::Int(0),
                "{key} on {s}"
            );
        }
        let mut c = RespConn::connect(rw.addr);
        assert_eq!(c.call(&["SET", key, "outside"]), Resp::Simple("OK".into()));
    }
}

/// Commands without keys that a MULTI holds before its first key are bounded (the proxy
/// holds them, not Redis): past the bound they are refused and EXEC aborts, nothing runs.
#[test]
fn keyless_commands_held_before_the_first_key_are_bounded() {
    let (_shards, addrs, rw) = three_shards();
    let mut cmds: Vec<Vec<&str>> = vec![vec!["MULTI"]];
    cmds.extend(std::iter::repeat_n(vec!["PING"], 1100));
    cmds.push(vec!["SET", "{b}k", "v"]);
    cmds.push(vec!["EXEC"]);
    let replies = run(rw.addr, &cmds);
    assert!(replies[1..=1024]
        .iter()
        .all(|r| *r == Resp::Simple("QUEUED".into())));
    assert_eq!(
        replies[1025].error(),
        Some(
            "ERR respway: more than 1024 commands without keys before the transaction's first key"
        )
    );
    assert_eq!(
        replies.last(),
        Some(&Resp::Error(
            "EXECABORT Transaction discarded because of previous errors.".into()
        ))
    );
    for s in &addrs {
        assert_eq!(
            RespConn::connect(*s).call(&["EXISTS", "{b}k"]),
            Resp::Int(0)
        );
    }
}

/// A transaction whose dedicated connection broke before EXEC: EXEC is answered as a lost
/// connection (`connection lost`), not `connection closed` (which means the endpoint left
/// the configuration), and nothing is applied.
#[test]
fn exec_on_a_broken_dedicated_connection_is_a_lost_connection() {
    let (_shards, addrs, rw) = three_shards();
    let i = shard_of(rw.addr, &addrs, "{t}a");
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["MULTI"]), Resp::Simple("OK".into()));
    assert_eq!(c.call(&["SET", "{t}a", "1"]), Resp::Simple("QUEUED".into()));
    // Every other client of the shard (respway's connections) is cut.
    RespConn::connect(addrs[i]).call(&["CLIENT", "KILL", "TYPE", "normal"]);
    // Time for respway to see the cut (it shows nowhere) before EXEC.
    std::thread::sleep(Duration::from_millis(100));
    let r = c.call(&["EXEC"]);
    let e = r.error().unwrap_or_else(|| panic!("EXEC: {r:?}"));
    assert!(e.contains(": connection lost: "), "{e}");
    assert_eq!(
        RespConn::connect(addrs[i]).call(&["EXISTS", "{t}a"]),
        Resp::Int(0)
    );
}
