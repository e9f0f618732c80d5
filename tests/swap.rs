//! Hot swap of the configuration under load: every reply stays correct, connections to
//! endpoints that remain are reused, an invalid configuration is refused and the last good
//! one keeps serving.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;

fn yaml(shards: &[SocketAddr], shadow: SocketAddr, step: usize) -> String {
    churn_yaml("127.0.0.1:0", shards, shadow, step)
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

    let load = set_get_load(rw.addr, 4, Duration::from_secs(20));
    // Let the pools connect, then count connections: swaps must not add any. Every session
    // has used every shard after 50 round trips (50 keys over 3 shards each).
    load.wait_round_trips(
        50,
        "the load's sessions to use every shard before the swaps",
    );
    let before: Vec<u64> = addrs[..3].iter().map(|a| total_connections(*a)).collect();
    let mut version = 1;
    for step in 1..=24 {
        // Pacing: a swap every 100 ms under the load.
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
    // The load keeps running on the last good configuration.
    load.wait_round_trips(50, "round trips on the last good configuration");
    let n = load.finish();
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
