//! The near cache and keys that expire: an entry of a key with a TTL is never served after
//! the key expired in Redis (the fill learns the key's TTL on the same connection, right
//! after the read), in every mode.

use std::time::{Duration, Instant};

use crate::support::*;

/// Keys set with 100–500 ms TTLs, each read in a loop through the sidecar (a second read is
/// served by the cache) until well past its expiry: no read sent after the key expired in
/// Redis (after its `SET` was acknowledged and its TTL passed, plus 2 ms for the
/// millisecond clocks) is answered with a value.
fn no_value_past_its_ttl(mode: &str) {
    let shard = redis();
    let mut y = sharded_yaml(&[shard.addr], "{ policy: modula }", false);
    y = y.replace(
        "    connect_timeout: 500ms\n",
        &format!("    connect_timeout: 500ms\n    near_cache: {{ mode: {mode}, max_age: 10s }}\n"),
    );
    let rw = respway_process(&y, &[]);
    let mut w = RespConn::connect(rw.addr);
    let mut r = RespConn::connect(rw.addr);
    // Trackers up (tracked, bcast): a read is filled once the cache serves.
    std::thread::sleep(Duration::from_millis(300));
    let keys: Vec<(String, u64)> = (0..20)
        .map(|i| (format!("ttl:{i}"), 100 + 20 * i))
        .collect();
    let mut expires = Vec::new();
    for (k, ms) in &keys {
        assert_eq!(
            w.call(&["SET", k, "v", "PX", &ms.to_string()]),
            Resp::Simple("OK".into())
        );
        expires.push(Instant::now() + Duration::from_millis(*ms + 2));
    }
    let (mut late, mut after, mut hits_before) = (Vec::new(), 0u64, 0u64);
    let end = Instant::now() + Duration::from_millis(800);
    while Instant::now() < end {
        for ((k, ms), exp) in keys.iter().zip(&expires) {
            let sent = Instant::now();
            let got = r.call(&["GET", k]);
            if sent >= *exp {
                after += 1;
                if got != Resp::Bulk(None) {
                    late.push((k.clone(), *ms, sent - *exp));
                }
            } else if got == Resp::bulk("v") {
                hits_before += 1;
            }
        }
    }
    let info = RespConn::connect(rw.addr)
        .call(&["INFO", "nearcache"])
        .text();
    eprintln!(
        "{mode}: {hits_before} reads before expiry, {after} after it, {} of them with a value; {}",
        late.len(),
        info.lines()
            .find(|l| l.starts_with("nearcache_main:"))
            .unwrap_or("")
    );
    let hits: u64 = info
        .split([':', ','])
        .find_map(|kv| kv.strip_prefix("hits="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(hits > 0, "the cache served reads: {info}");
    assert!(
        late.is_empty(),
        "values served past their key's expiry: {late:?}"
    );
}

#[test]
fn tracked_entries_never_outlive_their_key_s_ttl() {
    no_value_past_its_ttl("tracked");
}

#[test]
fn ttl_mode_entries_never_outlive_their_key_s_ttl() {
    no_value_past_its_ttl("ttl");
}

/// A key that expired between the fill's read and its `PTTL` (`-2`) is not kept: its entry
/// would have no end but `max_age` (it was served for seconds past its key's expiry).
#[test]
fn a_key_gone_by_the_fills_pttl_is_not_kept() {
    let fake = FakeShard::start(|_| FakeMode::ExpiredOnRead);
    let y = sharded_yaml(&[fake.addr], "{ policy: modula }", false).replace(
        "    connect_timeout: 500ms\n",
        "    connect_timeout: 500ms\n    near_cache: { mode: ttl, max_age: 10s }\n",
    );
    let rw = respway_not_learning(&y);
    let mut r = RespConn::connect(rw.addr);
    for _ in 0..5 {
        assert_eq!(r.call(&["GET", "gone"]), Resp::bulk("v"));
    }
    let info = r.call(&["INFO", "nearcache"]).text();
    let stat = |name: &str| -> u64 {
        info.split([':', ',', '\n'])
            .find_map(|kv| kv.trim().strip_prefix(&format!("{name}=")))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {info}"))
    };
    assert_eq!(
        stat("hits"),
        0,
        "served from an entry of a gone key: {info}"
    );
    assert!(stat("fills_dropped") >= 1, "{info}");
}
