//! Today's client libraries, unchanged and on their default settings, through respway over 3
//! real redis-server shards: redis-py, node-redis and ioredis at the versions pinned in
//! `tests/clients/` (`requirements.txt`, `package.json` + `package-lock.json`).
//!
//! Each test runs one of the scripts there (`py_client.py`, `node_redis.mjs`, `ioredis.mjs`),
//! which prints a line per scenario and exits 1 if any failed. With `--proxy` they run
//! against respway, including what only a sharding proxy does (a cross-shard transaction
//! refused); without it against one plain redis-server, which checks the scripts themselves.
//!
//! The libraries are installed by `tests/clients/setup.sh` (CI runs it); a test whose library
//! is missing fails and says so rather than skipping.

use crate::support::*;

/// The hash tags the scripts use for a transaction over several shards (`CROSS_TAGS` in
/// `py_client.py` and `common.mjs`): with `crc16_slots` over 3 shards each is on its own shard.
const CROSS_TAGS: [&str; 3] = ["a", "b", "c"];

/// Panics (naming `setup.sh`) unless python3 imports the pinned `redis` version.
fn require_redis_py() {
    let reqs = std::fs::read_to_string(clients_dir().join("requirements.txt")).expect("reqs");
    let want = reqs
        .lines()
        .find_map(|l| l.trim().strip_prefix("redis=="))
        .expect("requirements.txt pins redis==VERSION");
    let (ok, out) = run_bounded("python3", &["-c", "import redis; print(redis.__version__)"]);
    assert!(
        ok && out.trim() == want,
        "python3 cannot import redis=={want} (got: {}); {SETUP}",
        out.trim()
    );
}

/// Panics (naming `setup.sh`) unless `tests/clients/node_modules` has the versions that
/// `package.json` pins.
fn require_node_modules() {
    assert!(
        clients_dir().join("node_modules").is_dir(),
        "tests/clients/node_modules is missing; {SETUP}"
    );
    let check = "const p = require('./package.json'); let bad = []; \
                 for (const [n, v] of Object.entries(p.dependencies)) { \
                   let got; try { got = require(n + '/package.json').version; } catch (e) { got = 'missing'; } \
                   if (got !== v) bad.push(n + ' ' + got + ' (want ' + v + ')'); } \
                 if (bad.length) { console.log(bad.join(', ')); process.exit(1); }";
    let (ok, out) = run_bounded("node", &["-e", check]);
    assert!(
        ok,
        "tests/clients/node_modules does not hold the pinned packages: {}; {SETUP}",
        out.trim()
    );
}

/// Runs a client script against `addr` and fails the test, with everything it printed,
/// unless it exits 0.
fn run_client(program: &str, script: &str, addr: std::net::SocketAddr, extra: &[&str]) {
    let addr = addr.to_string();
    let mut args = vec![script, "--addr", &addr];
    args.extend_from_slice(extra);
    let (ok, out) = run_bounded(program, &args);
    if ok {
        eprintln!("{program} {}:\n{out}", args.join(" "));
    }
    assert!(
        ok,
        "{script} {} failed; its output:\n{out}",
        args[1..].join(" ")
    );
}

/// Three shards behind respway (`crc16_slots`, hash tags on), after checking that the
/// scripts' cross-shard tags really are on three different shards.
fn three_shards_behind_respway() -> (Vec<Proc>, Respway) {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<_> = shards.iter().map(|s| s.addr).collect();
    let rw = respway(&sharded_yaml(&addrs, "{ policy: crc16_slots }", true), 1);
    let mut c = sync_client(rw.addr);
    let mut owners = Vec::new();
    for tag in CROSS_TAGS {
        let key = format!("{{{tag}}}probe");
        let _: () = redis::cmd("SET").arg(&key).arg("1").query(&mut c).unwrap();
        let on: Vec<usize> = (0..shards.len())
            .filter(|&i| RespConn::connect(addrs[i]).get(&key).is_some())
            .collect();
        assert_eq!(on.len(), 1, "{key} is on shards {on:?}");
        owners.push(on[0]);
        let _: i64 = redis::cmd("DEL").arg(&key).query(&mut c).unwrap();
    }
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(
        owners.len(),
        3,
        "the tags {CROSS_TAGS:?} must be on three different shards"
    );
    (shards, rw)
}

fn through_respway(program: &str, script: &str, extra: &[&str]) {
    let (_shards, rw) = three_shards_behind_respway();
    let mut args = vec!["--proxy"];
    args.extend_from_slice(extra);
    run_client(program, script, rw.addr, &args);
}

fn against_plain_redis(program: &str, script: &str, extra: &[&str]) {
    let r = redis();
    run_client(program, script, r.addr, extra);
}

// --- through respway ----------------------------------------------------------------------

#[test]
fn redis_py_default_through_respway() {
    require_redis_py();
    through_respway("python3", "py_client.py", &["--protocol", "default"]);
}

#[test]
fn redis_py_protocol_2_through_respway() {
    require_redis_py();
    through_respway("python3", "py_client.py", &["--protocol", "2"]);
}

#[test]
fn node_redis_default_through_respway() {
    require_node_modules();
    through_respway("node", "node_redis.mjs", &[]);
}

#[test]
fn ioredis_default_through_respway() {
    require_node_modules();
    through_respway("node", "ioredis.mjs", &[]);
}

// --- the scripts themselves, against one plain redis-server -------------------------------

#[test]
fn redis_py_default_against_plain_redis() {
    require_redis_py();
    against_plain_redis("python3", "py_client.py", &["--protocol", "default"]);
}

#[test]
fn redis_py_protocol_2_against_plain_redis() {
    require_redis_py();
    against_plain_redis("python3", "py_client.py", &["--protocol", "2"]);
}

#[test]
fn node_redis_default_against_plain_redis() {
    require_node_modules();
    against_plain_redis("node", "node_redis.mjs", &[]);
}

#[test]
fn ioredis_default_against_plain_redis() {
    require_node_modules();
    against_plain_redis("node", "ioredis.mjs", &[]);
}

// --- SCAN through the libraries' own iterators (the keyspace-wide commands) ---------------

#[test]
fn redis_py_scan_iter_through_respway() {
    require_redis_py();
    let (_shards, rw) = three_shards_behind_respway();
    run_client("python3", "py_scan.py", rw.addr, &["--protocol", "default"]);
    run_client("python3", "py_scan.py", rw.addr, &["--protocol", "2"]);
}

#[test]
fn ioredis_scan_stream_through_respway() {
    require_node_modules();
    let (_shards, rw) = three_shards_behind_respway();
    run_client("node", "ioredis_scan.mjs", rw.addr, &[]);
    run_client("node", "ioredis_scan.mjs", rw.addr, &["--resp", "2"]);
}

#[test]
fn redis_py_scan_iter_against_plain_redis() {
    require_redis_py();
    against_plain_redis("python3", "py_scan.py", &[]);
}

#[test]
fn ioredis_scan_stream_against_plain_redis() {
    require_node_modules();
    against_plain_redis("node", "ioredis_scan.mjs", &[]);
}
