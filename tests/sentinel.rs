//! Sentinel-managed shards against real processes: a primary, its replica and three
//! `redis-server --sentinel`, beside a plain shard in the same cluster, with a write load
//! through respway while the primary is killed or switched by `SENTINEL FAILOVER`, and while
//! the Sentinels stop answering.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;

/// A primary, its replica, three Sentinels watching them as `m0`, and a plain shard.
pub(crate) struct Rig {
    pub(crate) primary: Proc,
    pub(crate) replica: Proc,
    pub(crate) sentinels: Vec<Proc>,
    pub(crate) plain: Proc,
}

impl Rig {
    pub(crate) fn start() -> Rig {
        Rig::start_with(&[])
    }

    /// [`Rig::start`] with more arguments for the replica.
    pub(crate) fn start_with(replica_args: &[&str]) -> Rig {
        let primary = redis_with(&["--repl-diskless-sync-delay", "0"]);
        let port = primary.addr.port().to_string();
        let mut args = vec!["--replicaof", "127.0.0.1", &port];
        args.extend_from_slice(replica_args);
        let replica = redis_with(&args);
        let plain = redis();
        let sentinels: Vec<Proc> = (0..3)
            .map(|_| sentinel_on(free_port(), "m0", primary.addr))
            .collect();
        let rig = Rig {
            primary,
            replica,
            sentinels,
            plain,
        };
        // Failover needs the Sentinels to know the replica and each other.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = rig.sentinels.iter().all(|s| {
                let mut c = RespConn::connect(s.addr);
                let replicas = c.call(&["SENTINEL", "REPLICAS", "m0"]);
                let master = c.call(&["SENTINEL", "MASTER", "m0"]);
                let port = rig.replica.addr.port().to_string();
                let knows_replica = match &replicas {
                    Resp::Array(Some(list)) => list
                        .iter()
                        .any(|r| field(r, "port").as_deref() == Some(port.as_str())),
                    _ => false,
                };
                knows_replica && field(&master, "num-other-sentinels").as_deref() == Some("2")
            });
            if ready {
                break;
            }
            assert!(Instant::now() < deadline, "the Sentinels never met");
            std::thread::sleep(Duration::from_millis(200));
        }
        rig
    }

    fn yaml(&self) -> String {
        self.yaml_with("prefer_replica", "")
    }

    /// The YAML with this read policy and, when not empty, the `sentinel` block's `zones`.
    pub(crate) fn yaml_with(&self, read_policy: &str, zones: &str) -> String {
        let list = self
            .sentinels
            .iter()
            .map(|s| s.addr.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    op_timeout: 1s\n    routes: {{ catch_all: main }}\nclusters:\n  - name: main\n    hash: {{ policy: ketama }}\n    connect_timeout: 300ms\n    read_policy: {read_policy}\n    shards:\n      - name: s0\n        sentinel: {{ master: m0, sentinels: [{list}]{zones} }}\n      - name: s1\n        endpoints: [ {{ address: \"{}\" }} ]\n",
            self.plain.addr
        )
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for s in &mut self.sentinels {
            let port = s.addr.port();
            s.kill();
            let _ = std::fs::remove_dir_all(
                std::env::temp_dir()
                    .join(format!("respway-sentinel-{port}-{}", std::process::id())),
            );
        }
    }
}

/// A field of a flat name/value array (a Sentinel's description of an instance).
pub(crate) fn field(r: &Resp, name: &str) -> Option<String> {
    let Resp::Array(Some(items)) = r else {
        return None;
    };
    items.chunks(2).find_map(|p| match p {
        [Resp::Bulk(Some(k)), Resp::Bulk(Some(v))] if k == name.as_bytes() => {
            Some(String::from_utf8_lossy(v).into_owned())
        }
        _ => None,
    })
}

/// Keys of each shard: written through respway, found on the plain shard or not.
pub(crate) fn keys_by_shard(
    rw: SocketAddr,
    plain: SocketAddr,
    n: usize,
) -> (Vec<String>, Vec<String>) {
    let mut c = RespConn::connect(rw);
    let mut direct = RespConn::connect(plain);
    let (mut s0, mut s1) = (Vec::new(), Vec::new());
    for i in 0..n {
        let k = format!("k{i}");
        assert_eq!(c.call(&["SET", &k, "0"]).text(), "OK");
        if direct.call(&["EXISTS", &k]) == Resp::Int(1) {
            s1.push(k);
        } else {
            s0.push(k);
        }
    }
    (s0, s1)
}

/// What one load thread saw.
#[derive(Default)]
struct Seen {
    /// Per key, the last value acknowledged and when.
    acked: std::collections::HashMap<String, (u64, Instant)>,
    /// Failed writes: when, the key's shard, the error.
    failed: Vec<(Instant, usize, String)>,
    ok: u64,
}

/// Threads that each `SET` their own keys (both shards) to increasing values through
/// respway until `stop` (bounded to 60 s), each counting its rounds (every key of its own
/// set once) in `progress`.
fn load(
    rw: SocketAddr,
    keys: &[(String, usize)],
    progress: &Progress,
    stop: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<Seen>> {
    let threads = progress.clients();
    (0..threads)
        .map(|t| {
            let mine: Vec<(String, usize)> = keys
                .iter()
                .enumerate()
                .filter(|(i, _)| i % threads == t)
                .map(|(_, k)| k.clone())
                .collect();
            let stop = stop.clone();
            let counter = progress.counter(t);
            std::thread::spawn(move || {
                let mut seen = Seen::default();
                let mut c = RespConn::connect(rw);
                let end = Instant::now() + Duration::from_secs(60);
                let mut v = 0u64;
                while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                    v += 1;
                    for (k, shard) in &mine {
                        let r = c.call(&["SET", k, &v.to_string()]);
                        let now = Instant::now();
                        if let Some(e) = r.error() {
                            seen.failed.push((now, *shard, e.to_string()));
                        } else {
                            seen.ok += 1;
                            seen.acked.insert(k.clone(), (v, now));
                        }
                    }
                    counter.tick();
                }
                seen
            })
        })
        .collect()
}

/// Listens on a Sentinel for `+switch-master` and records when it arrives.
pub(crate) fn switch_watch(sentinel: SocketAddr) -> Arc<Mutex<Option<Instant>>> {
    let at = Arc::new(Mutex::new(None));
    let out = at.clone();
    let mut c = RespConn::connect(sentinel);
    c.send(&["SUBSCRIBE", "+switch-master"]);
    let _ = c.read();
    std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(90);
        while Instant::now() < end {
            if let Ok(m) = c.read() {
                let about_m0 = matches!(&m, Resp::Array(Some(parts))
                    if parts.get(2).is_some_and(|p| matches!(p, Resp::Bulk(Some(b)) if b.starts_with(b"m0 "))));
                if about_m0 {
                    *out.lock().unwrap() = Some(Instant::now());
                    return;
                }
            }
        }
    });
    at
}

/// The ids of the plain client connections on `node` other than the caller's: respway's
/// (Sentinels name theirs, replicas and primaries are flagged).
fn respway_connections(node: SocketAddr) -> Vec<u64> {
    let mut c = RespConn::connect(node);
    let Resp::Int(me) = c.call(&["CLIENT", "ID"]) else {
        panic!("CLIENT ID")
    };
    let list = c.call(&["CLIENT", "LIST"]).text();
    list.lines()
        .filter(|l| l.contains(" name= ") && l.contains(" flags=N "))
        .filter_map(|l| l.strip_prefix("id=")?.split(' ').next()?.parse().ok())
        .filter(|id| *id != me as u64)
        .collect()
}

/// Writes a marker on `primary` and waits until its replica has everything written before
/// it: every write acknowledged before this call is then replicated.
fn wait_replicated(primary: SocketAddr) -> Instant {
    let mark = Instant::now();
    let mut c = RespConn::connect(primary);
    assert_eq!(c.call(&["SET", "marker", "1"]).text(), "OK");
    assert_eq!(
        c.call(&["WAIT", "1", "5000"]),
        Resp::Int(1),
        "replica caught up"
    );
    mark
}

/// The failover under load: `switch` ends the primary's reign (kill -9 or SENTINEL
/// FAILOVER); then writes of s0 resume through the new primary within 1 s of the Sentinel's
/// `+switch-master`, s1 never fails, and every write replicated before the switch is there.
/// `switch` returns when the switch itself began (no write may fail before).
fn failover_under_load(name: &str, switch: impl FnOnce(&mut Rig) -> Instant) {
    let mut rig = Rig::start();
    let rw = respway(&rig.yaml(), 2);
    let admin = respway::admin::start(
        "127.0.0.1:0".parse().unwrap(),
        false,
        rw.server.as_ref().unwrap(),
    )
    .expect("admin");
    let (s0, s1) = keys_by_shard(rw.addr, rig.plain.addr, 64);
    assert!(!s0.is_empty() && !s1.is_empty(), "keys on both shards");
    // Written once, replicated, and never again: each must survive the failover.
    let mut c = RespConn::connect(rw.addr);
    let pre: Vec<String> = (0..200).map(|i| format!("pre:{i}")).collect();
    for k in &pre {
        assert_eq!(c.call(&["SET", k, k]).text(), "OK");
    }
    // An idle session keeps the chain it last used (and its pools) until its next command.
    drop(c);
    let keys: Vec<(String, usize)> = s0
        .iter()
        .map(|k| (k.clone(), 0))
        .chain(s1.iter().map(|k| (k.clone(), 1)))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Progress::new(4);
    let threads = load(rw.addr, &keys, &progress, stop.clone());
    // Load before the switch: every thread has written each of its keys a few times.
    progress.wait_each(
        5,
        Duration::from_secs(30),
        "the load to run before the switch",
    );
    let switched = switch_watch(rig.sentinels[2].addr);
    let mark = wait_replicated(rig.primary.addr);
    let old_primary = rig.primary.addr;
    let pooled = respway_connections(old_primary);
    assert!(
        !pooled.is_empty(),
        "{name}: respway's connections to the primary"
    );
    let t0 = switch(&mut rig);
    let deadline = Instant::now() + Duration::from_secs(45);
    let at = loop {
        if let Some(at) = *switched.lock().unwrap() {
            break at;
        }
        assert!(Instant::now() < deadline, "{name}: no +switch-master");
        std::thread::sleep(Duration::from_millis(10));
    };
    // The load runs on past the bound on failures after +switch-master (below) and 500 ms
    // more: the time in which a write failing too late would show (time passing is the test).
    let window = slack(Duration::from_secs(1)) + Duration::from_millis(500);
    std::thread::sleep((at + window).saturating_duration_since(Instant::now()));
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<Seen> = threads.into_iter().map(|t| t.join().unwrap()).collect();

    let failed: Vec<&(Instant, usize, String)> = seen.iter().flat_map(|s| &s.failed).collect();
    let other: Vec<_> = failed.iter().filter(|f| f.1 == 1).collect();
    assert!(
        other.is_empty(),
        "{name}: the other shard failed: {other:?}"
    );
    let last_failure = failed.iter().map(|f| f.0).max();
    if let Some(last) = last_failure {
        let after = last.saturating_duration_since(at);
        // 1 s, times the slack factor (the load ran `window`, longer).
        assert!(
            after <= slack(Duration::from_secs(1)),
            "{name}: writes of s0 still failed {after:?} after +switch-master: {:?}",
            failed.last()
        );
    }
    let resumed = seen
        .iter()
        .flat_map(|s| s.acked.values())
        .filter(|(_, when)| *when > at)
        .count();
    assert!(
        resumed > 0,
        "{name}: no write acknowledged after the switch"
    );
    // Every key holds its last acknowledged value (those came after the switch, on the new
    // primary), and every write replicated before the switch is there.
    // Read on the new primary itself (a replica may lag) and on the plain shard.
    let mut on = [
        RespConn::connect(rig.replica.addr),
        RespConn::connect(rig.plain.addr),
    ];
    let shard_of: std::collections::HashMap<&String, usize> =
        keys.iter().map(|(k, s)| (k, *s)).collect();
    for s in &seen {
        for (k, (v, when)) in &s.acked {
            assert!(*when > at || *when < mark, "{name}: load stopped early");
            let got = on[shard_of[k]].get(k);
            assert_eq!(got, Some(v.to_string().into_bytes()), "{name}: {k}");
        }
    }
    // Keys never moved to the other shard while theirs had no primary.
    for (k, shard) in &keys {
        if *shard == 0 {
            assert_eq!(
                on[1].call(&["EXISTS", k]),
                Resp::Int(0),
                "{name}: {k} remapped"
            );
        }
    }
    let mut check = RespConn::connect(rw.addr);
    for k in &pre {
        assert_eq!(check.get(k), Some(k.clone().into_bytes()), "{name}: {k}");
    }
    // A demoted primary's pools are closed (a killed one has none left anyway).
    if std::net::TcpStream::connect(old_primary).is_ok() {
        // Once it serves again, as a replica, reads use new connections to it.
        let deadline = Instant::now() + Duration::from_secs(20);
        let replica = format!("endpoint {old_primary} role=replica");
        while !http_get(admin.local_addr(), "/clusters")
            .1
            .contains(&replica)
        {
            assert!(
                Instant::now() < deadline,
                "{name}: the demoted primary never came back"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut r = RespConn::connect(rw.addr);
        for k in &s0 {
            assert!(!r.call(&["GET", k]).is_error());
        }
        let left: Vec<u64> = respway_connections(old_primary)
            .into_iter()
            .filter(|id| pooled.contains(id))
            .collect();
        assert!(
            left.is_empty(),
            "{name}: still open on the demoted primary: {left:?}"
        );
    }
    // Operators see the failover followed.
    let (_, metrics) = http_get(admin.local_addr(), "/metrics");
    assert!(
        metrics
            .contains("respway_sentinel_primary_changes_total{cluster=\"main\",shard=\"s0\"} 1\n"),
        "{name}: {metrics}"
    );
    let (_, clusters) = http_get(admin.local_addr(), "/clusters");
    assert!(
        clusters.contains("shard s0 sentinel master=m0 sentinels_answering=3/3")
            && clusters.contains("primary_changes=1")
            && clusters.contains(&format!(
                "shard s0 endpoint {} role=primary",
                rig.replica.addr
            )),
        "{name}: {clusters}"
    );
    let first = failed.iter().map(|f| f.0).min();
    eprintln!(
        "{name}: +switch-master {:?} after the switch began; {} writes failed{}; {} acknowledged",
        at - t0,
        failed.len(),
        match (first, last_failure) {
            (Some(a), Some(b)) => format!(
                ", from {:?} to {:?} after it began (the last {:?} after +switch-master)",
                a.saturating_duration_since(t0),
                b.saturating_duration_since(t0),
                b.saturating_duration_since(at)
            ),
            _ => String::new(),
        },
        seen.iter().map(|s| s.ok).sum::<u64>()
    );
    for f in failed.iter().take(3) {
        eprintln!("  e.g. {}", f.2);
    }
}

#[test]
fn kill_9_of_the_primary_under_load_is_followed_within_a_second_of_switch_master() {
    failover_under_load("kill -9", |rig| {
        rig.primary.signal("-9");
        Instant::now()
    });
}

#[test]
fn sentinel_failover_under_load_is_followed_within_a_second_of_switch_master() {
    failover_under_load("SENTINEL FAILOVER", |rig| {
        let began = Instant::now();
        let r = RespConn::connect(rig.sentinels[1].addr).call(&["SENTINEL", "FAILOVER", "m0"]);
        assert_eq!(r.text(), "OK", "SENTINEL FAILOVER");
        began
    });
}

/// Sentinels that stop answering (SIGSTOP, a partition) and one killed and started again:
/// respway keeps writing to the last primary it knows, without an error, and follows the
/// next failover through the restarted Sentinel.
#[test]
fn sentinels_partitioned_or_restarted_keep_the_last_primary_and_are_followed_again() {
    failover_under_load("Sentinels stopped, one restarted", |rig| {
        for s in &rig.sentinels {
            s.signal("-STOP");
        }
        // Three seconds without an answering Sentinel: the time is the fault.
        std::thread::sleep(Duration::from_secs(3));
        for s in &rig.sentinels {
            s.signal("-CONT");
        }
        let s0 = rig.sentinels[0].addr;
        rig.sentinels[0].signal("-9");
        wait_until(
            Duration::from_secs(10),
            "the killed Sentinel's port closed",
            || std::net::TcpStream::connect(s0).is_err(),
        );
        rig.sentinels[0] = sentinel_on(s0.port(), "m0", rig.primary.addr);
        // The restarted Sentinel must know the others again before it can lead a failover:
        // linked to both other Sentinels and to the replica, whose INFO it has read.
        let replica = rig.replica.addr.port().to_string();
        wait_until(
            Duration::from_secs(30),
            "the restarted Sentinel linked to the others and the replica",
            || {
                let mut c = RespConn::connect(s0);
                let linked =
                    |e: &Resp| field(e, "flags").is_some_and(|f| !f.contains("disconnected"));
                let others = match c.call(&["SENTINEL", "SENTINELS", "m0"]) {
                    Resp::Array(Some(l)) => l.len() == 2 && l.iter().all(linked),
                    _ => false,
                };
                let replica_read = match c.call(&["SENTINEL", "REPLICAS", "m0"]) {
                    Resp::Array(Some(l)) => l.iter().any(|r| {
                        field(r, "port").as_deref() == Some(replica.as_str())
                            && linked(r)
                            && field(r, "info-refresh")
                                .and_then(|ms| ms.parse::<u64>().ok())
                                .is_some_and(|ms| ms < 5000)
                    }),
                    _ => false,
                };
                others && replica_read
            },
        );
        let began = Instant::now();
        let r = RespConn::connect(rig.sentinels[0].addr).call(&["SENTINEL", "FAILOVER", "m0"]);
        assert_eq!(r.text(), "OK", "SENTINEL FAILOVER");
        began
    });
}

/// A shard whose Sentinels do not answer has no primary: its keys get an error naming it (and
/// never go to another shard), the other shard serves, and `/ready` names it.
#[test]
fn a_shard_with_no_primary_known_answers_its_keys_with_an_error_and_is_not_ready() {
    let plain = redis();
    let (a, b) = (free_port(), free_port());
    let yaml = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    routes: {{ catch_all: main }}\nclusters:\n  - name: main\n    hash: {{ policy: ketama }}\n    connect_timeout: 300ms\n    shards:\n      - name: s0\n        sentinel: {{ master: m9, sentinels: [\"127.0.0.1:{a}\", \"127.0.0.1:{b}\"] }}\n      - name: s1\n        endpoints: [ {{ address: \"{}\" }} ]\n",
        plain.addr
    );
    let rw = respway(&yaml, 1);
    let admin = respway::admin::start(
        "127.0.0.1:0".parse().unwrap(),
        false,
        rw.server.as_ref().unwrap(),
    )
    .expect("admin");
    let mut c = RespConn::connect(rw.addr);
    let (mut refused, mut served) = (0, 0);
    for i in 0..40 {
        let k = format!("k{i}");
        match c.call(&["SET", &k, "v"]) {
            Resp::Error(e) => {
                assert_eq!(
                    e,
                    "ERR respway: shard s0 unavailable: no primary known: no Sentinel has named one for master \"m9\" yet"
                );
                assert_eq!(
                    RespConn::connect(plain.addr).call(&["EXISTS", &k]),
                    Resp::Int(0)
                );
                refused += 1;
            }
            r => {
                assert_eq!(r.text(), "OK");
                served += 1;
            }
        }
    }
    assert!(
        refused > 0 && served > 0,
        "{refused} refused, {served} served"
    );
    let (status, body) = http_get(admin.local_addr(), "/ready");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("main/s0"), "{body}");
}

/// The zones given for the nodes the Sentinels name make zone-local reads work: a sidecar in
/// the replica's zone reads from it, and from the promoted one after a failover.
#[test]
fn zones_of_the_nodes_sentinels_name_serve_zone_local_reads() {
    let rig = Rig::start();
    let zones = format!(
        ", zones: {{ \"{}\": z0, \"{}\": z1 }}",
        rig.primary.addr, rig.replica.addr
    );
    let rw = respway_in_zone(&rig.yaml_with("zone_local", &zones), 1, Some("z1"));
    let mut c = RespConn::connect(rw.addr);
    let (s0, _) = keys_by_shard(rw.addr, rig.plain.addr, 32);
    let before = (
        commandstat(rig.primary.addr, "get"),
        commandstat(rig.replica.addr, "get"),
    );
    for k in &s0 {
        assert!(!c.call(&["GET", k]).is_error());
    }
    let after = (
        commandstat(rig.primary.addr, "get"),
        commandstat(rig.replica.addr, "get"),
    );
    assert_eq!(after.0, before.0, "no read on the primary (zone z0)");
    assert_eq!(
        after.1 - before.1,
        s0.len() as u64,
        "every read on the replica (zone z1)"
    );
}
