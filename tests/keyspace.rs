//! Keyspace-wide commands through respway over real redis-server shards: SCAN (its cursor
//! over every shard, MATCH / COUNT / TYPE, writes during the scan, a config swap during the
//! scan), KEYS and its `keys_max` guard, DBSIZE, RANDOMKEY, FLUSHDB / FLUSHALL behind
//! `admin_commands`, hot keys listed once, prefix routes with `remove_prefix`, RESP3.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;

/// One listener (with `listener` settings added) over `shards`, catch-all cluster `main`
/// (with `cluster` settings added).
fn yaml(shards: &[SocketAddr], listener: &str, cluster: &str) -> String {
    let mut y = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    op_timeout: 5s\n{listener}    routes:\n      catch_all: main\nclusters:\n  - name: main\n{cluster}    shards:\n"
    );
    for (i, a) in shards.iter().enumerate() {
        y.push_str(&format!(
            "      - name: s{i}\n        endpoints: [ {{ address: \"{a}\", role: primary }} ]\n"
        ));
    }
    y
}

fn config(y: &str) -> respway_filters::model::Config {
    respway_xds::translate(&respway_xds::parse_yaml(y).unwrap()).unwrap()
}

fn addrs(p: &[Proc]) -> Vec<SocketAddr> {
    p.iter().map(|s| s.addr).collect()
}

/// Writes `keys` (value = key) through `c` in MSET pipelines.
fn load(c: &mut redis::Connection, keys: &[String]) {
    for chunk in keys.chunks(20_000) {
        let mut pipe = redis::pipe();
        for batch in chunk.chunks(500) {
            let mut cmd = redis::cmd("MSET");
            for k in batch {
                cmd.arg(k).arg(k);
            }
            pipe.add_command(cmd).ignore();
        }
        let () = pipe.query(c).expect("MSET pipeline");
    }
}

/// One SCAN call: the next cursor and the keys.
fn scan_once(c: &mut redis::Connection, cursor: &str, opts: &[&str]) -> (String, Vec<String>) {
    redis::cmd("SCAN")
        .arg(cursor)
        .arg(opts)
        .query(c)
        .unwrap_or_else(|e| panic!("SCAN {cursor} {opts:?}: {e}"))
}

/// A whole SCAN walk: every key returned (with repeats) and the number of calls; panics past
/// `max_calls` calls or 20 s.
fn scan_all(c: &mut redis::Connection, opts: &[&str], max_calls: usize) -> (Vec<String>, usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut cursor = "0".to_string();
    let mut out = Vec::new();
    for calls in 1..=max_calls {
        assert!(Instant::now() < deadline, "SCAN walk took over 20 s");
        let (next, keys) = scan_once(c, &cursor, opts);
        out.extend(keys);
        if next == "0" {
            return (out, calls);
        }
        cursor = next;
    }
    panic!("SCAN {opts:?} did not end within {max_calls} calls");
}

fn err_text(r: redis::RedisResult<redis::Value>) -> String {
    match r {
        Err(e) => e.to_string(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

#[test]
fn scan_returns_every_key_of_four_shards_while_writes_go_on() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let a = addrs(&shards);
    let rw = respway(&yaml(&a, "", ""), 2);
    let mut c = sync_client(rw.addr);
    let original: Vec<String> = (0..100_000).map(|i| format!("k:{i}")).collect();
    load(&mut c, &original);
    let per_shard: Vec<u64> = a.iter().map(|x| dbsize(*x)).collect();
    assert_eq!(per_shard.iter().sum::<u64>(), 100_000);
    assert!(
        per_shard.iter().all(|&n| n > 10_000),
        "keys spread over every shard: {per_shard:?}"
    );

    // A second client writes 10% more keys (new names) during the scan: it starts after the
    // first SCAN call, and the scan waits for it to end once it is past the second shard, so
    // every write lands while the walk is under way.
    let addr = rw.addr;
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        let mut w = sync_client(addr);
        go_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the scan starts");
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut written = 0;
        for batch in 0..100 {
            if Instant::now() > deadline {
                break;
            }
            let mut pipe = redis::pipe();
            for i in 0..100 {
                pipe.cmd("SET")
                    .arg(format!("new:{}", batch * 100 + i))
                    .arg(1)
                    .ignore();
            }
            let () = pipe.query(&mut w).expect("writes during the scan");
            written += 100;
        }
        written
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut go = Some(go_tx);
    let mut writer = Some(writer);
    let mut written = 0;
    let mut seen = Vec::new();
    let mut cursor = "0".to_string();
    let mut calls = 0;
    loop {
        assert!(
            calls < 5_000 && Instant::now() < deadline,
            "SCAN did not end"
        );
        let (next, keys) = scan_once(&mut c, &cursor, &["COUNT", "500"]);
        calls += 1;
        seen.extend(keys);
        if let Some(go) = go.take() {
            go.send(()).unwrap();
        }
        if next == "0" {
            break;
        }
        cursor = next;
        if cursor.parse::<u64>().unwrap() & 0xffff >= 2 {
            if let Some(w) = writer.take() {
                written = w.join().expect("writer");
            }
        }
    }
    assert!(writer.is_none(), "the scan ended before the writer");
    assert_eq!(written, 10_000);
    let seen: HashSet<String> = seen.into_iter().collect();
    let missing: Vec<&String> = original.iter().filter(|k| !seen.contains(*k)).collect();
    assert!(
        missing.is_empty(),
        "{} original keys never returned, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    assert!(calls >= 100_000 / 1_000, "only {calls} SCAN calls");
    // Nothing but keys that exist.
    assert!(seen
        .iter()
        .all(|k| k.starts_with("k:") || k.starts_with("new:")));
    let total: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(total, 110_000);
}

#[test]
fn scan_honours_match_count_and_type_and_rejects_bad_cursors() {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let a = addrs(&shards);
    let rw = respway(&yaml(&a, "", ""), 1);
    let mut c = sync_client(rw.addr);
    let strings: Vec<String> = (0..300).map(|i| format!("s:{i}")).collect();
    load(&mut c, &strings);
    for i in 0..60 {
        let _: i64 = redis::cmd("HSET")
            .arg(format!("h:{i}"))
            .arg("f")
            .arg("v")
            .query(&mut c)
            .unwrap();
    }
    // MATCH
    let (got, _) = scan_all(&mut c, &["MATCH", "h:*"], 1_000);
    let got: HashSet<String> = got.into_iter().collect();
    let want: HashSet<String> = (0..60).map(|i| format!("h:{i}")).collect();
    assert_eq!(got, want);
    // TYPE
    let (got, _) = scan_all(&mut c, &["TYPE", "string", "COUNT", "100"], 1_000);
    let got: HashSet<String> = got.into_iter().collect();
    assert_eq!(got, strings.iter().cloned().collect());
    // COUNT: a large count walks each shard in one call; a small one takes many.
    let (all, big) = scan_all(&mut c, &["COUNT", "10000"], 100);
    assert_eq!(all.len(), 360);
    assert!(big <= 3, "COUNT 10000 took {big} calls over 3 shards");
    let (all, small) = scan_all(&mut c, &["COUNT", "5"], 1_000);
    assert_eq!(all.iter().collect::<HashSet<_>>().len(), 360);
    assert!(small >= 360 / 20, "COUNT 5 took only {small} calls");
    // Every batch of a COUNT 5 walk is small (Redis may return a few more than asked).
    let (_, batch) = scan_once(&mut c, "0", &["COUNT", "5"]);
    assert!(batch.len() <= 20, "COUNT 5 returned {} keys", batch.len());

    // Bad input gets Redis's answers, and the connection goes on.
    for bad in ["abc", "-1", "1x", "18446744073709551616", ""] {
        let e = err_text(redis::cmd("SCAN").arg(bad).query(&mut c));
        assert!(e.contains("invalid cursor"), "SCAN {bad:?}: {e}");
    }
    // Shard index 3 (and 9) with 3 shards.
    for out_of_range in ["3", "9", "65539"] {
        let e = err_text(redis::cmd("SCAN").arg(out_of_range).query(&mut c));
        assert!(e.contains("invalid cursor"), "SCAN {out_of_range}: {e}");
    }
    let e = err_text(
        redis::cmd("SCAN")
            .arg("0")
            .arg("COUNT")
            .arg("0")
            .query(&mut c),
    );
    assert!(e.contains("syntax error"), "COUNT 0: {e}");
    let e = err_text(
        redis::cmd("SCAN")
            .arg("0")
            .arg("BOGUS")
            .arg("1")
            .query(&mut c),
    );
    assert!(e.contains("syntax error"), "unknown option: {e}");
    let e = err_text(redis::cmd("SCAN").arg("0").arg("MATCH").query(&mut c));
    assert!(e.contains("syntax error"), "MATCH without a value: {e}");
    // An unknown TYPE: whatever Redis says (7.0: no keys), and respway stays up.
    let r: redis::RedisResult<redis::Value> = redis::cmd("SCAN")
        .arg("0")
        .arg("TYPE")
        .arg("nosuch")
        .query(&mut c);
    if let Ok(v) = r {
        assert!(matches!(v, redis::Value::Array(_)), "{v:?}");
    }
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn keys_dbsize_randomkey_and_single_key_introspection() {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let a = addrs(&shards);
    let rw = respway(&yaml(&a, "    keys_max: 150\n", ""), 1);
    let mut c = sync_client(rw.addr);
    let mut r = RespConn::connect(rw.addr);
    // Empty: DBSIZE 0, RANDOMKEY nil ($-1 in RESP2), KEYS empty.
    let n: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n, 0);
    r.send(&["RANDOMKEY"]);
    assert_eq!(r.read_exact_raw(5).unwrap(), b"$-1\r\n");
    let k: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert!(k.is_empty());

    let keys: Vec<String> = (0..100).map(|i| format!("k:{i}")).collect();
    load(&mut c, &keys);
    let others: Vec<String> = (0..40).map(|i| format!("o:{i}")).collect();
    load(&mut c, &others);
    // KEYS merges every shard.
    let got: Vec<String> = redis::cmd("KEYS").arg("k:*").query(&mut c).unwrap();
    assert_eq!(got.len(), 100);
    assert_eq!(
        got.into_iter().collect::<HashSet<_>>(),
        keys.iter().cloned().collect()
    );
    let got: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert_eq!(got.len(), 140);
    // DBSIZE sums every shard.
    let n: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n, 140);
    assert_eq!(a.iter().map(|x| dbsize(*x)).sum::<u64>(), 140);
    // RANDOMKEY returns keys that exist (from more than one shard over many calls).
    let all: HashSet<&String> = keys.iter().chain(&others).collect();
    let mut seen = HashSet::new();
    for _ in 0..60 {
        let k: String = redis::cmd("RANDOMKEY").query(&mut c).unwrap();
        assert!(all.contains(&k), "RANDOMKEY gave {k}");
        seen.insert(k);
    }
    assert!(seen.len() > 3, "RANDOMKEY: {seen:?}");
    // Past keys_max (150): refused.
    let more: Vec<String> = (0..20).map(|i| format!("m:{i}")).collect();
    load(&mut c, &more);
    let e = err_text(redis::cmd("KEYS").arg("*").query(&mut c));
    assert!(
        e.contains("respway: KEYS matched more than 150 keys (the listener's keys_max); use SCAN"),
        "{e}"
    );
    let got: Vec<String> = redis::cmd("KEYS").arg("m:*").query(&mut c).unwrap();
    assert_eq!(got.len(), 20);

    // Single-key introspection goes to the key's shard.
    let used: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("k:1")
        .query(&mut c)
        .unwrap();
    assert!(used > 0);
    let enc: String = redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg("k:1")
        .query(&mut c)
        .unwrap();
    assert_eq!(enc, "embstr");
    let t: String = redis::cmd("TYPE").arg("k:1").query(&mut c).unwrap();
    assert_eq!(t, "string");

    // Every shard empty again: RANDOMKEY nil after trying them all.
    for k in keys.iter().chain(&others).chain(&more) {
        let _: i64 = redis::cmd("DEL").arg(k).query(&mut c).unwrap();
    }
    let none: Option<String> = redis::cmd("RANDOMKEY").query(&mut c).unwrap();
    assert_eq!(none, None);
}

#[test]
fn flush_is_refused_by_default_and_empties_every_shard_with_admin_commands() {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let a = addrs(&shards);
    let keys: Vec<String> = (0..90).map(|i| format!("k:{i}")).collect();
    {
        let rw = respway(&yaml(&a, "", ""), 1);
        let mut c = sync_client(rw.addr);
        load(&mut c, &keys);
        let before: Vec<u64> = a.iter().map(|x| dbsize(*x)).collect();
        assert!(before.iter().all(|&n| n > 0), "{before:?}");
        for (cmd, arg) in [
            ("FLUSHDB", None),
            ("flushall", None),
            ("FlushDB", Some("ASYNC")),
            ("FLUSHALL", Some("SYNC")),
        ] {
            let mut q = redis::cmd(cmd);
            if let Some(x) = arg {
                q.arg(x);
            }
            let e = err_text(q.query(&mut c));
            let name = cmd.to_ascii_uppercase();
            assert!(
                e.contains(&format!(
                    "respway: {name} is refused: it would empty every shard (the listener's admin_commands allows it)"
                )),
                "{cmd}: {e}"
            );
        }
        let after: Vec<u64> = a.iter().map(|x| dbsize(*x)).collect();
        assert_eq!(before, after, "a refused FLUSH emptied a shard");
        for x in &a {
            assert_eq!(commandstat(*x, "flushdb") + commandstat(*x, "flushall"), 0);
        }
    }
    let rw = respway(&yaml(&a, "    admin_commands: true\n", ""), 1);
    let mut c = sync_client(rw.addr);
    let ok: String = redis::cmd("FLUSHDB").query(&mut c).unwrap();
    assert_eq!(ok, "OK");
    assert_eq!(a.iter().map(|x| dbsize(*x)).collect::<Vec<_>>(), [0, 0, 0]);
    load(&mut c, &keys);
    let ok: String = redis::cmd("FLUSHALL").arg("ASYNC").query(&mut c).unwrap();
    assert_eq!(ok, "OK");
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.iter().any(|x| dbsize(*x) > 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(a.iter().map(|x| dbsize(*x)).collect::<Vec<_>>(), [0, 0, 0]);
    // A bad argument is each shard's error.
    let e = err_text(redis::cmd("FLUSHDB").arg("NOW").query(&mut c));
    assert!(e.contains("syntax error"), "{e}");
}

#[test]
fn hot_keys_are_listed_once() {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let a = addrs(&shards);
    let rw = respway(
        &yaml(&a, "", "    hot_keys:\n      - { prefix: HOT_ }\n"),
        1,
    );
    let mut c = sync_client(rw.addr);
    let hot: Vec<String> = (0..8).map(|i| format!("HOT_{i}")).collect();
    for k in &hot {
        let () = redis::cmd("SET").arg(k).arg("v").query(&mut c).unwrap();
    }
    let cold: Vec<String> = (0..50).map(|i| format!("c:{i}")).collect();
    load(&mut c, &cold);
    // Every shard holds every hot key.
    for x in &a {
        let mut s = RespConn::connect(*x);
        for k in &hot {
            assert!(s.get(k).is_some(), "{k} missing on {x}");
        }
    }
    let count = |v: Vec<String>| {
        let mut m: HashMap<String, usize> = HashMap::new();
        for k in v {
            *m.entry(k).or_default() += 1;
        }
        m
    };
    let (scanned, _) = scan_all(&mut c, &["COUNT", "7"], 1_000);
    let m = count(scanned);
    assert_eq!(m.len(), 58);
    for k in hot.iter().chain(&cold) {
        assert_eq!(m.get(k), Some(&1), "SCAN listed {k} {:?} times", m.get(k));
    }
    let (scanned, _) = scan_all(&mut c, &["MATCH", "HOT_*"], 1_000);
    assert_eq!(count(scanned).len(), 8);
    let listed: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert_eq!(listed.len(), 58);
    let m = count(listed);
    assert!(hot.iter().all(|k| m.get(k) == Some(&1)), "{m:?}");
    // DBSIZE counts what the shards store: each hot key once per shard.
    let n: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n, 50 + 8 * 3);
}

#[test]
fn prefix_routes_get_their_prefix_back_and_mirrors_are_not_listed() {
    let main: Vec<Proc> = (0..2).map(|_| redis()).collect();
    let side = redis();
    let shadow = redis();
    let mut y = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    routes:\n      catch_all: main\n      catch_all_mirrors:\n        - {{ cluster: shadow, mode: dual_write }}\n      prefixes:\n        - {{ prefix: \"side:\", cluster: side, remove_prefix: true }}\nclusters:\n  - name: side\n    shards:\n      - endpoints: [ {{ address: \"{}\", role: primary }} ]\n  - name: shadow\n    shards:\n      - endpoints: [ {{ address: \"{}\", role: primary }} ]\n  - name: main\n    shards:\n",
        side.addr, shadow.addr
    );
    for m in &main {
        y.push_str(&format!(
            "      - endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
            m.addr
        ));
    }
    let rw = respway(&y, 1);
    let mut c = sync_client(rw.addr);
    let main_keys: Vec<String> = (0..40).map(|i| format!("m:{i}")).collect();
    load(&mut c, &main_keys);
    let side_keys: Vec<String> = (0..30).map(|i| format!("side:k{i}")).collect();
    for k in &side_keys {
        let () = redis::cmd("SET").arg(k).arg("v").query(&mut c).unwrap();
    }
    // The side cluster stores them without the prefix; the shadow got the mirrored copies.
    assert_eq!(RespConn::connect(side.addr).get("k1"), Some(b"v".to_vec()));
    let deadline = Instant::now() + Duration::from_secs(5);
    while dbsize(shadow.addr) < 40 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(dbsize(shadow.addr), 40);

    let all: HashSet<String> = main_keys.iter().chain(&side_keys).cloned().collect();
    let (scanned, _) = scan_all(&mut c, &["COUNT", "9"], 1_000);
    assert_eq!(scanned.len(), 70, "mirror copies listed? {scanned:?}");
    assert_eq!(scanned.into_iter().collect::<HashSet<_>>(), all);
    let side_set: HashSet<String> = side_keys.iter().cloned().collect();
    for pat in ["side:*", "side:k*", "*k*", "s*"] {
        let (got, _) = scan_all(&mut c, &["MATCH", pat], 1_000);
        assert_eq!(
            got.into_iter().collect::<HashSet<_>>(),
            side_set,
            "SCAN MATCH {pat}"
        );
        let got: Vec<String> = redis::cmd("KEYS").arg(pat).query(&mut c).unwrap();
        assert_eq!(
            got.into_iter().collect::<HashSet<_>>(),
            side_set,
            "KEYS {pat}"
        );
    }
    let got: Vec<String> = redis::cmd("KEYS").arg("side:k1").query(&mut c).unwrap();
    assert_eq!(got, ["side:k1"]);
    let (got, _) = scan_all(&mut c, &["MATCH", "m:*"], 1_000);
    assert_eq!(got.len(), 40);
    let got: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert_eq!(got.into_iter().collect::<HashSet<_>>(), all);
    let n: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n, 70);
    for _ in 0..30 {
        let k: String = redis::cmd("RANDOMKEY").query(&mut c).unwrap();
        assert!(all.contains(&k), "RANDOMKEY gave {k}");
    }
}

#[test]
fn a_cursor_survives_a_swap_that_keeps_the_shards() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let a = addrs(&shards);
    let rw = respway(&yaml(&a, "", ""), 1);
    let server = rw.server.as_ref().unwrap();
    let mut c = sync_client(rw.addr);
    let keys: Vec<String> = (0..2_000).map(|i| format!("k:{i}")).collect();
    load(&mut c, &keys);

    // Walk into the second shard, then swap to a config with the same shards.
    let mut seen = HashSet::new();
    let mut cursor = "0".to_string();
    for _ in 0..1_000 {
        let (next, got) = scan_once(&mut c, &cursor, &["COUNT", "50"]);
        seen.extend(got);
        cursor = next;
        let shard = cursor.parse::<u64>().unwrap() & 0xffff;
        if shard >= 1 && cursor.parse::<u64>().unwrap() >> 16 != 0 {
            break;
        }
    }
    let mid: u64 = cursor.parse().unwrap();
    assert!(mid & 0xffff >= 1 && mid >> 16 != 0, "cursor {cursor}");
    server
        .apply(config(&yaml(
            &a,
            "    keys_max: 5000\n",
            "    hot_keys:\n      - { prefix: HOT_ }\n",
        )))
        .unwrap();
    for _ in 0..1_000 {
        let (next, got) = scan_once(&mut c, &cursor, &["COUNT", "50"]);
        seen.extend(got);
        cursor = next;
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(cursor, "0");
    assert_eq!(seen, keys.iter().cloned().collect::<HashSet<_>>());

    // A swap to 3 shards: a cursor naming the 4th shard is invalid.
    server.apply(config(&yaml(&a[..3], "", ""))).unwrap();
    let e = err_text(redis::cmd("SCAN").arg("3").query(&mut c));
    assert!(e.contains("invalid cursor"), "{e}");
    let (_, got) = scan_once(&mut c, "2", &["COUNT", "10000"]);
    assert!(!got.is_empty());
}

#[test]
fn resp3_clients_get_valid_keyspace_replies() {
    let shards: Vec<Proc> = (0..2).map(|_| redis()).collect();
    let a = addrs(&shards);
    let rw = respway(&yaml(&a, "", ""), 1);
    let mut r = RespConn::connect(rw.addr);
    let hello = r.call(&["HELLO", "3"]);
    assert!(!hello.is_error(), "{hello:?}");
    // Empty: RANDOMKEY is the RESP3 null.
    r.send(&["RANDOMKEY"]);
    assert_eq!(r.read_exact_raw(3).unwrap(), b"_\r\n");
    for i in 0..20 {
        let k = format!("k:{i}");
        assert_eq!(r.call(&["SET", &k, "v"]), Resp::Simple("OK".into()));
    }
    let mut seen = HashSet::new();
    let mut cursor = "0".to_string();
    for _ in 0..100 {
        let reply = r.call(&["SCAN", &cursor, "COUNT", "3"]);
        let Resp::Array(Some(parts)) = reply else {
            panic!("SCAN in RESP3: {reply:?}");
        };
        assert_eq!(parts.len(), 2, "{parts:?}");
        cursor = parts[0].text();
        let Resp::Array(Some(keys)) = &parts[1] else {
            panic!("SCAN keys in RESP3: {:?}", parts[1]);
        };
        seen.extend(keys.iter().map(Resp::text));
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(cursor, "0");
    assert_eq!(seen.len(), 20);
    assert_eq!(r.call(&["DBSIZE"]), Resp::Int(20));
    let Resp::Array(Some(keys)) = r.call(&["KEYS", "*"]) else {
        panic!("KEYS in RESP3");
    };
    assert_eq!(keys.len(), 20);
    let k = r.call(&["RANDOMKEY"]).text();
    assert!(seen.contains(&k));
}
