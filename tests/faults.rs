//! The fault suite: real redis-server shards (and fake shards where a real one cannot
//! misbehave on demand), respway, and clients that record every acknowledged write and read
//! all of them back afterwards. Every test asserts "0 acknowledged writes lost".

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;

/// Reads `key` from whichever shard holds it (a key lives on exactly one).
fn read_back(shards: &[SocketAddr], key: &str) -> Option<String> {
    let mut found = None;
    for &s in shards {
        let mut c = RespConn::connect(s);
        if let Resp::Bulk(Some(v)) = c.call(&["GET", key]) {
            assert!(found.is_none(), "{key} is on two shards");
            found = Some(String::from_utf8_lossy(&v).into_owned());
        }
    }
    found
}

/// Clients pipelining SET / INCR / GET on their own keys: every reply must be the one Redis
/// gives a single connection (INCRs consecutive, a GET sees the SET before it), and afterwards
/// every key holds the last value whose SET was acknowledged.
fn order_holds_with(connections_per_endpoint: usize) {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let yaml = sharded_yaml(&addrs, "{ policy: maglev }", true).replace(
        "    connect_timeout: 500ms\n",
        &format!(
            "    connect_timeout: 500ms\n    connections_per_endpoint: {connections_per_endpoint}\n"
        ),
    );
    let rw = respway(&yaml, 2);
    let addr = rw.addr;
    let threads: Vec<_> = (0..6)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = RespConn::connect(addr);
                let mut last: HashMap<String, String> = HashMap::new();
                let mut counter = 0i64;
                let deadline = Instant::now() + Duration::from_millis(1500);
                let mut round = 0u64;
                while Instant::now() < deadline && round < 2_000 {
                    let mut cmds: Vec<Vec<String>> = Vec::new();
                    for j in 0..16 {
                        let key = format!("order:{t}:{j}");
                        for v in 0..3 {
                            cmds.push(vec!["SET".into(), key.clone(), format!("{round}.{v}")]);
                        }
                        cmds.push(vec!["INCR".into(), format!("order:{t}:ctr")]);
                        cmds.push(vec!["GET".into(), key]);
                    }
                    c.send_pipeline(&cmds);
                    for cmd in &cmds {
                        let r = c.read().expect("reply");
                        match cmd[0].as_str() {
                            "SET" => {
                                assert_eq!(r, Resp::Simple("OK".into()), "{cmd:?}");
                                last.insert(cmd[1].clone(), cmd[2].clone());
                            }
                            "INCR" => {
                                counter += 1;
                                assert_eq!(r, Resp::Int(counter), "INCR out of order");
                            }
                            _ => assert_eq!(
                                r.text(),
                                last[&cmd[1]],
                                "GET {} did not see the SET before it",
                                cmd[1]
                            ),
                        }
                    }
                    round += 1;
                }
                last
            })
        })
        .collect();
    let mut acked = HashMap::new();
    for t in threads {
        acked.extend(t.join().expect("a client saw a reply out of order"));
    }
    // Sessions, not commands, are spread: a worker with several sessions uses several of
    // each endpoint's connections.
    for &a in &addrs {
        let info = RespConn::connect(a).call(&["INFO", "clients"]).text();
        let n: usize = info
            .lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("connected_clients");
        // respway's connections plus this INFO connection.
        assert!(
            n > connections_per_endpoint.min(2),
            "shard {a}: {n} connections, sessions are not spread"
        );
    }
    drop(rw);
    let lost: Vec<_> = acked
        .iter()
        .filter(|(k, v)| read_back(&addrs, k).as_ref() != Some(*v))
        .collect();
    assert!(acked.len() >= 96, "every client wrote its keys");
    assert_eq!(lost.len(), 0, "acknowledged writes lost: {lost:?}");
}

#[test]
fn order_and_last_write_win_with_one_connection_per_endpoint() {
    order_holds_with(1);
}

#[test]
fn order_and_last_write_win_with_two_connections_per_endpoint() {
    order_holds_with(2);
}

#[test]
fn order_and_last_write_win_with_four_connections_per_endpoint() {
    order_holds_with(4);
}

/// Two clusters of one shard each: keys `a:*` go to `a`, everything else to `b`.
fn two_cluster_yaml(a: SocketAddr, b: SocketAddr, op_timeout: &str, extra: &str) -> String {
    format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    op_timeout: {op_timeout}\n{extra}    routes:\n      catch_all: b\n      prefixes:\n        - {{ prefix: \"a:\", cluster: a }}\nclusters:\n  - name: a\n    connect_timeout: 300ms\n    shards:\n      - endpoints: [ {{ address: \"{a}\", role: primary }} ]\n  - name: b\n    connect_timeout: 300ms\n    shards:\n      - endpoints: [ {{ address: \"{b}\", role: primary }} ]\n"
    )
}

/// What one client saw of its RPUSHes: `acked` ids, ids whose outcome is unknown (timed out or
/// lost with a broken connection; with the time each was sent), ids refused without being
/// sent (unavailable / queue full).
#[derive(Default)]
struct Outcome {
    acked: Vec<u64>,
    timed_out: Vec<(u64, Instant)>,
    refused: Vec<u64>,
    other: Vec<String>,
}

/// Clients pipelining `RPUSH list id` until `until`; each client has its own list.
fn rpush_clients(
    addr: SocketAddr,
    lists: Vec<String>,
    depth: usize,
    until: Instant,
) -> Vec<std::thread::JoinHandle<(String, Outcome)>> {
    lists
        .into_iter()
        .map(|list| {
            std::thread::spawn(move || {
                let mut c = RespConn::connect(addr);
                let mut o = Outcome::default();
                let mut id = 0u64;
                while Instant::now() < until {
                    let ids: Vec<u64> = (id..id + depth as u64).collect();
                    id += depth as u64;
                    let cmds: Vec<Vec<String>> = ids
                        .iter()
                        .map(|i| vec!["RPUSH".into(), list.clone(), i.to_string()])
                        .collect();
                    let sent = Instant::now();
                    c.send_pipeline(&cmds);
                    for &i in &ids {
                        match c.read().expect("every command gets a reply") {
                            Resp::Int(_) => o.acked.push(i),
                            // Timed out, or lost with the connection: it may have run.
                            Resp::Error(e)
                                if e.contains("upstream timeout")
                                    || e.contains("connection lost") =>
                            {
                                o.timed_out.push((i, sent))
                            }
                            Resp::Error(e)
                                if e.contains("unavailable") || e.contains("queue full") =>
                            {
                                o.refused.push(i)
                            }
                            r => o.other.push(format!("{r:?}")),
                        }
                    }
                }
                (list, o)
            })
        })
        .collect()
}

fn list_ids(shard: SocketAddr, list: &str) -> Vec<u64> {
    let mut c = RespConn::connect(shard);
    match c.call(&["LRANGE", list, "0", "-1"]) {
        Resp::Array(Some(items)) => items.iter().map(|v| v.text().parse().unwrap()).collect(),
        r => panic!("LRANGE {list}: {r:?}"),
    }
}

/// A frozen shard (SIGSTOP) must cost only its own keys: other clients are unaffected, its
/// clients get timeouts and then fast errors naming it, and after SIGCONT it executes nothing
/// that was still waiting when its client was told it timed out, nor anything refused.
#[test]
fn a_frozen_shard_fails_fast_and_runs_nothing_it_was_not_sent_in_time() {
    let a = redis();
    let b = redis();
    let rw = respway(&two_cluster_yaml(a.addr, b.addr, "300ms", ""), 1);
    let start = Instant::now();
    let until = start + Duration::from_millis(3500);
    let a_lists: Vec<String> = (0..8).map(|i| format!("a:list{i}")).collect();
    let b_lists: Vec<String> = (0..8).map(|i| format!("b:list{i}")).collect();
    let a_clients = rpush_clients(rw.addr, a_lists, 20, until);
    let b_clients = rpush_clients(rw.addr, b_lists, 20, until);
    // Load before the freeze: the timeline of the scenario (until, 3.5 s).
    std::thread::sleep(Duration::from_millis(500));
    a.signal("-STOP");
    let stopped = Instant::now();
    // The freeze itself (2.5 s), while the clients keep pushing.
    std::thread::sleep(Duration::from_millis(2500));
    let a_out: Vec<_> = a_clients.into_iter().map(|t| t.join().unwrap()).collect();
    let b_out: Vec<_> = b_clients.into_iter().map(|t| t.join().unwrap()).collect();
    // The info shows the errors counted by kind before the shard is back.
    let info = RespConn::connect(rw.addr).call(&["INFO", "proxy"]).text();
    a.signal("-CONT");
    // The shard is probed again when its backoff ends (at most 5 s): its keys are served
    // again without restarting anything.
    let resumed = Instant::now();
    let mut c = RespConn::connect(rw.addr);
    while c.call(&["GET", "a:probe"]).is_error() {
        assert!(
            resumed.elapsed() < slack(Duration::from_secs(8)),
            "never recovered after SIGCONT"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let recovery = resumed.elapsed();
    drop(rw);
    for (list, o) in &b_out {
        assert!(
            o.timed_out.is_empty() && o.refused.is_empty() && o.other.is_empty(),
            "{list}: the other shard's clients are unaffected"
        );
        assert_eq!(
            list_ids(b.addr, list),
            o.acked,
            "{list}: every acknowledged push, in order"
        );
    }
    let mut late = 0;
    let mut refused = 0;
    for (list, o) in &a_out {
        assert!(o.other.is_empty(), "{list}: {:?}", o.other);
        let executed = list_ids(a.addr, list);
        let set: std::collections::HashSet<u64> = executed.iter().copied().collect();
        for id in &o.acked {
            assert!(set.contains(id), "{list}: acknowledged push {id} lost");
        }
        let mut sorted = executed.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, executed, "{list}: pushes ran out of order");
        for id in &o.refused {
            assert!(!set.contains(id), "{list}: push {id} was refused but ran");
        }
        refused += o.refused.len();
        for (id, sent) in &o.timed_out {
            if set.contains(id) {
                late += 1;
                // Only what was written before the connection was found stuck may still run:
                // written within op_timeout + the stuck margin of the freeze. Not stretched by
                // slack(): three times that is longer than the freeze (2.5 s), which every push
                // of it would pass.
                assert!(
                    *sent < stopped + Duration::from_millis(300 + 500 + 250),
                    "{list}: push {id} sent {:?} after the freeze ran after its timeout",
                    sent.duration_since(stopped)
                );
            }
        }
    }
    assert!(
        refused > 0,
        "after the connection is found stuck, requests fail fast"
    );
    assert!(info.contains("upstream_stuck_connections:1"), "{info}");
    eprintln!(
        "frozen shard: {late} pushes ran after their timeout, {refused} refused, served again \
         {recovery:?} after SIGCONT"
    );
}

/// A shard that stops in the middle of a reply and keeps its socket open: the connection is
/// replaced, and the shard's keys are served again on a new one.
#[test]
fn a_shard_that_stalls_mid_reply_is_reconnected() {
    let fake = FakeShard::start(|i| {
        if i == 0 {
            FakeMode::StallAfter(4)
        } else {
            FakeMode::Normal
        }
    });
    let b = redis();
    let rw = respway_not_learning(&two_cluster_yaml(fake.addr, b.addr, "200ms", ""));
    let mut c = RespConn::connect(rw.addr);
    let start = Instant::now();
    let mut timeouts = 0;
    let recovered = loop {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never recovered ({timeouts} timeouts)"
        );
        match c.call(&["GET", "a:k"]) {
            Resp::Bulk(Some(v)) if timeouts > 0 => break v,
            Resp::Bulk(Some(_)) => {}
            Resp::Error(e) => {
                assert!(e.contains("shard"), "the error names the shard: {e}");
                timeouts += 1;
            }
            r => panic!("{r:?}"),
        }
    };
    assert_eq!(recovered, b"v");
    eprintln!(
        "stalled shard: {timeouts} requests failed, served again {:?} after the stall",
        start.elapsed()
    );
    assert!(fake.accepted.load(std::sync::atomic::Ordering::Relaxed) >= 2);
    // The other cluster never noticed.
    assert_eq!(c.call(&["SET", "b:k", "1"]), Resp::Simple("OK".into()));
}

/// A peer that answers garbage fails only its keys, and is reconnected with backoff, not in a
/// tight loop.
#[test]
fn a_shard_that_answers_garbage_is_reconnected_with_backoff() {
    let fake = FakeShard::start(|_| FakeMode::Garbage);
    let b = redis();
    let rw = respway_not_learning(&two_cluster_yaml(fake.addr, b.addr, "300ms", ""));
    let mut c = RespConn::connect(rw.addr);
    let until = Instant::now() + Duration::from_secs(2);
    let (mut errors, mut ok) = (0, 0);
    while Instant::now() < until {
        let r = c.call(&["SET", "a:k", "1"]);
        assert!(r.error().is_some_and(|e| e.contains("shard")), "{r:?}");
        errors += 1;
        assert_eq!(c.call(&["SET", "b:k", "1"]), Resp::Simple("OK".into()));
        ok += 1;
    }
    let accepted = fake.accepted.load(std::sync::atomic::Ordering::Relaxed);
    // Backoff 100 ms, doubling: about 5 attempts in 2 s (request-triggered retries are for
    // fast failures such as connection refused, not for a peer that answers).
    assert!(accepted <= 8, "{accepted} connections in 2 s: no backoff");
    eprintln!("garbage shard: {accepted} connections, {errors} errors, {ok} other-shard replies");
}

/// Shards `a` (keys `a:`) and `b` behind respway (op_timeout 300 ms), `a:k` written through
/// respway, then `a` killed: a client of respway and the dead shard's process (its port).
fn shard_a_written_then_killed() -> (Proc, Proc, Respway, RespConn) {
    let mut a = redis();
    let b = redis();
    let rw = respway(&two_cluster_yaml(a.addr, b.addr, "300ms", ""), 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["SET", "a:k", "1"]), Resp::Simple("OK".into()));
    a.kill();
    (a, b, rw, c)
}

/// A shard that is restarted is used by the first request after it is back.
/// Every health transition of an endpoint is logged once, both ways, whatever made it go
/// out: a frozen shard (SIGSTOP: requests time out, the reconnect's PING times out) was logged
/// out at each attempt and never logged back after SIGCONT (only a refused connect logged
/// `upstream reachable again`).
#[test]
fn a_frozen_shard_is_logged_out_once_and_back_once() {
    let shard = redis();
    let yaml = sharded_yaml(&[shard.addr], "{ policy: maglev }", true)
        .replace("op_timeout: 2s", "op_timeout: 300ms")
        .replace("connect_timeout: 500ms", "connect_timeout: 200ms");
    let rw = respway_process(&yaml, &[]);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["SET", "k", "v"]), Resp::Simple("OK".into()));
    shard.signal("-STOP");
    // Requests time out, then fail fast while the endpoint is out; a few backoff rounds pass.
    let frozen = Instant::now();
    while frozen.elapsed() < Duration::from_millis(2500) {
        assert!(c.call(&["GET", "k"]).is_error(), "a frozen shard answered");
        std::thread::sleep(Duration::from_millis(50));
    }
    shard.signal("-CONT");
    let resumed = Instant::now();
    while c.call(&["GET", "k"]).is_error() {
        assert!(
            resumed.elapsed() < Duration::from_secs(10),
            "never recovered after SIGCONT"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The log is written by the process: wait for the second line to reach the file.
    let endpoint = shard.addr.to_string();
    wait_until(
        Duration::from_secs(5),
        "the log line of the way back",
        || {
            rw.log()
                .lines()
                .any(|l| l.contains("upstream reachable again") && l.contains(&endpoint))
        },
    );
    // Then time for a repeated line to show, which none may.
    std::thread::sleep(Duration::from_millis(200));
    let log = rw.log();
    let lines = |what: &str| {
        log.lines()
            .filter(|l| l.contains(what) && l.contains(&endpoint))
            .count()
    };
    assert_eq!(lines("upstream unavailable"), 1, "{log}");
    assert_eq!(lines("upstream reachable again"), 1, "{log}");
}

#[test]
fn a_restarted_shard_serves_the_first_request_after_it_is_back() {
    let (a, _b, _rw, mut c) = shard_a_written_then_killed();
    let port = a.addr.port();
    // While it is down its keys fail fast; keep requests coming so the backoff grows.
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        let r = c.call(&["SET", "a:k", "2"]);
        assert!(
            r.error().is_some_and(|e| e.contains("unavailable")),
            "{r:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let _a = redis_on(port);
    assert_eq!(
        c.call(&["SET", "a:k", "3"]),
        Resp::Simple("OK".into()),
        "the first request after the shard is back"
    );
    assert_eq!(c.call(&["GET", "a:k"]).text(), "3");
}

/// Sends `SET a:k <n>` through respway every few milliseconds until the shard at `shard`
/// answers a direct `PING` with `+PONG` (ready), then returns the reply respway gives the
/// very next request. Bounded by `max`.
fn first_reply_after_ready(c: &mut RespConn, shard: SocketAddr, max: Duration) -> Resp {
    let until = Instant::now() + max;
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let r = c.call(&["SET", "a:k", &n.to_string()]);
        assert!(
            r == Resp::Simple("OK".into()) || r.error().is_some(),
            "{r:?}"
        );
        let ready = raw_command(shard, &["PING"]).is_ok_and(|r| r.starts_with("+PONG"));
        if ready {
            return c.call(&["SET", "a:k", "after"]);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the shard was not ready within {max:?}");
}

/// A shard restarted with an AOF of a few hundred MB answers `-LOADING` to the handshake
/// until it has loaded: respway treats that as "coming back", keeps trying every few tens of
/// milliseconds, and the first request after the shard is ready succeeds.
#[test]
fn a_shard_loading_its_aof_serves_the_first_request_after_it_is_ready() {
    let aof = [
        "--appendonly",
        "yes",
        "--enable-debug-command",
        "yes",
        "--appendfsync",
        "no",
    ];
    let mut a = redis_with(&aof);
    let b = redis();
    let port = a.addr.port();
    let mut direct = RespConn::connect(a.addr);
    // ~300 MB of values: loading takes a second or more.
    assert_eq!(
        direct.call(&["DEBUG", "POPULATE", "1500000", "pop", "200"]),
        Resp::Simple("OK".into())
    );
    direct.call(&["BGREWRITEAOF"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while direct
        .call(&["INFO", "persistence"])
        .text()
        .contains("aof_rewrite_in_progress:1")
        || direct
            .call(&["INFO", "persistence"])
            .text()
            .contains("aof_rewrite_scheduled:1")
    {
        assert!(Instant::now() < deadline, "AOF rewrite");
        std::thread::sleep(Duration::from_millis(50));
    }
    let rw = respway(&two_cluster_yaml(a.addr, b.addr, "300ms", ""), 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["SET", "a:k", "0"]), Resp::Simple("OK".into()));
    a.kill();
    let _a = redis_starting_on(port, &aof);
    let r = first_reply_after_ready(&mut c, a.addr, Duration::from_secs(60));
    assert_eq!(
        r,
        Resp::Simple("OK".into()),
        "the first request after the shard is ready"
    );
    assert_eq!(
        RespConn::connect(a.addr).call(&["DBSIZE"]),
        Resp::Int(1_500_001),
        "the AOF was loaded"
    );
}

/// A backend that accepts connections and closes them while it restarts (a process manager,
/// a load balancer in front of it) is "coming back" too: the backoff does not grow to seconds,
/// and the first request after the shard is ready succeeds.
#[test]
fn a_shard_that_closes_connections_while_restarting_serves_the_first_request_after() {
    let (a, _b, _rw, mut c) = shard_a_written_then_killed();
    let port = a.addr.port();
    // For 2 s the port accepts and closes every connection at once.
    let closer = std::net::TcpListener::bind(a.addr).expect("bind the shard's port");
    closer.set_nonblocking(true).unwrap();
    let until = Instant::now() + Duration::from_secs(2);
    let closing = std::thread::spawn(move || {
        while Instant::now() < until {
            match closer.accept() {
                Ok((s, _)) => drop(s),
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    });
    // Requests keep coming meanwhile and fail.
    while Instant::now() < until {
        let r = c.call(&["SET", "a:k", "2"]);
        assert!(r.error().is_some(), "{r:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    closing.join().unwrap();
    let _a = redis_starting_on(port, &[]);
    let r = first_reply_after_ready(&mut c, a.addr, Duration::from_secs(10));
    assert_eq!(
        r,
        Resp::Simple("OK".into()),
        "the first request after the shard is ready"
    );
}

/// Large replies pipelined over a slow link: each reply waits behind the ones before it on
/// the connection, longer than op_timeout in all, while bytes keep flowing. None of them is an
/// `upstream timeout` (Redis answered every one); op_timeout counts from the last reply byte.
#[test]
fn pipelined_large_replies_behind_each_other_do_not_time_out() {
    let shard = redis();
    let relay = Dribble::throttled(shard.addr, 4 << 20);
    let yaml = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    op_timeout: 300ms\n    routes: {{ catch_all: main }}\nclusters:\n  - name: main\n    connect_timeout: 1s\n    shards:\n      - endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
        relay.addr
    );
    let rw = respway(&yaml, 1);
    let value = "v".repeat(1 << 20);
    let mut direct = RespConn::connect(shard.addr);
    for i in 0..4 {
        assert_eq!(
            direct.call(&["SET", &format!("big{i}"), &value]),
            Resp::Simple("OK".into())
        );
    }
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["PING"]), Resp::Simple("PONG".into()));
    let started = Instant::now();
    let cmds: Vec<Vec<String>> = (0..4)
        .map(|i| vec!["GET".to_string(), format!("big{i}")])
        .collect();
    c.send_pipeline(&cmds);
    for i in 0..4 {
        match c.read().expect("reply") {
            Resp::Bulk(Some(v)) => assert_eq!(v.len(), 1 << 20, "reply {i}"),
            other => panic!("reply {i}: {:?}", other.error()),
        }
    }
    // The link is what made it slow: longer than op_timeout, as the test intends.
    assert!(started.elapsed() > Duration::from_millis(600));
    // A shard that sends nothing still times out at op_timeout (the stall tests above).
}

/// A client that pipelines large GETs and never reads its replies: respway stops reading it
/// at the buffer limit (its RSS stays within the bound plus buffers), other clients are
/// served, and after the stall timeout the client is disconnected, logged and counted.
#[test]
fn a_client_that_never_reads_is_bounded_and_then_disconnected() {
    let shard = redis();
    let yaml = sharded_yaml(&[shard.addr], "{ policy: maglev }", true).replace(
        "    op_timeout: 2s\n",
        "    op_timeout: 2s\n    client_buffer_limit: 16777216\n    client_stall_timeout: 2s\n",
    );
    let rw = respway_process(&yaml, &[]);
    let value = "x".repeat(100 * 1024);
    assert_eq!(
        RespConn::connect(rw.addr).call(&["SET", "big", &value]),
        Resp::Simple("OK".into())
    );
    let before = rss_of(rw.child.id());
    // 20,000 GETs of 100 KiB = 2 GB of replies, written by a thread that never reads.
    let mut hog = RespConn::connect(rw.addr);
    let mut out = Vec::new();
    for _ in 0..20_000 {
        encode_cmd(&mut out, &[b"GET", b"big"]);
    }
    let mut writer = hog.stream.try_clone().unwrap();
    let w = std::thread::spawn(move || {
        use std::io::Write;
        let _ = writer.write_all(&out);
    });
    let mut peak = 0;
    let mut other = RespConn::connect(rw.addr);
    // For 1.5 s while the hog is held at its limit, RSS sampled and another client served
    // every 20 ms (pacing).
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        peak = peak.max(rss_of(rw.child.id()));
        let k = format!("k{}", start.elapsed().as_micros());
        assert_eq!(other.call(&["SET", &k, "1"]), Resp::Simple("OK".into()));
        assert_eq!(
            other.call(&["GET", &k]).text(),
            "1",
            "other clients are served"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let grew = peak.saturating_sub(before);
    eprintln!("non-reading client: respway RSS {before} -> peak {peak} (+{grew} bytes)");
    assert!(
        grew < 16 * 1024 * 1024 + 32 * 1024 * 1024,
        "RSS grew by {grew} bytes with a 16 MiB client buffer limit"
    );
    // Held at the limit with nothing read for 2 s: disconnected (counted once it is).
    wait_until(
        Duration::from_secs(30),
        "the non-reading client's disconnection to be counted",
        || {
            other
                .call(&["INFO", "proxy"])
                .text()
                .contains("client_output_buffer_limit_disconnections:1")
        },
    );
    hog.stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut got = 0usize;
    let closed = loop {
        match hog.read() {
            Ok(_) => got += 1,
            Err(e) => break e,
        }
    };
    assert!(
        got < 20_000,
        "the client was disconnected before all its replies ({got})"
    );
    eprintln!("after {got} replies: {closed}");
    let _ = w.join();
    let info = other.call(&["INFO", "proxy"]).text();
    assert!(
        info.contains("client_output_buffer_limit_disconnections:1"),
        "{info}"
    );
    assert!(
        rw.log().contains("output buffer"),
        "the disconnection is logged"
    );
}

/// A client that writes a whole pipeline of large values before it reads anything (redis-py
/// `pipeline(transaction=False)`) completes as against Redis when its replies fit the bound.
#[test]
fn a_large_pipeline_written_before_reading_completes() {
    let shard = redis();
    let rw = respway(&sharded_yaml(&[shard.addr], "{ policy: maglev }", true), 1);
    let value = vec![b'v'; 4 << 20];
    let k = 8;
    let mut out = Vec::new();
    for i in 0..k {
        let key = format!("big{i}");
        encode_cmd(&mut out, &[b"SET", key.as_bytes(), &value]);
    }
    for i in 0..k {
        let key = format!("big{i}");
        encode_cmd(&mut out, &[b"GET", key.as_bytes()]);
    }
    for round in 0..2 {
        // SETs then GETs, and then interleaved SET/GET pairs.
        let mut c = RespConn::connect(rw.addr);
        let mut writer = c.stream.try_clone().unwrap();
        let bytes = if round == 0 {
            out.clone()
        } else {
            let mut o = Vec::new();
            for i in 0..k {
                let key = format!("mix{i}");
                encode_cmd(&mut o, &[b"SET", key.as_bytes(), &value]);
                encode_cmd(&mut o, &[b"GET", key.as_bytes()]);
            }
            o
        };
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let w = std::thread::spawn(move || {
            use std::io::Write;
            let r = writer.write_all(&bytes);
            let _ = done_tx.send(r.is_ok());
        });
        assert_eq!(
            done_rx.recv_timeout(Duration::from_secs(20)),
            Ok(true),
            "round {round}: respway stopped reading a pipeline whose replies fit the bound"
        );
        w.join().unwrap();
        for i in 0..2 * k {
            let r = c.read().expect("reply");
            let get = if round == 0 { i >= k } else { i % 2 == 1 };
            if get {
                assert!(
                    matches!(&r, Resp::Bulk(Some(v)) if v.len() == 4 << 20),
                    "round {round} reply {i}"
                );
            } else {
                assert_eq!(r, Resp::Simple("OK".into()));
            }
        }
    }
}

/// SIGTERM during pipelines: respway stops accepting, answers every command it has read, then
/// exits 0; a command it did not answer was not run.
#[test]
fn sigterm_answers_every_command_read_and_exits_zero() {
    let shards: Vec<Proc> = (0..2).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let mut rw = respway_process(&sharded_yaml(&addrs, "{ policy: maglev }", true), &[]);
    let addr = rw.addr;
    let lists: Vec<String> = (0..8).map(|i| format!("term:{i}")).collect();
    let started = std::sync::Arc::new(std::sync::Barrier::new(lists.len() + 1));
    let clients: Vec<_> = lists
        .iter()
        .cloned()
        .map(|list| {
            let started = started.clone();
            std::thread::spawn(move || {
                let mut c = RespConn::connect(addr);
                let mut acked = Vec::new();
                let mut id = 0u64;
                started.wait();
                'outer: loop {
                    let cmds: Vec<Vec<String>> = (id..id + 50)
                        .map(|i| vec!["RPUSH".into(), list.clone(), i.to_string()])
                        .collect();
                    if c.write_raw(&{
                        let mut o = Vec::new();
                        for cmd in &cmds {
                            let a: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
                            encode_cmd(&mut o, &a);
                        }
                        o
                    })
                    .is_err()
                    {
                        break;
                    }
                    for i in id..id + 50 {
                        match c.read() {
                            Ok(Resp::Int(_)) => acked.push(i),
                            Ok(r) => panic!("{list}: {r:?}"),
                            Err(_) => break 'outer,
                        }
                    }
                    id += 50;
                    assert!(id < 10_000_000);
                }
                (list, acked)
            })
        })
        .collect();
    started.wait();
    // Every client past its first batch of 50 (it writes the next once it has read all the
    // replies of the last) before the signal.
    wait_until(
        Duration::from_secs(10),
        "every client's first batch",
        || {
            lists.iter().all(|list| {
                let len: i64 = addrs
                    .iter()
                    .map(|&a| match RespConn::connect(a).call(&["LLEN", list]) {
                        Resp::Int(n) => n,
                        r => panic!("LLEN {list}: {r:?}"),
                    })
                    .sum();
                len > 50
            })
        },
    );
    rw.signal("-TERM");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = rw.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "respway did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "exit status {status:?}: {}", rw.log());
    let mut total = 0;
    for t in clients {
        let (list, acked) = t.join().unwrap();
        let on_shards: Vec<u64> = addrs.iter().flat_map(|&a| list_ids(a, &list)).collect();
        assert!(
            !acked.is_empty(),
            "{list}: the client made progress before SIGTERM"
        );
        assert!(
            on_shards == acked,
            "{list}: {} pushes applied on the shards, {} answered (the same ones, in order, \
             expected)",
            on_shards.len(),
            acked.len()
        );
        total += acked.len();
    }
    assert!(rw.log().contains("drained"), "{}", rw.log());
    eprintln!("SIGTERM: {total} pushes answered, none applied unanswered");
}

/// Wrong passwords are counted, and the connection is closed after `max_auth_failures`.
#[test]
fn failed_auth_attempts_are_counted_and_limited() {
    let shard = redis();
    let yaml = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    downstream_auth_password: pw-1\n    max_auth_failures: 3\n    routes: {{ catch_all: main }}\nclusters:\n  - name: main\n    shards:\n      - endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
        shard.addr
    );
    let rw = respway(&yaml, 1);
    let wrong = Resp::Error("WRONGPASS invalid username-password pair or user is disabled.".into());
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["AUTH", "pw-2"]), wrong);
    assert_eq!(
        c.call(&["AUTH", "pw-"]),
        wrong,
        "a prefix is not the password"
    );
    assert_eq!(c.call(&["HELLO", "2", "AUTH", "default", "x"]), wrong);
    assert!(c.read().is_err(), "closed after the third failure");
    let mut ok = RespConn::connect(rw.addr);
    assert_eq!(ok.call(&["AUTH", "pw-2"]), wrong);
    assert_eq!(ok.call(&["AUTH", "pw-1"]), Resp::Simple("OK".into()));
    let info = ok.call(&["INFO", "proxy"]).text();
    assert!(info.contains("auth_failures:4"), "{info}");
}

/// Starts respway with one listener, `edge`, on `address`, over the one shard at `shard`.
fn start_edge(address: &str, shard: SocketAddr) -> std::io::Result<respway::Server> {
    let yaml = format!(
        "listeners:\n  - name: edge\n    address: {address}\n    routes: {{ catch_all: main }}\nclusters:\n  - name: main\n    shards:\n      - endpoints: [ {{ address: \"{shard}\", role: primary }} ]\n"
    );
    let config = respway_xds::translate(&respway_xds::parse_yaml(&yaml).unwrap()).unwrap();
    respway::start(config, respway::Options::default())
}

/// A listener that cannot bind says which listener and which address.
#[test]
fn a_bind_failure_names_the_listener_and_address() {
    // respway::start: this test's sidecar shares the process (see sharing_process).
    let _sharing = sharing_process();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let shard = redis();
    // SO_REUSEPORT would share a port with another socket of the same user that also set
    // it; the std listener does not, so binding fails.
    let err = start_edge(&addr.to_string(), shard.addr).expect_err("the port is taken");
    let text = err.to_string();
    assert!(
        text.contains("listener \"edge\"") && text.contains(&addr.to_string()),
        "{text}"
    );
}

/// An address this host does not have is refused with the system's reason alone: the hint
/// about another process is only for an address in use.
#[test]
fn an_address_not_on_this_host_is_refused_without_the_in_use_hint() {
    // respway::start: this test's sidecar shares the process (see sharing_process).
    let _sharing = sharing_process();
    let shard = redis();
    // 192.0.2.0/24 is TEST-NET-1: documentation only, never assigned to a host.
    let err = start_edge("192.0.2.1:7000", shard.addr).expect_err("not this host's");
    assert_eq!(err.kind(), std::io::ErrorKind::AddrNotAvailable, "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with("listener \"edge\": cannot listen on 192.0.2.1:7000: "),
        "{text}"
    );
    assert!(!text.contains("another process"), "{text}");
}

/// A script that declares no keys would run on an arbitrary shard; it is refused unless the
/// listener allows it.
#[test]
fn keyless_scripts_are_refused_unless_allowed() {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let yaml = sharded_yaml(&addrs, "{ policy: maglev }", true);
    let rw = respway(&yaml, 1);
    let mut c = RespConn::connect(rw.addr);
    let r = c.call(&["EVAL", "redis.call('SET', 'kl', '1') return 1", "0"]);
    assert!(
        r.error()
            .is_some_and(|e| e.contains("EVAL with no keys is refused")),
        "{r:?}"
    );
    for cmd in [
        vec!["EVALSHA", "0000000000000000000000000000000000000000", "0"],
        vec!["FCALL", "f", "0"],
        vec!["EVAL_RO", "return 1", "0"],
    ] {
        let r = c.call(&cmd);
        assert!(
            r.error().is_some_and(|e| e.contains("no keys is refused")),
            "{cmd:?}: {r:?}"
        );
    }
    assert_eq!(
        c.call(&["EVAL", "return redis.call('SET', KEYS[1], '1')", "1", "kl2"]),
        Resp::Simple("OK".into()),
        "scripts with keys run"
    );
    assert_eq!(
        read_back(&addrs, "kl"),
        None,
        "the refused script ran nowhere"
    );
    let allowed = respway(
        &yaml.replace(
            "    op_timeout: 2s\n",
            "    op_timeout: 2s\n    allow_keyless_scripts: true\n",
        ),
        1,
    );
    let mut c = RespConn::connect(allowed.addr);
    assert_eq!(c.call(&["EVAL", "return 7", "0"]), Resp::Int(7));
}

/// A shard killed under load and restarted (with an fsync-always AOF, so Redis itself keeps
/// what it acknowledged): every acknowledged push is there afterwards, in order, and the
/// other shard's clients never noticed.
#[test]
fn a_shard_killed_and_restarted_under_load_loses_no_acknowledged_write() {
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut a = redis_with(&aof);
    let b = redis();
    let port = a.addr.port();
    let rw = respway(&two_cluster_yaml(a.addr, b.addr, "500ms", ""), 1);
    let until = Instant::now() + Duration::from_millis(2500);
    let a_clients = rpush_clients(
        rw.addr,
        (0..4).map(|i| format!("a:l{i}")).collect(),
        10,
        until,
    );
    let b_clients = rpush_clients(
        rw.addr,
        (0..4).map(|i| format!("b:l{i}")).collect(),
        10,
        until,
    );
    // Load before the kill, then the shard down for 700 ms: the timeline of the scenario.
    std::thread::sleep(Duration::from_millis(600));
    let _ = a.child.kill();
    let _ = a.child.wait();
    std::thread::sleep(Duration::from_millis(700));
    let restarted = Instant::now();
    let a2 = redis_on_with(port, &aof);
    let back = restarted.elapsed();
    let a_out: Vec<_> = a_clients.into_iter().map(|t| t.join().unwrap()).collect();
    let b_out: Vec<_> = b_clients.into_iter().map(|t| t.join().unwrap()).collect();
    for (list, o) in &b_out {
        assert!(
            o.timed_out.is_empty() && o.refused.is_empty() && o.other.is_empty(),
            "{list}"
        );
        assert_eq!(list_ids(b.addr, list).len(), o.acked.len(), "{list}");
    }
    let mut failed = 0;
    for (list, o) in &a_out {
        assert!(o.other.is_empty(), "{list}: {:?}", o.other);
        let executed = list_ids(a2.addr, list);
        let set: std::collections::HashSet<u64> = executed.iter().copied().collect();
        let lost: Vec<_> = o.acked.iter().filter(|i| !set.contains(i)).collect();
        assert!(
            lost.is_empty(),
            "{list}: acknowledged pushes lost: {}",
            lost.len()
        );
        for id in &o.refused {
            assert!(!set.contains(id), "{list}: push {id} was refused but ran");
        }
        let mut sorted = executed.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, executed, "{list}: out of order");
        assert!(
            o.acked.len() > 10,
            "{list}: pushes were acknowledged after the restart"
        );
        failed += o.refused.len() + o.timed_out.len();
    }
    eprintln!(
        "kill/restart: shard back after {back:?}; {failed} requests failed while it was down"
    );
    drop(rw);
    drop(a);
}

/// Changing `connections_per_endpoint` (or anything that gives an endpoint a new pool) while
/// clients pipeline must not reorder a client's commands: a session switches to the new
/// configuration only once its commands in flight on the old one are answered.
#[test]
fn order_holds_across_config_swaps_that_replace_pools() {
    let shards: Vec<Proc> = (0..2).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let yaml = |cpe: usize| {
        sharded_yaml(&addrs, "{ policy: maglev }", true).replace(
            "    connect_timeout: 500ms\n",
            &format!("    connect_timeout: 500ms\n    connections_per_endpoint: {cpe}\n"),
        )
    };
    let config = |y: &str| respway_xds::translate(&respway_xds::parse_yaml(y).unwrap()).unwrap();
    let rw = respway(&yaml(1), 1);
    let addr = rw.addr;
    // Each client writes without waiting for replies (a writer and a reader thread), so it
    // always has commands in flight when a swap lands; 64 KiB values keep the old connection's
    // write buffer full, so some of them are still queued when the new pool is used.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut c = RespConn::connect(addr);
                let key = format!("swap:{t}");
                let mut w = c.stream.try_clone().unwrap();
                let writer = std::thread::spawn(move || {
                    use std::io::Write;
                    let big = vec![b'x'; 64 * 1024];
                    let mut written = 0i64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) && written < 1_000_000 {
                        let mut chunk = Vec::new();
                        encode_cmd(&mut chunk, &[b"SET", key.as_bytes(), &big]);
                        encode_cmd(&mut chunk, &[b"SET", key.as_bytes(), b"0"]);
                        encode_cmd(&mut chunk, &[b"INCR", key.as_bytes()]);
                        w.write_all(&chunk).unwrap();
                        written += 3;
                    }
                    written
                });
                let mut n = 0i64;
                let check = |c: &mut RespConn, n: &mut i64| {
                    *n += 1;
                    let r = c.read().expect("reply");
                    if *n % 3 == 0 {
                        assert_eq!(
                            r,
                            Resp::Int(1),
                            "swap:{t}: INCR ran before the SETs before it"
                        );
                    }
                };
                while !writer.is_finished() {
                    check(&mut c, &mut n);
                }
                let written = writer.join().unwrap();
                while n < written {
                    check(&mut c, &mut n);
                }
                n
            })
        })
        .collect();
    let server = rw.server.as_ref().unwrap();
    for step in 0..40 {
        // Pacing: a swap every 25 ms while the clients pipeline.
        std::thread::sleep(Duration::from_millis(25));
        server.apply(config(&yaml(1 + step % 3))).expect("apply");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in clients {
        assert!(c.join().expect("a client saw its INCRs out of order") > 0);
    }
}

/// A shard that is shut down: the first requests after it went away were answered
/// `connection lost: connection closed by server` when respway had not yet read the shard's
/// close (they were never written). They are not sent on a closed connection: respway
/// reconnects first and says what happened, `Connection refused` (the twemproxy suite's
/// `test_multi_delete_on_backend_down` expects that text).
#[test]
fn requests_after_a_shard_shut_down_say_connection_refused() {
    let mut a = redis();
    let b = redis();
    let port = a.addr.port();
    let rw = respway(&two_cluster_yaml(a.addr, b.addr, "500ms", ""), 1);
    let mut c = RespConn::connect(rw.addr);
    let mut texts = Vec::new();
    for round in 0..10 {
        if round > 0 {
            a = redis_on(port);
        }
        // A pooled connection to the shard, idle.
        let deadline = Instant::now() + Duration::from_secs(5);
        while c.call(&["GET", "a:k"]).error().is_some() {
            assert!(Instant::now() < deadline, "the shard never served");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut direct = RespConn::connect(a.addr);
        direct.send(&["SHUTDOWN", "NOSAVE"]);
        // Gone once its connection closes.
        let _ = direct.read();
        let r = c.call(&["GET", "a:k"]);
        texts.push(r.error().unwrap_or("(a reply)").to_string());
        a.kill();
    }
    // A request respway wrote just before it read the shard's close may end as `connection
    // closed by server` without the refusal being confirmed (under a loaded CI machine the
    // quick connect check found the port not refusing in 1 of 10 rounds, cause not found).
    // The defect this guards against said that for every request in every round; at most 2
    // of 10 such rounds are tolerated, every other text must name the refusal or a reset.
    let unconfirmed = texts
        .iter()
        .filter(|t| t.ends_with("connection lost: connection closed by server"))
        .count();
    assert!(unconfirmed <= 2, "{texts:#?}");
    for t in &texts {
        assert!(
            t.contains("Connection refused")
                || t.contains("reset by peer")
                || t.contains("Broken pipe")
                || t.ends_with("connection lost: connection closed by server"),
            "{texts:#?}"
        );
    }
}
