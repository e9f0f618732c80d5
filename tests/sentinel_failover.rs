//! Failovers of a Sentinel-managed shard that respway makes better than the Sentinels alone:
//! a planned `SENTINEL FAILOVER` under write load loses no acknowledged write (writes are held
//! from the first event that says the failover began until `+switch-master`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sentinel::{field, keys_by_shard, switch_watch, Rig};
use crate::support::*;

/// What one writer saw: the keys it wrote (each once, never again) that were acknowledged,
/// when; and the errors.
#[derive(Default)]
struct Writes {
    acked: Vec<(String, Instant)>,
    failed: Vec<(Instant, String)>,
}

/// One writer of a new key per write through respway until `stop` (bounded to 90 s), about
/// one write per `pace`: `write` writes key `k` and says why it failed; `tick` is called
/// every 16 writes. A write lost after its acknowledgement is a key missing afterwards.
fn writer(
    rw: SocketAddr,
    stop: Arc<AtomicBool>,
    prefix: String,
    pace: Duration,
    write: fn(&mut RespConn, &str) -> Option<String>,
    tick: impl Fn() + Send + 'static,
) -> std::thread::JoinHandle<Writes> {
    std::thread::spawn(move || {
        let mut w = Writes::default();
        let mut c = RespConn::connect(rw);
        let end = Instant::now() + Duration::from_secs(90);
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) && Instant::now() < end {
            n += 1;
            let k = format!("{prefix}{n}");
            match write(&mut c, &k) {
                Some(e) => w.failed.push((Instant::now(), e)),
                None => w.acked.push((k, Instant::now())),
            }
            if n.is_multiple_of(16) {
                tick();
            }
            std::thread::sleep(pace);
        }
        w
    })
}

/// Writers that each `SET` a new key per command (both shards), about 1,000 a second each
/// (bounded: every key is read back), counted in `progress`.
fn unique_writers(
    rw: SocketAddr,
    progress: &Progress,
    stop: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<Writes>> {
    let set = |c: &mut RespConn, k: &str| c.call(&["SET", k, "1"]).error().map(str::to_string);
    (0..progress.clients())
        .map(|t| {
            let counter = progress.counter(t);
            let tick = move || counter.tick();
            writer(
                rw,
                stop.clone(),
                format!("w:{t}:"),
                Duration::from_micros(500),
                set,
                tick,
            )
        })
        .collect()
}

/// A writer of new keys in transactions (`MULTI`, `SET`, `EXEC`): the keys of the
/// transactions `EXEC` acknowledged, and the refused ones.
fn transaction_writer(rw: SocketAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Writes> {
    let tx = |c: &mut RespConn, k: &str| {
        let r = [
            c.call(&["MULTI"]),
            c.call(&["SET", k, "1"]),
            c.call(&["EXEC"]),
        ];
        match &r[2] {
            Resp::Array(Some(replies)) if replies.len() == 1 => None,
            _ => Some(format!("{r:?}")),
        }
    };
    writer(rw, stop, "tx:".into(), Duration::from_millis(1), tx, || {})
}

/// The primary the Sentinels name for `m0` now.
fn primary_now(sentinel: SocketAddr) -> SocketAddr {
    let r = RespConn::connect(sentinel).call(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m0"]);
    let Resp::Array(Some(parts)) = r else {
        panic!("GET-MASTER-ADDR-BY-NAME: {r:?}")
    };
    let text = |i: usize| match &parts[i] {
        Resp::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("GET-MASTER-ADDR-BY-NAME: {other:?}"),
    };
    format!("{}:{}", text(0), text(1)).parse().unwrap()
}

/// Three `SENTINEL FAILOVER`s (there, back, there again) under writes of new keys: every
/// acknowledged write is on the shard's primary afterwards, and no write fails.
#[test]
fn a_planned_failover_under_write_load_loses_no_acknowledged_write() {
    let rig = Rig::start();
    let yaml = rig.yaml_with("primary", "");
    let rw = respway(&yaml, 2);
    let admin = respway::admin::start(
        "127.0.0.1:0".parse().unwrap(),
        false,
        rw.server.as_ref().unwrap(),
    )
    .expect("admin");
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Progress::new(4);
    let writers = unique_writers(rw.addr, &progress, stop.clone());
    let tx_writer = transaction_writer(rw.addr, stop.clone());
    let sentinel = rig.sentinels[0].addr;
    let mut switches = Vec::new();
    for round in 0..3 {
        progress.wait_each(5, Duration::from_secs(30), "writes before the failover");
        let from = primary_now(sentinel);
        let switched = switch_watch(rig.sentinels[2].addr);
        // The demoted node of the last round must be a replica in sync before it can be
        // chosen (SENTINEL FAILOVER says -NOGOODSLAVE until the Sentinels see it linked, but
        // promotes one still loading what its primary acknowledged): as an operator would
        // before a planned failover, wait until it has everything written so far.
        let replica = if from == rig.primary.addr {
            rig.replica.addr
        } else {
            rig.primary.addr
        };
        wait_until(Duration::from_secs(40), "the replica in sync", || {
            let info = RespConn::connect(replica)
                .call(&["INFO", "replication"])
                .text();
            info.contains("master_link_status:up")
                && info.contains("master_sync_in_progress:0")
                && RespConn::connect(from).call(&["WAIT", "1", "1000"]) == Resp::Int(1)
        });
        let began = {
            let deadline = Instant::now() + Duration::from_secs(40);
            loop {
                let r =
                    RespConn::connect(rig.sentinels[1].addr).call(&["SENTINEL", "FAILOVER", "m0"]);
                if matches!(&r, Resp::Simple(s) if s == "OK") {
                    break Instant::now();
                }
                assert!(
                    Instant::now() < deadline,
                    "round {round}: SENTINEL FAILOVER: {r:?}"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        };
        wait_until(Duration::from_secs(45), "+switch-master", || {
            switched.lock().unwrap().is_some()
        });
        let at = switched.lock().unwrap().unwrap();
        progress.wait_each(5, Duration::from_secs(30), "writes after the switch");
        // The Sentinels that did not lead the failover learn the new primary from the
        // leader's hello messages (every 2 s): one seen +switch-master does not say another
        // names the new primary yet (CI saw Sentinel 0 still name the old one).
        let mut to = from;
        let agreed = wait_until(
            Duration::from_secs(30),
            "every Sentinel naming the new primary",
            || {
                let named: Vec<SocketAddr> =
                    rig.sentinels.iter().map(|s| primary_now(s.addr)).collect();
                to = named[0];
                named.iter().all(|p| *p == to)
            },
        );
        eprintln!("round {round}: every Sentinel named the new primary {agreed:?} later");
        assert_ne!(from, to, "round {round}: the primary changed");
        switches.push((began, at));
    }
    stop.store(true, Ordering::Relaxed);
    let writes: Vec<Writes> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    let tx = tx_writer.join().unwrap();
    let failed: Vec<&(Instant, String)> = writes.iter().flat_map(|w| &w.failed).collect();
    // Every acknowledged key is on the shards: on the primary the Sentinels name now (read
    // directly) or on the plain shard.
    let mut on = [
        RespConn::connect(primary_now(sentinel)),
        RespConn::connect(rig.plain.addr),
    ];
    let acked: Vec<&(String, Instant)> = writes.iter().flat_map(|w| &w.acked).collect();
    let mut lost = Vec::new();
    // When each write of the Sentinel-managed shard was acknowledged.
    let mut s0 = Vec::new();
    for (k, at) in &acked {
        let found = on
            .iter_mut()
            .position(|c| c.call(&["EXISTS", k.as_str()]) == Resp::Int(1));
        match found {
            Some(0) => s0.push(*at),
            Some(_) => {}
            None => {
                let rel: Vec<String> = switches
                    .iter()
                    .map(|(b, a)| {
                        let ms = |x: Instant| {
                            if *at >= x {
                                (*at - x).as_millis() as i64
                            } else {
                                -((x - *at).as_millis() as i64)
                            }
                        };
                        format!("began{:+}ms switch{:+}ms", ms(*b), ms(*a))
                    })
                    .collect();
                if lost.len() < 5 {
                    eprintln!("lost {k}: {rel:?}");
                }
                lost.push(k)
            }
        }
    }
    // The longest time no write of the Sentinel-managed shard was acknowledged around each
    // switch: how long writes were held.
    s0.sort();
    for (i, (began, at)) in switches.iter().enumerate() {
        let gap = s0
            .windows(2)
            .filter(|w| w[1] > *began && w[0] < *at + Duration::from_millis(500))
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        eprintln!(
            "failover {i}: +switch-master {:?} after SENTINEL FAILOVER; writes of the shard paused {gap:?}",
            *at - *began
        );
    }
    eprintln!(
        "{} writes acknowledged, {} failed, {} lost",
        acked.len(),
        failed.len(),
        lost.len()
    );
    // Transactions run on dedicated connections: during a failover they are refused (not
    // sent), never acknowledged by the old primary and then dropped.
    let tx_lost: Vec<&String> = tx
        .acked
        .iter()
        .filter(|(k, _)| {
            on.iter_mut()
                .all(|c| c.call(&["EXISTS", k.as_str()]) == Resp::Int(0))
        })
        .map(|(k, _)| k)
        .collect();
    eprintln!(
        "transactions: {} acknowledged, {} refused, {} lost",
        tx.acked.len(),
        tx.failed.len(),
        tx_lost.len()
    );
    assert!(
        tx_lost.is_empty(),
        "acknowledged transactions lost: {tx_lost:?}"
    );
    // Operators see the writes held.
    let (_, metrics) = http_get(admin.local_addr(), "/metrics");
    assert!(
        metrics
            .contains("respway_sentinel_failover_holds_total{cluster=\"main\",shard=\"s0\"} 3\n"),
        "{metrics}"
    );
    let held = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("respway_sentinel_held_writes_total{cluster=\"main\",shard=\"s0\"} ")
        })
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(held > 0, "{metrics}");
    eprintln!("{held} writes held");
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(
        failed.is_empty(),
        "{} writes failed, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
}

/// What one reader saw: its failed reads (when, the error) and how many were answered.
type Reads = (Vec<(Instant, String)>, u64);

/// Readers that `GET` their keys through respway until `stop` (bounded to 90 s); the errors,
/// when, and the reads answered.
fn readers(
    rw: SocketAddr,
    keys: Arc<Vec<String>>,
    progress: &Progress,
    stop: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<Reads>> {
    (0..progress.clients())
        .map(|t| {
            let (keys, stop) = (keys.clone(), stop.clone());
            let counter = progress.counter(t);
            std::thread::spawn(move || {
                let (mut failed, mut ok) = (Vec::new(), 0u64);
                let mut c = RespConn::connect(rw);
                let end = Instant::now() + Duration::from_secs(90);
                while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                    for k in keys.iter().skip(t).step_by(4) {
                        match c.call(&["GET", k]) {
                            Resp::Error(e) => failed.push((Instant::now(), e)),
                            _ => ok += 1,
                        }
                    }
                    counter.tick();
                    std::thread::sleep(Duration::from_millis(1));
                }
                (failed, ok)
            })
        })
        .collect()
}

/// Readers of the Sentinel-managed shard's keys through a sidecar (`prefer_replica`, 2
/// workers), started once every key is replicated and reads flow.
struct ReadLoad {
    rw: Respway,
    keys: Vec<String>,
    stop: Arc<AtomicBool>,
    progress: Progress,
    threads: Vec<std::thread::JoinHandle<Reads>>,
}

impl ReadLoad {
    fn start(rig: &Rig) -> ReadLoad {
        let rw = respway(&rig.yaml_with("prefer_replica", ""), 2);
        let (keys, _) = keys_by_shard(rw.addr, rig.plain.addr, 128);
        assert!(!keys.is_empty());
        let mut p = RespConn::connect(rig.primary.addr);
        assert_eq!(p.call(&["WAIT", "1", "5000"]), Resp::Int(1), "replicated");
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Progress::new(4);
        let threads = readers(rw.addr, Arc::new(keys.clone()), &progress, stop.clone());
        progress.wait_each(3, Duration::from_secs(30), "reads before the kill");
        ReadLoad {
            rw,
            keys,
            stop,
            progress,
            threads,
        }
    }

    /// Stops the readers: the failed reads (when, the error) and how many were answered.
    fn finish(&mut self) -> (Vec<(Instant, String)>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let seen: Vec<Reads> = self.threads.drain(..).map(|t| t.join().unwrap()).collect();
        let ok = seen.iter().map(|s| s.1).sum();
        (seen.into_iter().flat_map(|s| s.0).collect(), ok)
    }
}

/// kill -9 of the primary with a live replica and `prefer_replica`: the replica keeps serving
/// the shard's reads while the Sentinels decide (it holds the freshest data there is), then
/// as the new primary: no read fails.
#[test]
fn reads_of_a_killed_primary_s_shard_keep_being_served_by_its_replica() {
    let rig = Rig::start();
    let mut load = ReadLoad::start(&rig);
    let switched = switch_watch(rig.sentinels[2].addr);
    let killed = Instant::now();
    rig.primary.signal("-9");
    wait_until(Duration::from_secs(45), "+switch-master", || {
        switched.lock().unwrap().is_some()
    });
    (load.progress).wait_each(3, Duration::from_secs(30), "reads after the switch");
    let (failed, ok) = load.finish();
    let at = switched.lock().unwrap().unwrap();
    eprintln!(
        "kill -9: +switch-master {:?} after the kill; {ok} reads answered, {} failed{:?}",
        at - killed,
        failed.len(),
        failed
            .iter()
            .take(3)
            .map(|f| f.0.saturating_duration_since(killed))
            .collect::<Vec<_>>()
    );
    assert!(
        failed.is_empty(),
        "{} reads failed, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
}

/// A dead primary whose replica is never promoted (`replica-priority 0`, as a read replica in
/// another place): once the Sentinels see the replica unlinked from its dead primary, it
/// still serves the shard's reads (the freshest data there is), instead of every read going
/// to the dead primary.
#[test]
fn reads_of_a_dead_primary_s_shard_stay_on_its_replica_while_no_switch_comes() {
    let rig = Rig::start_with(&["--replica-priority", "0"]);
    let mut load = ReadLoad::start(&rig);
    rig.primary.signal("-9");
    // The Sentinels see the primary down, then its replica unlinked.
    let port = rig.replica.addr.port().to_string();
    wait_until(
        Duration::from_secs(30),
        "a Sentinel seeing the replica unlinked",
        || {
            let r = RespConn::connect(rig.sentinels[0].addr).call(&["SENTINEL", "REPLICAS", "m0"]);
            matches!(&r, Resp::Array(Some(l)) if l.iter().any(|e| {
                field(e, "port").as_deref() == Some(port.as_str())
                    && field(e, "master-link-status").as_deref() == Some("err")
            }))
        },
    );
    // Reads go on past it: the time in which the replica would have left the rotation.
    (load.progress).wait_each(
        3,
        Duration::from_secs(30),
        "reads after the replica unlinked",
    );
    std::thread::sleep(Duration::from_secs(1));
    let (failed, ok) = load.finish();
    let (rw, keys) = (&load.rw, &load.keys);
    eprintln!(
        "dead primary, no switch: {ok} reads answered, {} failed",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} reads failed, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    // With serve_stale_reads: false, the unlinked replica leaves the rotation at the next
    // round and reads go to the dead primary: refused, as before the setting.
    let strict = rig.yaml_with("prefer_replica", ", serve_stale_reads: false");
    let resources = respway_xds::parse_yaml(&strict).expect("yaml");
    let config = respway_xds::translate(&resources).expect("config");
    rw.server.as_ref().unwrap().apply(config).expect("apply");
    let mut r = RespConn::connect(rw.addr);
    wait_until(
        Duration::from_secs(10),
        "reads refused without stale reads",
        || r.call(&["GET", &keys[0]]).is_error(),
    );
    // Writes still fail, naming the shard: the replica takes none.
    let mut w = RespConn::connect(rw.addr);
    let r = w.call(&["SET", &keys[0], "x"]);
    assert!(r.is_error(), "a write of the dead primary's shard: {r:?}");
}
