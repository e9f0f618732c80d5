//! Active health checks against real redis-server processes: a frozen (SIGSTOP) replica, a
//! loading replica and a drained one leave read rotation and come back; a primary demoted
//! outside the configuration refuses writes (sent nowhere) and shows in `/clusters`,
//! `/metrics` and `/ready`.
//!
//! The "replicas" here are standalone servers holding a value of their own under the key the
//! tests read, so every reply says which endpoint answered it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;

/// Checks every 100 ms, 200 ms timeout, out after 2 failures, back after 2 passes.
const CHECK: &str = "{ interval: 100ms, timeout: 200ms, unhealthy_threshold: 2, healthy_threshold: 2, drain_key: maint }";

/// One cluster `main`, one shard `s0`: `primary` and `replica`, reads prefer the replica.
fn yaml(primary: SocketAddr, replica: SocketAddr, check: &str) -> String {
    format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    op_timeout: 1s\n    routes: {{ catch_all: main }}\n\
         clusters:\n  - name: main\n    connect_timeout: 300ms\n    read_policy: prefer_replica\n{check}\
         \x20   shards:\n      - name: s0\n        endpoints:\n\
         \x20         - {{ address: \"{primary}\", role: primary }}\n\
         \x20         - {{ address: \"{replica}\", role: replica }}\n"
    )
}

fn checked(primary: SocketAddr, replica: SocketAddr) -> String {
    yaml(primary, replica, &format!("    health_check: {CHECK}\n"))
}

/// A primary and a standalone "replica", each holding `k` = its own role.
fn pair(replica_args: &[&str]) -> (Proc, Proc) {
    let primary = redis();
    let replica = redis_with(replica_args);
    RespConn::connect(primary.addr).call(&["SET", "k", "primary"]);
    RespConn::connect(replica.addr).call(&["SET", "k", "replica"]);
    (primary, replica)
}

/// Polls `f` every 20 ms until it is true; false after `max`.
fn until(max: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + max;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Reads `k` through respway until `want` answers it (at most 5 s).
fn reads_reach(c: &mut RespConn, want: &str) -> bool {
    until(Duration::from_secs(5), || {
        c.call(&["GET", "k"]) == Resp::bulk(want)
    })
}

/// A frozen replica accepts connections but answers nothing: after `interval` ×
/// `unhealthy_threshold` (and the timeout) no read is sent to it, so every read is answered by
/// the primary at once; SIGCONT puts it back after `healthy_threshold` passes.
#[test]
fn a_frozen_replica_leaves_read_rotation_and_comes_back() {
    let (primary, replica) = pair(&[]);
    let rw = respway(&checked(primary.addr, replica.addr), 1);
    let server = rw.server.as_ref().expect("server");
    let admin =
        respway::admin::start("127.0.0.1:0".parse().unwrap(), false, server).expect("admin");
    let mut c = RespConn::connect(rw.addr);
    assert!(reads_reach(&mut c, "replica"), "reads go to the replica");

    let before = commandstat(replica.addr, "get");
    replica.signal("-STOP");
    // 2 failures of 200 ms each, 100 ms apart (about 600 ms): the check takes it out.
    let endpoint = replica.addr.to_string();
    wait_until(
        Duration::from_secs(10),
        "the frozen replica marked unhealthy",
        || {
            http_get(admin.local_addr(), "/clusters")
                .1
                .lines()
                .any(|l| l.contains(&endpoint) && l.contains("check=unhealthy"))
        },
    );
    let started = Instant::now();
    for _ in 0..20 {
        assert_eq!(c.call(&["GET", "k"]), Resp::bulk("primary"));
    }
    // Not stretched by slack(): one read sent to the frozen replica waits out the op timeout
    // (1 s) alone, which is what this tells apart.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "no read waited on the frozen replica: {:?}",
        started.elapsed()
    );
    replica.signal("-CONT");
    assert_eq!(
        commandstat(replica.addr, "get"),
        before,
        "no read reached the replica while it was out"
    );
    assert!(reads_reach(&mut c, "replica"), "back after 2 passes");
}

/// A replica loading its data set answers `-LOADING`: the reads sent to it before the check
/// takes it out go to the primary once, and then none are sent to it; it is back when loaded.
#[test]
fn a_loading_replica_serves_no_reads() {
    let (primary, replica) = pair(&["--enable-debug-command", "yes"]);
    let mut r = RespConn::connect(replica.addr);
    assert_eq!(
        r.call(&["DEBUG", "POPULATE", "20000"]),
        Resp::Simple("OK".into())
    );
    for (k, v) in [
        ("key-load-delay", "100"),
        ("loading-process-events-interval-bytes", "1024"),
    ] {
        assert_eq!(r.call(&["CONFIG", "SET", k, v]), Resp::Simple("OK".into()));
    }
    let rw = respway(&checked(primary.addr, replica.addr), 1);
    let mut c = RespConn::connect(rw.addr);
    assert!(reads_reach(&mut c, "replica"), "reads go to the replica");

    // DEBUG RELOAD blocks its own client until loaded; others get -LOADING meanwhile.
    let reloading = std::thread::spawn(move || r.call(&["DEBUG", "RELOAD"]));
    assert!(
        until(Duration::from_secs(5), || raw_command(
            replica.addr,
            &["PING"]
        )
        .is_ok_and(|p| p.starts_with("-LOADING"))),
        "the replica never answered -LOADING"
    );
    let mut answers = 0;
    while raw_command(replica.addr, &["PING"]).is_ok_and(|p| p.starts_with("-LOADING")) {
        assert_eq!(
            c.call(&["GET", "k"]),
            Resp::bulk("primary"),
            "while loading"
        );
        answers += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(answers > 5, "{answers} reads while loading");
    assert_eq!(reloading.join().expect("reload"), Resp::Simple("OK".into()));
    assert!(reads_reach(&mut c, "replica"), "back once loaded");
}

/// `EXISTS drain_key` answering 1 takes the replica out at once; deleting the key puts it back.
#[test]
fn a_drain_key_takes_a_replica_out_and_back() {
    let (primary, replica) = pair(&[]);
    let rw = respway(&checked(primary.addr, replica.addr), 1);
    let mut c = RespConn::connect(rw.addr);
    assert!(reads_reach(&mut c, "replica"), "reads go to the replica");
    let mut r = RespConn::connect(replica.addr);
    r.call(&["SET", "maint", "1"]);
    assert!(reads_reach(&mut c, "primary"), "drained");
    // One check (100 ms) took it out: from now on, no read reaches it. The pause lets a check
    // under way end (no state shows it) before the replica's GETs are counted.
    std::thread::sleep(Duration::from_millis(100));
    let before = commandstat(replica.addr, "get");
    for _ in 0..20 {
        assert_eq!(c.call(&["GET", "k"]), Resp::bulk("primary"));
    }
    assert_eq!(
        commandstat(replica.addr, "get"),
        before,
        "none while draining"
    );
    r.call(&["DEL", "maint"]);
    assert!(reads_reach(&mut c, "replica"), "back when the key is gone");
}

/// A primary made a replica of another server outside the configuration: writes to its shard
/// get respway's `-READONLY` (and are sent nowhere), reads are served; `/clusters`, `/metrics`
/// and `/ready` show it. Made primary again, it takes writes again.
#[test]
fn a_demoted_primary_refuses_writes_and_is_shown() {
    let (primary, replica) = pair(&[]);
    let other = redis();
    let rw = respway(&checked(primary.addr, replica.addr), 1);
    let server = rw.server.as_ref().expect("server");
    let admin =
        respway::admin::start("127.0.0.1:0".parse().unwrap(), false, server).expect("admin");
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["SET", "w", "1"]), Resp::Simple("OK".into()));
    let (status, body) = http_get(admin.local_addr(), "/clusters");
    assert_eq!(status, 200);
    assert!(body.contains("check=healthy check_transitions=0"), "{body}");

    let mut p = RespConn::connect(primary.addr);
    let port = other.addr.port().to_string();
    assert_eq!(
        p.call(&["REPLICAOF", "127.0.0.1", &port]),
        Resp::Simple("OK".into())
    );
    let sets = commandstat(primary.addr, "set");
    let refusal = format!(
        "READONLY respway: shard s0 ({}): the configured primary answers ROLE as a replica of \
         127.0.0.1:{port}; writes are refused until it is primary again or the configuration \
         names another",
        primary.addr
    );
    assert!(
        until(Duration::from_secs(5), || c
            .call(&["SET", "w", "2"])
            .error()
            .is_some_and(|e| e == refusal)),
        "writes are refused: {:?}",
        c.call(&["SET", "w", "2"])
    );
    assert_eq!(commandstat(primary.addr, "set"), sets, "no write was sent");
    assert!(c.call(&["GET", "k"]).error().is_none(), "reads are served");

    let (_, body) = http_get(admin.local_addr(), "/clusters");
    let line = body
        .lines()
        .find(|l| l.contains(&primary.addr.to_string()))
        .expect("primary line");
    assert!(line.contains("check=demoted check_transitions=1"), "{line}");
    let (_, metrics) = http_get(admin.local_addr(), "/metrics");
    let demoted = format!(
        "respway_upstream_check_demoted{{cluster=\"main\",shard=\"s0\",endpoint=\"{}\"}} 1",
        primary.addr
    );
    assert!(metrics.contains(&demoted), "{demoted} not in:\n{metrics}");
    assert!(
        metrics.contains("respway_upstream_errors_total{cluster=\"main\",shard=\"s0\",endpoint=")
            && metrics.contains("kind=\"demoted\"} "),
        "{metrics}"
    );
    let (status, ready) = http_get(admin.local_addr(), "/ready");
    assert_eq!(status, 503, "{ready}");
    assert!(
        ready.contains(&format!(
            "not ready: main/s0: primary {} answers ROLE as a replica of 127.0.0.1:{port}",
            primary.addr
        )),
        "{ready}"
    );

    assert_eq!(
        p.call(&["REPLICAOF", "NO", "ONE"]),
        Resp::Simple("OK".into())
    );
    assert!(
        until(Duration::from_secs(5), || c.call(&["SET", "w", "3"])
            == Resp::Simple("OK".into())),
        "writes are taken again"
    );
    let (status, ready) = http_get(admin.local_addr(), "/ready");
    assert_eq!(status, 200, "{ready}");
    drop(admin);
}

/// Without a `health_check`, `/clusters` shows no check and nothing is checked.
#[test]
fn clusters_without_a_health_check_show_none() {
    let (primary, replica) = pair(&[]);
    let rw = respway(&yaml(primary.addr, replica.addr, ""), 1);
    let server = rw.server.as_ref().expect("server");
    let admin =
        respway::admin::start("127.0.0.1:0".parse().unwrap(), false, server).expect("admin");
    let mut c = RespConn::connect(rw.addr);
    assert!(reads_reach(&mut c, "replica"));
    let (_, body) = http_get(admin.local_addr(), "/clusters");
    assert!(!body.contains("check="), "{body}");
    // Three check intervals' worth of time: none is sent (nothing to wait for).
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(commandstat(replica.addr, "role"), 0, "no ROLE was sent");
}

/// A replica that loses its primary with `replica-serve-stale-data no` answers `-MASTERDOWN`
/// on the connections it already has: those reads go to the primary at once, and the check
/// takes it out, naming the reply.
#[test]
fn a_replica_without_its_primary_serves_no_reads() {
    let (primary, replica) = pair(&[]);
    let rw = respway(&checked(primary.addr, replica.addr), 1);
    let server = rw.server.as_ref().expect("server");
    let admin =
        respway::admin::start("127.0.0.1:0".parse().unwrap(), false, server).expect("admin");
    let mut c = RespConn::connect(rw.addr);
    assert!(reads_reach(&mut c, "replica"), "reads go to the replica");

    let mut r = RespConn::connect(replica.addr);
    let ok = Resp::Simple("OK".into());
    assert_eq!(
        r.call(&["CONFIG", "SET", "replica-serve-stale-data", "no"]),
        ok
    );
    let gone = free_port().to_string();
    assert_eq!(r.call(&["REPLICAOF", "127.0.0.1", &gone]), ok);
    for _ in 0..20 {
        assert_eq!(c.call(&["GET", "k"]), Resp::bulk("primary"));
    }
    let line = || {
        let (_, body) = http_get(admin.local_addr(), "/clusters");
        body.lines()
            .find(|l| l.contains(&replica.addr.to_string()))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        until(Duration::from_secs(5), || line()
            .contains("check=unhealthy")),
        "{}",
        line()
    );
    assert!(
        line().contains("MASTERDOWN Link with MASTER is down"),
        "{}",
        line()
    );
    let (_, metrics) = http_get(admin.local_addr(), "/metrics");
    let out = format!(
        "respway_upstream_check_healthy{{cluster=\"main\",shard=\"s0\",endpoint=\"{}\"}} 0",
        replica.addr
    );
    assert!(metrics.contains(&out), "{out} not in:\n{metrics}");
}

/// The checks follow the configuration served: an endpoint a push removes is no longer
/// checked, one it adds is, and one that stays keeps its state (here: draining).
#[test]
fn checks_follow_the_configuration_served() {
    let (primary, old) = pair(&[]);
    let new = redis();
    RespConn::connect(new.addr).call(&["SET", "k", "new"]);
    let rw = respway(&checked(primary.addr, old.addr), 1);
    let mut c = RespConn::connect(rw.addr);
    assert!(reads_reach(&mut c, "replica"));
    let server = rw.server.as_ref().expect("server");
    let admin =
        respway::admin::start("127.0.0.1:0".parse().unwrap(), false, server).expect("admin");
    // The primary drains: reads go to the replica (the primary is only the last resort).
    RespConn::connect(primary.addr).call(&["SET", "maint", "1"]);
    let endpoint = primary.addr.to_string();
    wait_until(Duration::from_secs(10), "the primary draining", || {
        http_get(admin.local_addr(), "/clusters")
            .1
            .lines()
            .any(|l| l.contains(&endpoint) && l.contains("check=draining"))
    });

    let config = |replica: SocketAddr| {
        respway_xds::translate(&respway_xds::parse_yaml(&checked(primary.addr, replica)).unwrap())
            .unwrap()
    };
    server.apply(config(new.addr)).expect("push");
    assert!(reads_reach(&mut c, "new"), "the new replica serves reads");
    assert!(
        until(Duration::from_secs(5), || commandstat(new.addr, "role") > 2),
        "the new replica is checked"
    );
    // A check of the removed endpoint already under way may still land; then five check
    // intervals pass without one (time passing is what shows it).
    std::thread::sleep(Duration::from_millis(300));
    let left = commandstat(old.addr, "role");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(commandstat(old.addr, "role"), left, "the old one is not");
    let (_, body) = http_get(admin.local_addr(), "/clusters");
    let line = body
        .lines()
        .find(|l| l.contains(&primary.addr.to_string()))
        .expect("primary line");
    assert!(
        line.contains("check=draining check_transitions=1"),
        "the primary kept its state: {line}"
    );
}

/// A replica stopped (SIGSTOP) under read load: the reads it holds time out as its own (the
/// errors name it), the reads retried on the primary get their own time, and nothing is
/// charged to the primary: an operator paged on the primary's errors is not sent to the
/// wrong server.
#[test]
fn a_stopped_replica_s_timeouts_are_its_own_not_the_primary_s() {
    let (primary, replica) = pair(&[]);
    let rw = respway(&checked(primary.addr, replica.addr), 1);
    let server = rw.server.as_ref().expect("server");
    let admin =
        respway::admin::start("127.0.0.1:0".parse().unwrap(), false, server).expect("admin");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            let addr = rw.addr;
            std::thread::spawn(move || {
                let mut c = RespConn::connect(addr);
                let mut errors = Vec::new();
                let end = Instant::now() + Duration::from_secs(30);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < end {
                    // Pipelined: reads queue behind one another on the replica's connection.
                    for _ in 0..16 {
                        c.send(&["GET", "k"]);
                    }
                    for _ in 0..16 {
                        if let Ok(Resp::Error(e)) = c.read() {
                            errors.push(e);
                        }
                    }
                }
                errors
            })
        })
        .collect();
    let mut c = RespConn::connect(rw.addr);
    assert!(reads_reach(&mut c, "replica"), "reads go to the replica");
    replica.signal("-STOP");
    // A read every 10 ms on a connection of its own, answered or not, until the check has
    // the replica out: some are sent to the replica just before, and still wait on it when
    // its stuck connection is replaced.
    let trickle = {
        let addr = rw.addr;
        std::thread::spawn(move || {
            let mut conns = Vec::new();
            for _ in 0..100 {
                let mut c = RespConn::connect(addr);
                c.send(&["GET", "k"]);
                conns.push(c);
                std::thread::sleep(Duration::from_millis(10));
            }
            let mut errors = Vec::new();
            for mut c in conns {
                if let Ok(Resp::Error(e)) = c.read() {
                    errors.push(e);
                }
            }
            errors
        })
    };
    let endpoint = replica.addr.to_string();
    wait_until(
        Duration::from_secs(10),
        "the stopped replica marked unhealthy",
        || {
            http_get(admin.local_addr(), "/clusters")
                .1
                .lines()
                .any(|l| l.contains(&endpoint) && l.contains("check=unhealthy"))
        },
    );
    // The stuck connection is replaced op_timeout + 500 ms after its oldest read: past it.
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut errors: Vec<String> = readers
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    errors.extend(trickle.join().unwrap());
    replica.signal("-CONT");
    let p = primary.addr.to_string();
    let on_primary: Vec<&String> = errors.iter().filter(|e| e.contains(&p)).collect();
    assert!(
        on_primary.is_empty(),
        "{} of {} errors name the primary, e.g. {:?}",
        on_primary.len(),
        errors.len(),
        on_primary.first()
    );
    let metrics = http_get(admin.local_addr(), "/metrics").1;
    let charged: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("respway_upstream_errors_total") && l.contains(&p))
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    assert!(
        charged.is_empty(),
        "errors charged to the primary: {charged:?}"
    );
    eprintln!(
        "stopped replica: {} reads failed, each naming the replica",
        errors.len()
    );
}

/// A replica restarted with an old dump under read load: it loads the dump in milliseconds
/// and answers reads with it until its resync with the primary is done (a full one here: the
/// primary's backlog is small and it waits 2 s before each sync). respway sends it no read
/// before it says it is in sync (`INFO replication`, checked on every new connection and by
/// the health check): no reader sees an old value, and none fails.
#[test]
fn a_replica_restarted_with_an_old_dump_serves_no_read_before_its_resync() {
    let primary = redis_with(&[
        "--repl-backlog-size",
        "16384",
        "--repl-diskless-sync-delay",
        "2",
    ]);
    let pport = primary.addr.port().to_string();
    let replica = redis_with(&["--replicaof", "127.0.0.1", &pport]);
    let keys: Vec<String> = (0..50).map(|i| format!("rs:{i}")).collect();
    let mut p = RespConn::connect(primary.addr);
    let synced = |p: &mut RespConn| {
        wait_until(Duration::from_secs(30), "the replica in sync", || {
            p.call(&["WAIT", "1", "1000"]) == Resp::Int(1)
        })
    };
    for k in &keys {
        p.call(&["SET", k, "old"]);
    }
    synced(&mut p);
    assert_eq!(
        RespConn::connect(replica.addr).call(&["SAVE"]),
        Resp::Simple("OK".into())
    );
    for k in &keys {
        p.call(&["SET", k, "new"]);
    }
    // Past the primary's backlog: the restarted replica cannot resume, it syncs in full.
    let filler = "x".repeat(100);
    for i in 0..2000 {
        p.call(&["SET", &format!("filler:{i}"), &filler]);
    }
    synced(&mut p);

    let rw = respway(&checked(primary.addr, replica.addr), 2);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, keys, addr) = (stop.clone(), keys.clone(), rw.addr);
            std::thread::spawn(move || {
                let mut c = RespConn::connect(addr);
                let (mut old, mut failed, mut ok) = (0u64, Vec::new(), 0u64);
                let end = Instant::now() + Duration::from_secs(60);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < end {
                    for k in &keys {
                        match c.call(&["GET", k]) {
                            Resp::Error(e) => failed.push(e),
                            r if r == Resp::bulk("old") => old += 1,
                            _ => ok += 1,
                        }
                    }
                }
                (old, failed, ok)
            })
        })
        .collect();
    let served = commandstat(replica.addr, "get");
    wait_until(Duration::from_secs(10), "reads on the replica", || {
        commandstat(replica.addr, "get") > served + 100
    });
    let port = replica.addr.port();
    let mut replica = replica;
    replica.kill();
    let restarted = Instant::now();
    let replica = redis_on_with(port, &["--replicaof", "127.0.0.1", &pport]);
    wait_until(Duration::from_secs(30), "the resync done", || {
        let info = RespConn::connect(replica.addr)
            .call(&["INFO", "replication"])
            .text();
        info.contains("master_link_status:up") && info.contains("master_sync_in_progress:0")
    });
    let resynced = restarted.elapsed();
    // Reads go on a little past it: the replica back in rotation.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen: Vec<_> = readers.into_iter().map(|t| t.join().unwrap()).collect();
    let old: u64 = seen.iter().map(|s| s.0).sum();
    let failed: Vec<&String> = seen.iter().flat_map(|s| &s.1).collect();
    let ok: u64 = seen.iter().map(|s| s.2).sum();
    eprintln!(
        "restarted replica: resync done {resynced:?} after the restart; {ok} reads answered, {old} with the old value, {} failed",
        failed.len()
    );
    assert_eq!(old, 0, "reads answered from the old dump");
    assert!(
        failed.is_empty(),
        "failed reads: {:?}",
        &failed[..failed.len().min(3)]
    );
}
