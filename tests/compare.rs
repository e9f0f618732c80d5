//! `respway-compare` against real `redis-server`s: a 2-shard source cluster (with `AUTH` and a
//! database number) and a 3-shard target cluster, both maglev. The test places keys with the
//! pickers the data plane builds (through `Routing`, not the tool's own code), plants one
//! difference of each kind, checks the summary and exit code 1, fixes them and checks exit 0;
//! then `--repair`: every type copied with its TTL (by `RESTORE`, and by the type-aware copy
//! when the target refuses it), and a second plain run that finds nothing.
//!
//! The servers come from the workspace's test harness (`respway-testkit`): free loopback
//! ports, killed on drop (also when an assertion fails).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use respway_filters::hash::ShardPicker;
use respway_filters::routing::Routing;
use respway_testkit::{redis_with, Proc, Resp, RespConn};

const PASSWORD: &str = "src-secret";
const SOURCE_DB: &str = "3";

// === clients ===

/// Connects, authenticates and selects `db` when asked.
fn open(addr: SocketAddr, password: Option<&str>, db: &str) -> RespConn {
    let mut c = RespConn::connect(addr);
    if let Some(p) = password {
        ok(&mut c, &["AUTH", p]);
    }
    ok(&mut c, &["SELECT", db]);
    c
}

/// One command whose reply must not be an error.
fn cmd(c: &mut RespConn, args: &[&str]) -> Resp {
    let reply = c.call(args);
    assert!(!reply.is_error(), "{args:?}: {reply:?}");
    reply
}

fn ok(c: &mut RespConn, args: &[&str]) {
    assert_eq!(cmd(c, args), Resp::Simple("OK".into()), "{args:?}");
}

// === the clusters ===

/// One cluster: its shard servers, open clients and the data plane's picker.
struct Cluster {
    clients: Vec<RespConn>,
    picker: Arc<dyn ShardPicker>,
}

impl Cluster {
    /// The client of the shard owning `key`.
    fn at(&mut self, key: &str) -> &mut RespConn {
        let shard = self.picker.pick(key.as_bytes());
        &mut self.clients[shard]
    }

    fn cmd(&mut self, args: &[&str]) -> Resp {
        cmd(self.at(args[1]), args)
    }

    /// Keys of each shard (KEYS: the data is tiny).
    fn keys_per_shard(&mut self) -> Vec<usize> {
        self.clients
            .iter_mut()
            .map(|c| match cmd(c, &["KEYS", "*"]) {
                Resp::Array(Some(k)) => k.len(),
                other => panic!("KEYS: {other:?}"),
            })
            .collect()
    }
}

struct Setup {
    servers: Vec<Proc>,
    config: PathBuf,
    source: Cluster,
    target: Cluster,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

fn setup() -> Setup {
    setup_with(&[])
}

/// [`setup`] with extra arguments for the target's servers.
fn setup_with(target_args: &[&str]) -> Setup {
    let src: Vec<Proc> = (0..2)
        .map(|_| redis_with(&["--requirepass", PASSWORD]))
        .collect();
    let dst: Vec<Proc> = (0..3).map(|_| redis_with(target_args)).collect();
    let shards = |servers: &[Proc]| {
        servers
            .iter()
            .map(|r| {
                format!(
                    "      - endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
                    r.addr
                )
            })
            .collect::<String>()
    };
    let yaml = format!(
        "listeners:\n  - name: main\n    routes: {{ catch_all: src }}\n\
         clusters:\n  - name: src\n    hash: {{ policy: maglev }}\n    auth: {{ password: {PASSWORD} }}\n    db: {SOURCE_DB}\n    shards:\n{}\
         \x20 - name: dst\n    hash: {{ policy: maglev }}\n    shards:\n{}",
        shards(&src),
        shards(&dst)
    );
    let config = std::env::temp_dir().join(format!(
        "respway-compare-{}-{}.yaml",
        std::process::id(),
        src[0].addr.port()
    ));
    std::fs::write(&config, yaml).expect("write config");
    let model = respway_xds::load_file(&config).expect("valid config");
    let routing = Routing::build(&model, &model.listeners[0]).expect("routing");
    assert_eq!(routing.clusters[0].name, "src");
    assert_eq!(routing.clusters[1].name, "dst");
    let source = Cluster {
        clients: src
            .iter()
            .map(|r| open(r.addr, Some(PASSWORD), SOURCE_DB))
            .collect(),
        picker: routing.clusters[0].picker.clone(),
    };
    let target = Cluster {
        clients: dst.iter().map(|r| open(r.addr, None, "0")).collect(),
        picker: routing.clusters[1].picker.clone(),
    };
    Setup {
        servers: src.into_iter().chain(dst).collect(),
        config,
        source,
        target,
    }
}

/// Writes the same data set through `c`: every type, some with TTLs, a big list.
fn fill(c: &mut Cluster) -> usize {
    let mut keys = 0;
    for i in 0..20 {
        let (k, v) = (format!("str:{i}"), format!("value-{i}"));
        c.cmd(&["SET", &k, &v]);
        keys += 1;
    }
    for i in 0..5 {
        let k = format!("hash:{i}");
        c.cmd(&["HSET", &k, "a", "1", "b", "2", "c", &i.to_string()]);
        let k = format!("list:{i}");
        c.cmd(&["RPUSH", &k, "x", "y", "z", &i.to_string()]);
        let k = format!("set:{i}");
        c.cmd(&["SADD", &k, "m1", "m2", "m3", &i.to_string()]);
        let k = format!("zset:{i}");
        c.cmd(&["ZADD", &k, "1", "one", "2.5", "two", "3", &format!("m{i}")]);
        let k = format!("stream:{i}");
        c.cmd(&["XADD", &k, "*", "f", "v"]);
        let k = format!("ttl:{i}");
        c.cmd(&["SET", &k, "v", "EX", "3600"]);
        keys += 6;
    }
    // Bigger than --sample-big 10: compared by length only.
    let items: Vec<String> = (0..30).map(|i| format!("item-{i}")).collect();
    let mut args = vec!["RPUSH", "biglist"];
    args.extend(items.iter().map(String::as_str));
    c.cmd(&args);
    // A key hashtag-placed like its sibling.
    c.cmd(&["SET", "{user:7}:name", "seven"]);
    keys + 2
}

/// Runs the binary with exactly these arguments.
fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_respway-compare"))
        .args(args)
        .output()
        .expect("run respway-compare")
}

/// Runs `src` → `dst` with small batches (so every shard takes several SCAN pages).
fn compare(s: &Setup, extra: &[&str]) -> Output {
    let config = s.config.to_str().expect("utf-8 temp path");
    let mut args = vec!["--config", config, "--source", "src", "--target", "dst"];
    args.extend(["--sample-big", "10", "--count", "7"]);
    if !extra.contains(&"--rate") {
        args.extend(["--rate", "100000"]);
    }
    args.extend(extra);
    run(&args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn summary(o: &Output) -> String {
    let out = stdout(o);
    out.lines()
        .rfind(|l| l.starts_with("scanned "))
        .unwrap_or_else(|| panic!("no summary in {out:?}, stderr {:?}", o.stderr))
        .to_string()
}

// === tests ===

#[test]
fn compare_reports_each_kind_of_difference_then_passes_once_fixed() {
    let mut s = setup();
    let n = fill(&mut s.source);
    assert_eq!(fill(&mut s.target), n);
    // Both clusters really are spread over their shards.
    assert!(s.source.keys_per_shard().iter().all(|&k| k > 0));
    assert!(s.target.keys_per_shard().iter().all(|&k| k > 0));

    // Same length, different content: not seen with --sample-big 10.
    s.target.cmd(&["LSET", "biglist", "5", "changed"]);
    let same = compare(&s, &[]);
    assert_eq!(
        summary(&same),
        format!("scanned {n}, matched {n}, missing_in_target 0, type_mismatch 0, value_mismatch 0, ttl_mismatch 0")
    );
    assert_eq!(same.status.code(), Some(0), "{}", stdout(&same));

    // One difference of each kind.
    s.target.cmd(&["DEL", "str:3"]);
    s.target.cmd(&["HSET", "hash:2", "b", "two"]);
    s.target.cmd(&["DEL", "set:1"]);
    s.target.cmd(&["SET", "set:1", "now a string"]);
    s.target.cmd(&["PERSIST", "ttl:4"]);
    let out = compare(&s, &[]);
    let text = stdout(&out);
    assert_eq!(
        summary(&out),
        format!(
            "scanned {n}, matched {}, missing_in_target 1, type_mismatch 1, value_mismatch 1, ttl_mismatch 1",
            n - 4
        ),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    for line in [
        "missing_in_target \"str:3\": string on source, absent on target shard ",
        "value_mismatch \"hash:2\": hash: field \"b\" is \"2\" on source, \"two\" on target",
        "type_mismatch \"set:1\": set on source, string on target",
        "ttl_mismatch \"ttl:4\": TTL ",
    ] {
        assert!(text.contains(line), "{line:?} not in {text}");
    }
    // --max-mismatches limits what is printed, not what is counted.
    let out = compare(&s, &["--max-mismatches", "1"]);
    let text = stdout(&out);
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("_mismatch \"") || l.starts_with("missing_in_target"))
            .count(),
        1,
        "{text}"
    );
    assert!(
        text.contains("... 3 more mismatches not shown (--max-mismatches 1)"),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(1));

    // More differences the value comparison must see.
    s.target.cmd(&["LSET", "list:0", "1", "Y"]);
    s.target.cmd(&["ZADD", "zset:3", "9", "two"]);
    s.target.cmd(&["SET", "str:9", "value-9!"]);
    s.target.cmd(&["XADD", "stream:2", "*", "f", "v2"]);
    s.target.cmd(&["RPUSH", "biglist", "one more"]);
    let out = compare(&s, &[]);
    let text = stdout(&out);
    for line in [
        "value_mismatch \"list:0\": list: index 1 is \"y\" on source, \"Y\" on target",
        "value_mismatch \"zset:3\": zset: rank ",
        "value_mismatch \"str:9\": string: \"value-9\" (7 bytes) on source, \"value-9!\" (8 bytes) on target",
        "value_mismatch \"stream:2\": stream: 1 entries on source, 2 on target",
        "value_mismatch \"biglist\": list: 30 elements on source, 31 on target",
    ] {
        assert!(text.contains(line), "{line:?} not in {text}");
    }
    assert!(
        summary(&out).ends_with("value_mismatch 6, ttl_mismatch 1"),
        "{text}"
    );

    // Fix everything: a clean pass.
    s.target.cmd(&["SET", "str:3", "value-3"]);
    s.target.cmd(&["HSET", "hash:2", "b", "2"]);
    s.target.cmd(&["DEL", "set:1"]);
    s.target.cmd(&["SADD", "set:1", "m1", "m2", "m3", "1"]);
    // The source's TTL (TTL values are compared within --ttl-tolerance, 1000 ms by default).
    let Resp::Int(pttl) = s.source.cmd(&["PTTL", "ttl:4"]) else {
        panic!("PTTL")
    };
    s.target.cmd(&["PEXPIRE", "ttl:4", &pttl.to_string()]);
    s.target.cmd(&["LSET", "list:0", "1", "y"]);
    s.target.cmd(&["ZADD", "zset:3", "2.5", "two"]);
    s.target.cmd(&["SET", "str:9", "value-9"]);
    s.target.cmd(&["DEL", "stream:2"]);
    s.target.cmd(&["XADD", "stream:2", "*", "f", "v"]);
    s.target.cmd(&["RPOP", "biglist"]);
    let out = compare(&s, &[]);
    assert_eq!(
        summary(&out),
        format!("scanned {n}, matched {n}, missing_in_target 0, type_mismatch 0, value_mismatch 0, ttl_mismatch 0"),
        "{}",
        stdout(&out)
    );
    assert_eq!(out.status.code(), Some(0));

    // Keys only in the target are not the tool's business (one-way).
    s.target.cmd(&["SET", "extra", "x"]);
    assert_eq!(compare(&s, &[]).status.code(), Some(0));

    // --limit bounds the keys scanned.
    let out = compare(&s, &["--limit", "5"]);
    assert!(
        summary(&out).starts_with("scanned 5, matched 5,"),
        "{}",
        stdout(&out)
    );

    // --rate paces: 10 keys at 20 keys/s cannot take less than half a second (a lower bound
    // only; the run may take longer on a slow machine).
    let started = Instant::now();
    let out = compare(&s, &["--limit", "10", "--rate", "20"]);
    assert!(summary(&out).starts_with("scanned 10, matched 10,"));
    assert!(
        started.elapsed() >= Duration::from_millis(450),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn compare_usage_and_config_errors_exit_2() {
    let s = setup();
    let config = s.config.to_str().unwrap();
    let out = run(&["--config", config, "--source", "src", "--target", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "respway-compare: --target: no cluster \"nope\" in the configuration (clusters: src, dst)\n"
    );
    let out = run(&[
        "--config",
        "/nonexistent/respway.yaml",
        "--source",
        "a",
        "--target",
        "b",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with("/nonexistent/respway.yaml: cannot read: "),
        "{}",
        stderr(&out)
    );
    // clap: a missing argument, a bad number (`--rate 0` is no limit since issue 43).
    assert_eq!(run(&["--config", config]).status.code(), Some(2));
    let out = run(&[
        "--config", config, "--source", "src", "--target", "dst", "--rate", "-1",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stdout(&out).is_empty());
}

#[test]
fn compare_unreachable_shard_exits_3() {
    let mut s = setup();
    fill(&mut s.source);
    // Stop one target shard: the comparison cannot be completed.
    let target_shard = s.servers.len() - 1;
    s.servers[target_shard].kill();
    let out = compare(&s, &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cluster \"dst\" shard "));
}

#[test]
fn compare_ttl_values_differing_beyond_the_tolerance_are_ttl_mismatches() {
    let mut s = setup();
    // An hour on the source, 100 s on the target: far apart.
    s.source.cmd(&["SET", "t:far", "v", "EX", "3600"]);
    s.target.cmd(&["SET", "t:far", "v", "EX", "100"]);
    // 200 ms apart: within the default tolerance (1000 ms), beyond 100 ms.
    s.source.cmd(&["SET", "t:near", "v", "PX", "600000"]);
    s.target.cmd(&["SET", "t:near", "v", "PX", "599800"]);
    // A TTL on one side only.
    s.source.cmd(&["SET", "t:none", "v"]);
    s.target.cmd(&["SET", "t:none", "v", "EX", "50"]);
    let out = compare(&s, &[]);
    let text = stdout(&out);
    assert_eq!(
        summary(&out),
        "scanned 3, matched 1, missing_in_target 0, type_mismatch 0, value_mismatch 0, ttl_mismatch 2",
        "{text}"
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    for line in [
        "ttl_mismatch \"t:far\": TTL 3",
        " ms on source, TTL 9",
        " ms on target, 3",
        " ms apart (--ttl-tolerance 1000)",
        "ttl_mismatch \"t:none\": no TTL on source, TTL ",
    ] {
        assert!(text.contains(line), "{line:?} not in {text}");
    }
    let out = compare(&s, &["--ttl-tolerance", "4000000"]);
    assert!(
        summary(&out).ends_with("ttl_mismatch 1"),
        "{}",
        stdout(&out)
    );
    let out = compare(&s, &["--ttl-tolerance", "100"]);
    assert!(
        summary(&out).ends_with("ttl_mismatch 3"),
        "{}",
        stdout(&out)
    );
}

/// Source keys of every type with TTLs, missing on the target; `fill`'s keys besides.
fn fill_with_ttls(c: &mut Cluster) -> usize {
    let n = fill(c);
    c.cmd(&["SET", "counter", "10"]);
    c.cmd(&["HSET", "ttl-hash", "f", "v", "g", "w"]);
    c.cmd(&["RPUSH", "ttl-list", "a", "b", "c"]);
    c.cmd(&["SADD", "ttl-set", "a", "b"]);
    c.cmd(&["ZADD", "ttl-zset", "1.5", "a", "-2", "b"]);
    for k in ["ttl-hash", "ttl-list", "ttl-set", "ttl-zset"] {
        c.cmd(&["PEXPIRE", k, "500000"]);
    }
    n + 5
}

fn pttl(c: &mut Cluster, key: &str) -> i64 {
    match c.cmd(&["PTTL", key]) {
        Resp::Int(n) => n,
        other => panic!("PTTL {key}: {other:?}"),
    }
}

/// `key` has the same TTL on both sides (within a second), or none on both.
fn same_ttl(s: &mut Setup, key: &str) {
    let (a, b) = (pttl(&mut s.source, key), pttl(&mut s.target, key));
    assert!(
        (a < 0 && b < 0) || (a >= 0 && b >= 0 && a.abs_diff(b) <= 1000),
        "{key}: PTTL {a} on source, {b} on target"
    );
}

#[test]
fn compare_repair_copies_every_type_with_its_ttl_then_a_plain_run_matches() {
    let mut s = setup();
    let n = fill_with_ttls(&mut s.source);
    // What dual-write wrote to the target before the backfill: the later elements of a list,
    // the later increments of a counter (the BUSYKEY case), a string with another TTL, a
    // string already right.
    s.target.cmd(&["RPUSH", "list:1", "z", "1"]);
    s.target.cmd(&["INCRBY", "counter", "3"]);
    s.target.cmd(&["SET", "ttl:2", "v", "EX", "100"]);
    s.target.cmd(&["SET", "str:5", "value-5"]);
    // A key only on the target: not the repair's business.
    s.target.cmd(&["SET", "only-target", "x", "EX", "500"]);

    let out = compare(&s, &["--repair", "--max-mismatches", "100"]);
    let text = stdout(&out);
    assert_eq!(
        summary(&out),
        format!(
            "scanned {n}, matched 1, missing_in_target {}, type_mismatch 0, value_mismatch 2, ttl_mismatch 1, repaired {}, unsettled 0",
            n - 4,
            n - 1
        ),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    for line in [
        "value_mismatch \"list:1\": list: 4 elements on source, 2 on target",
        "value_mismatch \"counter\": string: \"10\" (2 bytes) on source, \"3\" (1 bytes) on target",
        "ttl_mismatch \"ttl:2\": TTL ",
    ] {
        assert!(text.contains(line), "{line:?} not in {text}");
    }
    // The values and TTLs themselves, read on the target.
    assert_eq!(s.target.cmd(&["GET", "counter"]), Resp::bulk("10"));
    assert_eq!(
        s.target.cmd(&["LRANGE", "list:1", "0", "-1"]),
        s.source.cmd(&["LRANGE", "list:1", "0", "-1"])
    );
    assert_eq!(s.target.cmd(&["XLEN", "stream:3"]), Resp::Int(1));
    assert_eq!(
        s.target
            .cmd(&["ZRANGE", "ttl-zset", "0", "-1", "WITHSCORES"]),
        s.source
            .cmd(&["ZRANGE", "ttl-zset", "0", "-1", "WITHSCORES"])
    );
    for key in [
        "ttl:2", "ttl:0", "ttl-hash", "ttl-list", "ttl-set", "ttl-zset", "str:1",
    ] {
        same_ttl(&mut s, key);
    }
    assert!(pttl(&mut s.target, "ttl-list") > 400_000);
    assert!(pttl(&mut s.target, "str:1") == -1);
    assert_eq!(s.target.cmd(&["GET", "only-target"]), Resp::bulk("x"));
    assert!(pttl(&mut s.target, "only-target") > 0);

    // A second plain run finds nothing; a second repair has nothing to do.
    let out = compare(&s, &[]);
    assert_eq!(
        summary(&out),
        format!("scanned {n}, matched {n}, missing_in_target 0, type_mismatch 0, value_mismatch 0, ttl_mismatch 0"),
        "{}",
        stdout(&out)
    );
    assert_eq!(out.status.code(), Some(0));
    let out = compare(&s, &["--repair"]);
    assert!(
        summary(&out).ends_with("ttl_mismatch 0, repaired 0, unsettled 0"),
        "{}",
        stdout(&out)
    );
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn compare_repair_rebuilds_by_type_when_the_target_refuses_restore() {
    // A target without RESTORE answers it `-ERR unknown command`, as a server of another
    // version answers `-ERR DUMP payload version or checksum are wrong`.
    let mut s = setup_with(&["--rename-command", "RESTORE", ""]);
    let n = fill_with_ttls(&mut s.source);
    s.target.cmd(&["RPUSH", "list:1", "z", "1"]);
    s.target.cmd(&["INCRBY", "counter", "3"]);
    s.target.cmd(&["SET", "ttl:2", "v", "EX", "100"]);
    s.target.cmd(&["SET", "hash:4", "a string now"]);

    let out = compare(&s, &["--repair", "--repair-rounds", "2"]);
    let text = stdout(&out);
    // Streams have no type-aware copy: listed, and the run exits 1.
    assert!(
        summary(&out).ends_with(&format!("repaired {}, unsettled 5", n - 5)),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    for i in 0..5 {
        let line = format!(
            "unsettled \"stream:{i}\": stream: not repaired: the target refused RESTORE (-ERR "
        );
        assert!(text.contains(&line), "{line:?} not in {text}");
    }
    assert!(
        text.contains("and a stream has no type-aware copy"),
        "{text}"
    );
    for key in [
        "ttl:2", "ttl:0", "ttl-hash", "ttl-list", "ttl-set", "ttl-zset", "str:1",
    ] {
        same_ttl(&mut s, key);
    }
    assert_eq!(s.target.cmd(&["GET", "counter"]), Resp::bulk("10"));
    assert_eq!(
        s.target.cmd(&["TYPE", "hash:4"]),
        Resp::Simple("hash".into())
    );
    assert_eq!(
        s.target
            .cmd(&["ZRANGE", "ttl-zset", "0", "-1", "WITHSCORES"]),
        s.source
            .cmd(&["ZRANGE", "ttl-zset", "0", "-1", "WITHSCORES"])
    );
    // Everything else matches now: only the streams are missing.
    let out = compare(&s, &[]);
    assert_eq!(
        summary(&out),
        format!("scanned {n}, matched {}, missing_in_target 5, type_mismatch 0, value_mismatch 0, ttl_mismatch 0", n - 5),
        "{}",
        stdout(&out)
    );
}

/// `--move`, move mode's background mover (issue 29): every key of the source goes to its
/// owner in the target with `MIGRATE` (value and TTL, deleted from the source), from the
/// source's database to the target's; a second run finds nothing left to move. Failing
/// before: the flag did not exist.
#[test]
fn compare_move_migrates_every_key_to_its_owner_with_its_ttl() {
    let mut s = setup();
    let n = fill_with_ttls(&mut s.source);
    let before = pttl(&mut s.source, "ttl:2");
    let out = compare(&s, &["--move"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert_eq!(
        stdout(&out),
        format!("scanned {n}, sent {n}, kept 0, absent 0, failed 0, big 0\n")
    );
    assert_eq!(s.source.keys_per_shard(), vec![0, 0]);
    assert_eq!(s.target.keys_per_shard().iter().sum::<usize>(), n);
    // Each key at the shard the target's placement gives it, with its value and TTL.
    assert_eq!(
        s.target.cmd(&["GET", "str:3"]),
        Resp::Bulk(Some(b"value-3".to_vec()))
    );
    assert_eq!(s.target.cmd(&["LLEN", "list:1"]), Resp::Int(4));
    let after = pttl(&mut s.target, "ttl:2");
    assert!(
        after > 0 && before - after < 5_000,
        "PTTL {before} -> {after}"
    );
    let again = compare(&s, &["--move"]);
    assert_eq!(
        stdout(&again),
        "scanned 0, sent 0, kept 0, absent 0, failed 0, big 0\n"
    );
}
