//! Layer contract of `HotKeyLayer`, driven by hand (`poll_ready` / `call` / `poll`) over a
//! mock inner service that records what it got and answers scripted replies.

mod support;

use respway_filters::error::Failure;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::sync::oneshot;
use tower::{Layer, Service, ServiceExt};

use respway_filters::hot_key::{HotKey, HotKeyLayer, HotKeyRuleStats, HotKeyStats};
use respway_filters::model::{
    Cluster, HashPolicy, HotKeyRead, HotKeyRule, PrefixRoute, RouteTable, Shard,
};
use respway_filters::request::{Reply, Request};
use respway_filters::routing::Routing;
use support::{noop_cx, ok, request, routing_of, send, Mock};

// === fixtures ===

fn shard(name: &str, port: u16, zone: &str) -> Shard {
    support::shard(name, port, Some(zone))
}

fn cluster(name: &str, hash: HashPolicy, shards: Vec<Shard>, hot_keys: Vec<HotKeyRule>) -> Cluster {
    Cluster {
        hot_keys,
        ..support::cluster(name, hash, shards)
    }
}

fn rule(prefix: &str, read: HotKeyRead) -> HotKeyRule {
    HotKeyRule {
        prefix: prefix.to_string(),
        read,
    }
}

/// Cluster `main`: 4 maglev shards s0..s3, s1 and s3 in zone z1 (ours unless `zone` is
/// None), with hot-key rules; cluster `plain` (routed by `p:`, prefix removed): 2 slot
/// shards and no rules.
fn routing(zone: Option<&str>) -> Arc<Routing> {
    let main = cluster(
        "main",
        HashPolicy::Maglev { table_size: 65537 },
        vec![
            shard("s0", 7000, "z2"),
            shard("s1", 7001, "z1"),
            shard("s2", 7002, "z2"),
            shard("s3", 7003, "z1"),
        ],
        vec![
            rule("HIGH_", HotKeyRead::RoundRobin),
            rule("HIGH_FREQ_", HotKeyRead::RoundRobin),
            rule("HZ_", HotKeyRead::SameZone),
            rule("HR_", HotKeyRead::Random),
        ],
    );
    let plain = cluster(
        "plain",
        HashPolicy::Crc16Slots,
        vec![shard("p0", 7100, "z1"), shard("p1", 7101, "z2")],
        Vec::new(),
    );
    let routes = RouteTable {
        routes: vec![PrefixRoute {
            prefix: "p:".to_string(),
            remove_prefix: true,
            cluster: "plain".to_string(),
            mirrors: Vec::new(),
        }],
        case_insensitive: false,
        catch_all: Some("main".to_string()),
        catch_all_mirrors: Vec::new(),
    };
    routing_of(routes, vec![main, plain], zone)
}

/// Replies `+shard<i>` for shard `i` (`+none` when not pinned).
fn by_shard(req: &Request) -> Reply {
    match req.shard {
        Some(i) => Bytes::from(format!("+shard{i}\r\n")),
        None => Bytes::from_static(b"+none\r\n"),
    }
}

fn hot_key(routing: &Arc<Routing>, inner: Mock) -> (HotKey<Mock>, Arc<HotKeyStats>) {
    let stats = Arc::new(HotKeyStats::new(routing));
    let svc = HotKeyLayer::new(routing.clone(), stats.clone()).layer(inner);
    (svc, stats)
}

fn rule_stats(stats: &HotKeyStats, prefix: &str) -> HotKeyRuleStats {
    stats
        .snapshot()
        .into_iter()
        .find(|s| s.cluster == "main" && s.prefix == prefix)
        .unwrap()
}

// === writes ===

#[test]
fn hot_write_goes_to_every_shard_and_answers_with_the_first_shards_reply() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(by_shard);
    let (mut svc, stats) = hot_key(&routing, mock.clone());

    let reply = send(&mut svc, request(&routing, &["SET", "HIGH_FREQ_menu", "v"]));

    assert_eq!(reply, Bytes::from_static(b"+shard0\r\n"));
    let seen = mock.seen();
    assert_eq!(seen.len(), 4, "one sub-request per shard");
    for (i, r) in seen.iter().enumerate() {
        assert_eq!(r.shard_index(), Some(i));
        assert_eq!(r.cluster, 0);
        assert_eq!(r.endpoint, None);
        assert_eq!(r.args, vec!["SET", "HIGH_FREQ_menu", "v"]);
        assert_eq!(r.keys.first(), Some(1));
    }
    let s = rule_stats(&stats, "HIGH_FREQ_");
    assert_eq!(s.fanned_out_writes, 1);
    assert_eq!(s.partial_failures, 0);
    assert_eq!(s.reads_per_shard, vec![0; 4]);
}

#[test]
fn writes_naming_a_hot_key_beyond_single_key_commands_are_refused() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(by_shard);
    let (mut svc, stats) = hot_key(&routing, mock.clone());

    // SameShard (EVAL) and multi-key Split (MSET, DEL) writes would reach one copy of the
    // hot key only: refused, and nothing reaches the inner service.
    for (argv, key) in [
        (&["EVAL", "return 1", "1", "HIGH_FREQ_a"][..], "HIGH_FREQ_a"),
        (&["MSET", "plain", "1", "HIGH_FREQ_b", "2"], "HIGH_FREQ_b"),
        (&["DEL", "HIGH_FREQ_a", "HIGH_FREQ_b"], "HIGH_FREQ_a"),
    ] {
        let reply = send(&mut svc, request(&routing, argv));
        let text = String::from_utf8_lossy(&reply);
        assert!(
            text.starts_with(&format!(
                "-ERR respway: hot key {key} is stored on every shard"
            )),
            "{argv:?}: {text}"
        );
    }
    assert!(mock.seen().is_empty());
    // Reads with other keys pass on unpinned: every copy holds the same value.
    let reply = send(
        &mut svc,
        request(&routing, &["MGET", "HIGH_FREQ_a", "plain"]),
    );
    assert_eq!(reply, Bytes::from_static(b"+none\r\n"));
    assert_eq!(mock.seen().len(), 1);
    assert!(mock.seen().iter().all(|r| r.shard.is_none()));
    assert_eq!(rule_stats(&stats, "HIGH_FREQ_").fanned_out_writes, 0);
}

#[test]
fn split_commands_with_one_hot_key_fan_out() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(by_shard);
    let (mut svc, stats) = hot_key(&routing, mock.clone());
    // DEL and MSET of a single hot key must reach every copy of it.
    send(&mut svc, request(&routing, &["DEL", "HIGH_FREQ_a"]));
    send(&mut svc, request(&routing, &["MSET", "HIGH_FREQ_a", "1"]));
    let shards: Vec<Option<usize>> = mock.seen().iter().map(|r| r.shard_index()).collect();
    let expected: Vec<Option<usize>> = (0..2).flat_map(|_| (0..4).map(Some)).collect();
    assert_eq!(shards, expected);
    assert_eq!(rule_stats(&stats, "HIGH_FREQ_").fanned_out_writes, 2);
}

#[test]
fn partial_failure_names_the_failed_shards_and_is_counted() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(|r: &Request| match r.shard {
        Some(1) => Bytes::from_static(b"-ERR boom one\r\n"),
        Some(3) => {
            Bytes::from_static(b"-READONLY You can't write against a read only replica.\r\n")
        }
        _ => ok(),
    });
    let (mut svc, stats) = hot_key(&routing, mock.clone());

    let reply = send(&mut svc, request(&routing, &["INCR", "HIGH_FREQ_hits"]));

    assert_eq!(
        reply,
        Bytes::from_static(
            b"-ERR respway: hot-key write failed on shard(s) s1, s3: ERR boom one\r\n"
        )
    );
    assert_eq!(mock.seen().len(), 4, "every shard was still asked");
    let s = rule_stats(&stats, "HIGH_FREQ_");
    assert_eq!(s.fanned_out_writes, 1);
    assert_eq!(s.partial_failures, 1);

    // A write that succeeds everywhere does not bump the failure counter.
    let mock = Mock::new(|_: &Request| ok());
    let (mut svc, stats) = hot_key(&routing, mock);
    assert_eq!(
        send(&mut svc, request(&routing, &["SET", "HIGH_FREQ_x", "1"])),
        ok()
    );
    assert_eq!(rule_stats(&stats, "HIGH_FREQ_").partial_failures, 0);
}

/// An inner future that completes when the test sends its reply.
struct Deferred(oneshot::Receiver<Reply>);

impl Future for Deferred {
    type Output = Result<Reply, Failure>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| Ok(r.expect("reply sender dropped")))
    }
}

/// The pinned shard of a call and the sender of its reply.
type Pending = (Option<usize>, oneshot::Sender<Reply>);

/// Hands out a `Deferred` per call and keeps the senders, in call order.
#[derive(Clone, Default)]
struct DeferredMock {
    senders: Arc<Mutex<Vec<Pending>>>,
}

impl Service<Request> for DeferredMock {
    type Response = Reply;
    type Error = Failure;
    type Future = Deferred;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Deferred {
        let (tx, rx) = oneshot::channel();
        self.senders.lock().unwrap().push((req.shard_index(), tx));
        Deferred(rx)
    }
}

#[test]
fn fan_out_completes_only_when_every_shard_has_answered() {
    let routing = routing(Some("z1"));
    let mock = DeferredMock::default();
    let stats = Arc::new(HotKeyStats::new(&routing));
    let mut svc = HotKeyLayer::new(routing.clone(), stats).layer(mock.clone());
    let mut cx = noop_cx();

    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut fut = svc.call(request(&routing, &["SET", "HIGH_FREQ_menu", "v"]));
    assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());

    let mut senders = std::mem::take(&mut *mock.senders.lock().unwrap());
    assert_eq!(
        senders.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![Some(0), Some(1), Some(2), Some(3)]
    );
    // Shards answer out of order; the last one to answer is shard 0.
    let (_, first) = senders.remove(0);
    for (shard, tx) in senders {
        tx.send(Bytes::from(format!("+shard{}\r\n", shard.unwrap())))
            .unwrap();
        assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
    }
    first.send(Bytes::from_static(b"+shard0\r\n")).unwrap();
    match Pin::new(&mut fut).poll(&mut cx) {
        Poll::Ready(Ok(r)) => assert_eq!(r, Bytes::from_static(b"+shard0\r\n")),
        Poll::Ready(Err(f)) => panic!("{f}"),
        Poll::Pending => panic!("every shard answered"),
    }
}

#[test]
fn a_shard_that_is_not_ready_is_not_called_and_fails_the_write() {
    let routing = routing(Some("z1"));
    let mut mock = Mock::new(|_: &Request| ok());
    mock.ready_for = 2;
    let (mut svc, stats) = hot_key(&routing, mock.clone());

    let reply = send(&mut svc, request(&routing, &["SET", "HIGH_FREQ_menu", "v"]));

    assert_eq!(
        reply,
        Bytes::from_static(
            b"-ERR respway: hot-key write failed on shard(s) s2, s3: ERR respway: shard not ready\r\n"
        )
    );
    let shards: Vec<_> = mock.seen().iter().map(|r| r.shard).collect();
    assert_eq!(shards, vec![Some(0), Some(1)]);
    assert_eq!(rule_stats(&stats, "HIGH_FREQ_").partial_failures, 1);
}

// === reads ===

#[test]
fn reads_rotate_over_the_shards_round_robin() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(by_shard);
    let (mut svc, stats) = hot_key(&routing, mock.clone());

    let mut replies = Vec::new();
    for _ in 0..8 {
        replies.push(send(
            &mut svc,
            request(&routing, &["GET", "HIGH_FREQ_menu"]),
        ));
    }

    let shards: Vec<usize> = mock
        .seen()
        .iter()
        .map(|r| r.shard_index().unwrap())
        .collect();
    assert_eq!(shards.len(), 8, "one call per read");
    // The rotation starts at a random shard per connection, then goes round in order.
    let start = shards[0];
    let expected: Vec<usize> = (0..8).map(|i| (start + i) % 4).collect();
    assert_eq!(shards, expected);
    for (r, s) in replies.iter().zip(&shards) {
        assert_eq!(r, &Bytes::from(format!("+shard{s}\r\n")));
    }
    assert_eq!(
        rule_stats(&stats, "HIGH_FREQ_").reads_per_shard,
        vec![2, 2, 2, 2]
    );
}

#[test]
fn same_zone_reads_prefer_local_shards() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(by_shard);
    let (mut svc, stats) = hot_key(&routing, mock.clone());

    for _ in 0..6 {
        send(&mut svc, request(&routing, &["HGET", "HZ_cfg", "f"]));
    }
    let shards: Vec<usize> = mock
        .seen()
        .iter()
        .map(|r| r.shard_index().unwrap())
        .collect();
    // s1 and s3 are in z1, alternating.
    assert!(shards.iter().all(|s| *s == 1 || *s == 3), "{shards:?}");
    assert!(shards.windows(2).all(|w| w[0] != w[1]), "{shards:?}");
    assert_eq!(rule_stats(&stats, "HZ_").reads_per_shard, vec![0, 3, 0, 3]);
}

#[test]
fn same_zone_reads_use_every_shard_when_none_is_local() {
    let routing = routing(None);
    let mock = Mock::new(by_shard);
    let (mut svc, _) = hot_key(&routing, mock.clone());

    for _ in 0..4 {
        send(&mut svc, request(&routing, &["GET", "HZ_cfg"]));
    }
    let mut shards: Vec<usize> = mock
        .seen()
        .iter()
        .map(|r| r.shard_index().unwrap())
        .collect();
    shards.sort();
    assert_eq!(shards, vec![0, 1, 2, 3]);
}

#[test]
fn random_reads_stay_in_range_and_reach_every_shard() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(by_shard);
    let (mut svc, stats) = hot_key(&routing, mock.clone());

    for _ in 0..400 {
        send(&mut svc, request(&routing, &["GET", "HR_x"]));
    }
    let reads = rule_stats(&stats, "HR_").reads_per_shard;
    assert_eq!(reads.iter().sum::<u64>(), 400);
    // Each shard's expected share is 100; 30 is over 8 standard deviations away.
    assert!(reads.iter().all(|&n| n > 30), "{reads:?}");
}

#[test]
fn the_longest_matching_rule_wins() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(|_: &Request| ok());
    let (mut svc, stats) = hot_key(&routing, mock);

    send(&mut svc, request(&routing, &["SET", "HIGH_FREQ_a", "1"]));
    send(&mut svc, request(&routing, &["SET", "HIGH_b", "1"]));
    send(&mut svc, request(&routing, &["SET", "HIGH_c", "1"]));

    assert_eq!(rule_stats(&stats, "HIGH_FREQ_").fanned_out_writes, 1);
    assert_eq!(rule_stats(&stats, "HIGH_").fanned_out_writes, 2);
}

// === pass-through ===

#[test]
fn other_requests_pass_through_untouched() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(by_shard);
    let (mut svc, stats) = hot_key(&routing, mock.clone());

    let mut pinned = request(&routing, &["SET", "HIGH_FREQ_a", "1"]);
    pinned.shard = Some(2);
    let inputs = vec![
        request(&routing, &["GET", "user:42"]),
        request(&routing, &["SET", "user:42", "v"]),
        // Routed to `plain` (no rules): after prefix removal the key looks hot, but is not.
        request(&routing, &["SET", "p:HIGH_FREQ_a", "v"]),
        // Case-sensitive prefixes.
        request(&routing, &["GET", "high_freq_a"]),
        // Already pinned by an outer layer.
        pinned,
        // No key.
        request(&routing, &["PING"]),
    ];
    for req in &inputs {
        send(&mut svc, req.clone());
    }

    let seen = mock.seen();
    assert_eq!(seen.len(), inputs.len());
    for (got, sent) in seen.iter().zip(&inputs) {
        assert_eq!(got.args, sent.args);
        assert_eq!(got.cluster, sent.cluster);
        assert_eq!(got.shard, sent.shard);
        assert_eq!(got.endpoint, sent.endpoint);
        assert_eq!(got.route, sent.route);
    }
    assert_eq!(seen[2].cluster, 1);
    assert!(stats
        .snapshot()
        .iter()
        .all(|s| s.fanned_out_writes == 0 && s.reads_per_shard.iter().all(|&n| n == 0)));
}

// === stats ===

#[test]
fn snapshots_list_every_rule_and_add_up_across_workers() {
    let routing = routing(Some("z1"));
    let worker = |writes: usize, reads: usize| {
        let (mut svc, stats) = hot_key(&routing, Mock::new(|_: &Request| ok()));
        for _ in 0..writes {
            send(&mut svc, request(&routing, &["SET", "HIGH_FREQ_a", "1"]));
        }
        for _ in 0..reads {
            send(&mut svc, request(&routing, &["GET", "HIGH_FREQ_a"]));
        }
        stats.snapshot()
    };
    let a = worker(1, 4);
    let b = worker(2, 8);
    // Rules are listed longest prefix first, as the routing table orders them.
    let prefixes: Vec<&str> = a.iter().map(|s| s.prefix.as_str()).collect();
    assert_eq!(prefixes, vec!["HIGH_FREQ_", "HIGH_", "HZ_", "HR_"]);

    let total = HotKeyRuleStats::sum([a.as_slice(), b.as_slice()]);
    assert_eq!(total.len(), 4);
    assert_eq!(
        total[0],
        HotKeyRuleStats {
            cluster: "main".to_string(),
            prefix: "HIGH_FREQ_".to_string(),
            fanned_out_writes: 3,
            partial_failures: 0,
            reads_per_shard: vec![3, 3, 3, 3],
        }
    );
}

// === through a runtime ===

#[tokio::test(flavor = "current_thread")]
async fn works_through_service_ext_on_a_runtime() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(by_shard);
    let (mut svc, _) = hot_key(&routing, mock.clone());

    let reply = svc
        .ready()
        .await
        .unwrap()
        .call(request(&routing, &["SET", "HIGH_FREQ_menu", "v"]))
        .await
        .unwrap();
    assert_eq!(reply, Bytes::from_static(b"+shard0\r\n"));
    assert_eq!(mock.seen().len(), 4);
}
