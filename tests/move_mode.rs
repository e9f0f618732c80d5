//! Move mode (issue 29) against real redis-servers: the order of one connection's commands
//! while keys move, and the proof under load that nothing is lost, applied twice or read
//! out of order.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::support::*;
use respway_filters::hash::{cluster_picker, ShardPicker};

fn shard(name: &str, addr: SocketAddr) -> String {
    format!(
        "      - name: {name}\n        endpoints: [ {{ address: \"{addr}\", role: primary }} ]\n"
    )
}

fn cluster(name: &str, shards: &[(&str, SocketAddr)]) -> String {
    let mut y = format!("  - name: {name}\n    hash: {{ policy: ketama }}\n    shards:\n");
    for (n, a) in shards {
        y.push_str(&shard(n, *a));
    }
    y
}

/// The listener's YAML: `catch_all` with optional mirrors, over the clusters given.
fn yaml(catch_all: &str, mirrors: &str, clusters: &str) -> String {
    format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes:\n      catch_all: {catch_all}\n{mirrors}clusters:\n{clusters}"
    )
}

const MOVE: &str = "      catch_all_mirrors:\n        - { cluster: new, mode: move }\n";

/// The shard pickers of the config's clusters, by name.
fn picker(yaml: &str, name: &str) -> Arc<dyn ShardPicker> {
    let resources = respway_xds::parse_yaml(yaml).expect("yaml");
    let config = respway_xds::translate(&resources).expect("config");
    let c = config
        .clusters
        .iter()
        .find(|c| c.name == name)
        .expect("cluster");
    cluster_picker(c).expect("picker")
}

/// Four redis-servers; `old` is ketama over the first two, `new` over all four (the two old
/// ones kept), and the move-mode config over them with both clusters' pickers.
struct TwoToFour {
    _shards: Vec<Proc>,
    a: Vec<SocketAddr>,
    clusters: String,
    config: String,
    po: Arc<dyn ShardPicker>,
    pn: Arc<dyn ShardPicker>,
}

fn two_to_four() -> TwoToFour {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let a: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let old = cluster("old", &[("a", a[0]), ("b", a[1])]);
    let new = cluster("new", &[("a", a[0]), ("b", a[1]), ("c", a[2]), ("d", a[3])]);
    let clusters = format!("{old}{new}");
    let config = yaml("old", MOVE, &clusters);
    let (po, pn) = (picker(&config, "old"), picker(&config, "new"));
    TwoToFour {
        _shards: shards,
        a,
        clusters,
        config,
        po,
        pn,
    }
}

impl TwoToFour {
    /// The first `n` keys `k:i` whose owner changes.
    fn moving(&self, n: usize) -> Vec<String> {
        (0..1000)
            .map(|i| format!("k:{i}"))
            .filter(|k| self.pn.pick(k.as_bytes()) >= 2)
            .take(n)
            .collect()
    }
}

/// Commands of one connection run in the order they were sent, also while a command waits
/// for its keys to move: a pipelined `GET` of a key that does not move ran before the `MSET`
/// sent ahead of it (which waited for the `MIGRATE` of its other key), and read the value from
/// before the `MSET`.
#[test]
fn a_pipeline_runs_in_order_while_its_keys_move() {
    let g = two_to_four();
    let (a, config, po, pn) = (&g.a, &g.config, &g.po, &g.pn);
    let moves = |k: &str| pn.pick(k.as_bytes()) >= 2;
    let keys: Vec<String> = (0..400).map(|i| format!("k:{i}")).collect();
    let moving: Vec<&String> = keys.iter().filter(|k| moves(k)).collect();
    let staying: Vec<&String> = keys.iter().filter(|k| !moves(k)).collect();
    assert!(moving.len() > 50 && staying.len() > 50);

    // The keys that move are on their old owners, with a value.
    for k in &moving {
        let mut d = sync_client(a[po.pick(k.as_bytes())]);
        let _: () = redis::cmd("SET").arg(*k).arg("old").query(&mut d).unwrap();
    }
    let rw = respway(config, 1);
    let mut c = sync_client(rw.addr);
    let mut out_of_order = Vec::new();
    for (m, s) in moving.iter().zip(&staying) {
        let (ok, got, moved): (String, Option<String>, Option<String>) = redis::pipe()
            .cmd("MSET")
            .arg(*m)
            .arg("new")
            .arg(*s)
            .arg("new")
            .cmd("GET")
            .arg(*s)
            .cmd("GET")
            .arg(*m)
            .query(&mut c)
            .unwrap();
        assert_eq!(ok, "OK");
        if got.as_deref() != Some("new") || moved.as_deref() != Some("new") {
            out_of_order.push(format!("{s}: {got:?}, {m}: {moved:?}"));
        }
    }
    assert!(
        out_of_order.is_empty(),
        "{} of {} pipelines read before their MSET ran: {:?}",
        out_of_order.len(),
        moving.len().min(staying.len()),
        &out_of_order[..out_of_order.len().min(5)]
    );
}

/// Sidecars do not switch at the same instant. A sidecar still on the old placement writes a
/// key on its old owner even after another sidecar, already in move mode, moved it: that
/// write is acknowledged and then hidden (the key is on two shards, the moved copy answers).
/// So every sidecar first goes through `prepare_move`, where a command that names a key whose
/// owner changes is refused (not run anywhere) and every other command is served as before,
/// and only when every sidecar is there does any go to `move`. Each neighbouring pair of
/// phases (old and `prepare_move`, `prepare_move` and `move`) agrees on where every key it
/// serves lives.
#[test]
fn prepare_move_lets_sidecars_switch_one_by_one() {
    let g = two_to_four();
    let (a, clusters) = (&g.a, &g.clusters);
    let before = yaml("old", "", clusters);
    let prepare = yaml(
        "old",
        "      catch_all_mirrors:\n        - { cluster: new, mode: prepare_move }\n",
        clusters,
    );
    let moving = &g.config;
    let moves = |k: &str| g.pn.pick(k.as_bytes()) >= 2;
    let (m, s) = {
        let keys: Vec<String> = (0..100).map(|i| format!("n:{i}")).collect();
        (
            keys.iter().find(|k| moves(k)).unwrap().clone(),
            keys.iter().find(|k| !moves(k)).unwrap().clone(),
        )
    };
    let incr = |c: &mut redis::Connection, k: &str| redis::cmd("INCR").arg(k).query::<i64>(c);

    // Old and prepare_move side by side: the key that will move is served by the old sidecar
    // only; the prepared one refuses it (and runs it nowhere) and serves the other keys.
    let s1 = respway(&prepare, 1);
    let s2 = respway(&before, 1);
    let (mut c1, mut c2) = (sync_client(s1.addr), sync_client(s2.addr));
    assert_eq!(incr(&mut c2, &m).unwrap(), 1);
    let err = incr(&mut c1, &m).unwrap_err();
    assert!(err.to_string().contains("about to move"), "{err}");
    assert_eq!(incr(&mut c1, &s).unwrap(), 1);
    assert_eq!(incr(&mut c2, &s).unwrap(), 2);
    let err = redis::cmd("MSET")
        .arg(&m)
        .arg(7)
        .arg(&s)
        .arg(7)
        .query::<()>(&mut c1)
        .unwrap_err();
    assert!(err.to_string().contains("about to move"), "{err}");
    assert_eq!(incr(&mut c2, &s).unwrap(), 3, "a refused MSET ran nowhere");
    drop((c2, s2));

    // prepare_move and move side by side: the moving sidecar moves the key and serves it; the
    // prepared one still refuses it.
    let s2 = respway(moving, 1);
    let mut c2 = sync_client(s2.addr);
    assert_eq!(incr(&mut c2, &m).unwrap(), 2);
    assert!(incr(&mut c1, &m).is_err());
    assert_eq!(incr(&mut c1, &s).unwrap(), 4);
    drop((c1, s1));

    // Both in move mode: every increment is there, each once.
    let s1 = respway(moving, 1);
    let mut c1 = sync_client(s1.addr);
    assert_eq!(incr(&mut c1, &m).unwrap(), 3);
    assert_eq!(incr(&mut c2, &s).unwrap(), 5);
    assert_eq!(dbsize(a[0]) + dbsize(a[1]) + dbsize(a[2]) + dbsize(a[3]), 2);
}

// === the proof under load ===

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

/// What one load thread expects of the keys it owns (`i` ≡ its number modulo the threads).
#[derive(Debug, Default, Clone)]
pub(crate) struct Model {
    counter: i64,
    list: Vec<u64>,
    hash: i64,
    set: BTreeSet<u64>,
    zset: i64,
    /// `t:i`: its value, and its TTL (ms) as set at that instant.
    ttl_string: (String, u64, Option<Instant>),
    /// `d:i`: set or deleted.
    toggled: Option<String>,
}

/// One SET or GET of a shared register, timed.
#[derive(Debug, Clone)]
pub(crate) struct Op {
    register: usize,
    write: bool,
    value: Option<String>,
    start: Instant,
    end: Instant,
}

pub(crate) const REGISTERS: usize = 16;
const TTL_MS: u64 = 1_000_000;

fn ok_or_refused<T: redis::FromRedisValue>(
    r: redis::RedisResult<T>,
    refused: &mut u64,
    what: &str,
) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e)
            if e.to_string().contains("about to move") || e.to_string().contains("read-only") =>
        {
            *refused += 1;
            None
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Writes the keys of index `i` as the preload does, into `m`.
pub(crate) fn preload(c: &mut redis::Connection, i: usize, m: &mut Model, seq: &mut u64) {
    let mut p = redis::pipe();
    for _ in 0..3 {
        *seq += 1;
        p.cmd("INCR").arg(format!("c:{i}")).ignore();
        p.cmd("RPUSH").arg(format!("l:{i}")).arg(*seq).ignore();
        p.cmd("HINCRBY")
            .arg(format!("h:{i}"))
            .arg("f")
            .arg(1)
            .ignore();
        p.cmd("SADD").arg(format!("s:{i}")).arg(*seq).ignore();
        p.cmd("ZINCRBY")
            .arg(format!("z:{i}"))
            .arg(1)
            .arg("m")
            .ignore();
        m.counter += 1;
        m.list.push(*seq);
        m.hash += 1;
        m.set.insert(*seq);
        m.zset += 1;
    }
    p.cmd("SET")
        .arg(format!("t:{i}"))
        .arg("p")
        .arg("PX")
        .arg(TTL_MS)
        .ignore();
    p.cmd("SET").arg(format!("d:{i}")).arg("p").ignore();
    p.cmd("SET")
        .arg(format!("r:{}", i % REGISTERS))
        .arg("init")
        .ignore();
    let _: () = p.query(c).expect("preload");
    m.ttl_string = ("p".into(), TTL_MS, Some(Instant::now()));
    m.toggled = Some("p".into());
}

/// One load thread: random commands of every type on its own keys, and SET/GET of the shared
/// registers, until `stop`, each round counted on `counter`. Returns its model, its register
/// history and its refusals.
pub(crate) fn load_thread(
    addr: SocketAddr,
    t: usize,
    threads: usize,
    keys: usize,
    mut models: BTreeMap<usize, Model>,
    stop: Arc<AtomicBool>,
    counter: ClientCounter,
) -> Outcome {
    let mut c = sync_client(addr);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64);
    let mut seq = 1_000_000 * (t as u64 + 1);
    let (mut refused, mut done) = (0u64, 0u64);
    let mut ops = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stop.load(Relaxed) && Instant::now() < deadline && done < 2_000_000 {
        done += 1;
        counter.tick();
        seq += 1;
        if rng.random_range(0..10) < 3 {
            let register = rng.random_range(0..REGISTERS);
            let key = format!("r:{register}");
            let write = rng.random_bool(0.5);
            let start = Instant::now();
            let value = if write {
                let v = format!("t{t}-{seq}");
                ok_or_refused::<()>(
                    redis::cmd("SET").arg(&key).arg(&v).query(&mut c),
                    &mut refused,
                    "SET register",
                )
                .map(|_| Some(v))
            } else {
                ok_or_refused::<Option<String>>(
                    redis::cmd("GET").arg(&key).query(&mut c),
                    &mut refused,
                    "GET register",
                )
            };
            let end = Instant::now();
            if let Some(value) = value {
                ops.push(Op {
                    register,
                    write,
                    value,
                    start,
                    end,
                });
            }
            continue;
        }
        let i = t + threads * rng.random_range(0..keys.div_ceil(threads));
        if i >= keys {
            continue;
        }
        let m = models.get_mut(&i).expect("own key");
        let r = &mut refused;
        match rng.random_range(0..9) {
            0 => {
                let got = ok_or_refused::<i64>(
                    redis::cmd("INCR").arg(format!("c:{i}")).query(&mut c),
                    r,
                    "INCR",
                );
                if let Some(n) = got {
                    m.counter += 1;
                    assert_eq!(n, m.counter, "INCR c:{i}");
                }
            }
            1 => {
                let got = ok_or_refused::<usize>(
                    redis::cmd("RPUSH")
                        .arg(format!("l:{i}"))
                        .arg(seq)
                        .query(&mut c),
                    r,
                    "RPUSH",
                );
                if let Some(n) = got {
                    m.list.push(seq);
                    assert_eq!(n, m.list.len(), "RPUSH l:{i}");
                }
            }
            2 => {
                let got = ok_or_refused::<i64>(
                    redis::cmd("HINCRBY")
                        .arg(format!("h:{i}"))
                        .arg("f")
                        .arg(1)
                        .query(&mut c),
                    r,
                    "HINCRBY",
                );
                if let Some(n) = got {
                    m.hash += 1;
                    assert_eq!(n, m.hash, "HINCRBY h:{i}");
                }
            }
            3 => {
                if ok_or_refused::<i64>(
                    redis::cmd("SADD")
                        .arg(format!("s:{i}"))
                        .arg(seq)
                        .query(&mut c),
                    r,
                    "SADD",
                )
                .is_some()
                {
                    m.set.insert(seq);
                }
            }
            4 => {
                let got = ok_or_refused::<f64>(
                    redis::cmd("ZINCRBY")
                        .arg(format!("z:{i}"))
                        .arg(1)
                        .arg("m")
                        .query(&mut c),
                    r,
                    "ZINCRBY",
                );
                if let Some(n) = got {
                    m.zset += 1;
                    assert_eq!(n as i64, m.zset, "ZINCRBY z:{i}");
                }
            }
            5 => {
                let v = format!("v{seq}");
                if ok_or_refused::<()>(
                    redis::cmd("SET")
                        .arg(format!("t:{i}"))
                        .arg(&v)
                        .arg("PX")
                        .arg(TTL_MS)
                        .query(&mut c),
                    r,
                    "SET PX",
                )
                .is_some()
                {
                    m.ttl_string = (v, TTL_MS, Some(Instant::now()));
                }
            }
            6 => {
                if let Some(n) = ok_or_refused::<i64>(
                    redis::cmd("PEXPIRE")
                        .arg(format!("t:{i}"))
                        .arg(2 * TTL_MS)
                        .query(&mut c),
                    r,
                    "PEXPIRE",
                ) {
                    assert_eq!(n, 1, "PEXPIRE t:{i}");
                    m.ttl_string.1 = 2 * TTL_MS;
                    m.ttl_string.2 = Some(Instant::now());
                }
            }
            7 => {
                if m.toggled.is_some() {
                    if let Some(n) = ok_or_refused::<i64>(
                        redis::cmd("DEL").arg(format!("d:{i}")).query(&mut c),
                        r,
                        "DEL",
                    ) {
                        assert_eq!(n, 1, "DEL d:{i}");
                        m.toggled = None;
                    }
                } else {
                    let v = format!("v{seq}");
                    if ok_or_refused::<()>(
                        redis::cmd("SET")
                            .arg(format!("d:{i}"))
                            .arg(&v)
                            .query(&mut c),
                        r,
                        "SET",
                    )
                    .is_some()
                    {
                        m.toggled = Some(v);
                    }
                }
            }
            _ => {
                if let Some(l) = ok_or_refused::<Vec<u64>>(
                    redis::cmd("LRANGE")
                        .arg(format!("l:{i}"))
                        .arg(0)
                        .arg(-1)
                        .query(&mut c),
                    r,
                    "LRANGE",
                ) {
                    assert_eq!(l, m.list, "LRANGE l:{i} read back");
                }
            }
        }
    }
    (models, ops, refused, done)
}

/// Every read of a register returned a value a single Redis could have returned: one that was
/// written (or the preloaded one), not after the read ended, and not overwritten by a write
/// that ended before the read began; and no read began after another read ended yet returned
/// a write older than the one that read returned. The violations, described.
fn register_violations(ops: &[Op], preloaded: Instant) -> Vec<String> {
    let mut out = Vec::new();
    for r in 0..REGISTERS {
        let mut writes: HashMap<&str, (Instant, Instant)> = HashMap::new();
        writes.insert("init", (preloaded, preloaded));
        for w in ops.iter().filter(|o| o.register == r && o.write) {
            writes.insert(w.value.as_deref().unwrap_or(""), (w.start, w.end));
        }
        let reads: Vec<&Op> = ops.iter().filter(|o| o.register == r && !o.write).collect();
        for read in &reads {
            let Some(v) = read.value.as_deref() else {
                out.push(format!("r:{r}: a read returned nil"));
                continue;
            };
            let Some(&(ws, we)) = writes.get(v) else {
                out.push(format!("r:{r}: a read returned {v:?}, never written"));
                continue;
            };
            if ws > read.end {
                out.push(format!("r:{r}: {v:?} read before it was written"));
            }
            if writes.values().any(|&(s2, e2)| s2 > we && e2 < read.start) {
                out.push(format!("r:{r}: {v:?} read after a later write had ended"));
            }
        }
        for a in &reads {
            for b in &reads {
                if a.end >= b.start {
                    continue;
                }
                let (Some(va), Some(vb)) = (a.value.as_deref(), b.value.as_deref()) else {
                    continue;
                };
                if let (Some(wa), Some(wb)) = (writes.get(va), writes.get(vb)) {
                    if va != vb && wb.1 < wa.0 {
                        out.push(format!(
                            "r:{r}: read {vb:?} after another read saw the newer {va:?}"
                        ));
                    }
                }
            }
        }
    }
    out
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Applies `yaml` to every sidecar, one after the other, and waits until each runs it.
fn push(sidecars: &[&Respway], yaml: &str) {
    for s in sidecars {
        let resources = respway_xds::parse_yaml(yaml).expect("yaml");
        let config = respway_xds::translate(&resources).expect("config");
        let version = s
            .server
            .as_ref()
            .expect("server")
            .apply(config)
            .expect("apply");
        wait_for("the sidecar to run the pushed config", || {
            let mut c = sync_client(s.addr);
            let info: String = redis::cmd("INFO").arg("proxy").query(&mut c).unwrap();
            info.contains(&format!("config_version:{version}\r"))
        });
    }
}

/// What a load thread ends with: its models, its register history, its refusals and the
/// commands it ran.
pub(crate) type Outcome = (BTreeMap<usize, Model>, Vec<Op>, u64, u64);

/// Two sidecars (2 workers each) on `before`, `KEYS` indices preloaded through the first,
/// and `THREADS` load threads split over both, running until [`Run::finish`].
struct Run {
    s1: Respway,
    s2: Respway,
    stop: Arc<AtomicBool>,
    load: Vec<std::thread::JoinHandle<Outcome>>,
    /// The load threads' rounds.
    progress: Progress,
    preloaded: Instant,
}

const KEYS: usize = 1_200;
const THREADS: usize = 4;
/// A pause of load ([`Run::pause`]): rounds of every load thread.
const PAUSE_ROUNDS: u64 = 200;

impl Run {
    fn start(before: &str) -> Run {
        let s1 = respway(before, 2);
        let s2 = respway(before, 2);
        let mut c = sync_client(s1.addr);
        let mut models: Vec<BTreeMap<usize, Model>> = vec![BTreeMap::new(); THREADS];
        let mut seq = 0;
        for i in 0..KEYS {
            let mut m = Model::default();
            preload(&mut c, i, &mut m, &mut seq);
            models[i % THREADS].insert(i, m);
        }
        let preloaded = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Progress::new(THREADS);
        let load = models
            .into_iter()
            .enumerate()
            .map(|(t, m)| {
                let addr = if t % 2 == 0 { s1.addr } else { s2.addr };
                let stop = stop.clone();
                let counter = progress.counter(t);
                std::thread::spawn(move || load_thread(addr, t, THREADS, KEYS, m, stop, counter))
            })
            .collect();
        Run {
            s1,
            s2,
            stop,
            load,
            progress,
            preloaded,
        }
    }

    /// A pause of load on what the sidecars serve now: every load thread runs
    /// [`PAUSE_ROUNDS`] more rounds (however long a loaded machine takes for them).
    fn pause(&self, what: &str) {
        self.progress
            .wait_each(PAUSE_ROUNDS, Duration::from_secs(60), what);
    }

    /// Pushes `yaml` to both sidecars, one after the other, after a pause of load.
    fn push(&self, yaml: &str) {
        self.pause("a pause of load before a push");
        push(&[&self.s1, &self.s2], yaml);
    }

    /// Stops the load: the models, the register history, the refusals and the commands run.
    fn finish(self) -> Outcome {
        // A last pause of load after the last push, then the load stops.
        self.pause("a last pause of load after the last push");
        self.stop.store(true, Relaxed);
        let mut models = BTreeMap::new();
        let (mut ops, mut refused, mut done) = (Vec::new(), 0, 0);
        for h in self.load {
            let (m, o, r, d) = h.join().expect("a load thread failed");
            models.extend(m);
            ops.extend(o);
            refused += r;
            done += d;
        }
        (models, ops, refused, done)
    }
}

/// `respway-compare --config (yaml) --source old --target new ARGS`, and its config file.
fn compare_cmd(yaml: &str, args: &[&str]) -> (std::process::Command, std::path::PathBuf) {
    let file = std::env::temp_dir().join(format!(
        "respway-migration-{}-{}.yaml",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::write(&file, yaml.replace("127.0.0.1:0", "127.0.0.1:1")).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_respway-compare"));
    cmd.args(["--config", file.to_str().unwrap()])
        .args(["--source", "old", "--target", "new"])
        .args(args);
    (cmd, file)
}

/// Runs `respway-compare --config (yaml) --source old --target new ARGS`: exit code, output.
fn compare(yaml: &str, args: &[&str]) -> (Option<i32>, String) {
    let (mut cmd, file) = compare_cmd(yaml, args);
    let out = cmd.output().expect("run respway-compare");
    let _ = std::fs::remove_file(&file);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Grows `n_old` ketama shards to `n_new`, keeping the old ones, online: two sidecars under a
/// load of every type go old → prepare_move → move (one after the other), the background
/// mover runs, then both go to the new placement alone. Afterwards every key equals the
/// model of the acknowledged writes (counters and lists exact: nothing lost, nothing run
/// twice), TTLs are within 1 s, no key is on a shard that does not own it, and the shared
/// registers' history is linearizable.
fn reshard_under_load(n_old: usize, n_new: usize) {
    let shards: Vec<Proc> = (0..n_new).map(|_| redis()).collect();
    let a: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let names: Vec<String> = (0..n_new).map(|i| format!("s{i}")).collect();
    let list = |n: usize| -> Vec<(&str, SocketAddr)> {
        (0..n).map(|i| (names[i].as_str(), a[i])).collect()
    };
    let clusters = format!(
        "{}{}",
        cluster("old", &list(n_old)),
        cluster("new", &list(n_new))
    );
    let prepare = yaml(
        "old",
        "      catch_all_mirrors:\n        - { cluster: new, mode: prepare_move }\n",
        &clusters,
    );
    let moving = yaml("old", MOVE, &clusters);
    let pn = picker(&moving, "new");
    let run = Run::start(&yaml("old", "", &clusters));
    let preloaded = run.preloaded;
    run.push(&prepare);
    run.push(&moving);
    // A pause of load with the move configuration served, before the mover runs.
    run.pause("a pause of load with the move configuration, before the mover");
    let (code, summary) = compare(&moving, &["--move", "--rate", "200000"]);
    assert_eq!(code, Some(0), "mover: {summary}");
    run.push(&yaml("new", "", &clusters));
    let (models, ops, refused, done) = run.finish();
    eprintln!(
        "{n_old} -> {n_new}: {done} commands, {refused} refused (prepare_move), mover: {summary}"
    );
    verify(&a, &pn, &models, &ops, preloaded);
}

/// Copy mode between two separate clusters (2 ketama shards to 3 others) under the same load
/// through two sidecars, with the cut-over docs/migration-and-resharding.md gives: dual_write (the old cluster
/// answers) → backfill (`--repair`, killed mid-way and run again) while the load runs → a write pause (`read_only`) until
/// every copy is applied → a last `--repair --prune`, which finds the clusters equal (and
/// deletes what a killed backfill resurrected) → the new
/// cluster serves reads, writes still paused → the new cluster answers, copies to the old →
/// the new cluster alone. The new cluster then equals the model of acknowledged writes
/// (nothing lost or applied twice, deletes not undone by the backfill, TTLs within 1 s) and
/// the registers' history is linearizable.
#[test]
fn copy_mode_between_clusters_under_load_loses_nothing() {
    let shards: Vec<Proc> = (0..5).map(|_| redis()).collect();
    let a: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let clusters = format!(
        "{}{}",
        cluster("old", &[("o0", a[0]), ("o1", a[1])]),
        cluster("new", &[("n0", a[2]), ("n1", a[3]), ("n2", a[4])])
    );
    let mirror = |m: &str| format!("      catch_all_mirrors:\n        - {m}\n");
    let dual = yaml(
        "old",
        &mirror("{ cluster: new, mode: dual_write }"),
        &clusters,
    );
    let paused = yaml(
        "old",
        &mirror("{ cluster: new, mode: read_only }"),
        &clusters,
    );
    let switched = yaml(
        "new",
        &mirror("{ cluster: old, mode: read_only }"),
        &clusters,
    );
    let back = yaml(
        "new",
        &mirror("{ cluster: old, mode: dual_write }"),
        &clusters,
    );
    let pn = picker(&dual, "new");
    let run = Run::start(&yaml("old", "", &clusters));
    let preloaded = run.preloaded;
    run.push(&dual);
    // The backfill killed mid-way, then run again: what the first run copied stays right.
    let (mut cmd, file) = compare_cmd(&dual, &["--repair", "--rate", "3000"]);
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run respway-compare");
    // Killed mid-way: the backfill runs 700 ms first (the timeline of the scenario; the whole
    // backfill takes longer at 3,000 keys/s).
    std::thread::sleep(Duration::from_millis(700));
    child.kill().expect("kill the backfill");
    assert!(child.wait().unwrap().code().is_none(), "killed mid-way");
    let _ = std::fs::remove_file(&file);
    let (code, first) = compare(&dual, &["--repair", "--rate", "200000"]);
    assert!(matches!(code, Some(0 | 1)), "backfill: {first}");
    run.push(&paused);
    for s in [&run.s1, &run.s2] {
        wait_for("every copy applied", || {
            let mut c = sync_client(s.addr);
            let info: String = redis::cmd("INFO").arg("mirror").query(&mut c).unwrap();
            let n = |f: &str| -> u64 {
                info.split([',', ':', '\r'])
                    .find_map(|kv| kv.strip_prefix(&format!("{f}=")))
                    .map_or(0, |v| v.parse().unwrap())
            };
            let done = n("mirrored") == n("applied") + n("failed");
            if !done {
                eprintln!("{info}");
            }
            done
        });
    }
    let (code, last) = compare(&paused, &["--repair", "--prune", "--rate", "200000"]);
    assert_eq!(code, Some(0), "the last pass finds every key equal: {last}");
    run.push(&switched);
    run.push(&back);
    run.push(&yaml("new", "", &clusters));
    let (models, ops, refused, done) = run.finish();
    eprintln!("copy mode: {done} commands, {refused} refused (read_only), backfill: {first}");
    verify(&a[2..], &pn, &models, &ops, preloaded);
    // The docs' last step, after the cut-over: `--repair` is refused (the old cluster is the
    // stale side), the cleanup's dry run deletes nothing, `--apply` empties the old cluster,
    // and the new one is left as it was.
    let last = yaml("new", "", &clusters);
    let (code, out) = compare(&last, &["--repair"]);
    assert_eq!(code, Some(2), "{out}");
    let old_keys = |a: &[SocketAddr]| -> i64 {
        a.iter()
            .map(|x| {
                redis::cmd("DBSIZE")
                    .query::<i64>(&mut sync_client(*x))
                    .unwrap()
            })
            .sum()
    };
    let before = old_keys(&a[..2]);
    assert!(before > 0);
    let (code, out) = compare(&last, &["--cleanup"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(old_keys(&a[..2]), before, "the dry run deleted: {out}");
    let (code, out) = compare(&last, &["--cleanup", "--apply"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("deletable {before}, kept 0, deleted {before}")),
        "{out}"
    );
    assert_eq!(old_keys(&a[..2]), 0, "{out}");
    verify(&a[2..], &pn, &models, &ops, preloaded);
}

/// Checks the end of a migration under load: every key of `models` is on its owner in the
/// final cluster (shards `a`, picker `pn`) and on no other shard of it, equal to the model
/// (counters and lists exact, TTLs within 1 s), no other key is there, and the registers'
/// history is linearizable.
pub(crate) fn verify(
    a: &[SocketAddr],
    pn: &Arc<dyn ShardPicker>,
    models: &BTreeMap<usize, Model>,
    ops: &[Op],
    preloaded: Instant,
) {
    // Every key is on its owner only, and equals the model.
    let mut clients: Vec<redis::Connection> = a.iter().map(|x| sync_client(*x)).collect();
    let mut wrong = Vec::new();
    for (i, m) in models {
        let keys = ["c", "l", "h", "s", "z", "t", "d"].map(|p| format!("{p}:{i}"));
        for k in &keys {
            let owner = pn.pick(k.as_bytes());
            for (s, d) in clients.iter_mut().enumerate() {
                let n: i64 = redis::cmd("EXISTS").arg(k).query(d).unwrap();
                let expected =
                    i64::from(s == owner && (!k.starts_with("d:") || m.toggled.is_some()));
                if n != expected {
                    wrong.push(format!("{k} on shard {s}: EXISTS {n}, owner {owner}"));
                }
            }
        }
        let d = &mut clients[pn.pick(keys[0].as_bytes())];
        let v: i64 = redis::cmd("GET").arg(&keys[0]).query(d).unwrap();
        if v != m.counter {
            wrong.push(format!("{}: {v}, model {}", keys[0], m.counter));
        }
        let d = &mut clients[pn.pick(keys[1].as_bytes())];
        let v: Vec<u64> = redis::cmd("LRANGE")
            .arg(&keys[1])
            .arg(0)
            .arg(-1)
            .query(d)
            .unwrap();
        if v != m.list {
            wrong.push(format!(
                "{}: {} elements, model {}",
                keys[1],
                v.len(),
                m.list.len()
            ));
        }
        let d = &mut clients[pn.pick(keys[2].as_bytes())];
        let v: i64 = redis::cmd("HGET").arg(&keys[2]).arg("f").query(d).unwrap();
        if v != m.hash {
            wrong.push(format!("{}: {v}, model {}", keys[2], m.hash));
        }
        let d = &mut clients[pn.pick(keys[3].as_bytes())];
        let v: BTreeSet<u64> = redis::cmd("SMEMBERS").arg(&keys[3]).query(d).unwrap();
        if v != m.set {
            wrong.push(format!(
                "{}: {} members, model {}",
                keys[3],
                v.len(),
                m.set.len()
            ));
        }
        let d = &mut clients[pn.pick(keys[4].as_bytes())];
        let v: f64 = redis::cmd("ZSCORE")
            .arg(&keys[4])
            .arg("m")
            .query(d)
            .unwrap();
        if v as i64 != m.zset {
            wrong.push(format!("{}: {v}, model {}", keys[4], m.zset));
        }
        let d = &mut clients[pn.pick(keys[5].as_bytes())];
        let (v, pttl): (String, i64) = redis::pipe()
            .cmd("GET")
            .arg(&keys[5])
            .cmd("PTTL")
            .arg(&keys[5])
            .query(d)
            .unwrap();
        let (mv, ttl, at) = &m.ttl_string;
        let expect = *ttl as i64 - at.unwrap().elapsed().as_millis() as i64;
        if &v != mv || (pttl - expect).abs() > 1_000 {
            wrong.push(format!(
                "{}: {v:?} PTTL {pttl}, model {mv:?} PTTL ~{expect}",
                keys[5]
            ));
        }
        if let Some(mv) = &m.toggled {
            let d = &mut clients[pn.pick(keys[6].as_bytes())];
            let v: String = redis::cmd("GET").arg(&keys[6]).query(d).unwrap();
            if &v != mv {
                wrong.push(format!("{}: {v:?}, model {mv:?}", keys[6]));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} keys differ from the model, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    let total: u64 = a.iter().map(|x| dbsize(*x)).sum();
    let expected = models
        .values()
        .map(|m| 6 + u64::from(m.toggled.is_some()))
        .sum::<u64>()
        + REGISTERS as u64;
    assert_eq!(total, expected, "no key beyond the model's");
    let violations = register_violations(ops, preloaded);
    assert!(
        violations.is_empty(),
        "{} of {} register operations not linearizable, e.g. {:?}",
        violations.len(),
        ops.len(),
        &violations[..violations.len().min(10)]
    );
    assert!(ops.len() > 1_000, "{} register operations", ops.len());
}

#[test]
fn two_to_four_shards_under_load_loses_nothing() {
    reshard_under_load(2, 4);
}

#[test]
fn three_to_five_shards_under_load_loses_nothing() {
    reshard_under_load(3, 5);
}

/// A key that a sidecar has seen moved (`MIGRATE` answered `OK` or `NOKEY`) is not sent a
/// `MIGRATE` again by that sidecar's worker: once every sidecar is in move mode nothing
/// writes it on its old owner, so the round trip would only find it gone, and it held the
/// connection's later commands (a pipelined client's throughput fell about 5x during a move).
#[test]
fn a_key_seen_moved_is_not_moved_again() {
    let g = two_to_four();
    let (a, po) = (&g.a, &g.po);
    let keys = g.moving(10);
    for k in &keys[..5] {
        let mut d = sync_client(a[po.pick(k.as_bytes())]);
        let _: () = redis::cmd("SET").arg(k).arg("v").query(&mut d).unwrap();
    }
    let rw = respway(&g.config, 1);
    for _ in 0..3 {
        let mut c = sync_client(rw.addr);
        for k in &keys {
            let _: Option<String> = redis::cmd("GET").arg(k).query(&mut c).unwrap();
        }
    }
    let mut c = sync_client(rw.addr);
    let info: String = redis::cmd("INFO").arg("mirror").query(&mut c).unwrap();
    assert!(
        info.contains("mirror_new:mirrored=0,dropped=0,failed=0,moved=5,absent=5,move_failed=0"),
        "one MIGRATE per key: {info}"
    );
    for k in &keys[..5] {
        let v: String = redis::cmd("GET").arg(k).query(&mut c).unwrap();
        assert_eq!(v, "v");
    }
}

/// Scripts and blocking commands name their keys, so they move them first like any command
/// (a blocking command then waits on the key's new owner, where a push through any sidecar
/// in move mode lands).
#[test]
fn scripts_and_blocking_commands_move_their_keys() {
    let g = two_to_four();
    let (a, po) = (&g.a, &g.po);
    let moving = g.moving(3);
    let (k, l, w) = (&moving[0], &moving[1], &moving[2]);
    let old_of = |k: &str| sync_client(a[po.pick(k.as_bytes())]);
    let _: () = redis::cmd("SET")
        .arg(k)
        .arg(41)
        .query(&mut old_of(k))
        .unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg(l)
        .arg("x")
        .arg("y")
        .query(&mut old_of(l))
        .unwrap();
    let rw = respway(&g.config, 1);
    let mut c = sync_client(rw.addr);
    let n: i64 = redis::cmd("EVAL")
        .arg("return redis.call('INCR', KEYS[1])")
        .arg(1)
        .arg(k)
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 42, "the script ran on the moved key");
    // BLPOP moves the list, then pops on its new owner.
    let got: (String, String) = redis::cmd("BLPOP").arg(l).arg(1).query(&mut c).unwrap();
    assert_eq!(got.1, "x");
    assert_eq!(
        dbsize(a[po.pick(k.as_bytes())]) + dbsize(a[po.pick(l.as_bytes())]),
        0
    );
    let rest: Vec<String> = redis::cmd("LRANGE")
        .arg(l)
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    assert_eq!(rest, ["y"]);
    // A client blocked on a key that moves is woken by a push through another connection.
    let addr = rw.addr;
    let w2 = w.clone();
    let blocked = std::thread::spawn(move || {
        let mut b = sync_client(addr);
        redis::cmd("BLPOP")
            .arg(&w2)
            .arg(5)
            .query::<Option<(String, String)>>(&mut b)
            .unwrap()
    });
    wait_blocked(a, "blpop", 1);
    let _: i64 = redis::cmd("RPUSH").arg(w).arg("z").query(&mut c).unwrap();
    assert_eq!(blocked.join().unwrap().map(|p| p.1).as_deref(), Some("z"));
}

/// A transaction on a route in move mode runs on its keys' new owner: each command's keys
/// move as it is queued, and EXEC is sent once they have; a pipeline's next command sees the
/// transaction's effect. A key that moves in after a WATCH of it counts as changed (EXEC
/// aborts, the retry succeeds). A move that fails discards the transaction: EXECABORT with
/// the reason, and nothing of it runs.
#[test]
fn transactions_move_their_keys_before_exec() {
    let g = two_to_four();
    let (a, po, pn) = (&g.a, &g.po, &g.pn);
    let keys = g.moving(4);
    let old_of = |k: &str| sync_client(a[po.pick(k.as_bytes())]);
    for k in &keys {
        let _: () = redis::cmd("SET")
            .arg(k)
            .arg(41)
            .query(&mut old_of(k))
            .unwrap();
    }
    let rw = respway(&g.config, 1);
    let mut c = sync_client(rw.addr);
    let (n, v): (i64, String) = redis::pipe()
        .atomic()
        .cmd("INCR")
        .arg(&keys[0])
        .cmd("GET")
        .arg(&keys[0])
        .query(&mut c)
        .unwrap();
    assert_eq!((n, v.as_str()), (42, "42"));
    // MULTI, INCR, EXEC and a GET in one pipeline: the GET runs after the EXEC.
    let (_, _, exec, after): (String, String, Vec<i64>, i64) = redis::pipe()
        .cmd("MULTI")
        .cmd("INCR")
        .arg(&keys[1])
        .cmd("EXEC")
        .cmd("GET")
        .arg(&keys[1])
        .query(&mut c)
        .unwrap();
    assert_eq!((exec, after), (vec![42], 42));
    // WATCH of a key that moves in after it: the first EXEC may abort, a retry succeeds.
    let mut tries = 0;
    loop {
        tries += 1;
        let _: () = redis::cmd("WATCH").arg(&keys[2]).query(&mut c).unwrap();
        let v: i64 = redis::cmd("GET").arg(&keys[2]).query(&mut c).unwrap();
        let r: Option<((),)> = redis::pipe()
            .atomic()
            .cmd("SET")
            .arg(&keys[2])
            .arg(v + 1)
            .query(&mut c)
            .unwrap();
        if r.is_some() {
            break;
        }
        assert!(tries < 3, "EXEC aborted {tries} times");
    }
    let v: i64 = redis::cmd("GET").arg(&keys[2]).query(&mut c).unwrap();
    assert_eq!(v, 42);
    for k in &keys[..3] {
        assert_eq!(
            redis::cmd("EXISTS")
                .arg(k)
                .query::<i64>(&mut old_of(k))
                .unwrap(),
            0,
            "{k} left its old shard"
        );
    }
    // A key on both shards: the move fails, the transaction is discarded.
    let k = &keys[3];
    let mut owner = sync_client(a[pn.pick(k.as_bytes())]);
    let _: () = redis::cmd("SET").arg(k).arg(7).query(&mut owner).unwrap();
    let _: () = redis::cmd("MULTI").query(&mut c).unwrap();
    let queued: String = redis::cmd("INCR").arg(k).query(&mut c).unwrap();
    assert_eq!(queued, "QUEUED");
    let err = redis::cmd("EXEC").query::<Vec<i64>>(&mut c).unwrap_err();
    assert!(
        err.to_string().contains("Transaction discarded") && err.to_string().contains("BUSYKEY"),
        "{err}"
    );
    let v: i64 = redis::cmd("GET").arg(k).query(&mut owner).unwrap();
    assert_eq!(v, 7, "the discarded INCR ran nowhere");
    let v: i64 = redis::cmd("GET").arg(k).query(&mut old_of(k)).unwrap();
    assert_eq!(v, 41);
}

/// A backfill killed between its copy of a key and its check leaves the copy on the target
/// even when the source deleted the key meanwhile, and the comparison (which walks the
/// source) never sees it again. `--repair --prune`, run in copy mode's write pause, deletes
/// from the target every key its source owner lacks, and nothing else.
#[test]
fn prune_deletes_what_the_source_lacks() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let a: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let clusters = format!(
        "{}{}",
        cluster("old", &[("o0", a[0]), ("o1", a[1])]),
        cluster("new", &[("n0", a[2]), ("n1", a[3])])
    );
    let config = yaml("old", "", &clusters);
    let (po, pn) = (picker(&config, "old"), picker(&config, "new"));
    for i in 0..50 {
        let k = format!("k:{i}");
        let mut d = sync_client(a[po.pick(k.as_bytes())]);
        let _: () = redis::cmd("SET").arg(&k).arg(i).query(&mut d).unwrap();
    }
    let ghost = "ghost:1";
    let mut d = sync_client(a[2 + pn.pick(ghost.as_bytes())]);
    let _: () = redis::cmd("SET")
        .arg(ghost)
        .arg("resurrected")
        .query(&mut d)
        .unwrap();
    let (code, out) = compare(&config, &["--repair"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        dbsize(a[2]) + dbsize(a[3]),
        51,
        "without --prune the ghost stays"
    );
    let (code, out) = compare(&config, &["--repair", "--prune"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("pruned 1\n"), "{out}");
    assert_eq!(dbsize(a[2]) + dbsize(a[3]), 50, "only the ghost went");
    let v: Option<String> = redis::cmd("GET").arg(ghost).query(&mut d).unwrap();
    assert_eq!(v, None);
}
