//! A hot-key rule added over keys that already exist (issue #31, item 3): the keys are copied
//! to every shard by the sidecar, reads never see a missing copy, writes run once (on the
//! key's home shard) and are copied from there, and removing the rule deletes the copies.
//! Real redis-server processes; every wait is a bounded loop.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;

const KEYS: usize = 200;

fn yaml(addrs: &[SocketAddr], rule: bool) -> String {
    let mut shards = String::new();
    for (i, a) in addrs.iter().enumerate() {
        shards.push_str(&format!(
            "      - {{ name: s{i}, endpoints: [ {{ address: \"{a}\", role: primary }} ] }}\n"
        ));
    }
    let rule = if rule {
        "    hot_keys:\n      - { prefix: HIGH_FREQ_ }\n"
    } else {
        ""
    };
    format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes: {{ catch_all: main }}\nclusters:\n  - name: main\n{rule}    shards:\n{shards}"
    )
}

fn config(y: &str) -> respway_filters::model::Config {
    respway_xds::translate(&respway_xds::parse_yaml(y).unwrap()).unwrap()
}

/// The keys the tests create: strings (every 10th with a TTL), a list, a hash, a counter.
fn key(i: usize) -> String {
    format!("HIGH_FREQ_k{i}")
}
const LIST: &str = "HIGH_FREQ_list";
const HASH: &str = "HIGH_FREQ_hash";
const COUNTER: &str = "HIGH_FREQ_counter";

/// Creates the keys through respway (before any rule: each lands on its home shard only).
fn create_keys(c: &mut redis::Connection) {
    let mut p = redis::pipe();
    for i in 0..KEYS {
        if i % 10 == 0 {
            p.cmd("SET").arg(key(i)).arg(i).arg("EX").arg(600).ignore();
        } else {
            p.cmd("SET").arg(key(i)).arg(i).ignore();
        }
    }
    p.cmd("RPUSH").arg(LIST).arg("a").arg("b").arg("c").ignore();
    p.cmd("HSET").arg(HASH).arg("f").arg("v").ignore();
    p.cmd("SET").arg(COUNTER).arg(10).ignore();
    let _: () = p.query(c).unwrap();
}

/// The shard (index) holding `k`, when exactly one does.
fn home(addrs: &[SocketAddr], k: &str) -> usize {
    let on: Vec<usize> = (0..addrs.len())
        .filter(|&i| {
            let n: i64 = redis::cmd("EXISTS")
                .arg(k)
                .query(&mut sync_client(addrs[i]))
                .unwrap();
            n == 1
        })
        .collect();
    assert_eq!(on.len(), 1, "{k} is on shards {on:?}");
    on[0]
}

fn info_hotkeys(addr: SocketAddr) -> String {
    redis::cmd("INFO")
        .arg("hotkeys")
        .query(&mut sync_client(addr))
        .unwrap()
}

/// Waits (bounded) until the rule's copy pass in respway is `done`.
fn wait_copied(addr: SocketAddr) -> String {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let info = info_hotkeys(addr);
        if info.contains("copy=done") {
            return info;
        }
        assert!(Instant::now() < until, "copy pass not done: {info}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads every key `rounds` times through respway (round-robin per connection, so every
/// shard is asked) and counts the answers that say the key does not exist.
fn missing_reads(c: &mut redis::Connection, rounds: usize) -> (usize, usize) {
    let mut p = redis::pipe();
    for _ in 0..rounds {
        for i in 0..KEYS {
            p.cmd("GET").arg(key(i));
        }
        p.cmd("LRANGE").arg(LIST).arg(0).arg(-1);
        p.cmd("HGET").arg(HASH).arg("f");
        p.cmd("GET").arg(COUNTER);
    }
    let replies: Vec<redis::Value> = p.query(c).unwrap();
    let missing = replies
        .iter()
        .filter(|v| match v {
            redis::Value::Nil => true,
            redis::Value::Array(a) => a.is_empty(),
            _ => false,
        })
        .count();
    (missing, replies.len())
}

#[test]
fn existing_keys_under_a_new_rule_are_never_read_as_missing() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let rw = respway(&yaml(&addrs, false), 1);
    let mut c = sync_client(rw.addr);
    create_keys(&mut c);
    rw.server
        .as_ref()
        .unwrap()
        .apply(config(&yaml(&addrs, true)))
        .unwrap();
    // Right after the push (the copy pass may not have run yet) ...
    let (missing, total) = missing_reads(&mut sync_client(rw.addr), 8);
    eprintln!("right after the push: {missing} of {total} reads answered as missing");
    assert_eq!(missing, 0, "{missing} of {total} reads found no key");
    // ... and once the copies are made, when reads spread over every shard.
    let info = wait_copied(rw.addr);
    let (missing, total) = missing_reads(&mut sync_client(rw.addr), 8);
    eprintln!("after the copy pass: {missing} of {total} reads answered as missing; {info}");
    assert_eq!(missing, 0, "{missing} of {total} reads found no key");
    let reads = info
        .lines()
        .find_map(|l| l.split("reads_per_shard=").nth(1))
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .to_string();
    let per_shard: Vec<u64> = reads.split('/').map(|n| n.parse().unwrap()).collect();
    assert!(
        per_shard.iter().all(|&n| n > 0),
        "reads spread over every shard once copied: {per_shard:?}"
    );
}

#[test]
fn incr_of_an_existing_counter_runs_once_and_is_copied_from_its_home() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let rw = respway(&yaml(&addrs, false), 1);
    let mut c = sync_client(rw.addr);
    create_keys(&mut c);
    let h = home(&addrs, COUNTER);
    rw.server
        .as_ref()
        .unwrap()
        .apply(config(&yaml(&addrs, true)))
        .unwrap();
    // Increments right after the push, before the copy pass may have run.
    let mut c = sync_client(rw.addr);
    for want in 11..=15 {
        let n: i64 = redis::cmd("INCR").arg(COUNTER).query(&mut c).unwrap();
        assert_eq!(n, want);
        for _ in 0..4 {
            let v: i64 = redis::cmd("GET").arg(COUNTER).query(&mut c).unwrap();
            assert_eq!(v, want, "a read through respway saw an older value");
        }
    }
    wait_copied(rw.addr);
    for want in 16..=20 {
        let n: i64 = redis::cmd("INCR").arg(COUNTER).query(&mut c).unwrap();
        assert_eq!(n, want);
        for _ in 0..8 {
            let v: i64 = redis::cmd("GET").arg(COUNTER).query(&mut c).unwrap();
            assert_eq!(v, want, "a read through respway saw another value");
        }
    }
    for (i, a) in addrs.iter().enumerate() {
        let v: Option<i64> = redis::cmd("GET")
            .arg(COUNTER)
            .query(&mut sync_client(*a))
            .unwrap();
        assert_eq!(v, Some(20), "shard {i} (home is {h})");
    }
    // A write that deletes the key deletes every copy; a list push runs once.
    let n: i64 = redis::cmd("LPUSH")
        .arg(LIST)
        .arg("z")
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 4);
    let _: i64 = redis::cmd("DEL").arg(COUNTER).query(&mut c).unwrap();
    for a in &addrs {
        let mut d = sync_client(*a);
        let n: i64 = redis::cmd("EXISTS").arg(COUNTER).query(&mut d).unwrap();
        assert_eq!(n, 0, "shard {a} kept a deleted counter");
        let l: i64 = redis::cmd("LLEN").arg(LIST).query(&mut d).unwrap();
        assert_eq!(l, 4, "shard {a}");
    }
}

#[test]
fn the_copy_pass_copies_values_and_ttls_and_removing_the_rule_deletes_the_copies() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let rw = respway(&yaml(&addrs, false), 2);
    let mut c = sync_client(rw.addr);
    create_keys(&mut c);
    // A key outside the prefix stays where it is.
    let _: () = redis::cmd("SET")
        .arg("cold")
        .arg("1")
        .query(&mut c)
        .unwrap();
    let homes: Vec<usize> = (0..KEYS).map(|i| home(&addrs, &key(i))).collect();
    let server = rw.server.as_ref().unwrap();
    server.apply(config(&yaml(&addrs, true))).unwrap();
    let info = wait_copied(rw.addr);
    eprintln!("{info}");
    assert!(
        info.contains(&format!("copied_keys={}", KEYS + 3)),
        "{info}"
    );
    for a in &addrs {
        let mut d = sync_client(*a);
        for i in 0..KEYS {
            let v: Option<String> = redis::cmd("GET").arg(key(i)).query(&mut d).unwrap();
            assert_eq!(v, Some(i.to_string()), "shard {a}: {}", key(i));
            let pttl: i64 = redis::cmd("PTTL").arg(key(i)).query(&mut d).unwrap();
            if i % 10 == 0 {
                // Copied with what was left of 600 s (the tolerance is the test's own run).
                assert!(pttl > 500_000 && pttl <= 600_000, "{}: {pttl}", key(i));
            } else {
                assert_eq!(pttl, -1, "{}", key(i));
            }
        }
        let l: Vec<String> = redis::cmd("LRANGE")
            .arg(LIST)
            .arg(0)
            .arg(-1)
            .query(&mut d)
            .unwrap();
        assert_eq!(l, ["a", "b", "c"]);
        let f: Option<String> = redis::cmd("HGET").arg(HASH).arg("f").query(&mut d).unwrap();
        assert_eq!(f.as_deref(), Some("v"));
    }
    let total: u64 = addrs.iter().map(|a| dbsize(*a)).sum();
    assert_eq!(total, 4 * (KEYS as u64 + 3) + 1);
    // The rule is removed: only the home copies remain.
    server.apply(config(&yaml(&addrs, false))).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let total: u64 = addrs.iter().map(|a| dbsize(*a)).sum();
        if total == KEYS as u64 + 3 + 1 {
            break;
        }
        assert!(Instant::now() < until, "{total} keys left");
        std::thread::sleep(Duration::from_millis(20));
    }
    for (i, h) in homes.iter().enumerate() {
        assert_eq!(home(&addrs, &key(i)), *h);
    }
    let (missing, _) = missing_reads(&mut c, 1);
    assert_eq!(missing, 0);
}

/// Hot writes of the same keys (with different home shards) from several connections at
/// once: the copies of two writes of a key cross, which the check after each copy catches
/// (it copies again, or deletes the copies when the key changed during every round). Every
/// write succeeds and runs once; every copy ends equal to its home value or deleted, and reads
/// through respway see the home value. (With `MIGRATE ... COPY` from the home shard instead, two shards copying to each
/// other block each other until `MIGRATE`'s timeout, and this test failed at once.) The
/// contention is extreme (every write races three others on its key), so the operation
/// timeout is raised: the test checks outcomes, not speed.
#[test]
fn concurrent_hot_writes_with_different_homes_all_succeed_and_converge() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let y = yaml(&addrs, true).replace("    routes:", "    op_timeout: 30s\n    routes:");
    let rw = respway(&y, 2);
    wait_copied(rw.addr);
    let (clients, rounds, keys) = (4, 200, 8);
    let started = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let addr = rw.addr;
            std::thread::spawn(move || {
                let mut c = sync_client(addr);
                for _ in 0..rounds {
                    let mut p = redis::pipe();
                    for k in 0..keys {
                        p.cmd("INCR").arg(key(k));
                    }
                    let _: Vec<i64> = p.query(&mut c).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let took = started.elapsed();
    let info = info_hotkeys(rw.addr);
    eprintln!(
        "{} hot INCRs from {clients} connections in {took:?}; {info}",
        clients * rounds * keys
    );
    let mut c = sync_client(rw.addr);
    for k in 0..keys {
        let want = (clients * rounds) as i64;
        let mut copies = 0;
        for a in &addrs {
            let v: Option<i64> = redis::cmd("GET")
                .arg(key(k))
                .query(&mut sync_client(*a))
                .unwrap();
            // A copy is the home value, or absent (deleted when the key kept changing
            // during every copy round): never an older value.
            assert!(v.is_none() || v == Some(want), "{} on {a}: {v:?}", key(k));
            copies += usize::from(v.is_some());
        }
        assert!(copies >= 1, "{}: no home copy", key(k));
        for _ in 0..8 {
            let v: i64 = redis::cmd("GET").arg(key(k)).query(&mut c).unwrap();
            assert_eq!(v, want, "{} through respway", key(k));
        }
    }
    assert!(info.contains("partial_failures=0"), "{info}");
}

/// A sidecar that starts with the rule (a restart, or the rule written into its file while it
/// was down) copies the keys that exist: the pass runs at every start, and is idempotent.
#[test]
fn a_start_with_the_rule_copies_the_keys_that_already_exist() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    {
        let before = respway(&yaml(&addrs, false), 1);
        create_keys(&mut sync_client(before.addr));
    }
    let rw = respway(&yaml(&addrs, true), 1);
    let info = wait_copied(rw.addr);
    assert!(
        info.contains(&format!("copied_keys={}", KEYS + 3)),
        "{info}"
    );
    let total: u64 = addrs.iter().map(|a| dbsize(*a)).sum();
    assert_eq!(total, 4 * (KEYS as u64 + 3));
    // Again (another start): the same copies, nothing added.
    drop(rw);
    let rw = respway(&yaml(&addrs, true), 1);
    wait_copied(rw.addr);
    let total: u64 = addrs.iter().map(|a| dbsize(*a)).sum();
    assert_eq!(total, 4 * (KEYS as u64 + 3));
    let (missing, _) = missing_reads(&mut sync_client(rw.addr), 4);
    assert_eq!(missing, 0);
}

/// What a hot key costs a client, one command at a time over one connection (printed with
/// `--nocapture`; nothing is asserted on time): a write is the write plus two snapshots on its
/// home shard and a copy on each other shard; a read is one read (of a copy, which has it).
#[test]
fn round_trips_of_hot_and_ordinary_keys() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let rw = respway(&yaml(&addrs, true), 1);
    wait_copied(rw.addr);
    let mut c = sync_client(rw.addr);
    let n = 2_000;
    let mut time = |cmd: &str, k: &str| {
        let started = Instant::now();
        for i in 0..n {
            let mut q = redis::cmd(cmd);
            q.arg(k);
            if cmd == "SET" {
                q.arg(i);
            }
            let _: redis::Value = q.query(&mut c).unwrap();
        }
        started.elapsed().as_micros() as f64 / n as f64
    };
    let cold_set = time("SET", "plain");
    let hot_set = time("SET", "HIGH_FREQ_x");
    let cold_get = time("GET", "plain");
    let hot_get = time("GET", "HIGH_FREQ_x");
    eprintln!(
        "mean round trip over {n}: SET ordinary {cold_set:.0} µs, SET hot {hot_set:.0} µs; GET ordinary {cold_get:.0} µs, GET hot {hot_get:.0} µs; {}",
        info_hotkeys(rw.addr).lines().nth(1).unwrap_or_default()
    );
    for a in &addrs {
        let v: Option<String> = redis::cmd("GET")
            .arg("HIGH_FREQ_x")
            .query(&mut sync_client(*a))
            .unwrap();
        assert_eq!(v, Some((n - 1).to_string()));
    }
}
