//! A Redis Cluster behind respway: shards discovered from a seed node (`CLUSTER SHARDS`),
//! keys placed by slot on the owning primary, multi-key commands split by slot, and the
//! cluster's changes followed (resharding with `MOVED`/`ASK`, failovers), against real
//! `redis-server --cluster-enabled yes` nodes joined by `redis-cli --cluster create`.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::*;

/// One listener over Redis Cluster `main` discovered from `seed`, refreshed every second.
fn yaml(seed: SocketAddr) -> String {
    format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    op_timeout: 2s\n    routes:\n      catch_all: main\n\
         clusters:\n  - name: main\n    connect_timeout: 500ms\n    redis_cluster:\n      seeds: [\"{seed}\"]\n      cluster_refresh_rate: 1s\n"
    )
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

/// Keys land on the primary that owns their slot, reads and multi-key commands over many
/// slots work, and nobody sees a redirection.
#[test]
fn keys_are_placed_on_the_primary_that_owns_their_slot() {
    let cluster = RedisCluster::start(3, 1);
    let rw = respway_process(&yaml(cluster.addrs()[0]), &[]);
    let mut c = RespConn::connect(rw.addr);
    assert!(
        until(Duration::from_secs(10), || c.call(&["SET", "probe", "1"])
            == Resp::Simple("OK".into())),
        "respway serves the cluster"
    );
    for i in 0..300 {
        let k = format!("k:{i}");
        assert_eq!(
            c.call(&["SET", &k, &i.to_string()]),
            Resp::Simple("OK".into()),
            "{k}"
        );
    }
    // Each key is on the primary the cluster says owns its slot (read there with no MOVED).
    for i in (0..300).step_by(7) {
        let k = format!("k:{i}");
        let slot = match RespConn::connect(cluster.addrs()[0]).call(&["CLUSTER", "KEYSLOT", &k]) {
            Resp::Int(n) => n as u16,
            other => panic!("KEYSLOT {other:?}"),
        };
        let owner = RedisCluster::owner(cluster.addrs()[0], slot).expect("an owner");
        assert_eq!(
            RespConn::connect(owner).call(&["GET", &k]),
            Resp::bulk(i.to_string()),
            "{k} on its owner {owner}"
        );
    }
    // MGET and MSET over many slots, DEL of many keys.
    let keys: Vec<String> = (0..50).map(|i| format!("k:{i}")).collect();
    let mut mget = vec!["MGET".to_string()];
    mget.extend(keys.iter().cloned());
    let got = c.call(&mget.iter().map(String::as_str).collect::<Vec<_>>());
    let want = Resp::Array(Some((0..50).map(|i| Resp::bulk(i.to_string())).collect()));
    assert_eq!(got, want);
    let mut mset = vec!["MSET".to_string()];
    for i in 0..40 {
        mset.push(format!("m:{i}"));
        mset.push(format!("v{i}"));
    }
    assert_eq!(
        c.call(&mset.iter().map(String::as_str).collect::<Vec<_>>()),
        Resp::Simple("OK".into())
    );
    let mut del = vec!["DEL".to_string()];
    del.extend((0..40).map(|i| format!("m:{i}")));
    assert_eq!(
        c.call(&del.iter().map(String::as_str).collect::<Vec<_>>()),
        Resp::Int(40)
    );
    // A transaction on one hashtag.
    assert_eq!(c.call(&["MULTI"]), Resp::Simple("OK".into()));
    c.call(&["SET", "{user:1}:a", "1"]);
    c.call(&["INCR", "{user:1}:b"]);
    assert_eq!(
        c.call(&["EXEC"]),
        Resp::Array(Some(vec![Resp::Simple("OK".into()), Resp::Int(1)]))
    );
}
