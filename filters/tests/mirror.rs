//! Layer contract of `MirrorLayer`, driven by hand (`poll_ready` / `call` / `poll`) over a
//! mock inner service and a mock sink that both record what they got.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tower::{Layer, Service, ServiceExt};

use crate::support::{request, routing_of, send, shard, Mock};
use respway_filters::mirror::{
    Mirror, MirrorCounts, MirrorLayer, MirrorSink, MirrorStats, READ_ONLY,
};
use respway_filters::model::{
    Cluster, HashPolicy, MirrorMode, MirrorPolicy, PrefixRoute, RouteTable,
};
use respway_filters::request::{error_reply, Reply, Request};
use respway_filters::routing::Routing;
use respway_filters::write_record::{Cursor, WriteRecord};

// === fixtures ===

const OLD: usize = 0;
const NEW: usize = 1;

fn cluster(name: &str, hash: HashPolicy, n: u16, port: u16) -> Cluster {
    let shards = (0..n)
        .map(|i| shard(&format!("{name}-{i}"), port + i, None))
        .collect();
    crate::support::cluster(name, hash, shards)
}

fn policy(mode: MirrorMode, include_reads: bool, fraction_ppm: u32) -> MirrorPolicy {
    MirrorPolicy {
        cluster: "new".to_string(),
        mode,
        include_reads,
        fraction_ppm,
    }
}

fn route(prefix: &str, mirrors: Vec<MirrorPolicy>) -> PrefixRoute {
    PrefixRoute {
        prefix: prefix.to_string(),
        remove_prefix: false,
        cluster: "old".to_string(),
        mirrors,
    }
}

const OLD_FIRST: MirrorMode = MirrorMode::DualWrite {
    target_is_primary: false,
};
const NEW_FIRST: MirrorMode = MirrorMode::DualWrite {
    target_is_primary: true,
};

/// Cluster `old` (4 maglev shards) is migrating to `new` (2 slot shards); each route prefix
/// is one policy. The catch-all (`old`) has none.
fn routing() -> Arc<Routing> {
    let routes = RouteTable {
        routes: vec![
            route("dw:", vec![policy(OLD_FIRST, false, 1_000_000)]),
            route("dwr:", vec![policy(OLD_FIRST, true, 1_000_000)]),
            route("np:", vec![policy(NEW_FIRST, false, 1_000_000)]),
            route("npr:", vec![policy(NEW_FIRST, true, 1_000_000)]),
            route("half:", vec![policy(OLD_FIRST, true, 500_000)]),
            route("zero:", vec![policy(OLD_FIRST, true, 0)]),
            route("ro:", vec![policy(MirrorMode::ReadOnly, true, 1_000_000)]),
            route("fw:", vec![policy(MirrorMode::Forward, true, 1_000_000)]),
        ],
        case_insensitive: false,
        catch_all: Some("old".to_string()),
        catch_all_mirrors: Vec::new(),
    };
    let clusters = vec![
        cluster("old", HashPolicy::Maglev { table_size: 65537 }, 4, 7000),
        cluster("new", HashPolicy::Crc16Slots, 2, 7100),
    ];
    routing_of(routes, clusters, None)
}

/// Answers `+from-<cluster>`.
fn from(cluster: usize) -> Reply {
    Bytes::from(format!("+from-{cluster}\r\n"))
}

/// A bounded queue that keeps what it accepted.
#[derive(Debug)]
struct Sink {
    capacity: usize,
    got: Mutex<Vec<Request>>,
}

impl Sink {
    fn new(capacity: usize) -> Arc<Sink> {
        Arc::new(Sink {
            capacity,
            got: Mutex::new(Vec::new()),
        })
    }

    fn got(&self) -> Vec<Request> {
        self.got.lock().unwrap().clone()
    }
}

impl MirrorSink for Sink {
    fn try_send(&self, req: Request) -> bool {
        let mut got = self.got.lock().unwrap();
        if got.len() >= self.capacity {
            return false;
        }
        got.push(req);
        true
    }
}

struct Setup {
    routing: Arc<Routing>,
    svc: Mirror<Mock>,
    inner: Mock,
    sink: Arc<Sink>,
    stats: Arc<MirrorStats>,
}

fn setup(capacity: usize) -> Setup {
    let routing = routing();
    let inner = Mock::new(|req: &Request| from(req.cluster));
    let sink = Sink::new(capacity);
    let stats = Arc::new(MirrorStats::new(routing.clusters.len()));
    let svc = MirrorLayer::new(routing.clone(), sink.clone(), stats.clone(), Arc::default())
        .layer(inner.clone());
    Setup {
        routing,
        svc,
        inner,
        sink,
        stats,
    }
}

impl Setup {
    /// `poll_ready` (must be ready), `call`, one poll (must be ready).
    fn send(&mut self, argv: &[&str]) -> Reply {
        let req = request(&self.routing, argv);
        self.send_req(req)
    }

    fn send_req(&mut self, req: Request) -> Reply {
        send(&mut self.svc, req)
    }
}

fn assert_same(got: &Request, sent: &Request) {
    assert_eq!(got.args, sent.args);
    assert_eq!(got.keys, sent.keys);
    assert_eq!(got.cluster, sent.cluster);
    assert_eq!(got.shard, sent.shard);
    assert_eq!(got.endpoint, sent.endpoint);
    assert_eq!(got.route, sent.route);
    assert_eq!(got.cmd.name, sent.cmd.name);
}

// === pass-through ===

#[test]
fn routes_without_policies_pass_through() {
    let mut t = setup(100);
    let reqs = [
        request(&t.routing, &["SET", "user:1", "v"]),
        request(&t.routing, &["GET", "user:1"]),
        request(&t.routing, &["EVAL", "return 1", "0"]),
    ];
    for r in &reqs {
        assert_eq!(t.send_req(r.clone()), from(OLD));
    }
    let seen = t.inner.seen();
    assert_eq!(seen.len(), 3);
    for (got, sent) in seen.iter().zip(&reqs) {
        assert_same(got, sent);
    }
    assert!(t.sink.got().is_empty());
    assert_eq!(t.stats.snapshot(), vec![MirrorCounts::default(); 2]);
}

#[test]
fn forward_mode_does_nothing() {
    let mut t = setup(100);
    assert_eq!(t.send(&["SET", "fw:a", "1"]), from(OLD));
    assert_eq!(t.send(&["GET", "fw:a"]), from(OLD));
    assert_eq!(t.inner.seen().len(), 2);
    assert!(t.sink.got().is_empty());
}

// === dual write, old cluster primary ===

#[test]
fn old_first_dual_write_keeps_the_original_and_queues_a_copy_to_the_mirror() {
    let mut t = setup(100);
    let sent = request(&t.routing, &["SET", "dw:a", "1"]);

    let reply = t.send_req(sent.clone());

    assert_eq!(
        reply,
        from(OLD),
        "the client's reply comes from the route's cluster"
    );
    let seen = t.inner.seen();
    assert_eq!(seen.len(), 1);
    assert_same(&seen[0], &sent);
    let copies = t.sink.got();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].cluster, NEW);
    assert_eq!(copies[0].shard, None);
    assert_eq!(copies[0].endpoint, None);
    assert_eq!(copies[0].args, sent.args);
    assert_eq!(
        t.stats.snapshot(),
        vec![
            MirrorCounts::default(),
            MirrorCounts {
                mirrored: 1,
                dropped: 0,
                failed: 0,
                ..Default::default()
            }
        ]
    );
}

#[test]
fn reads_are_mirrored_only_with_include_reads() {
    let mut t = setup(100);
    assert_eq!(t.send(&["GET", "dw:a"]), from(OLD));
    assert!(t.sink.got().is_empty(), "include_reads is off");

    assert_eq!(t.send(&["GET", "dwr:a"]), from(OLD));
    let copies = t.sink.got();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].cluster, NEW);
    assert_eq!(copies[0].args, vec!["GET", "dwr:a"]);
}

#[test]
fn multi_key_commands_are_mirrored_whole() {
    let mut t = setup(100);
    let sent = request(&t.routing, &["MSET", "dw:a", "1", "dw:b", "2"]);
    t.send_req(sent.clone());
    assert_same(&t.inner.seen()[0], &sent);
    let copies = t.sink.got();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].args, sent.args);
    assert_eq!(copies[0].cluster, NEW);
}

// === dual write, new cluster primary ===

#[test]
fn new_first_dual_write_answers_from_the_mirror_and_copies_to_the_route_cluster() {
    let mut t = setup(100);
    let mut sent = request(&t.routing, &["SET", "np:a", "1"]);
    // Whatever an outer layer pinned refers to the old cluster; it is cleared.
    sent.shard = Some(3);
    sent.endpoint = Some(0);

    let reply = t.send_req(sent.clone());

    assert_eq!(
        reply,
        from(NEW),
        "the client's reply comes from the new cluster"
    );
    let seen = t.inner.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].cluster, NEW);
    assert_eq!(seen[0].shard, None);
    assert_eq!(seen[0].endpoint, None);
    assert_eq!(seen[0].args, sent.args);
    let copies = t.sink.got();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].cluster, OLD);
    assert_eq!(copies[0].shard, None);
    assert_eq!(copies[0].endpoint, None);
    assert_eq!(copies[0].args, sent.args);
    assert_eq!(t.stats.snapshot()[OLD].mirrored, 1);
    assert_eq!(t.stats.snapshot()[NEW].mirrored, 0);
}

#[test]
fn new_first_reads_always_go_to_the_mirror_and_are_copied_only_with_include_reads() {
    let mut t = setup(100);
    assert_eq!(t.send(&["GET", "np:a"]), from(NEW));
    assert!(t.sink.got().is_empty());

    assert_eq!(t.send(&["GET", "npr:a"]), from(NEW));
    let copies = t.sink.got();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].cluster, OLD);
}

// === sampling ===

#[test]
fn fraction_zero_mirrors_nothing() {
    let mut t = setup(usize::MAX);
    for i in 0..1000 {
        let key = format!("zero:{i}");
        assert_eq!(t.send(&["SET", &key, "v"]), from(OLD));
    }
    assert_eq!(t.inner.seen().len(), 1000);
    assert!(t.sink.got().is_empty());
    assert_eq!(t.stats.snapshot()[NEW], MirrorCounts::default());
}

#[test]
fn fraction_half_mirrors_about_half() {
    let mut t = setup(usize::MAX);
    for i in 0..10_000 {
        let key = format!("half:{i}");
        assert_eq!(t.send(&["SET", &key, "v"]), from(OLD));
    }
    let n = t.sink.got().len();
    // Expected 5000, standard deviation 50: these bounds are 10 deviations away.
    assert!((4500..=5500).contains(&n), "{n} of 10000 mirrored");
    assert_eq!(t.stats.snapshot()[NEW].mirrored, n as u64);
    assert_eq!(t.inner.seen().len(), 10_000, "every original still goes on");
}

// === a full queue ===

#[test]
fn a_full_queue_drops_copies_and_leaves_the_reply_alone() {
    let mut t = setup(2);
    for i in 0..5 {
        let key = format!("dw:{i}");
        assert_eq!(t.send(&["SET", &key, "v"]), from(OLD));
    }
    assert_eq!(t.inner.seen().len(), 5);
    assert_eq!(t.sink.got().len(), 2);
    assert_eq!(
        t.stats.snapshot()[NEW],
        MirrorCounts {
            mirrored: 2,
            dropped: 3,
            failed: 0,
            ..Default::default()
        }
    );
}

// === read-only ===

#[test]
fn read_only_refuses_writes_and_serves_reads() {
    let mut t = setup(100);
    assert_eq!(t.send(&["SET", "ro:a", "1"]), error_reply(READ_ONLY));
    assert_eq!(
        t.send(&["INCR", "ro:a"]),
        Bytes::from_static(
            b"-ERR respway: route is read-only (migration cut-over), writes are refused\r\n"
        )
    );
    assert!(
        t.inner.seen().is_empty(),
        "refused writes never reach the inner service"
    );

    assert_eq!(t.send(&["GET", "ro:a"]), from(OLD));
    let seen = t.inner.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].args, vec!["GET", "ro:a"]);
    assert!(t.sink.got().is_empty());
}

#[test]
fn proxy_commands_are_neither_refused_nor_mirrored() {
    let mut t = setup(100);
    // A key-less command put on a read-only route and on a dual-write route by hand.
    for prefix in ["ro:x", "dw:x"] {
        let mut ping = request(&t.routing, &["PING"]);
        ping.route = t.routing.route(prefix.as_bytes()).unwrap().route;
        assert_eq!(t.send_req(ping), from(OLD));
    }
    assert_eq!(t.inner.seen().len(), 2);
    assert!(t.sink.got().is_empty());
}

// === stats ===

#[test]
fn failures_are_recorded_by_the_consumer_and_workers_add_up() {
    let a = MirrorStats::new(2);
    a.record_failed(NEW);
    a.record_failed(NEW);
    a.record_failed(7); // out of range: ignored
    let b = MirrorStats::new(2);
    b.record_failed(OLD);

    let mut t = setup(1);
    t.send(&["SET", "dw:a", "1"]);
    t.send(&["SET", "dw:b", "1"]);

    let total = MirrorCounts::sum([
        a.snapshot().as_slice(),
        b.snapshot().as_slice(),
        t.stats.snapshot().as_slice(),
    ]);
    assert_eq!(
        total,
        vec![
            MirrorCounts {
                mirrored: 0,
                dropped: 0,
                failed: 1,
                ..Default::default()
            },
            MirrorCounts {
                mirrored: 1,
                dropped: 1,
                failed: 2,
                ..Default::default()
            },
        ]
    );
}

// === through a runtime ===

#[tokio::test(flavor = "current_thread")]
async fn works_through_service_ext_on_a_runtime() {
    let mut t = setup(100);
    let req = request(&t.routing, &["SET", "np:a", "1"]);
    let reply = t.svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(reply, from(NEW));
    assert_eq!(t.sink.got().len(), 1);
}

// === refusals of the primary side ===

/// A key of `cluster` on another shard than `key`, for a CROSSSLOT.
fn apart(routing: &Routing, cluster: usize, key: &str) -> String {
    let picker = &routing.clusters[cluster].picker;
    let home = picker.pick(key.as_bytes());
    (0..100)
        .map(|i| format!("{}{i}", &key[..key.find(':').unwrap() + 1]))
        .find(|k| picker.pick(k.as_bytes()) != home)
        .unwrap()
}

#[test]
fn commands_the_primary_side_refuses_are_answered_and_not_copied() {
    let mut t = setup(100);
    let crossslot = error_reply(respway_filters::multi_key::CROSSSLOT);
    // New-first: the new cluster runs it; old-first: the old one does.
    for (key, primary) in [("np:a", NEW), ("dw:a", OLD)] {
        let other = apart(&t.routing, primary, key);
        assert_eq!(t.send(&["RENAME", key, &other]), crossslot, "{key}");
    }
    assert!(t.inner.seen().is_empty());
    assert!(
        t.sink.got().is_empty(),
        "a refused command is copied nowhere"
    );
    assert_eq!(t.stats.snapshot(), vec![MirrorCounts::default(); 2]);
}

#[test]
fn a_hot_key_written_with_other_keys_on_the_primary_side_is_not_copied() {
    use respway_filters::model::{HotKeyRead, HotKeyRule};
    let mut new = cluster("new", HashPolicy::Crc16Slots, 2, 7100);
    new.hot_keys = vec![HotKeyRule {
        prefix: "HIGH_FREQ_".to_string(),
        read: HotKeyRead::RoundRobin,
    }];
    let routes = RouteTable {
        catch_all: Some("old".to_string()),
        catch_all_mirrors: vec![policy(NEW_FIRST, false, 1_000_000)],
        ..Default::default()
    };
    let routing = routing_of(
        routes,
        vec![cluster("old", HashPolicy::Crc16Slots, 1, 7000), new],
        None,
    );
    let inner = Mock::new(|req: &Request| from(req.cluster));
    let sink = Sink::new(100);
    let stats = Arc::new(MirrorStats::new(2));
    let mut svc =
        MirrorLayer::new(routing.clone(), sink.clone(), stats, Arc::default()).layer(inner.clone());
    let reply = send(
        &mut svc,
        request(&routing, &["MSET", "HIGH_FREQ_a", "1", "plain", "2"]),
    );
    assert!(
        reply.starts_with(b"-ERR respway: hot key HIGH_FREQ_a is stored on every shard"),
        "{reply:?}"
    );
    assert!(inner.seen().is_empty());
    assert!(sink.got().is_empty());
    // On its own, the hot key's write goes on (the hot-key layer fans it out) and is copied.
    send(&mut svc, request(&routing, &["SET", "HIGH_FREQ_a", "1"]));
    assert_eq!(inner.seen().len(), 1);
    assert_eq!(sink.got().len(), 1);
}

// === the record of write copies ===

/// [`setup`], with a record (one worker) for every cluster that receives write copies.
fn setup_recorded(capacity: usize) -> (Setup, Vec<Option<Arc<WriteRecord>>>) {
    let mut t = setup(capacity);
    let targets = t.routing.write_copy_targets();
    let records: Vec<Option<Arc<WriteRecord>>> = (0..t.routing.clusters.len())
        .map(|c| targets.contains(&c).then(|| Arc::new(WriteRecord::new(1))))
        .collect();
    let parts: Vec<_> = records
        .iter()
        .map(|r| r.as_ref().and_then(|r| r.part(0)))
        .collect();
    t.svc = MirrorLayer::new(
        t.routing.clone(),
        t.sink.clone(),
        t.stats.clone(),
        Arc::default(),
    )
    .with_records(parts.into())
    .layer(t.inner.clone());
    (t, records)
}

/// The keys a record holds, sorted.
fn recorded(r: &WriteRecord) -> Vec<String> {
    let mut keys: Vec<String> = r
        .keys_since(None)
        .expect("read")
        .keys
        .iter()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    keys.sort();
    keys
}

/// Old-first copies go to `new` and new-first ones to `old`: both clusters get a record, and
/// each copy's keys land in its receiving cluster's.
#[test]
fn write_copies_are_recorded_by_receiving_cluster() {
    let (mut t, records) = setup_recorded(100);
    let mut targets = t.routing.write_copy_targets();
    targets.sort();
    assert_eq!(targets, [OLD, NEW]);
    t.send(&["SET", "dw:a", "1"]);
    t.send(&["MSET", "dw:b", "1", "dw:c", "2"]);
    t.send(&["SET", "np:d", "1"]);
    t.send(&["SET", "dw:a", "2"]);
    let (old, new) = (
        records[OLD].as_ref().unwrap(),
        records[NEW].as_ref().unwrap(),
    );
    assert_eq!(recorded(new), ["dw:a", "dw:b", "dw:c"]);
    assert_eq!(recorded(old), ["np:d"]);
    // Three writes copied to `new`: its cursor is at 3, and `dw:a` (the last) is past 2.
    let view = new.view();
    assert_eq!(view.cursor.seqs, [3]);
    assert_eq!(view.keys, 3);
    let at_2 = Cursor {
        id: new.id(),
        seqs: vec![2],
    };
    let since = new.keys_since(Some(&at_2)).expect("read").keys;
    assert_eq!(since, [Box::from(&b"dw:a"[..])]);
}

/// Copied reads, sampled-out writes, routes without a dual write and read-only routes record
/// nothing; a copy dropped by a full queue is recorded (its key differs on `new`); a write
/// copy without keys marks the record incomplete.
#[test]
fn only_write_copies_are_recorded_and_dropped_ones_too() {
    // Room for the copied read and one write copy.
    let (mut t, records) = setup_recorded(2);
    let new = records[NEW].as_ref().unwrap();
    t.send(&["GET", "dwr:r"]);
    t.send(&["SET", "zero:z", "1"]);
    t.send(&["SET", "plain", "1"]);
    t.send(&["SET", "fw:f", "1"]);
    t.send(&["GET", "ro:x"]);
    t.send(&["SET", "ro:x", "1"]);
    assert!(recorded(new).is_empty());
    assert_eq!(new.view().cursor.seqs, [0]);
    // The queue has room for one more copy: the second is dropped, and still recorded.
    t.send(&["SET", "dw:queued", "1"]);
    t.send(&["SET", "dw:dropped", "1"]);
    assert_eq!(t.stats.snapshot()[NEW].dropped, 1);
    assert_eq!(recorded(new), ["dw:dropped", "dw:queued"]);
    assert!(!new.view().incomplete);
    let mut script = request(&t.routing, &["EVAL", "return 1", "0"]);
    script.route = t.routing.route(b"dw:").unwrap().route;
    t.send_req(script);
    let view = new.view();
    assert!(view.incomplete, "a keyless write copy cannot be listed");
    assert!(!view.overflowed);
}

/// A route with `read_only` or `move` copies no write, so its mirror cluster gets no record.
#[test]
fn read_only_and_move_routes_receive_no_record() {
    for mode in [
        MirrorMode::ReadOnly,
        MirrorMode::Move,
        MirrorMode::PrepareMove,
        MirrorMode::Forward,
    ] {
        let routes = RouteTable {
            catch_all: Some("old".to_string()),
            catch_all_mirrors: vec![policy(mode, true, 1_000_000)],
            ..Default::default()
        };
        let routing = routing_of(
            routes,
            vec![
                cluster("old", HashPolicy::Crc16Slots, 1, 7000),
                cluster("new", HashPolicy::Crc16Slots, 1, 7100),
            ],
            None,
        );
        assert!(routing.write_copy_targets().is_empty(), "{mode:?}");
    }
}
