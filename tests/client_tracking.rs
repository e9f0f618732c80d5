//! Client-side caching through the sidecar: `CLIENT TRACKING on` answered by respway, and
//! invalidation pushes (RESP3 `>2 invalidate [keys]`) driven by the sidecar's own tracking —
//! writes through any session of the sidecar at once, writes by other clients of the shards
//! through the near cache's trackers — against real redis-server processes, with a raw RESP3
//! client and with redis-py's own client-side cache.
//!
//! Each sidecar is a process of its own: a flush announced by one test's sidecar must not
//! reach another test's sessions (the announcements are process-wide, as a sidecar is).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;

/// One listener (advertising Redis 7.4, which redis-py's cache asks for) over one cluster
/// `main` of `shards`, with `near_cache` (a YAML mapping) when given.
fn yaml(shards: &[SocketAddr], near_cache: Option<&str>) -> String {
    let mut y = sharded_yaml(shards, "{ policy: modula }", false);
    y = y.replace(
        "    op_timeout: 2s\n",
        "    op_timeout: 2s\n    advertised_redis_version: \"7.4.0\"\n    admin_commands: true\n",
    );
    if let Some(nc) = near_cache {
        y = y.replace(
            "    connect_timeout: 500ms\n",
            &format!("    connect_timeout: 500ms\n    near_cache: {nc}\n"),
        );
    }
    y
}

/// A RESP3 connection to `addr` with tracking turned on by `tracking` (the arguments after
/// `CLIENT TRACKING`).
fn tracking_client(addr: SocketAddr, tracking: &[&str]) -> RespConn {
    let mut c = RespConn::connect(addr);
    let hello = c.call(&["HELLO", "3"]);
    assert!(!hello.is_error(), "HELLO 3: {hello:?}");
    let mut cmd = vec!["CLIENT", "TRACKING"];
    cmd.extend_from_slice(tracking);
    assert_eq!(c.call(&cmd), Resp::Simple("OK".into()), "{cmd:?}");
    c
}

/// The next message, if one comes within `wait` (the read timeout is restored).
fn next_within(c: &mut RespConn, wait: Duration) -> Option<Resp> {
    c.stream.set_read_timeout(Some(wait)).expect("timeout");
    let r = c.read().ok();
    c.stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    r
}

/// An invalidation push naming `keys` (`None`: every key, a flush).
fn push(keys: Option<&[&str]>) -> Resp {
    Resp::Other(
        b'>',
        vec![
            Resp::bulk("invalidate"),
            match keys {
                Some(k) => Resp::Array(Some(k.iter().map(Resp::bulk).collect())),
                None => Resp::Bulk(None),
            },
        ],
    )
}

/// Waits (2 s at most) for the push naming `keys`, skipping nothing: the next message must be
/// it.
fn expect_push(c: &mut RespConn, keys: Option<&[&str]>, what: &str) {
    let got = next_within(c, Duration::from_secs(2));
    assert_eq!(got, Some(push(keys)), "{what}");
}

/// Reads what comes within 300 ms: only repeats of the announcement of `keys` may.
fn settle(c: &mut RespConn, keys: Option<&[&str]>) {
    while let Some(m) = next_within(c, Duration::from_millis(300)) {
        assert_eq!(m, push(keys), "only a repeated announcement");
    }
}

/// Every string and number of a reply, in order, separated by spaces.
fn words(r: &Resp) -> String {
    fn walk(r: &Resp, out: &mut Vec<String>) {
        match r {
            Resp::Simple(s) => out.push(s.clone()),
            Resp::Bulk(Some(b)) => out.push(String::from_utf8_lossy(b).into_owned()),
            Resp::Int(n) => out.push(n.to_string()),
            Resp::Array(Some(items)) | Resp::Other(_, items) => {
                items.iter().for_each(|i| walk(i, out))
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(r, &mut out);
    out.join(" ")
}

/// Waits until every tracker of the sidecar is subscribed.
fn trackers_up(rw: SocketAddr, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = RespConn::connect(rw).call(&["INFO", "nearcache"]).text();
        if text.contains(&format!("trackers_up={n},"))
            || text.ends_with(&format!("trackers_up={n}\r\n"))
        {
            return;
        }
        assert!(Instant::now() < deadline, "{n} trackers up: {text}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A key read with tracking on is announced when anyone changes it: another client of the
/// shard (through the tracker), another session of the sidecar (at once), the reader itself
/// (after its write's reply), and a `FLUSHDB` through the sidecar announces every key.
/// `CLIENT TRACKING off` ends the announcements.
#[test]
fn a_key_read_with_tracking_on_is_announced_when_anyone_writes_it() {
    let shard = redis();
    let rw = respway_process(&yaml(&[shard.addr], Some("{ mode: tracked }")), &[]);
    trackers_up(rw.addr, 1);
    let mut direct = RespConn::connect(shard.addr);
    direct.call(&["SET", "ctk:a", "v1"]);
    let mut c = tracking_client(rw.addr, &["on"]);
    let mut other = RespConn::connect(rw.addr);

    // Another client of the shard writes: Redis tells the sidecar's tracker. (The read is
    // the first on the worker's connection to the shard, which opens for it: it carries the
    // tracking redirect itself, so it is followed, not announced at once.)
    assert_eq!(c.call(&["GET", "ctk:a"]), Resp::bulk("v1"));
    assert_eq!(next_within(&mut c, Duration::from_millis(300)), None);
    direct.call(&["SET", "ctk:a", "v2"]);
    expect_push(&mut c, Some(&["ctk:a"]), "a direct write of a key read");

    // Announced once: a second write of a key not read since is not announced again.
    direct.call(&["SET", "ctk:a", "v3"]);
    assert_eq!(next_within(&mut c, Duration::from_millis(300)), None);

    // Another session of the sidecar writes it.
    assert_eq!(c.call(&["GET", "ctk:a"]), Resp::bulk("v3"));
    assert_eq!(
        other.call(&["SET", "ctk:a", "v4"]),
        Resp::Simple("OK".into())
    );
    expect_push(&mut c, Some(&["ctk:a"]), "a write through another session");
    // Redis tells the tracker of that write too: its invalidation, which may still be on the
    // way, finds the key no longer followed (it would be announced again if the key were
    // read again before it arrived: a repeat, never a wrong order).
    settle(&mut c, Some(&["ctk:a"]));

    // The reader writes it: the write's reply, then the announcement (as Redis 7.2 and
    // later order them).
    assert_eq!(c.call(&["GET", "ctk:a"]), Resp::bulk("v4"));
    assert_eq!(c.call(&["SET", "ctk:a", "v5"]), Resp::Simple("OK".into()));
    expect_push(&mut c, Some(&["ctk:a"]), "the reader's own write");

    // A key never read is not announced (default mode).
    other.call(&["SET", "ctk:never-read", "x"]);
    assert_eq!(next_within(&mut c, Duration::from_millis(300)), None);

    // FLUSHDB through the sidecar: every key.
    assert_eq!(c.call(&["GET", "ctk:a"]), Resp::bulk("v5"));
    assert_eq!(other.call(&["FLUSHDB"]), Resp::Simple("OK".into()));
    expect_push(&mut c, None, "FLUSHDB announces a flush");
    // Once: Redis's own flush message to the tracker comes too, and finds nothing followed.
    assert_eq!(next_within(&mut c, Duration::from_millis(300)), None);

    // Counted (INFO proxy; the same counters as the metrics).
    let info = RespConn::connect(rw.addr).call(&["INFO", "proxy"]).text();
    let field = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no {name} in {info}"))
            .trim()
            .parse()
            .expect("a number")
    };
    assert_eq!(field("client_tracking_sessions"), 1);
    assert_eq!(field("client_tracking_announced_keys"), 3, "{info}");
    assert_eq!(field("client_tracking_unfollowed_reads"), 0, "{info}");
    assert_eq!(field("client_tracking_flushes"), 1, "{info}");

    // Off: nothing more.
    assert_eq!(c.call(&["GET", "ctk:a"]), Resp::Bulk(None));
    assert_eq!(
        c.call(&["CLIENT", "TRACKING", "off"]),
        Resp::Simple("OK".into())
    );
    direct.call(&["SET", "ctk:a", "after-off"]);
    other.call(&["SET", "ctk:a", "after-off-2"]);
    assert_eq!(next_within(&mut c, Duration::from_millis(300)), None);
    assert_eq!(c.call(&["PING"]), Resp::Simple("PONG".into()));
    let info = RespConn::connect(rw.addr).call(&["INFO", "proxy"]).text();
    assert!(info.contains("client_tracking_sessions:0"), "{info}");
}

/// Where the sidecar cannot follow a key (a cluster without a tracked near cache), a read
/// with tracking on is announced right after its reply: the client's cache never keeps a
/// value nobody would announce a change of.
#[test]
fn a_key_nobody_follows_is_announced_right_after_its_read() {
    let shard = redis();
    let rw = respway_process(&yaml(&[shard.addr], None), &[]);
    let mut c = tracking_client(rw.addr, &["on"]);
    RespConn::connect(shard.addr).call(&["SET", "ctk:u", "v"]);
    assert_eq!(c.call(&["GET", "ctk:u"]), Resp::bulk("v"));
    expect_push(&mut c, Some(&["ctk:u"]), "an untracked read");
    // In a pipeline: the announcement after the replies owed when it is made (one for
    // both reads of the key).
    c.send_pipeline(&[vec!["GET", "ctk:u"], vec!["STRLEN", "ctk:u"]]);
    let got: Vec<Resp> = (0..3).map(|_| c.read().expect("message")).collect();
    assert_eq!(
        got,
        [Resp::bulk("v"), Resp::Int(1), push(Some(&["ctk:u"]))],
        "replies first, then one announcement"
    );
    assert_eq!(next_within(&mut c, Duration::from_millis(300)), None);
}

/// The options and the refusals: RESP2 and `REDIRECT` (respway pushes on the client's own
/// connection only), `PREFIX` without `BCAST`, `CLIENT CACHING` outside `OPTIN`/`OPTOUT`;
/// `OPTIN` follows only the reads after `CLIENT CACHING yes`; `BCAST PREFIX` announces every
/// write under the prefix made through the sidecar; `CLIENT TRACKINGINFO` and `GETREDIR`.
#[test]
fn tracking_options_follow_redis() {
    let shard = redis();
    let rw = respway_process(&yaml(&[shard.addr], Some("{ mode: tracked }")), &[]);
    trackers_up(rw.addr, 1);
    let mut direct = RespConn::connect(shard.addr);
    let mut other = RespConn::connect(rw.addr);

    let mut two = RespConn::connect(rw.addr);
    let refused = two.call(&["CLIENT", "TRACKING", "on"]);
    assert!(
        refused.error().is_some_and(|e| e.contains("RESP3")),
        "{refused:?}"
    );
    let refused = two.call(&["CLIENT", "TRACKING", "on", "REDIRECT", "7"]);
    assert!(
        refused.error().is_some_and(|e| e.contains("REDIRECT")),
        "{refused:?}"
    );
    assert_eq!(
        two.call(&["CLIENT", "GETREDIR"]),
        Resp::Int(-1),
        "not tracking"
    );

    let mut c = RespConn::connect(rw.addr);
    c.call(&["HELLO", "3"]);
    assert_eq!(
        c.call(&["CLIENT", "TRACKING", "on", "PREFIX", "p:"]),
        Resp::Error("ERR PREFIX option requires BCAST mode to be enabled".into())
    );
    assert_eq!(
        c.call(&["CLIENT", "TRACKING", "on", "OPTIN", "OPTOUT"]),
        Resp::Error("ERR You can't specify both OPTIN mode and OPTOUT mode".into())
    );
    assert_eq!(
        c.call(&["CLIENT", "TRACKING", "on", "BCAST", "OPTIN"]),
        Resp::Error("ERR OPTIN and OPTOUT are not compatible with BCAST".into())
    );
    assert_eq!(
        c.call(&["CLIENT", "CACHING", "yes"]),
        Resp::Error(
            "ERR CLIENT CACHING can be called only when the client is in tracking mode with \
             OPTIN or OPTOUT mode enabled"
                .into()
        )
    );

    // OPTIN: only the read right after CLIENT CACHING yes is followed.
    assert_eq!(
        c.call(&["CLIENT", "TRACKING", "on", "OPTIN"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(c.call(&["CLIENT", "GETREDIR"]), Resp::Int(0));
    direct.call(&["MSET", "cto:x", "1", "cto:y", "2"]);
    assert_eq!(c.call(&["GET", "cto:x"]), Resp::bulk("1"));
    assert_eq!(
        c.call(&["CLIENT", "CACHING", "yes"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(c.call(&["GET", "cto:y"]), Resp::bulk("2"));
    direct.call(&["MSET", "cto:x", "10", "cto:y", "20"]);
    expect_push(
        &mut c,
        Some(&["cto:y"]),
        "only the key read after CACHING yes",
    );
    assert_eq!(next_within(&mut c, Duration::from_millis(300)), None);
    let text = words(&c.call(&["CLIENT", "TRACKINGINFO"]));
    assert_eq!(text, "flags on optin redirect 0 prefixes");

    // BCAST PREFIX: every write under the prefix through the sidecar, read or not (BCAST
    // cannot be switched on while tracking is on).
    assert!(c
        .call(&["CLIENT", "TRACKING", "on", "BCAST"])
        .error()
        .is_some_and(|e| e.contains("switch BCAST")));
    assert_eq!(
        c.call(&["CLIENT", "TRACKING", "off"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(
        c.call(&["CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "ctb:"]),
        Resp::Simple("OK".into())
    );
    other.call(&["SET", "ctb:1", "x"]);
    expect_push(&mut c, Some(&["ctb:1"]), "a write under the prefix");
    other.call(&["SET", "elsewhere:1", "x"]);
    assert_eq!(next_within(&mut c, Duration::from_millis(300)), None);
    let text = words(&c.call(&["CLIENT", "TRACKINGINFO"]));
    assert_eq!(text, "flags on bcast redirect 0 prefixes ctb:");
}

/// Runs a client script (`tests/clients/`) against a sidecar with a tracked near cache over
/// one shard: `--addr` the sidecar, `--shard` the shard behind it.
fn client_side_caching(program: &str, script: &str) {
    let shard = redis();
    let rw = respway_process(&yaml(&[shard.addr], Some("{ mode: tracked }")), &[]);
    trackers_up(rw.addr, 1);
    let shard_addr = shard.addr.to_string();
    let rw_addr = rw.addr.to_string();
    let (ok, out) = run_bounded(
        program,
        &[script, "--addr", &rw_addr, "--shard", &shard_addr],
    );
    eprintln!("{out}");
    assert!(ok, "{script} failed:\n{out}");
}

/// redis-py's client-side cache (`protocol=3`, `cache_config`) through the sidecar: repeated
/// reads are answered by the client's cache, and a write by another client of the shard is
/// seen once the sidecar's announcement arrives.
#[test]
fn redis_py_client_side_caching_sees_invalidations() {
    client_side_caching("python3", "py_csc.py");
}

/// node-redis's client-side cache (`RESP: 3`, `clientSideCache`) through the sidecar: the
/// same scenarios as redis-py's.
#[test]
fn node_redis_client_side_caching_sees_invalidations() {
    client_side_caching("node", "node_csc.mjs");
}

/// A `FLUSHALL` made directly on the shard, with entries of the key on both workers: by the
/// time a tracking client is told (`>2 invalidate _`), no worker serves the pre-flush value,
/// round after round.
#[test]
fn a_direct_flush_drops_every_worker_s_entries_before_tracking_clients_are_told() {
    let shard = redis();
    let rw = Spawn::new(env!("CARGO_BIN_EXE_respway"))
        .config(
            "--config",
            "respway.yaml",
            &yaml(&[shard.addr], Some("{ mode: tracked }")),
        )
        .args(["--workers", "2"])
        .start();
    trackers_up(rw.addr, 2);
    let mut direct = RespConn::connect(shard.addr);
    let mut told = tracking_client(rw.addr, &["on"]);
    // Sessions are spread over the workers: some on each.
    let mut readers: Vec<RespConn> = (0..8).map(|_| RespConn::connect(rw.addr)).collect();
    let mut stale = Vec::new();
    for round in 0..400 {
        let v = format!("v{round}");
        assert_eq!(
            direct.call(&["SET", "ctk:f", &v]),
            Resp::Simple("OK".into())
        );
        // Read on every session until it answers the new value (the direct write's
        // invalidation of the nil read last round is on its way), and once more: cached on
        // both workers (a second read admits).
        for r in &mut readers {
            wait_until(Duration::from_secs(2), "the new value read", || {
                r.call(&["GET", "ctk:f"]) == Resp::bulk(&v)
            });
            assert_eq!(r.call(&["GET", "ctk:f"]), Resp::bulk(&v));
        }
        // Followed by the tracking client: a flush is announced to it.
        assert_eq!(told.call(&["GET", "ctk:f"]), Resp::bulk(&v));
        assert_eq!(direct.call(&["FLUSHALL"]), Resp::Simple("OK".into()));
        expect_push(&mut told, None, "the flush announced");
        for r in &mut readers {
            let got = r.call(&["GET", "ctk:f"]);
            if got != Resp::Bulk(None) {
                stale.push((round, got));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "pre-flush values after the push: {stale:?}"
    );
}
