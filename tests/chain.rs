//! End-to-end tests of the filter chain against real redis-server processes: prefix routes,
//! hot-key fan-out, request mirroring and migration modes, zone-local replica reads.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;

fn get(c: &mut redis::Connection, k: &str) -> Option<String> {
    redis::cmd("GET").arg(k).query(c).unwrap()
}

fn set(c: &mut redis::Connection, k: &str, v: &str) {
    let _: () = redis::cmd("SET").arg(k).arg(v).query(c).unwrap();
}

fn shard_list(addrs: &[SocketAddr]) -> String {
    let mut y = String::new();
    for a in addrs {
        y.push_str(&format!(
            "      - endpoints: [ {{ address: \"{a}\", role: primary }} ]\n"
        ));
    }
    y
}

#[test]
fn prefix_routes_pick_clusters_and_strip_prefixes() {
    let main = redis();
    let profile = redis();
    let freq = redis();
    let yaml = format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes:\n      case_insensitive: true\n      catch_all: main\n      prefixes:\n        - {{ prefix: \"up:\", cluster: profile }}\n        - {{ prefix: \"up:vip:\", cluster: freq, remove_prefix: true }}\n        - {{ prefix: \"fc:\", cluster: freq, remove_prefix: true }}\nclusters:\n  - name: main\n    shards:\n{}  - name: profile\n    shards:\n{}  - name: freq\n    shards:\n{}",
        shard_list(&[main.addr]),
        shard_list(&[profile.addr]),
        shard_list(&[freq.addr])
    );
    let rw = respway(&yaml, 1);
    let mut c = sync_client(rw.addr);
    set(&mut c, "up:1", "a");
    set(&mut c, "UP:2", "b"); // case-insensitive match, key kept as sent
    set(&mut c, "up:vip:3", "c"); // longest prefix wins, prefix removed
    set(&mut c, "fc:4", "d");
    set(&mut c, "other", "e");
    let keys = |a: SocketAddr| {
        let mut d = sync_client(a);
        let mut k: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut d).unwrap();
        k.sort();
        k
    };
    assert_eq!(keys(profile.addr), ["UP:2", "up:1"]);
    assert_eq!(keys(freq.addr), ["3", "4"]);
    assert_eq!(keys(main.addr), ["other"]);
    // Reads come back through the same routes.
    assert_eq!(get(&mut c, "up:vip:3").as_deref(), Some("c"));
    assert_eq!(get(&mut c, "fc:4").as_deref(), Some("d"));
    // Keys routed to different clusters cannot be combined.
    let err = redis::cmd("MGET")
        .arg("up:1")
        .arg("other")
        .query::<Vec<Option<String>>>(&mut c)
        .unwrap_err();
    assert!(err.to_string().contains("different clusters"), "{err}");
    // Key-less commands use the catch-all; same-cluster multi-key works.
    let v: Vec<Option<String>> = redis::cmd("MGET")
        .arg("up:1")
        .arg("UP:2")
        .query(&mut c)
        .unwrap();
    assert_eq!(v, [Some("a".to_string()), Some("b".to_string())]);
}

/// Reads per shard for a zipf(1.5) workload over 1000 keys whose 10 hottest keys are under
/// the hot prefix (the hottest alone is ~38% of reads). Returns max/mean of GET calls.
fn zipf_balance(hot_rule: bool) -> (f64, Vec<u64>) {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    // Shards hashed by fixed names, not by their (random) ports, so the cold keys' spread —
    // and with it the figure asserted — is the same in every run.
    let mut shard_yaml = String::new();
    for (i, a) in addrs.iter().enumerate() {
        shard_yaml.push_str(&format!(
            "      - {{ hash_key: shard{i}, endpoints: [ {{ address: \"{a}\", role: primary }} ] }}\n"
        ));
    }
    let rule = if hot_rule {
        "    hot_keys:\n      - { prefix: HIGH_FREQ_, read: round_robin }\n"
    } else {
        ""
    };
    let yaml = format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes: {{ catch_all: main }}\nclusters:\n  - name: main\n{rule}    shards:\n{shard_yaml}"
    );
    let rw = respway(&yaml, 1);
    let mut c = sync_client(rw.addr);
    let key = |rank: usize| {
        if rank <= 10 {
            format!("HIGH_FREQ_{rank}")
        } else {
            format!("k:{rank}")
        }
    };
    let mut p = redis::pipe();
    for r in 1..=1000 {
        p.cmd("SET").arg(key(r)).arg(r).ignore();
    }
    let _: () = p.query(&mut c).unwrap();
    // Deterministic zipf sample: inverse CDF over a fixed sequence.
    let weights: Vec<f64> = (1..=1000).map(|r| (r as f64).powf(-1.5)).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(1000);
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cdf.push(acc);
    }
    let n = 20_000;
    let mut p = redis::pipe();
    let mut hottest = 0;
    for i in 0..n {
        let u = ((i as f64 * 0.618_033_988_75) % 1.0).max(1e-9);
        let rank = cdf.iter().position(|&c| c >= u).unwrap_or(999) + 1;
        if rank == 1 {
            hottest += 1;
        }
        p.cmd("GET").arg(key(rank)).ignore();
    }
    assert!(
        hottest * 100 / n >= 30,
        "hot key is {}% of reads",
        hottest * 100 / n
    );
    let _: () = p.query(&mut c).unwrap();
    let gets: Vec<u64> = addrs.iter().map(|a| commandstat(*a, "get")).collect();
    assert_eq!(gets.iter().sum::<u64>(), n as u64);
    let mean = n as f64 / 4.0;
    let max = *gets.iter().max().unwrap() as f64;
    (max / mean, gets)
}

#[test]
fn hot_keys_spread_reads_and_fan_out_writes() {
    let (with, per_shard_with) = zipf_balance(true);
    let (without, per_shard_without) = zipf_balance(false);
    eprintln!("hot-key balance: with rule max/mean {with:.3} {per_shard_with:?}; without {without:.3} {per_shard_without:?}");
    assert!(
        with <= 1.15,
        "with the rule the busiest shard serves {with:.3}x the mean"
    );
    assert!(
        without > 1.5,
        "without the rule the busiest shard serves {without:.3}x the mean"
    );
}

/// Four shards and respway over them, keys under `HIGH_FREQ_` hot. Keep the shards bound for
/// as long as respway is used: dropping them stops them.
fn four_shards_with_hot_keys() -> (Vec<Proc>, Vec<SocketAddr>, Respway) {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let yaml = format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes: {{ catch_all: main }}\nclusters:\n  - name: main\n    hot_keys:\n      - {{ prefix: HIGH_FREQ_ }}\n    shards:\n{}",
        shard_list(&addrs)
    );
    let rw = respway(&yaml, 1);
    (shards, addrs, rw)
}

#[test]
fn hot_key_writes_reach_every_shard() {
    let (shards, addrs, rw) = four_shards_with_hot_keys();
    let mut c = sync_client(rw.addr);
    set(&mut c, "HIGH_FREQ_menu", "v1");
    for a in &addrs {
        let mut d = sync_client(*a);
        assert_eq!(
            get(&mut d, "HIGH_FREQ_menu").as_deref(),
            Some("v1"),
            "shard {a}"
        );
    }
    for _ in 0..8 {
        assert_eq!(get(&mut c, "HIGH_FREQ_menu").as_deref(), Some("v1"));
    }
    let info: String = redis::cmd("INFO").arg("hotkeys").query(&mut c).unwrap();
    assert!(
        info.contains(
            "hotkey_main_HIGH_FREQ_:fanned_out_writes=1,partial_failures=0,reads_per_shard=2/2/2/2"
        ),
        "{info}"
    );
    let _: i64 = redis::cmd("DEL")
        .arg("HIGH_FREQ_menu")
        .query(&mut c)
        .unwrap();
    for a in &addrs {
        assert_eq!(dbsize(*a), 0);
    }
    // One shard down: the write reports the failed shard. (It runs on the key's home shard
    // and is copied to the others: when the home shard is the one down, the write fails there
    // and names it; otherwise the copy to it fails: `hot-key write failed on shard(s) ...`.)
    let mut shards = shards;
    shards[2].kill();
    let err = redis::cmd("SET")
        .arg("HIGH_FREQ_x")
        .arg("v")
        .query::<()>(&mut c)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("shard-2")
            && (err.contains("hot-key write failed") || err.contains("unavailable")),
        "{err}"
    );
}

/// A hot key lives on every shard, so a write must reach every copy. A write that names it
/// with other keys (MSET, DEL, RENAME, a script) would reach one copy only, and reads from the
/// other shards would still see the old value: such writes are refused, and nothing runs.
#[test]
fn a_hot_key_written_with_other_keys_is_refused_not_half_written() {
    let (_shards, addrs, rw) = four_shards_with_hot_keys();
    let mut c = sync_client(rw.addr);
    set(&mut c, "HIGH_FREQ_menu", "v1");
    let every_copy = |want: Option<&str>| {
        for a in &addrs {
            let mut d = sync_client(*a);
            assert_eq!(get(&mut d, "HIGH_FREQ_menu").as_deref(), want, "shard {a}");
        }
    };
    let refused = |c: &mut redis::Connection, args: &[&str]| {
        let err = redis::cmd(args[0])
            .arg(&args[1..])
            .query::<redis::Value>(c)
            .unwrap_err();
        assert!(
            err.to_string().contains("hot key HIGH_FREQ_menu"),
            "{args:?}: {err}"
        );
    };
    refused(&mut c, &["MSET", "HIGH_FREQ_menu", "v2", "plain", "1"]);
    refused(&mut c, &["DEL", "plain", "HIGH_FREQ_menu"]);
    refused(&mut c, &["RENAME", "HIGH_FREQ_menu", "HIGH_FREQ_old"]);
    refused(
        &mut c,
        &[
            "EVAL",
            "return redis.call('SET', KEYS[1], 'v3')",
            "1",
            "HIGH_FREQ_menu",
        ],
    );
    every_copy(Some("v1"));
    let total: u64 = addrs.iter().map(|a| dbsize(*a)).sum();
    assert_eq!(
        total, 4,
        "only the hot key's copies exist: nothing else ran"
    );
    // Reads with other keys read one copy, as every copy holds the same value.
    let got: Vec<Option<String>> = redis::cmd("MGET")
        .arg("HIGH_FREQ_menu")
        .arg("plain")
        .query(&mut c)
        .unwrap();
    assert_eq!(got, [Some("v1".to_string()), None]);
    // On its own, in any single-key form, the write reaches every copy.
    let _: () = redis::cmd("MSET")
        .arg("HIGH_FREQ_menu")
        .arg("v2")
        .query(&mut c)
        .unwrap();
    every_copy(Some("v2"));
    let n: i64 = redis::cmd("DEL")
        .arg("HIGH_FREQ_menu")
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 1);
    every_copy(None);
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn migration_yaml(old: &[SocketAddr], new: &[SocketAddr], mirror: &str) -> String {
    format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes:\n      catch_all: old\n      catch_all_mirrors:\n        - {mirror}\nclusters:\n  - name: old\n    shards:\n{}  - name: new\n    shards:\n{}",
        shard_list(old),
        shard_list(new)
    )
}

#[test]
fn migration_modes_dual_write_switch_reads_read_only() {
    let old: Vec<Proc> = (0..2).map(|_| redis()).collect();
    let new: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let old_a: Vec<SocketAddr> = old.iter().map(|p| p.addr).collect();
    let new_a: Vec<SocketAddr> = new.iter().map(|p| p.addr).collect();
    let total = |a: &[SocketAddr]| a.iter().map(|x| dbsize(*x)).sum::<u64>();

    // 1. Dual write, old cluster primary: both get the writes, reads come from old.
    let rw = respway(
        &migration_yaml(&old_a, &new_a, "{ cluster: new, mode: dual_write }"),
        1,
    );
    let mut c = sync_client(rw.addr);
    for i in 0..100 {
        set(&mut c, &format!("user:{i}"), "v1");
    }
    wait_for("the mirror to catch up", || total(&new_a) == 100);
    let info: String = redis::cmd("INFO").arg("mirror").query(&mut c).unwrap();
    assert!(
        info.contains("mirror_new:mirrored=100,dropped=0,failed=0"),
        "{info}"
    );
    assert_eq!(total(&old_a), 100);
    for s in &new {
        assert_eq!(commandstat(s.addr, "get"), 0);
    }
    assert_eq!(get(&mut c, "user:1").as_deref(), Some("v1"));
    for s in &new {
        assert_eq!(
            commandstat(s.addr, "get"),
            0,
            "reads are not mirrored by default"
        );
    }
    drop(c);
    drop(rw);

    // 2. Switch reads: the new cluster answers, the old one still gets the writes.
    let rw = respway(
        &migration_yaml(
            &old_a,
            &new_a,
            "{ cluster: new, mode: dual_write, primary: mirror }",
        ),
        1,
    );
    let mut c = sync_client(rw.addr);
    set(&mut c, "only-new-reply", "v2");
    assert_eq!(get(&mut c, "only-new-reply").as_deref(), Some("v2"));
    let new_gets: u64 = new_a.iter().map(|a| commandstat(*a, "get")).sum();
    assert_eq!(new_gets, 1, "reads come from the new cluster");
    wait_for("the copy to the old cluster", || total(&old_a) == 101);
    drop(c);
    drop(rw);

    // 3. Read-only cut-over window: writes refused, reads served.
    let rw = respway(
        &migration_yaml(&old_a, &new_a, "{ cluster: new, mode: read_only }"),
        1,
    );
    let mut c = sync_client(rw.addr);
    let err = redis::cmd("SET")
        .arg("user:1")
        .arg("x")
        .query::<()>(&mut c)
        .unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    assert_eq!(get(&mut c, "user:1").as_deref(), Some("v1"));
}

/// A command the primary side of a dual-write route refuses (here `CROSSSLOT`: the new
/// cluster has three shards) must not run on the other side either: the client is told it
/// failed. Before, the copy was queued before the refusal, and the old cluster (one shard,
/// where every RENAME is allowed) renamed the key anyway.
#[test]
fn a_command_the_primary_side_refuses_is_not_mirrored() {
    let old = redis();
    let new: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let new_a: Vec<SocketAddr> = new.iter().map(|p| p.addr).collect();
    let rw = respway(
        &migration_yaml(
            &[old.addr],
            &new_a,
            "{ cluster: new, mode: dual_write, primary: mirror }",
        ),
        1,
    );
    let mut c = sync_client(rw.addr);
    let mut o = sync_client(old.addr);
    for i in 0..20 {
        set(&mut c, &format!("key_{i}"), &format!("v{i}"));
    }
    wait_for("the copies to the old cluster", || dbsize(old.addr) == 20);
    // A key on another shard of the new cluster than key_0.
    let shard_of = |k: &str| {
        new_a
            .iter()
            .position(|a| get(&mut sync_client(*a), k).is_some())
            .unwrap()
    };
    let home = shard_of("key_0");
    let i = (1..20)
        .find(|i| shard_of(&format!("key_{i}")) != home)
        .expect("20 keys over 3 shards");
    let err = redis::cmd("RENAME")
        .arg("key_0")
        .arg(format!("key_{i}"))
        .query::<()>(&mut c)
        .unwrap_err();
    assert_eq!(err.code(), Some("CROSSSLOT"), "{err}");
    // Copies go to the old cluster in order: once this one is there, the RENAME's would be.
    set(&mut c, "sentinel", "1");
    wait_for("the sentinel's copy", || {
        get(&mut o, "sentinel").as_deref() == Some("1")
    });
    assert_eq!(
        get(&mut o, "key_0").as_deref(),
        Some("v0"),
        "key_0 was renamed on old"
    );
    assert_eq!(get(&mut o, &format!("key_{i}")), Some(format!("v{i}")));
    assert_eq!(get(&mut c, "key_0").as_deref(), Some("v0"));
}

#[test]
fn zone_local_reads_hit_the_same_zone_replica() {
    let primary = redis();
    let port = primary.addr.port().to_string();
    let local = redis_with(&["--replicaof", "127.0.0.1", &port]);
    let remote = redis_with(&["--replicaof", "127.0.0.1", &port]);
    let yaml = format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes: {{ catch_all: main }}\nclusters:\n  - name: main\n    read_policy: zone_local\n    zone_fallback: primary\n    shards:\n      - endpoints:\n          - {{ address: \"{}\", role: primary, zone: z2 }}\n          - {{ address: \"{}\", role: replica, zone: z1 }}\n          - {{ address: \"{}\", role: replica, zone: z2 }}\n",
        primary.addr, local.addr, remote.addr
    );
    let rw = respway_in_zone(&yaml, 1, Some("z1"));
    let mut c = sync_client(rw.addr);
    set(&mut c, "k", "v");
    // Both replicas have the write before the reads start (a replica still in its first
    // sync on a loaded machine would answer nil; WAIT's own timeout was too short for CI).
    let mut p = sync_client(primary.addr);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let acked: i64 = redis::cmd("WAIT").arg(2).arg(1000).query(&mut p).unwrap();
        if acked == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replicas did not catch up: {acked} of 2"
        );
    }
    for _ in 0..50 {
        assert_eq!(get(&mut c, "k").as_deref(), Some("v"));
    }
    assert_eq!(
        commandstat(local.addr, "get"),
        50,
        "reads served by the z1 replica"
    );
    assert_eq!(commandstat(primary.addr, "get"), 0);
    assert_eq!(commandstat(remote.addr, "get"), 0);
    assert_eq!(
        commandstat(primary.addr, "set"),
        1,
        "writes go to the primary"
    );
    // The local replica dies: reads fall back to the primary once it is marked unhealthy.
    let mut local = local;
    local.kill();
    // Not one read fails: the read that finds the replica gone is retried on the primary,
    // and later reads skip the replica while it is unhealthy.
    for _ in 0..20 {
        assert_eq!(get(&mut c, "k").as_deref(), Some("v"));
    }
    let before = commandstat(primary.addr, "get");
    for _ in 0..10 {
        assert_eq!(get(&mut c, "k").as_deref(), Some("v"));
    }
    assert_eq!(commandstat(primary.addr, "get"), before + 10);
    assert_eq!(
        commandstat(remote.addr, "get"),
        0,
        "fallback is the primary, not the other zone"
    );
}

/// The migration playbook on one running respway process and one client connection: each
/// step is an edit of the config file and a SIGHUP; no restart, no reconnect.
#[test]
fn migration_steps_change_online_with_sighup() {
    let old: Vec<Proc> = (0..2).map(|_| redis()).collect();
    let new: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let old_a: Vec<SocketAddr> = old.iter().map(|p| p.addr).collect();
    let new_a: Vec<SocketAddr> = new.iter().map(|p| p.addr).collect();
    let total = |a: &[SocketAddr]| a.iter().map(|x| dbsize(*x)).sum::<u64>();
    let proc_ = Spawn::new(env!("CARGO_BIN_EXE_respway"))
        .config(
            "--config",
            "respway.yaml",
            &migration_yaml(&old_a, &new_a, "{ cluster: new, mode: dual_write }"),
        )
        .args(["--workers", "1"])
        .start();
    let port = proc_.addr.port();
    let path = proc_.config.clone().expect("config file");
    let write = |mirror: &str| {
        let y = migration_yaml(&old_a, &new_a, mirror)
            .replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
        std::fs::write(&path, y).unwrap();
    };
    let hup = |mirror: &str,
               c: &mut redis::Connection,
               probe: &dyn Fn(&mut redis::Connection) -> bool| {
        write(mirror);
        proc_.signal("-HUP");
        wait_for(&format!("reload to {mirror}"), || probe(c));
    };
    let mut c = sync_client(proc_.addr);
    // 1. Dual write, old answers.
    set(&mut c, "a", "1");
    wait_for("copy in new", || total(&new_a) == 1);
    // 2. Switch reads to new (new-first dual write): a key only in new becomes visible.
    let mut direct = sync_client(new_a[0]);
    let _: () = redis::cmd("SET")
        .arg("probe")
        .arg("x")
        .query(&mut direct)
        .ok()
        .unwrap_or(());
    // "probe" may not belong to new_a[0] under maglev, so read it back through the shard
    // that owns it: write it on every new shard instead.
    for a in &new_a {
        let mut d = sync_client(*a);
        set(&mut d, "probe", "from-new");
    }
    hup(
        "{ cluster: new, mode: dual_write, primary: mirror }",
        &mut c,
        &|c| get(c, "probe").as_deref() == Some("from-new"),
    );
    set(&mut c, "b", "2");
    wait_for("copy in old", || total(&old_a) == 2);
    // 3. Read-only window.
    hup("{ cluster: new, mode: read_only }", &mut c, &|c| {
        redis::cmd("SET").arg("c").arg("3").query::<()>(c).is_err()
    });
    assert_eq!(get(&mut c, "a").as_deref(), Some("1"));
    // 4. Stop dual write: writes go to old only.
    hup("{ cluster: new, mode: forward }", &mut c, &|c| {
        redis::cmd("SET").arg("d").arg("4").query::<()>(c).is_ok()
    });
    let has = |a: &[SocketAddr], k: &str| a.iter().any(|x| get(&mut sync_client(*x), k).is_some());
    set(&mut c, "f", "6");
    // Time for a copy to reach the new cluster, which none may.
    std::thread::sleep(Duration::from_millis(100));
    assert!(has(&old_a, "d") && has(&old_a, "f"));
    assert!(
        !has(&new_a, "d") && !has(&new_a, "f"),
        "forward mode mirrors nothing"
    );
    // An invalid file is refused; the last good configuration keeps serving.
    std::fs::write(&path, "listeners: [").unwrap();
    proc_.signal("-HUP");
    wait_for("the bad file refused", || {
        proc_.log().contains("reload refused")
    });
    set(&mut c, "e", "5");
    assert_eq!(get(&mut c, "e").as_deref(), Some("5"));
    drop(proc_);
}

/// Mirror and hot-key counters are totals over the process's life: a configuration push
/// (here the same configuration again, and then one with a changed op_timeout) does not
/// reset INFO mirror or INFO hotkeys.
#[test]
fn mirror_and_hot_key_counters_survive_config_pushes() {
    let old: Vec<Proc> = (0..2).map(|_| redis()).collect();
    let new: Vec<Proc> = (0..2).map(|_| redis()).collect();
    let old_a: Vec<SocketAddr> = old.iter().map(|p| p.addr).collect();
    let new_a: Vec<SocketAddr> = new.iter().map(|p| p.addr).collect();
    let yaml = migration_yaml(&old_a, &new_a, "{ cluster: new, mode: dual_write }").replace(
        "  - name: old\n    shards:\n",
        "  - name: old\n    hot_keys:\n      - { prefix: HIGH_FREQ_ }\n    shards:\n",
    );
    let rw = respway(&yaml, 2);
    let total = |a: &[SocketAddr]| a.iter().map(|x| dbsize(*x)).sum::<u64>();
    let mut c = sync_client(rw.addr);
    for i in 0..40 {
        set(&mut c, &format!("user:{i}"), "v");
    }
    set(&mut c, "HIGH_FREQ_a", "v");
    wait_for("the mirror to catch up", || total(&new_a) == 41);
    let config = || {
        let resources = respway_xds::parse_yaml(&yaml).expect("yaml");
        respway_xds::translate(&resources).expect("config")
    };
    let server = rw.server.as_ref().expect("server");
    server.apply(config()).expect("same config again");
    let mut changed = config();
    changed.listeners[0].op_timeout = Duration::from_secs(3);
    server.apply(changed).expect("changed config");
    for i in 40..50 {
        set(&mut c, &format!("user:{i}"), "v");
    }
    set(&mut c, "HIGH_FREQ_b", "v");
    wait_for("the mirror to catch up", || total(&new_a) == 52);
    let info: String = redis::cmd("INFO").arg("mirror").query(&mut c).unwrap();
    assert!(
        info.contains("mirror_new:mirrored=52,dropped=0,failed=0"),
        "{info}"
    );
    // Every copy the new cluster answered is counted as applied, over both pushes too.
    wait_for("every copy counted as applied", || {
        let info: String = redis::cmd("INFO").arg("mirror").query(&mut c).unwrap();
        info.contains(",applied=52\r\n")
    });
    let info: String = redis::cmd("INFO").arg("hotkeys").query(&mut c).unwrap();
    assert!(
        info.contains("hotkey_old_HIGH_FREQ_:fanned_out_writes=2,"),
        "{info}"
    );
}

/// Doubling 2 → 4 shards while reusing the 2 old ones (issue 29): the old cluster's shards
/// `a` and `b` are also `a` and `b` of the new one. A key whose owner is the same Redis in
/// both clusters was written by the client's command and then again by its mirrored copy,
/// so `INCR` counted twice (2,999 of 3,000 counters wrong when the issue was filed). A copy
/// is now never sent to the Redis (address and database) the write itself reached; keys
/// whose owner changes still get their copy.
#[test]
fn dual_write_over_shared_shards_applies_each_write_once() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let a: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let shard = |name: &str, addr: SocketAddr| {
        format!("      - name: {name}\n        endpoints: [ {{ address: \"{addr}\", role: primary }} ]\n")
    };
    let yaml = format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes:\n      catch_all: old\n      catch_all_mirrors:\n        - {{ cluster: new, mode: dual_write }}\nclusters:\n  - name: old\n    hash: {{ policy: ketama }}\n    shards:\n{}{}  - name: new\n    hash: {{ policy: ketama }}\n    shards:\n{}{}{}{}",
        shard("a", a[0]),
        shard("b", a[1]),
        shard("a", a[0]),
        shard("b", a[1]),
        shard("c", a[2]),
        shard("d", a[3]),
    );
    let rw = respway(&yaml, 1);
    let mut c = sync_client(rw.addr);
    const KEYS: usize = 300;
    const TIMES: i64 = 5;
    for _ in 0..TIMES {
        for i in 0..KEYS {
            let _: i64 = redis::cmd("INCR")
                .arg(format!("c:{i}"))
                .query(&mut c)
                .unwrap();
        }
    }
    // Every copy queued has run once each is answered (applied) or failed.
    wait_for("the mirror to send its copies", || {
        let info: String = redis::cmd("INFO").arg("mirror").query(&mut c).unwrap();
        info.contains("mirror_new:mirrored=")
    });
    wait_for("every copy answered", || {
        let info: String = redis::cmd("INFO").arg("mirror").query(&mut c).unwrap();
        let line = info
            .lines()
            .find_map(|l| l.strip_prefix("mirror_new:"))
            .unwrap_or_default()
            .to_string();
        let field = |name: &str| -> u64 {
            line.split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        };
        field("applied") + field("failed") == field("mirrored")
    });
    let mut on_new_only = 0;
    for (s, addr) in a.iter().enumerate() {
        let mut d = sync_client(*addr);
        for i in 0..KEYS {
            let v: Option<i64> = redis::cmd("GET")
                .arg(format!("c:{i}"))
                .query(&mut d)
                .unwrap();
            if let Some(v) = v {
                assert_eq!(
                    v, TIMES,
                    "c:{i} on shard {s} counts {v} after {TIMES} INCRs"
                );
                if s >= 2 {
                    on_new_only += 1;
                }
            }
        }
    }
    assert!(
        on_new_only > 0,
        "keys that move to c and d still get their copies"
    );
    for i in 0..KEYS {
        let v: i64 = redis::cmd("GET")
            .arg(format!("c:{i}"))
            .query(&mut c)
            .unwrap();
        assert_eq!(v, TIMES, "c:{i} through respway");
    }
}

/// Move mode (issue 29, item 1): growing 2 → 4 shards while keeping the 2 old ones. Keys of
/// every type written before the move keep every element, increment and TTL; a key whose
/// owner changes is moved (MIGRATE) before the command that names it runs on its new owner,
/// so it is never on two shards and nothing runs twice; a key whose owner stays is not
/// touched. A placement with only the new cluster then finds every key.
#[test]
fn move_mode_moves_each_key_before_its_command() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let a: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let shard = |name: &str, addr: SocketAddr| {
        format!("      - name: {name}\n        endpoints: [ {{ address: \"{addr}\", role: primary }} ]\n")
    };
    let old = format!(
        "  - name: old\n    hash: {{ policy: ketama }}\n    shards:\n{}{}",
        shard("a", a[0]),
        shard("b", a[1])
    );
    let new = format!(
        "  - name: new\n    hash: {{ policy: ketama }}\n    shards:\n{}{}{}{}",
        shard("a", a[0]),
        shard("b", a[1]),
        shard("c", a[2]),
        shard("d", a[3])
    );
    let yaml = |catch_all: &str, mirrors: &str| {
        format!(
            "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes:\n      catch_all: {catch_all}\n{mirrors}clusters:\n{old}{new}"
        )
    };
    const KEYS: usize = 200;
    let on = |i: usize| -> Vec<usize> {
        (0..4)
            .filter(|s| {
                let mut d = sync_client(a[*s]);
                redis::cmd("EXISTS")
                    .arg(format!("n:{i}"))
                    .query::<i64>(&mut d)
                    .unwrap()
                    == 1
            })
            .collect()
    };

    // Before: the old cluster alone.
    let rw = respway(&yaml("old", ""), 1);
    let mut c = sync_client(rw.addr);
    for i in 0..KEYS {
        for _ in 0..3 {
            let _: i64 = redis::cmd("INCR")
                .arg(format!("n:{i}"))
                .query(&mut c)
                .unwrap();
            let _: i64 = redis::cmd("RPUSH")
                .arg(format!("{{n:{i}}}:l"))
                .arg("x")
                .query(&mut c)
                .unwrap();
        }
        let _: () = redis::cmd("SET")
            .arg(format!("s:{i}"))
            .arg("v")
            .arg("EX")
            .arg(1000)
            .query(&mut c)
            .unwrap();
    }
    let before: Vec<Vec<usize>> = (0..KEYS).map(on).collect();
    assert!(before.iter().all(|s| s.len() == 1 && s[0] < 2));
    drop(c);
    drop(rw);

    // Move mode: the new cluster's placement, keys moved on first use.
    let moving = yaml(
        "old",
        "      catch_all_mirrors:\n        - { cluster: new, mode: move }\n",
    );
    let rw = respway(&moving, 1);
    let mut c = sync_client(rw.addr);
    for i in 0..KEYS {
        for _ in 0..2 {
            let _: i64 = redis::cmd("INCR")
                .arg(format!("n:{i}"))
                .query(&mut c)
                .unwrap();
            let _: i64 = redis::cmd("RPUSH")
                .arg(format!("{{n:{i}}}:l"))
                .arg("y")
                .query(&mut c)
                .unwrap();
        }
        let ttl: i64 = redis::cmd("PTTL")
            .arg(format!("s:{i}"))
            .query(&mut c)
            .unwrap();
        assert!(ttl > 990_000, "s:{i} keeps its TTL: {ttl}");
    }
    let after: Vec<Vec<usize>> = (0..KEYS).map(on).collect();
    let moved = (0..KEYS).filter(|i| after[*i] != before[*i]).count();
    // Keyspace commands see both placements' shards, each Redis once.
    let n: u64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(n, 3 * KEYS as u64, "DBSIZE over the old and the new shards");
    assert!(after.iter().all(|s| s.len() == 1), "every key on one shard");
    assert!(moved > 0 && moved < KEYS, "{moved} of {KEYS} keys moved");
    for i in 0..KEYS {
        let n: i64 = redis::cmd("GET")
            .arg(format!("n:{i}"))
            .query(&mut c)
            .unwrap();
        assert_eq!(n, 5, "n:{i}: 3 increments before the move, 2 after");
        let l: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("{{n:{i}}}:l"))
            .arg(0)
            .arg(-1)
            .query(&mut c)
            .unwrap();
        assert_eq!(l, ["x", "x", "x", "y", "y"], "{{n:{i}}}:l");
    }

    // Every MIGRATE is counted, one per key that moved (a key seen moved gets no MIGRATE
    // again, so none answered NOKEY).
    let info: String = redis::cmd("INFO").arg("mirror").query(&mut c).unwrap();
    let field = |info: &str, name: &str| -> u64 {
        let at = info
            .find(&format!(",{name}="))
            .unwrap_or_else(|| panic!("{info}"));
        info[at + name.len() + 2..]
            .split([',', '\r'])
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(field(&info, "moved") >= 2 * moved as u64, "{info}");
    assert_eq!(field(&info, "absent"), 0, "{info}");
    assert_eq!(field(&info, "move_failed"), 0, "{info}");
    drop(c);
    drop(rw);

    // A key on both its old and its new owner (written by something that is not in move
    // mode), met by a sidecar that has not seen it moved: the move fails, the command is not
    // run, neither copy changes.
    let rw = respway(&moving, 1);
    let mut c = sync_client(rw.addr);
    let i = (0..KEYS).find(|i| after[*i] != before[*i]).unwrap();
    let mut stale = sync_client(a[before[i][0]]);
    let _: () = redis::cmd("SET")
        .arg(format!("n:{i}"))
        .arg(100)
        .query(&mut stale)
        .unwrap();
    let err = redis::cmd("INCR")
        .arg(format!("n:{i}"))
        .query::<i64>(&mut c)
        .unwrap_err();
    assert!(err.to_string().contains("BUSYKEY"), "{err}");
    let mut owner = sync_client(a[after[i][0]]);
    let v: i64 = redis::cmd("GET")
        .arg(format!("n:{i}"))
        .query(&mut owner)
        .unwrap();
    assert_eq!(v, 5);
    let info: String = redis::cmd("INFO").arg("mirror").query(&mut c).unwrap();
    assert_eq!(field(&info, "move_failed"), 1, "{info}");
    drop(c);
    drop(rw);

    // After: the new cluster alone finds every key it owns.
    let _: () = redis::cmd("DEL")
        .arg(format!("n:{i}"))
        .query(&mut stale)
        .unwrap();
    let rw = respway(&yaml("new", ""), 1);
    let mut c = sync_client(rw.addr);
    for i in 0..KEYS {
        let n: i64 = redis::cmd("GET")
            .arg(format!("n:{i}"))
            .query(&mut c)
            .unwrap();
        assert_eq!(n, 5, "n:{i} through the new placement");
    }
}
