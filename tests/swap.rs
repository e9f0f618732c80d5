//! Hot swap of the configuration under load: every reply stays correct, connections to
//! endpoints that remain are reused, an invalid configuration is refused and the last good
//! one keeps serving.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;

fn yaml(shards: &[SocketAddr], shadow: SocketAddr, step: usize) -> String {
    // Each step changes something: shard count, a hot-key rule, a mirror, a prefix route.
    let n = if step.is_multiple_of(2) { 3 } else { 4 };
    let hot = if step.is_multiple_of(3) {
        "    hot_keys:\n      - { prefix: HOT_ }\n"
    } else {
        ""
    };
    let mirror = if step % 4 == 1 {
        "      catch_all_mirrors:\n        - { cluster: shadow, mode: dual_write }\n"
    } else {
        ""
    };
    let prefix = if step % 5 == 2 {
        "      prefixes:\n        - { prefix: \"side:\", cluster: shadow }\n"
    } else {
        ""
    };
    let mut y = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    routes:\n      catch_all: main\n{mirror}{prefix}clusters:\n  - name: main\n{hot}    shards:\n"
    );
    for (i, a) in shards.iter().take(n).enumerate() {
        y.push_str(&format!(
            "      - name: s{i}\n        endpoints: [ {{ address: \"{a}\", role: primary }} ]\n"
        ));
    }
    y.push_str(&format!(
        "  - name: shadow\n    shards:\n      - endpoints: [ {{ address: \"{shadow}\", role: primary }} ]\n"
    ));
    y
}

fn config(y: &str) -> respway_filters::model::Config {
    respway_xds::translate(&respway_xds::parse_yaml(y).unwrap()).unwrap()
}

fn total_connections(addr: SocketAddr) -> u64 {
    let mut c = sync_client(addr);
    let info: String = redis::cmd("INFO").arg("stats").query(&mut c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

#[test]
fn config_swaps_under_load_fail_no_request() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let shadow = redis();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let rw = respway(&yaml(&addrs, shadow.addr, 0), 2);
    let server = rw.server.as_ref().unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..4)
        .map(|t| {
            let (stop, done, addr) = (stop.clone(), done.clone(), rw.addr);
            std::thread::spawn(move || {
                let mut c = sync_client(addr);
                let deadline = Instant::now() + Duration::from_secs(20);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let key = format!("t{t}:k{}", i % 500);
                    let val = format!("v{i}");
                    // SET and GET in one pipeline: one write, decoded in one batch, so they
                    // run on the same chain even when a swap moves the key to another shard.
                    let (ok, got): (String, String) = redis::pipe()
                        .cmd("SET")
                        .arg(&key)
                        .arg(&val)
                        .cmd("GET")
                        .arg(&key)
                        .query(&mut c)
                        .unwrap_or_else(|e| panic!("request failed at {i}: {e}"));
                    assert_eq!(ok, "OK");
                    assert_eq!(got, val, "wrong reply for {key}");
                    i += 1;
                }
                done.fetch_add(i, Ordering::Relaxed);
            })
        })
        .collect();
    // Let the pools connect, then count connections: swaps must not add any.
    std::thread::sleep(Duration::from_millis(300));
    let before: Vec<u64> = addrs[..3].iter().map(|a| total_connections(*a)).collect();
    let mut version = 1;
    for step in 1..=24 {
        std::thread::sleep(Duration::from_millis(100));
        version = server
            .apply(config(&yaml(&addrs, shadow.addr, step)))
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
    }
    assert_eq!(version, 25);
    // An invalid configuration is refused; the last good one keeps serving.
    let mut bad = config(&yaml(&addrs, shadow.addr, 0));
    bad.listeners[0].routes.catch_all = Some("nope".into());
    let err = server.apply(bad).unwrap_err();
    assert!(err.contains("nope"), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("a client saw a failed or wrong reply");
    }
    let n = done.load(Ordering::Relaxed);
    assert!(n > 200, "only {n} round trips");
    let after: Vec<u64> = addrs[..3].iter().map(|a| total_connections(*a)).collect();
    for (b, a) in before.iter().zip(&after) {
        // +1 for our own INFO connection.
        assert!(
            a - b <= 1,
            "swaps opened new connections: {before:?} -> {after:?}"
        );
    }
    // The mirror was on for some steps: the shadow cluster got copies.
    assert!(dbsize(shadow.addr) > 0);
}
