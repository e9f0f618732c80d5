//! Layer contract of `HotKeyLayer`, driven by hand (`poll_ready` / `call` / `poll`) over a
//! mock inner service that records what it got and answers scripted replies.

use respway_filters::error::Failure;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::sync::oneshot;
use tower::{Layer, Service, ServiceExt};

use crate::support::{noop_cx, ok, request, routing_of, send, Mock};
use respway_filters::hot_key::{HotKey, HotKeyLayer, HotKeyRuleStats, HotKeyStats};
use respway_filters::model::{
    Cluster, HashPolicy, HotKeyRead, HotKeyRule, PrefixRoute, RouteTable, Shard,
};
use respway_filters::request::{Reply, Request};
use respway_filters::routing::Routing;

// === fixtures ===

fn shard(name: &str, port: u16, zone: &str) -> Shard {
    crate::support::shard(name, port, Some(zone))
}

fn cluster(name: &str, hash: HashPolicy, shards: Vec<Shard>, hot_keys: Vec<HotKeyRule>) -> Cluster {
    Cluster {
        hot_keys,
        ..crate::support::cluster(name, hash, shards)
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
    let routing = routing_of(routes, vec![main, plain], zone);
    copied(&routing, true);
    routing
}

/// Marks the copy pass of every hot-key rule of `routing` done (reads spread) or not.
fn copied(routing: &Routing, done: bool) {
    for c in routing.clusters.iter() {
        for r in &c.hot_keys {
            r.copied.store(done, Ordering::Release);
        }
    }
}

/// The home shard of `key` in cluster `main` (where the hash puts it).
fn home(routing: &Routing, key: &str) -> usize {
    routing.clusters[0].picker.pick(key.as_bytes())
}

/// The snapshot [`redis_like`] answers: payload `abc`, no expiry.
const SNAPSHOT: &[u8] = b"*2\r\n$3\r\nabc\r\n:-1\r\n";

/// Answers as Redis would the requests of a hot write: the snapshot script with [`SNAPSHOT`],
/// `RESTORE` with `+OK`, `DEL` with `:1`, anything else with [`by_shard`].
fn redis_like(r: &Request) -> Reply {
    match &r.args[0][..] {
        b"EVAL" => Bytes::from_static(SNAPSHOT),
        b"RESTORE" => ok(),
        b"DEL" if r.keys.first().is_none() => Bytes::from_static(b":1\r\n"),
        _ => by_shard(r),
    }
}

/// The `RESTORE` of [`SNAPSHOT`] of `key`.
fn restore(key: &str) -> Vec<String> {
    ["RESTORE", key, "0", "abc", "REPLACE"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn args(r: &Request) -> Vec<String> {
    r.args
        .iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
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

/// A hot write runs once, on the key's home shard, followed there by a snapshot of the key
/// (run by Redis right after it), which is restored on every other shard; a second snapshot
/// checks the key did not change meanwhile. A non-idempotent write never runs on a shard
/// without the key.
#[test]
fn hot_write_runs_on_the_home_shard_and_its_snapshot_is_copied() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(redis_like);
    let (mut svc, stats) = hot_key(&routing, mock.clone());
    let h = home(&routing, "HIGH_FREQ_menu");
    let others: Vec<usize> = (0..4).filter(|&s| s != h).collect();

    let reply = send(&mut svc, request(&routing, &["SET", "HIGH_FREQ_menu", "v"]));

    assert_eq!(
        reply,
        Bytes::from(format!("+shard{h}\r\n")),
        "the write's own reply"
    );
    let seen = mock.seen();
    assert_eq!(seen.len(), 6, "write, snapshot, 3 copies, snapshot");
    assert_eq!(args(&seen[0]), ["SET", "HIGH_FREQ_menu", "v"]);
    assert_eq!(seen[0].keys.first(), Some(1));
    for i in [1, 5] {
        assert_eq!(args(&seen[i])[0], "EVAL");
        assert_eq!(args(&seen[i])[3], "HIGH_FREQ_menu");
        assert_eq!(seen[i].shard_index(), Some(h));
    }
    for (r, to) in seen[2..5].iter().zip(&others) {
        assert_eq!(args(r), restore("HIGH_FREQ_menu"));
        assert_eq!(r.shard_index(), Some(*to));
        assert_eq!(r.keys.first(), None, "not routed again below");
    }
    assert_eq!(seen[0].shard_index(), Some(h));
    assert!(seen.iter().all(|r| r.cluster == 0 && r.endpoint.is_none()));
    let s = rule_stats(&stats, "HIGH_FREQ_");
    assert_eq!(s.fanned_out_writes, 1);
    assert_eq!(s.partial_failures, 0);
    assert_eq!(s.copy_retries, 0);
    assert_eq!(s.reads_per_shard, vec![0; 4]);
}

/// A snapshot with an expiry is restored with it, as an absolute time.
#[test]
fn a_copy_keeps_the_expiry_of_the_home_key() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(|r: &Request| match &r.args[0][..] {
        b"EVAL" => Bytes::from_static(b"*2\r\n$3\r\nabc\r\n:1900000000000\r\n"),
        _ => ok(),
    });
    let (mut svc, _) = hot_key(&routing, mock.clone());
    send(
        &mut svc,
        request(&routing, &["EXPIRE", "HIGH_FREQ_menu", "60"]),
    );
    assert_eq!(
        args(&mock.seen()[2]),
        [
            "RESTORE",
            "HIGH_FREQ_menu",
            "1900000000000",
            "abc",
            "REPLACE",
            "ABSTTL"
        ]
    );
}

/// When the key changed between the snapshots (another client wrote it, and the copies of
/// the two writes may have crossed), the newer snapshot is copied again.
#[test]
fn a_key_that_changed_while_copied_is_copied_again() {
    let routing = routing(Some("z1"));
    let snaps = Arc::new(Mutex::new(0));
    let n = snaps.clone();
    let mock = Mock::new(move |r: &Request| match &r.args[0][..] {
        b"EVAL" => {
            let mut n = n.lock().unwrap();
            *n += 1;
            // 1st: v1; 2nd and 3rd: v2 (a write of another client came in between).
            let v = if *n == 1 { "v1" } else { "v2" };
            Bytes::from(format!("*2\r\n$2\r\n{v}\r\n:-1\r\n"))
        }
        _ => ok(),
    });
    let (mut svc, stats) = hot_key(&routing, mock.clone());
    assert_eq!(
        send(
            &mut svc,
            request(&routing, &["SET", "HIGH_FREQ_menu", "v1"])
        ),
        ok()
    );
    let seen = mock.seen();
    assert_eq!(
        seen.len(),
        10,
        "write, snapshot, 3 copies, snapshot, 3 copies, snapshot"
    );
    assert!(seen[6..9].iter().all(|r| args(r)[3] == "v2"));
    assert_eq!(rule_stats(&stats, "HIGH_FREQ_").copy_retries, 1);
}

/// A key that changes during every round (written continuously by other clients): after the
/// last round its copies are deleted instead (reads fall back to the home shard), and the
/// write, which applied, answers as usual.
#[test]
fn a_key_that_keeps_changing_has_its_copies_deleted_not_left_old() {
    let routing = routing(Some("z1"));
    let snaps = Arc::new(Mutex::new(0));
    let n = snaps.clone();
    let mock = Mock::new(move |r: &Request| match &r.args[0][..] {
        b"EVAL" => {
            let mut n = n.lock().unwrap();
            *n += 1;
            Bytes::from(format!("*2\r\n$2\r\nv{}\r\n:-1\r\n", *n % 10))
        }
        b"DEL" => Bytes::from_static(b":1\r\n"),
        _ => ok(),
    });
    let (mut svc, stats) = hot_key(&routing, mock.clone());
    assert_eq!(
        send(&mut svc, request(&routing, &["SET", "HIGH_FREQ_menu", "v"])),
        ok()
    );
    let seen = mock.seen();
    assert_eq!(
        seen.len(),
        2 + 4 * 4 + 3,
        "write, snapshot, 4 rounds, 3 deletions"
    );
    let h = home(&routing, "HIGH_FREQ_menu");
    let dels: Vec<_> = seen[18..]
        .iter()
        .map(|r| (args(r), r.shard_index()))
        .collect();
    let want: Vec<_> = (0..4)
        .filter(|&s| s != h)
        .map(|s| {
            (
                vec!["DEL".to_string(), "HIGH_FREQ_menu".to_string()],
                Some(s),
            )
        })
        .collect();
    assert_eq!(dels, want);
    let s = rule_stats(&stats, "HIGH_FREQ_");
    assert_eq!(
        (s.copy_retries, s.copies_dropped, s.partial_failures),
        (3, 1, 0)
    );
}

/// A write that deleted the key (or left it expired): the snapshot finds no key, and the
/// copies are deleted on the other shards.
#[test]
fn a_write_that_removes_the_key_deletes_every_copy() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(|r: &Request| match &r.args[0][..] {
        b"EVAL" => Bytes::from_static(b"$-1\r\n"),
        _ => Bytes::from_static(b":1\r\n"),
    });
    let (mut svc, stats) = hot_key(&routing, mock.clone());
    let h = home(&routing, "HIGH_FREQ_a");

    let reply = send(&mut svc, request(&routing, &["DEL", "HIGH_FREQ_a"]));

    assert_eq!(reply, Bytes::from_static(b":1\r\n"));
    let seen = mock.seen();
    assert_eq!(
        seen.len(),
        6,
        "DEL, snapshot, 3 DELs of the copies, snapshot"
    );
    let dels: Vec<(Vec<String>, Option<usize>)> = seen[2..5]
        .iter()
        .map(|r| (args(r), r.shard_index()))
        .collect();
    let want: Vec<(Vec<String>, Option<usize>)> = (0..4)
        .filter(|&s| s != h)
        .map(|s| (vec!["DEL".to_string(), "HIGH_FREQ_a".to_string()], Some(s)))
        .collect();
    assert_eq!(dels, want);
    assert_eq!(rule_stats(&stats, "HIGH_FREQ_").partial_failures, 0);
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
fn split_commands_with_one_hot_key_are_copied() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(redis_like);
    let (mut svc, stats) = hot_key(&routing, mock.clone());
    let h = home(&routing, "HIGH_FREQ_a");
    // DEL and MSET of a single hot key must reach every copy of it.
    send(&mut svc, request(&routing, &["DEL", "HIGH_FREQ_a"]));
    send(&mut svc, request(&routing, &["MSET", "HIGH_FREQ_a", "1"]));
    let seen = mock.seen();
    assert_eq!(seen.len(), 12);
    assert_eq!(args(&seen[0]), ["DEL", "HIGH_FREQ_a"]);
    assert_eq!(args(&seen[6]), ["MSET", "HIGH_FREQ_a", "1"]);
    assert_eq!(seen[0].shard_index(), Some(h));
    assert_eq!(seen[6].shard_index(), Some(h));
    assert_eq!(rule_stats(&stats, "HIGH_FREQ_").fanned_out_writes, 2);
}

/// A copy that fails: the write applied on the home shard, the client is told which shards
/// have no copy, and their (now old) copies are deleted, so reads there fall back home.
#[test]
fn partial_failure_names_the_failed_shards_and_is_counted() {
    let routing = routing(Some("z1"));
    let h = home(&routing, "HIGH_FREQ_hits");
    let others: Vec<usize> = (0..4).filter(|&s| s != h).collect();
    let (bad1, bad2) = (others[0], others[2]);
    let mock = Mock::new(move |r: &Request| match (&r.args[0][..], r.shard_index()) {
        (b"RESTORE", Some(s)) if s == bad1 => Bytes::from_static(b"-ERR boom\r\n"),
        (b"RESTORE", Some(s)) if s == bad2 => Bytes::from_static(b"-OOM no memory\r\n"),
        (b"INCR", _) => Bytes::from_static(b":7\r\n"),
        _ => redis_like(r),
    });
    let (mut svc, stats) = hot_key(&routing, mock.clone());

    let reply = send(&mut svc, request(&routing, &["INCR", "HIGH_FREQ_hits"]));

    assert_eq!(
        String::from_utf8_lossy(&reply),
        format!(
            "-ERR respway: hot-key write failed on shard(s) s{bad1}, s{bad2}: ERR boom (the \
             write applied on home shard s{h})\r\n"
        )
    );
    let seen = mock.seen();
    assert_eq!(seen.len(), 8, "INCR, snapshot, 3 copies, snapshot, 2 DELs");
    assert_eq!(
        seen[6..]
            .iter()
            .map(|r| r.shard_index())
            .collect::<Vec<_>>(),
        [Some(bad1), Some(bad2)]
    );
    assert!(seen[6..]
        .iter()
        .all(|r| args(r) == ["DEL", "HIGH_FREQ_hits"]));
    let s = rule_stats(&stats, "HIGH_FREQ_");
    assert_eq!(s.fanned_out_writes, 1);
    assert_eq!(s.partial_failures, 1);

    // A write whose copies all succeed does not bump the failure counter.
    let mock = Mock::new(redis_like);
    let (mut svc, stats) = hot_key(&routing, mock);
    let reply = send(&mut svc, request(&routing, &["SET", "HIGH_FREQ_x", "1"]));
    assert!(!reply.starts_with(b"-"), "{reply:?}");
    assert_eq!(rule_stats(&stats, "HIGH_FREQ_").partial_failures, 0);

    // The write's own error is the reply (nothing was changed), and nothing is copied.
    let mock = Mock::new(|r: &Request| match &r.args[0][..] {
        b"INCR" => Bytes::from_static(b"-WRONGTYPE Operation against a key\r\n"),
        _ => redis_like(r),
    });
    let (mut svc, _) = hot_key(&routing, mock.clone());
    let reply = send(&mut svc, request(&routing, &["INCR", "HIGH_FREQ_x"]));
    assert!(reply.starts_with(b"-WRONGTYPE"));
    assert_eq!(mock.seen().len(), 2);
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

/// The pinned shard of a call, the sender of its reply, and the command's name.
type Pending = (Option<usize>, oneshot::Sender<Reply>, String);

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
        let name = String::from_utf8_lossy(&req.args[0]).into_owned();
        self.senders
            .lock()
            .unwrap()
            .push((req.shard_index(), tx, name));
        Deferred(rx)
    }
}

/// Answers every call `mock` holds as [`redis_like`] would (by command name); how many.
fn answer_all(mock: &DeferredMock) -> usize {
    let pending = std::mem::take(&mut *mock.senders.lock().unwrap());
    let n = pending.len();
    for (_, tx, name) in pending {
        let reply = match name.as_str() {
            "EVAL" => Bytes::from_static(SNAPSHOT),
            _ => ok(),
        };
        let _ = tx.send(reply);
    }
    n
}

#[test]
fn a_write_completes_only_when_every_copy_has_answered() {
    let routing = routing(Some("z1"));
    let mock = DeferredMock::default();
    let stats = Arc::new(HotKeyStats::new(&routing));
    let mut svc = HotKeyLayer::new(routing.clone(), stats).layer(mock.clone());
    let mut cx = noop_cx();
    let h = home(&routing, "HIGH_FREQ_menu");

    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut fut = svc.call(request(&routing, &["SET", "HIGH_FREQ_menu", "v"]));
    assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
    let names = |m: &DeferredMock| -> Vec<(Option<usize>, String)> {
        m.senders
            .lock()
            .unwrap()
            .iter()
            .map(|s| (s.0, s.2.clone()))
            .collect()
    };
    assert_eq!(
        names(&mock),
        [(Some(h), "SET".to_string()), (Some(h), "EVAL".to_string())]
    );
    // The write's reply first, then the snapshot: the copies go out.
    let mut pending = std::mem::take(&mut *mock.senders.lock().unwrap());
    let (_, snap, _) = pending.pop().unwrap();
    let (_, write, _) = pending.pop().unwrap();
    write.send(Bytes::from_static(b"+written\r\n")).unwrap();
    assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
    snap.send(Bytes::from_static(SNAPSHOT)).unwrap();
    assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
    assert_eq!(names(&mock).len(), 3, "one copy per other shard");
    // Copies answer; the check snapshot goes out; it answers: done.
    assert_eq!(answer_all(&mock), 3);
    assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
    assert_eq!(names(&mock), [(Some(h), "EVAL".to_string())]);
    assert_eq!(answer_all(&mock), 1);
    match Pin::new(&mut fut).poll(&mut cx) {
        Poll::Ready(Ok(r)) => assert_eq!(r, Bytes::from_static(b"+written\r\n")),
        Poll::Ready(Err(f)) => panic!("{f}"),
        Poll::Pending => panic!("every copy answered"),
    }
}

#[test]
fn a_copy_that_is_not_ready_is_not_called_and_fails_the_write() {
    let routing = routing(Some("z1"));
    let mut mock = Mock::new(redis_like);
    mock.ready_for = 2;
    let (mut svc, stats) = hot_key(&routing, mock.clone());
    let h = home(&routing, "HIGH_FREQ_menu");
    let others: Vec<usize> = (0..4).filter(|&s| s != h).collect();

    let reply = send(&mut svc, request(&routing, &["SET", "HIGH_FREQ_menu", "v"]));

    assert_eq!(
        String::from_utf8_lossy(&reply),
        format!(
            "-ERR respway: hot-key write failed on shard(s) s{}, s{}, s{}: ERR respway: shard \
             not ready (the write applied on home shard s{h})\r\n",
            others[0], others[1], others[2]
        )
    );
    let shards: Vec<_> = mock.seen().iter().map(|r| r.shard).collect();
    assert_eq!(
        shards,
        vec![Some(h as u32); 2],
        "the write and its snapshot"
    );
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

/// Until the rule's copy pass has finished, reads go to the key's home shard only.
#[test]
fn reads_stay_on_the_home_shard_until_the_keys_are_copied() {
    let routing = routing(Some("z1"));
    copied(&routing, false);
    let mock = Mock::new(by_shard);
    let (mut svc, stats) = hot_key(&routing, mock.clone());
    let h = home(&routing, "HIGH_FREQ_menu");
    for _ in 0..4 {
        send(&mut svc, request(&routing, &["GET", "HIGH_FREQ_menu"]));
    }
    assert!(mock.seen().iter().all(|r| r.shard_index() == Some(h)));
    assert_eq!(rule_stats(&stats, "HIGH_FREQ_").reads_per_shard[h], 4);
    copied(&routing, true);
    for _ in 0..4 {
        send(&mut svc, request(&routing, &["GET", "HIGH_FREQ_menu"]));
    }
    let mut shards: Vec<usize> = mock.seen()[4..]
        .iter()
        .map(|r| r.shard_index().unwrap())
        .collect();
    shards.sort();
    assert_eq!(shards, [0, 1, 2, 3]);
}

/// A copy that says the key does not exist (or fails) is never the answer: the read is sent
/// again to the home shard.
#[test]
fn a_read_that_finds_no_copy_falls_back_to_the_home_shard() {
    let routing = routing(Some("z1"));
    let h = home(&routing, "HIGH_FREQ_menu");
    let mock = Mock::new(move |r: &Request| match r.shard_index() {
        Some(s) if s == h => Bytes::from_static(b"$1\r\nv\r\n"),
        Some(s) if s % 2 == 0 => Bytes::from_static(b"$-1\r\n"),
        _ => Bytes::from_static(b"*0\r\n"),
    });
    let (mut svc, stats) = hot_key(&routing, mock.clone());
    for _ in 0..8 {
        let reply = send(&mut svc, request(&routing, &["GET", "HIGH_FREQ_menu"]));
        assert_eq!(reply, Bytes::from_static(b"$1\r\nv\r\n"));
    }
    let s = rule_stats(&stats, "HIGH_FREQ_");
    assert_eq!(s.read_fallbacks, 6, "two reads of each of the three copies");
    assert_eq!(mock.seen().len(), 8 + 6);
}

/// While a hot write of the connection is in flight, its reads go to the home shard, behind
/// the write: a pipelined read sees the write before it.
#[test]
fn reads_behind_a_write_in_flight_go_to_the_home_shard() {
    let routing = routing(Some("z1"));
    let mock = DeferredMock::default();
    let stats = Arc::new(HotKeyStats::new(&routing));
    let mut svc = HotKeyLayer::new(routing.clone(), stats).layer(mock.clone());
    let mut cx = noop_cx();
    let h = home(&routing, "HIGH_FREQ_menu");

    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut write = svc.call(request(&routing, &["SET", "HIGH_FREQ_menu", "v"]));
    let reads: Vec<_> = (0..4)
        .map(|_| svc.call(request(&routing, &["GET", "HIGH_FREQ_menu"])))
        .collect();
    let shards: Vec<_> = mock.senders.lock().unwrap().iter().map(|s| s.0).collect();
    assert_eq!(
        shards,
        vec![Some(h); 6],
        "write, snapshot, 4 reads: all home"
    );
    let mut rounds = 0;
    while Pin::new(&mut write).poll(&mut cx).is_pending() {
        rounds += 1;
        assert!(rounds < 10 && answer_all(&mock) > 0);
    }
    drop(reads);
    answer_all(&mock);
    // The write is done: reads spread again.
    let mut spread = Vec::new();
    for _ in 0..4 {
        spread.push(svc.call(request(&routing, &["GET", "HIGH_FREQ_menu"])));
    }
    let mut shards: Vec<_> = mock.senders.lock().unwrap().iter().map(|s| s.0).collect();
    shards.sort();
    assert_eq!(shards, [Some(0), Some(1), Some(2), Some(3)]);
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
    let mock = Mock::new(redis_like);
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
        let (mut svc, stats) = hot_key(&routing, Mock::new(redis_like));
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
            read_fallbacks: 0,
            copy_retries: 0,
            copies_dropped: 0,
            reads_per_shard: vec![3, 3, 3, 3],
        }
    );
}

// === through a runtime ===

#[tokio::test(flavor = "current_thread")]
async fn works_through_service_ext_on_a_runtime() {
    let routing = routing(Some("z1"));
    let mock = Mock::new(redis_like);
    let (mut svc, _) = hot_key(&routing, mock.clone());

    let reply = svc
        .ready()
        .await
        .unwrap()
        .call(request(&routing, &["SET", "HIGH_FREQ_menu", "v"]))
        .await
        .unwrap();
    let h = home(&routing, "HIGH_FREQ_menu");
    assert_eq!(reply, Bytes::from(format!("+shard{h}\r\n")));
    assert_eq!(mock.seen().len(), 6);
}
