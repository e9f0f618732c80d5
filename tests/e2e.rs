//! End-to-end tests: real redis-server shards, respway in-process, real clients (the `redis`
//! crate, raw sockets, redis-cli, redis-benchmark, nutcracker).

use std::collections::HashMap;
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;
use redis::Value;

fn three_shards() -> Vec<Proc> {
    (0..3).map(|_| redis()).collect()
}

fn addrs(p: &[Proc]) -> Vec<std::net::SocketAddr> {
    p.iter().map(|p| p.addr).collect()
}

/// Three shards and respway over them with this hash block (hash tags on). Keep the shards
/// bound (`_shards`, not `_`) for as long as respway is used: dropping them stops them.
fn three_shards_behind_respway(hash: &str, workers: usize) -> (Vec<Proc>, Respway) {
    let shards = three_shards();
    let rw = respway(&sharded_yaml(&addrs(&shards), hash, true), workers);
    (shards, rw)
}

/// Runs `redis-cli -h 127.0.0.1 -p <port> <args>`; returns its stdout and stderr.
fn redis_cli(port: u16, args: &[&str]) -> (String, String) {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn single_key_commands_of_each_type() {
    let (shards, rw) = three_shards_behind_respway("{ policy: maglev }", 2);
    let mut c = sync_client(rw.addr);
    let _: () = redis::cmd("SET")
        .arg("str")
        .arg("v1")
        .query(&mut c)
        .unwrap();
    let v: String = redis::cmd("GET").arg("str").query(&mut c).unwrap();
    assert_eq!(v, "v1");
    let n: i64 = redis::cmd("INCRBY")
        .arg("ctr")
        .arg(5)
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 5);
    let _: i64 = redis::cmd("HSET")
        .arg("h")
        .arg("f")
        .arg("x")
        .arg("g")
        .arg("y")
        .query(&mut c)
        .unwrap();
    let h: HashMap<String, String> = redis::cmd("HGETALL").arg("h").query(&mut c).unwrap();
    assert_eq!(h.get("g").map(String::as_str), Some("y"));
    let _: i64 = redis::cmd("RPUSH")
        .arg("l")
        .arg("a")
        .arg("b")
        .arg("c")
        .query(&mut c)
        .unwrap();
    let l: Vec<String> = redis::cmd("LRANGE")
        .arg("l")
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    assert_eq!(l, ["a", "b", "c"]);
    let _: i64 = redis::cmd("SADD")
        .arg("s")
        .arg("m1")
        .arg("m2")
        .query(&mut c)
        .unwrap();
    let card: i64 = redis::cmd("SCARD").arg("s").query(&mut c).unwrap();
    assert_eq!(card, 2);
    let _: i64 = redis::cmd("ZADD")
        .arg("z")
        .arg(2)
        .arg("b")
        .arg(1)
        .arg("a")
        .query(&mut c)
        .unwrap();
    let z: Vec<String> = redis::cmd("ZRANGE")
        .arg("z")
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    assert_eq!(z, ["a", "b"]);
    let _: bool = redis::cmd("EXPIRE")
        .arg("str")
        .arg(100)
        .query(&mut c)
        .unwrap();
    let ttl: i64 = redis::cmd("TTL").arg("str").query(&mut c).unwrap();
    assert!(ttl > 0 && ttl <= 100, "ttl {ttl}");
    let id: String = redis::cmd("XADD")
        .arg("x")
        .arg("*")
        .arg("f")
        .arg("v")
        .query(&mut c)
        .unwrap();
    assert!(id.contains('-'));
    let bin: Vec<u8> = vec![0, 13, 10, 255, b'$'];
    let _: () = redis::cmd("SET")
        .arg("bin")
        .arg(&bin[..])
        .query(&mut c)
        .unwrap();
    let back: Vec<u8> = redis::cmd("GET").arg("bin").query(&mut c).unwrap();
    assert_eq!(back, bin);
    // Local commands.
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    let echo: String = redis::cmd("ECHO").arg("hi").query(&mut c).unwrap();
    assert_eq!(echo, "hi");
    let info: String = redis::cmd("INFO").query(&mut c).unwrap();
    assert!(info.contains("proxy:respway"), "{info}");
    // Keys landed on more than one shard.
    let used = shards.iter().filter(|s| dbsize(s.addr) > 0).count();
    assert!(used >= 2, "keys should spread over shards, used {used}");
}

#[test]
fn pipeline_of_1000_across_shards_keeps_order() {
    let (shards, rw) = three_shards_behind_respway("{ policy: maglev }", 2);
    let mut c = sync_client(rw.addr);
    let mut p = redis::pipe();
    for i in 0..1000 {
        p.cmd("SET").arg(format!("key:{i}")).arg(i).ignore();
    }
    let _: () = p.query(&mut c).unwrap();
    let mut p = redis::pipe();
    for i in 0..1000u32 {
        p.cmd("GET").arg(format!("key:{i}"));
        if i.is_multiple_of(10) {
            p.cmd("PING"); // local replies interleaved with upstream ones
        }
    }
    let replies: Vec<Value> = p.query(&mut c).unwrap();
    let mut it = replies.into_iter();
    for i in 0..1000u32 {
        let v: i64 = redis::from_redis_value(&it.next().unwrap()).unwrap();
        assert_eq!(v, i64::from(i), "reply {i} out of order");
        if i.is_multiple_of(10) {
            let pong: String = redis::from_redis_value(&it.next().unwrap()).unwrap();
            assert_eq!(pong, "PONG");
        }
    }
    let per_shard: Vec<u64> = shards.iter().map(|s| dbsize(s.addr)).collect();
    assert_eq!(per_shard.iter().sum::<u64>(), 1000);
    assert!(
        per_shard.iter().all(|&n| n > 200),
        "uneven placement {per_shard:?}"
    );
}

#[test]
fn multi_key_split_one_subcommand_per_shard() {
    let (shards, rw) = three_shards_behind_respway("{ policy: maglev }", 1);
    let mut c = sync_client(rw.addr);
    let mut mset = redis::cmd("MSET");
    for i in 0..100 {
        mset.arg(format!("m{i}")).arg(format!("v{i}"));
    }
    let _: () = mset.query(&mut c).unwrap();
    for s in &shards {
        assert_eq!(commandstat(s.addr, "mset"), 1, "one MSET per shard");
    }
    let mut mget = redis::cmd("MGET");
    for i in (0..100).rev() {
        mget.arg(format!("m{i}"));
    }
    mget.arg("missing");
    let vals: Vec<Option<String>> = mget.query(&mut c).unwrap();
    assert_eq!(vals.len(), 101);
    for (j, i) in (0..100).rev().enumerate() {
        assert_eq!(vals[j].as_deref(), Some(format!("v{i}").as_str()));
    }
    assert_eq!(vals[100], None);
    for s in &shards {
        assert_eq!(commandstat(s.addr, "mget"), 1, "one MGET per shard");
    }
    let n: i64 = redis::cmd("EXISTS")
        .arg("m1")
        .arg("m2")
        .arg("m1")
        .arg("nope")
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 3);
    let mut del = redis::cmd("DEL");
    for i in 0..50 {
        del.arg(format!("m{i}"));
    }
    del.arg("nope");
    let n: i64 = del.query(&mut c).unwrap();
    assert_eq!(n, 50);
    let total: u64 = shards.iter().map(|s| dbsize(s.addr)).sum();
    assert_eq!(total, 50);
}

/// The list `list` = 3 1 2 and weights `{weight}1..3` = 30 10 20: by weight, 2 3 1.
fn seed_sort(c: &mut redis::Connection, list: &str, weight: &str) {
    let _: i64 = redis::cmd("RPUSH")
        .arg(list)
        .arg(&["3", "1", "2"])
        .query(c)
        .unwrap();
    for (i, v) in [(1, "30"), (2, "10"), (3, "20")] {
        let _: () = redis::cmd("SET")
            .arg(format!("{weight}{i}"))
            .arg(v)
            .query(c)
            .unwrap();
    }
}

/// `SORT key BY pattern` and `GET pattern` read other keys on the shard that runs the SORT.
/// Keys the pattern forms on other shards would silently read as missing (weights of 0,
/// `GET`s of nil), so respway refuses such patterns as Redis Cluster does, and runs the ones
/// whose keys all live with the sorted key: a `{hashtag}` before the `*`, or a single shard.
#[test]
fn sort_patterns_that_read_other_shards_are_refused() {
    const BY_DENIED: &str = "BY option of SORT denied in Cluster mode when keys formed by the pattern may be in different slots.";
    const GET_DENIED: &str = "GET option of SORT denied in Cluster mode when keys formed by the pattern may be in different slots.";
    let (_shards, rw) = three_shards_behind_respway("{ policy: crc16_slots }", 1);
    let mut c = sync_client(rw.addr);
    let refused = |c: &mut redis::Connection, args: &[&str]| -> String {
        let err = redis::cmd(args[0])
            .arg(&args[1..])
            .query::<Value>(c)
            .unwrap_err();
        assert_eq!(err.code(), Some("ERR"), "{args:?}: {err}");
        err.detail().unwrap_or_default().to_string()
    };
    let sorted = |c: &mut redis::Connection, args: &[&str]| -> Vec<String> {
        redis::cmd(args[0])
            .arg(&args[1..])
            .query(c)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    };
    // "a" and "b" are in different crc16 thirds (slots 15495 and 3300); the weights spread.
    seed_sort(&mut c, "a", "w_");
    assert_eq!(refused(&mut c, &["SORT", "a", "BY", "w_*"]), BY_DENIED);
    assert_eq!(refused(&mut c, &["SORT_RO", "a", "BY", "w_*"]), BY_DENIED);
    assert_eq!(
        refused(&mut c, &["SORT", "a", "GET", "#", "GET", "w_*"]),
        GET_DENIED
    );
    assert_eq!(refused(&mut c, &["SORT", "a", "BY", "w_*->f"]), BY_DENIED);
    // A tag that holds the `*`, or another shard's tag, does not keep the keys together.
    assert_eq!(refused(&mut c, &["SORT", "a", "BY", "{w*}"]), BY_DENIED);
    assert_eq!(
        refused(&mut c, &["SORT", "{a}l", "BY", "{b}w_*"]),
        BY_DENIED
    );
    // Patterns that read no key are the sorted key's own business.
    assert_eq!(
        sorted(&mut c, &["SORT", "a", "BY", "nosort"]),
        ["3", "1", "2"]
    );
    assert_eq!(
        sorted(&mut c, &["SORT", "a", "BY", "w_fixed"]),
        ["3", "1", "2"]
    );
    assert_eq!(sorted(&mut c, &["SORT", "a", "GET", "#"]), ["1", "2", "3"]);
    assert_eq!(
        sorted(&mut c, &["SORT_RO", "a", "DESC", "LIMIT", "0", "2"]),
        ["3", "2"]
    );
    // With a hashtag before the `*`, every key the pattern forms is on the key's shard.
    seed_sort(&mut c, "{u}l", "{u}w_");
    assert_eq!(
        sorted(&mut c, &["SORT", "{u}l", "BY", "{u}w_*"]),
        ["2", "3", "1"]
    );
    assert_eq!(
        sorted(
            &mut c,
            &["SORT_RO", "{u}l", "BY", "{u}w_*", "GET", "{u}w_*", "GET", "#"]
        ),
        ["10", "2", "20", "3", "30", "1"]
    );
    // In a transaction the refusal discards it, as any command refused while queued does.
    let _: () = redis::cmd("MULTI").query(&mut c).unwrap();
    assert_eq!(refused(&mut c, &["SORT", "a", "BY", "w_*"]), BY_DENIED);
    let err = redis::cmd("EXEC").query::<Value>(&mut c).unwrap_err();
    assert_eq!(err.code(), Some("EXECABORT"), "{err}");

    // Over one shard every key is with every other: nothing is refused.
    let one = redis();
    let rw1 = respway(
        &sharded_yaml(&[one.addr], "{ policy: crc16_slots }", true),
        1,
    );
    let mut c1 = sync_client(rw1.addr);
    seed_sort(&mut c1, "a", "w_");
    assert_eq!(
        sorted(&mut c1, &["SORT", "a", "BY", "w_*", "GET", "w_*"]),
        ["10", "20", "30"]
    );
}

#[test]
fn crossslot_and_hashtags() {
    let (_shards, rw) = three_shards_behind_respway("{ policy: crc16_slots }", 1);
    let mut c = sync_client(rw.addr);
    // "a" and "b" are in different crc16 thirds (slots 15495 and 3300).
    let _: () = redis::cmd("SET").arg("a").arg("1").query(&mut c).unwrap();
    let err = redis::cmd("RENAME")
        .arg("a")
        .arg("b")
        .query::<()>(&mut c)
        .unwrap_err();
    assert_eq!(err.code(), Some("CROSSSLOT"), "{err}");
    let _: () = redis::cmd("SET")
        .arg("{user1}.a")
        .arg("1")
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("RENAME")
        .arg("{user1}.a")
        .arg("{user1}.b")
        .query(&mut c)
        .unwrap();
    let v: String = redis::cmd("GET").arg("{user1}.b").query(&mut c).unwrap();
    assert_eq!(v, "1");
    let _: i64 = redis::cmd("SADD")
        .arg("{t}s1")
        .arg("x")
        .arg("y")
        .query(&mut c)
        .unwrap();
    let _: i64 = redis::cmd("SADD")
        .arg("{t}s2")
        .arg("y")
        .query(&mut c)
        .unwrap();
    let inter: Vec<String> = redis::cmd("SINTER")
        .arg("{t}s1")
        .arg("{t}s2")
        .query(&mut c)
        .unwrap();
    assert_eq!(inter, ["y"]);
    let r: i64 = redis::cmd("EVAL")
        .arg("return redis.call('INCR', KEYS[1]) + redis.call('INCR', KEYS[2])")
        .arg(2)
        .arg("{e}1")
        .arg("{e}2")
        .query(&mut c)
        .unwrap();
    assert_eq!(r, 2);
    let err = redis::cmd("EVAL")
        .arg("return 1")
        .arg(2)
        .arg("a")
        .arg("b")
        .query::<i64>(&mut c)
        .unwrap_err();
    assert_eq!(err.code(), Some("CROSSSLOT"));
}

#[test]
fn unsupported_and_unknown_commands_keep_the_connection() {
    let (_shards, rw) = three_shards_behind_respway("{ policy: maglev }", 1);
    let mut c = sync_client(rw.addr);
    for cmd in [
        vec!["SWAPDB", "0", "1"],
        vec!["MOVE", "k", "1"],
        vec!["DEBUG", "SLEEP", "0"],
        vec!["CONFIG", "GET", "x"],
    ] {
        let mut r = redis::cmd(cmd[0]);
        for a in &cmd[1..] {
            r.arg(*a);
        }
        let err = r.query::<Value>(&mut c).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("is not supported by respway"),
            "{cmd:?}: {text}"
        );
    }
    let err = redis::cmd("NOSUCHCMD")
        .arg("x")
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(err.to_string().contains("unknown command"), "{err}");
    let err = redis::cmd("GET").query::<Value>(&mut c).unwrap_err();
    assert!(
        err.to_string().contains("wrong number of arguments"),
        "{err}"
    );
    // MULTI opens a transaction (tests/transactions.rs); DISCARD ends it.
    let ok: String = redis::cmd("MULTI").query(&mut c).unwrap();
    assert_eq!(ok, "OK");
    let ok: String = redis::cmd("DISCARD").query(&mut c).unwrap();
    assert_eq!(ok, "OK");
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}

fn read_until_closed(c: &mut RespConn) -> String {
    let (out, end) = c.read_until_closed(Duration::from_secs(5));
    end.unwrap_or_else(|e| panic!("connection not closed after protocol error: {e}"));
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn bad_resp_closes_only_that_connection() {
    let (_shards, rw) = three_shards_behind_respway("{ policy: maglev }", 1);
    let mut good = sync_client(rw.addr);
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query(&mut good)
        .unwrap();
    for bad in [
        &b"*1\r\n$abc\r\n"[..],
        b"*2\r\n$3\r\nGET\r\n$1\r\nkXY\r\n",
        b"*-5x\r\n",
        b"\"unbalanced\r\n",
        b"*99999999999\r\n",
    ] {
        let mut c = RespConn::connect(rw.addr);
        // A valid command first: its reply must still arrive, in order.
        c.write_raw(b"PING\r\n").unwrap();
        c.write_raw(bad).unwrap();
        let out = read_until_closed(&mut c);
        assert!(
            out.starts_with("+PONG\r\n-ERR Protocol error"),
            "{bad:?} gave {out:?}"
        );
    }
    // Inline commands work (telnet / nc style).
    let mut c = RespConn::connect(rw.addr);
    c.write_raw(b"GET k\r\nQUIT\r\n").unwrap();
    assert_eq!(read_until_closed(&mut c), "$1\r\nv\r\n+OK\r\n");
    let v: String = redis::cmd("GET").arg("k").query(&mut good).unwrap();
    assert_eq!(v, "v");
}

#[test]
fn a_killed_shard_fails_only_its_keys() {
    let (mut shards, rw) = three_shards_behind_respway("{ policy: crc16_slots }", 1);
    let mut c = sync_client(rw.addr);
    // crc16 thirds: find keys for shard 0 and shard 2.
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    for k in &keys {
        let _: () = redis::cmd("SET").arg(k).arg("v").query(&mut c).unwrap();
    }
    shards[1].kill();
    let start = Instant::now();
    let (mut ok, mut failed) = (0, 0);
    for k in &keys {
        match redis::cmd("GET").arg(k).query::<String>(&mut c) {
            Ok(v) => {
                assert_eq!(v, "v");
                ok += 1;
            }
            Err(e) => {
                assert!(e.to_string().contains("shard s1"), "{e}");
                failed += 1;
            }
        }
    }
    assert!(ok > 100 && failed > 30, "ok {ok} failed {failed}");
    assert!(
        start.elapsed() < slack(Duration::from_secs(30)),
        "a dead shard must not hang clients"
    );
    // The client connection is still fine.
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    // The shard comes back (empty: no persistence): its keys are served again once the
    // backoff has passed, with no restart of respway.
    let failed_key = keys
        .iter()
        .find(|k| redis::cmd("GET").arg(k).query::<String>(&mut c).is_err())
        .expect("a key of the dead shard")
        .clone();
    let _back = redis_on(shards[1].addr.port());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match redis::cmd("GET")
            .arg(&failed_key)
            .query::<Option<String>>(&mut c)
        {
            Ok(v) => {
                assert_eq!(v, None);
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "shard never recovered: {e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _: () = redis::cmd("SET")
        .arg(&failed_key)
        .arg("again")
        .query(&mut c)
        .unwrap();
}

/// A shard address that points at something that is not Redis (here a real HTTP server,
/// `python3 -m http.server`, which answers RESP with an HTTP 400 page): its keys get an error
/// naming the shard, the other shards' keys are served, and one pipeline mixing both gets
/// every reply, in order.
#[test]
fn a_shard_that_is_not_redis_fails_only_its_keys() {
    let port = free_port();
    let http = Spawn::new("python3")
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .on_port(port)
        .start();
    let (a, b) = (redis(), redis());
    let rw = respway(
        &sharded_yaml(
            &[a.addr, http.addr, b.addr],
            "{ policy: crc16_slots }",
            true,
        ),
        1,
    );
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    let mut out = Vec::new();
    for k in &keys {
        encode_cmd(&mut out, &[b"SET", k.as_bytes(), b"v"]);
        encode_cmd(&mut out, &[b"GET", k.as_bytes()]);
    }
    let mut c = RespConn::connect(rw.addr);
    c.write_raw(&out).unwrap();
    let mut replies = Vec::new();
    while replies.len() < 2 * keys.len() {
        match c.read() {
            Ok(r) => replies.push(r),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                panic!("respway closed the client connection")
            }
            Err(e) => panic!("every reply arrives: {e}"),
        }
    }
    assert!(c.buffered().is_empty(), "more replies than requests");
    let (mut served, mut failed) = (0, 0);
    for (i, pair) in replies.chunks(2).enumerate() {
        if pair[0] == Resp::Simple("OK".into()) {
            assert_eq!(pair[1], Resp::bulk("v"), "GET {}", keys[i]);
            served += 1;
        } else {
            for r in pair {
                // "connection lost: Protocol error: invalid reply type byte '<'" for those in
                // flight when the page arrived, "unavailable: ..." for later ones.
                assert!(
                    r.error()
                        .is_some_and(|e| e.starts_with("ERR respway: shard s1 (")),
                    "{}: {r:?}",
                    keys[i]
                );
            }
            failed += 1;
        }
    }
    assert!(
        served > 100 && failed > 30,
        "served {served} failed {failed}"
    );
    // The client connection and the other shards are fine.
    let mut c = sync_client(rw.addr);
    let v: String = redis::cmd("GET")
        .arg("k0")
        .query(&mut c)
        .unwrap_or_default();
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    let _ = v;
}

#[test]
fn redis_cli_and_redis_benchmark_work() {
    let (shards, rw) = three_shards_behind_respway("{ policy: maglev }", 2);
    let port = rw.addr.port();
    let cli = |args: &[&str]| redis_cli(port, args).0.trim().to_string();
    assert_eq!(cli(&["SET", "cli:key", "hello world"]), "OK");
    assert_eq!(cli(&["GET", "cli:key"]), "hello world");
    assert_eq!(cli(&["MSET", "a", "1", "b", "2", "c", "3"]), "OK");
    assert_eq!(cli(&["MGET", "a", "b", "c"]), "1\n2\n3");
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-n",
            "2000",
            "-c",
            "10",
            "-P",
            "8",
            "-t",
            "set,get",
            "-q",
            "-r",
            "1000",
        ])
        .output()
        .expect("redis-benchmark");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("SET:") && text.contains("GET:"), "{text}");
    let total: u64 = shards.iter().map(|s| commandstat(s.addr, "set")).sum();
    assert!(total >= 2000, "benchmark SETs reached the shards: {total}");
}

#[test]
fn keys_written_through_nutcracker_are_found_through_respway() {
    let shards = three_shards();
    let mut yml = String::from(
        "alpha:\n  listen: 127.0.0.1:0\n  hash: fnv1a_64\n  distribution: ketama\n  hash_tag: \"{}\"\n  redis: true\n  auto_eject_hosts: false\n  servers:\n",
    );
    for s in &shards {
        yml.push_str(&format!("   - {}:1\n", s.addr));
    }
    let nc = nutcracker(&yml);

    let n = 10_000;
    // nutcracker closes connections that send CLIENT SETINFO (as the redis crate does on
    // connect), so write through it with a raw pipelined socket.
    let key_of = |i: usize| {
        if i.is_multiple_of(10) {
            format!("{{tag{}}}:k{i}", i % 37)
        } else {
            format!("user:{i}")
        }
    };
    let mut out = Vec::new();
    for i in 0..n {
        let (key, val) = (key_of(i), i.to_string());
        encode_cmd(&mut out, &[b"SET", key.as_bytes(), val.as_bytes()]);
    }
    let mut c = RespConn::connect(nc.addr);
    c.write_raw(&out).unwrap();
    let expect = b"+OK\r\n".repeat(n);
    let mut got = Vec::new();
    while got.len() < expect.len() {
        let k = c.read_raw().expect("nutcracker replies");
        assert!(!k.is_empty(), "nutcracker closed the connection");
        got.extend_from_slice(&k);
    }
    assert!(got == expect, "every SET through nutcracker succeeded");
    let per_shard: Vec<u64> = shards.iter().map(|s| dbsize(s.addr)).collect();
    assert_eq!(per_shard.iter().sum::<u64>(), n as u64);

    // Unnamed shards: like twemproxy's `host:port:weight` servers, each is hashed by its
    // "host:port" (a twemproxy server name would be given as the shard name instead).
    let yaml = sharded_yaml(
        &addrs(&shards),
        "{ policy: ketama, key_hash: fnv1a_64 }",
        true,
    )
    .lines()
    .filter(|l| !l.trim_start().starts_with("- name: s"))
    .map(|l| l.replace("        endpoints:", "      - endpoints:"))
    .collect::<Vec<_>>()
    .join("\n");
    let rw = respway(&yaml, 2);
    let mut c = sync_client(rw.addr);
    let mut p = redis::pipe();
    for i in 0..n {
        p.cmd("GET").arg(key_of(i));
    }
    let vals: Vec<Option<i64>> = p.query(&mut c).unwrap();
    let missing = vals
        .iter()
        .enumerate()
        .filter(|(i, v)| **v != Some(*i as i64))
        .count();
    assert_eq!(
        missing, 0,
        "{missing} of {n} keys written by nutcracker not found through respway"
    );
}

#[test]
fn invalid_config_exits_2_naming_the_field() {
    let dir = std::env::temp_dir().join(format!("respway-badconf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.yaml");
    std::fs::write(&path, "clusters:\n  - name: main\n    shards:\n      - endpoints:\n          - { address: \"nope\", role: primary }\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_respway"))
        .args(["--config", path.to_str().unwrap(), "--check"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml") && err.contains("address"), "{err}");
}

#[test]
fn downstream_auth_and_upstream_auth_and_select() {
    let shard = redis_with(&["--requirepass", "shard-pw"]);
    let yaml = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    downstream_auth_password: client-pw\n    routes: {{ catch_all: main }}\nclusters:\n  - name: main\n    db: 3\n    auth: {{ password: shard-pw }}\n    shards:\n      - endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
        shard.addr
    );
    let rw = respway(&yaml, 1);
    let cli = |args: &[&str]| {
        let (stdout, stderr) = redis_cli(rw.addr.port(), args);
        format!("{stdout}{stderr}").trim().to_string()
    };
    assert!(
        cli(&["GET", "k"]).starts_with("NOAUTH"),
        "{}",
        cli(&["GET", "k"])
    );
    assert!(cli(&["-a", "wrong", "--no-auth-warning", "GET", "k"]).contains("WRONGPASS"));
    assert_eq!(
        cli(&["-a", "client-pw", "--no-auth-warning", "SET", "k", "v"]),
        "OK"
    );
    assert_eq!(
        cli(&["-a", "client-pw", "--no-auth-warning", "GET", "k"]),
        "v"
    );
    // The key is in database 3 of the password-protected shard.
    let direct = |args: &[&str]| {
        let args = [&["-a", "shard-pw", "--no-auth-warning"][..], args].concat();
        redis_cli(shard.addr.port(), &args).0.trim().to_string()
    };
    assert_eq!(direct(&["-n", "3", "GET", "k"]), "v");
    assert_eq!(direct(&["-n", "0", "EXISTS", "k"]), "0");
}

#[test]
fn a_slow_shard_times_out_without_blocking_others() {
    let shards: Vec<Proc> = (0..3)
        .map(|_| redis_with(&["--enable-debug-command", "yes"]))
        .collect();
    let yaml = sharded_yaml(&addrs(&shards), "{ policy: crc16_slots }", true)
        .replace("op_timeout: 2s", "op_timeout: 300ms");
    let rw = respway(&yaml, 1);
    let mut c = sync_client(rw.addr);
    // "b" is in slots 0-5460 (s0), "a" in 10923-16383 (s2).
    let _: () = redis::cmd("SET").arg("a").arg("1").query(&mut c).unwrap();
    let _: () = redis::cmd("SET").arg("b").arg("2").query(&mut c).unwrap();
    // Block shard 2 for 3 s, and go on only once it is blocked (a PING on a connection of
    // its own goes unanswered): a fixed sleep raced the DEBUG SLEEP on a loaded machine.
    let slow = shards[2].addr;
    let blocker = std::thread::spawn(move || {
        let mut d = sync_client(slow);
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(3)
            .query(&mut d)
            .unwrap();
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        use std::io::{Read, Write};
        let mut probe = std::net::TcpStream::connect(slow).unwrap();
        probe
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        probe.write_all(b"PING\r\n").unwrap();
        let mut buf = [0u8; 16];
        if probe.read(&mut buf).is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "the shard never blocked");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The reply is respway's timeout (300 ms), not the shard's late answer.
    let err = redis::cmd("GET")
        .arg("a")
        .query::<String>(&mut c)
        .unwrap_err();
    assert!(err.to_string().contains("upstream timeout"), "{err}");
    // Another client, and this one, still reach the healthy shard meanwhile.
    let mut other = sync_client(rw.addr);
    let v: String = redis::cmd("GET").arg("b").query(&mut other).unwrap();
    assert_eq!(v, "2");
    let v: String = redis::cmd("GET").arg("b").query(&mut c).unwrap();
    assert_eq!(v, "2");
    blocker.join().unwrap();
    // Once the shard answers again, replies line up again (the late reply was discarded).
    let v: String = redis::cmd("GET").arg("a").query(&mut c).unwrap();
    assert_eq!(v, "1");
}

#[test]
fn bounded_pending_replies_keep_order_under_a_deep_pipeline() {
    let shards = three_shards();
    // A long op_timeout: this test is about order under backpressure, and a loaded machine
    // (the debug build beside other suites) must not turn a slow reply into a timeout error.
    let yaml = sharded_yaml(&addrs(&shards), "{ policy: maglev }", true).replace(
        "op_timeout: 2s",
        "op_timeout: 30s\n    max_pending_per_client: 8",
    );
    let rw = respway(&yaml, 1);
    // 20,000 commands written in one go: respway holds at most 8 replies at a time and stops
    // reading in between; every reply still comes back, in order.
    let n = 20_000;
    let mut out = Vec::new();
    for i in 0..n {
        let v = i.to_string();
        out.extend_from_slice(
            format!(
                "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${}\r\n{v}\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
                v.len()
            )
            .as_bytes(),
        );
    }
    let mut c = RespConn::connect(rw.addr);
    let writer = {
        let mut s = c.stream.try_clone().unwrap();
        std::thread::spawn(move || s.write_all(&out).unwrap())
    };
    c.stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut expect = Vec::new();
    for i in 0..n {
        let v = i.to_string();
        expect.extend_from_slice(format!("+OK\r\n${}\r\n{v}\r\n", v.len()).as_bytes());
    }
    let got = c.read_exact_raw(expect.len()).unwrap();
    writer.join().unwrap();
    if let Some(at) = got.iter().zip(&expect).position(|(a, b)| a != b) {
        let show = |b: &[u8]| String::from_utf8_lossy(&b[at..(at + 80).min(b.len())]).into_owned();
        panic!(
            "replies out of order or lost at byte {at}: got {:?}, expected {:?}",
            show(&got),
            show(&expect)
        );
    }
}

/// What Redis sends (RESP2) for an array of bulk strings.
fn bulk_array(items: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", items.len()).into_bytes();
    for i in items {
        out.extend_from_slice(format!("${}\r\n", i.len()).as_bytes());
        out.extend_from_slice(i);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// What Redis sends for `XRANGE` of entries `(id, [f, value])`: arrays three deep.
fn stream_range(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", entries.len()).into_bytes();
    for (id, v) in entries {
        out.extend_from_slice(
            format!("*2\r\n${}\r\n{id}\r\n*2\r\n$1\r\nf\r\n", id.len()).as_bytes(),
        );
        out.extend_from_slice(format!("${}\r\n", v.len()).as_bytes());
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// List elements, some of which look like RESP headers (skipped by length, never scanned).
fn tricky_items(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            if i % 997 == 0 {
                format!("*3\r\n$1\r\n{i}").into_bytes()
            } else {
                format!("e{i}").into_bytes()
            }
        })
        .collect()
}

/// Writes `cmds` in one pipeline on `c` and reads one integer reply per command.
fn load_pipeline(c: &mut RespConn, cmds: &[Vec<Vec<u8>>]) {
    let mut out = Vec::new();
    for cmd in cmds {
        let a: Vec<&[u8]> = cmd.iter().map(Vec::as_slice).collect();
        encode_cmd(&mut out, &a);
    }
    c.write_raw(&out).unwrap();
    for _ in cmds {
        let r = c.read().expect("reply");
        assert!(matches!(r, Resp::Int(_) | Resp::Bulk(_)), "{r:?}");
    }
}

/// A list of `items` under `key` (RPUSH in batches) and a stream of `entries` (`XADD` with
/// explicit ids), written through `c`.
fn load_list_and_stream(
    c: &mut RespConn,
    key: &str,
    items: &[Vec<u8>],
    stream: &str,
    entries: &[(String, Vec<u8>)],
) {
    let mut cmds = Vec::new();
    for batch in items.chunks(1000) {
        let mut cmd = vec![b"RPUSH".to_vec(), key.as_bytes().to_vec()];
        cmd.extend(batch.iter().cloned());
        cmds.push(cmd);
    }
    for (id, v) in entries {
        cmds.push(vec![
            b"XADD".to_vec(),
            stream.as_bytes().to_vec(),
            id.clone().into_bytes(),
            b"f".to_vec(),
            v.clone(),
        ]);
    }
    load_pipeline(c, &cmds);
}

fn stream_entries(n: usize) -> Vec<(String, Vec<u8>)> {
    (1..=n)
        .map(|i| (format!("1-{i}"), format!("v\r\n{i}").into_bytes()))
        .collect()
}

/// Replies far larger than a read (a 200,000-element LRANGE, a 30,000-entry XRANGE nested
/// three deep) come back byte for byte, in order with the small replies pipelined around them
/// and with commands to other shards between them.
#[test]
fn huge_replies_come_back_whole_and_in_order_between_pipelined_commands() {
    let shards = three_shards();
    let yaml = sharded_yaml(&addrs(&shards), "{ policy: maglev }", true)
        .replace("op_timeout: 2s", "op_timeout: 60s");
    let rw = respway(&yaml, 1);
    let mut c = RespConn::connect(rw.addr);
    c.stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let items = tricky_items(200_000);
    let entries = stream_entries(30_000);
    load_list_and_stream(&mut c, "{h}big", &items, "{h}s", &entries);
    let list = bulk_array(&items);
    let stream = stream_range(&entries);
    let pipeline: Vec<Vec<&str>> = vec![
        vec!["SET", "k0", "a"],
        vec!["LRANGE", "{h}big", "0", "-1"],
        vec!["GET", "k0"],
        vec!["XRANGE", "{h}s", "-", "+"],
        vec!["INCR", "k1"],
        vec!["LRANGE", "{h}big", "0", "-1"],
        vec!["PING"],
        vec!["GET", "k2"],
        vec!["XRANGE", "{h}s", "-", "+"],
        vec!["INCR", "k1"],
    ];
    // What Redis itself sends for the pipeline, with the two INCRs answering `a` and `b`.
    let expect = |a: i64, b: i64| {
        let mut e = Vec::new();
        for part in [
            &b"+OK\r\n"[..],
            &list,
            b"$1\r\na\r\n",
            &stream,
            format!(":{a}\r\n").as_bytes(),
            &list,
            b"+PONG\r\n",
            b"$-1\r\n",
            &stream,
            format!(":{b}\r\n").as_bytes(),
        ] {
            e.extend_from_slice(part);
        }
        e
    };
    for (round, (a, b)) in [(1, 2), (3, 4)].into_iter().enumerate() {
        let want = expect(a, b);
        c.send_pipeline(&pipeline);
        let got = c.read_exact_raw(want.len()).unwrap();
        assert!(
            got == want,
            "round {round}: replies differ from Redis's bytes or are out of order"
        );
    }
    assert_eq!(c.call(&["PING"]), Resp::Simple("PONG".into()));
}

/// A shard whose replies reach respway a few bytes per read (a relay that writes 1 to 13
/// bytes at a time): a 5,000-entry nested XRANGE and a 20,000-element LRANGE are cut at the
/// right places and delivered intact, in order with the commands around them.
#[test]
fn nested_replies_arriving_in_tiny_reads_are_delivered_intact() {
    let shard = redis();
    let relay = Dribble::start(shard.addr, 13);
    let yaml = sharded_yaml(&[relay.addr], "{ policy: maglev }", true)
        .replace("op_timeout: 2s", "op_timeout: 60s")
        .replace("connect_timeout: 500ms", "connect_timeout: 10s");
    let rw = respway(&yaml, 1);
    let items = tricky_items(20_000);
    let entries = stream_entries(5_000);
    // Loaded directly: the relay is for the replies under test.
    load_list_and_stream(
        &mut RespConn::connect(shard.addr),
        "l",
        &items,
        "s",
        &entries,
    );
    let mut c = RespConn::connect(rw.addr);
    c.stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    c.send_pipeline(&[
        vec!["GET", "nothing"],
        vec!["XRANGE", "s", "-", "+"],
        vec!["PING"],
        vec!["LRANGE", "l", "0", "-1"],
        vec!["XRANGE", "s", "-", "+", "COUNT", "1"],
        vec!["SET", "x", "y"],
    ]);
    let mut expect = b"$-1\r\n".to_vec();
    expect.extend_from_slice(&stream_range(&entries));
    expect.extend_from_slice(b"+PONG\r\n");
    expect.extend_from_slice(&bulk_array(&items));
    expect.extend_from_slice(&stream_range(&entries[..1]));
    expect.extend_from_slice(b"+OK\r\n");
    let got = c.read_exact_raw(expect.len()).unwrap();
    assert!(got == expect, "replies differ from Redis's bytes");
    assert_eq!(c.call(&["GET", "x"]), Resp::bulk("y"));
}

/// A second respway started on an address a running one listens on is refused with "address
/// in use", as redis-server and nutcracker refuse it. `SO_REUSEPORT` is how one respway's
/// workers share their address; without this check another process would silently take
/// part of the first one's clients.
#[test]
fn an_address_in_use_is_refused_not_shared() {
    // respway::start: this test's sidecar shares the process (see sharing_process).
    let _sharing = sharing_process();
    let shard = redis();
    let first = respway(&sharded_yaml(&[shard.addr], "{ policy: maglev }", true), 2);
    let yaml = sharded_yaml(&[shard.addr], "{ policy: maglev }", true)
        .replace("127.0.0.1:0", &first.addr.to_string());
    let config = respway_xds::translate(&respway_xds::parse_yaml(&yaml).unwrap()).unwrap();
    let second = respway::start(
        config,
        respway::Options {
            workers: 1,
            ..Default::default()
        },
    );
    let err = match second {
        Ok(s) => {
            s.shutdown();
            panic!("a second respway started on {}", first.addr);
        }
        Err(e) => e,
    };
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "listener \"main\": cannot listen on {}: ",
            first.addr
        )),
        "{msg}"
    );
    // The first one still serves.
    let mut c = sync_client(first.addr);
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut c).unwrap();
    let v: String = redis::cmd("GET").arg("k").query(&mut c).unwrap();
    assert_eq!(v, "v");
}
