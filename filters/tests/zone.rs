//! The zone layer's contract, driven by hand (`poll_ready` then `call`) over a mock inner
//! service that records the endpoint each request was given, and a mock health view whose
//! failing set the test changes between calls.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{ok, Mock};
use bytes::Bytes;
use respway_filters::codec_limits::Limits;
use respway_filters::command;
use respway_filters::model::{
    Cluster, Config, Endpoint, HashPolicy, Listener, ReadPolicy, Role, RouteTable, Shard,
    ZoneFallback,
};
use respway_filters::request::Request;
use respway_filters::routing::Routing;
use respway_filters::zone::{AllHealthy, HealthView, Zone, ZoneLayer};
use tower::{Layer, Service, ServiceExt};

// --- fixtures ---------------------------------------------------------------------------

/// Endpoint layout of shard 0 of every test cluster (the sidecar is in zone `z1`):
///
/// | index | role | zone |
/// |---|---|---|
/// | 0 | replica | z1 |
/// | 1 | primary | z1 |
/// | 2 | replica | z2 |
/// | 3 | replica | z1 |
/// | 4 | replica | z2 |
///
/// The primary is deliberately not first, so a test that confuses "index 0" with "the
/// primary" fails. Shard 1 has only its primary.
const P: usize = 1;
const LOCAL: [usize; 2] = [0, 3];
const REMOTE: [usize; 2] = [2, 4];

fn endpoint(port: u16, role: Role, zone: &str) -> Endpoint {
    Endpoint {
        address: format!("127.0.0.1:{port}").parse().unwrap(),
        role,
        zone: Some(zone.to_string()),
    }
}

fn cluster(name: &str, read_policy: ReadPolicy, base: u16) -> Cluster {
    Cluster {
        tls: None,
        health_check: None,
        near_cache: None,
        redis_cluster: None,
        name: name.to_string(),
        hash: HashPolicy::Maglev { table_size: 65537 },
        hashtag: None,
        shards: vec![
            Shard {
                name: "s0".to_string(),
                hash_key: format!("127.0.0.1:{}", base + 1),
                weight: 1,
                slots: Vec::new(),
                endpoints: vec![
                    endpoint(base, Role::Replica, "z1"),
                    endpoint(base + 1, Role::Primary, "z1"),
                    endpoint(base + 2, Role::Replica, "z2"),
                    endpoint(base + 3, Role::Replica, "z1"),
                    endpoint(base + 4, Role::Replica, "z2"),
                ],
                sentinel: None,
            },
            Shard {
                name: "s1".to_string(),
                hash_key: format!("127.0.0.1:{}", base + 10),
                weight: 1,
                slots: Vec::new(),
                endpoints: vec![endpoint(base + 10, Role::Primary, "z2")],
                sentinel: None,
            },
        ],
        connections_per_endpoint: 1,
        databases: respway_filters::model::DEFAULT_DATABASES,
        dedicated_connections: respway_filters::model::DEFAULT_DEDICATED_CONNECTIONS,
        max_queue_per_connection: respway_filters::model::DEFAULT_MAX_QUEUE_PER_CONNECTION,
        connect_timeout: Duration::from_secs(1),
        auth: None,
        endpoint_auth: Vec::new(),
        db: 0,
        hot_keys: Vec::new(),
        read_policy,
    }
}

/// Cluster index of each policy in [`routing`].
const PRIMARY: usize = 0;
const PREFER_REPLICA: usize = 1;
const LOCAL_THEN_PRIMARY: usize = 2;
const LOCAL_THEN_REPLICA: usize = 3;
const ANY: usize = 4;

fn routing(zone: Option<&str>) -> Arc<Routing> {
    let policies = [
        ReadPolicy::Primary,
        ReadPolicy::PreferReplica,
        ReadPolicy::ZoneLocal {
            fallback: ZoneFallback::Primary,
        },
        ReadPolicy::ZoneLocal {
            fallback: ZoneFallback::AnyReplica,
        },
        ReadPolicy::Any,
    ];
    let clusters = policies
        .iter()
        .enumerate()
        .map(|(i, &p)| cluster(&format!("c{i}"), p, 7000 + 100 * i as u16))
        .collect();
    let config = Config {
        listeners: vec![Listener {
            observe: Default::default(),
            cluster_emulation: None,
            tls: None,
            name: "main".to_string(),
            address: "127.0.0.1:6380".parse().unwrap(),
            routes: RouteTable {
                catch_all: Some("c0".to_string()),
                ..RouteTable::default()
            },
            downstream_password: None,
            users: Vec::new(),
            op_timeout: Duration::from_secs(1),
            max_pending_per_client: 1024,
            resp: Default::default(),
            client: Default::default(),
            limits: Limits::default(),
        }],
        clusters,
        zone: zone.map(str::to_string),
    };
    let routing = Routing::build(&config, &config.listeners[0]).unwrap();
    // The fixture means what the table says.
    let s0 = &routing.clusters[0].shards[0];
    assert_eq!(s0.primary, P);
    if zone == Some("z1") {
        let local: Vec<usize> = (0..5).filter(|&i| s0.endpoints[i].local).collect();
        assert_eq!(local, vec![0, 1, 3]);
    }
    Arc::new(routing)
}

/// Health view with a set of failing `(cluster, shard, endpoint)`s; counts its lookups.
#[derive(Debug, Default)]
struct Health {
    down: Mutex<HashSet<(usize, usize, usize)>>,
    lookups: AtomicUsize,
}

impl Health {
    fn set_down(&self, cluster: usize, endpoints: &[usize]) {
        let mut down = self.down.lock().unwrap();
        down.retain(|&(c, _, _)| c != cluster);
        down.extend(endpoints.iter().map(|&e| (cluster, 0, e)));
    }

    fn lookups(&self) -> usize {
        self.lookups.load(Ordering::Relaxed)
    }
}

impl HealthView for Health {
    fn healthy(&self, cluster: usize, shard: usize, endpoint: usize) -> bool {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        !self
            .down
            .lock()
            .unwrap()
            .contains(&(cluster, shard, endpoint))
    }
}

fn request(args: &[&'static str], cluster: usize, shard: Option<usize>) -> Request {
    let cmd = command::lookup(args[0].as_bytes()).expect("known command");
    let args: Vec<Bytes> = args
        .iter()
        .map(|a| Bytes::from_static(a.as_bytes()))
        .collect();
    let key = (args.len() > 1).then_some(1);
    let mut req = Request::new(cmd, args, key.as_slice());
    req.cluster = cluster;
    if let Some(s) = shard {
        req.pin_shard(s);
    }
    req
}

fn get(cluster: usize) -> Request {
    request(&["GET", "k"], cluster, Some(0))
}

fn set(cluster: usize) -> Request {
    request(&["SET", "k", "v"], cluster, Some(0))
}

/// A zone service over the standard fixture (sidecar in z1), in front of a mock that
/// answers `+OK`.
struct Fixture {
    svc: Zone<Mock>,
    inner: Mock,
    health: Arc<Health>,
}

impl Fixture {
    fn new() -> Self {
        Self::with_zone(Some("z1"))
    }

    fn with_zone(zone: Option<&str>) -> Self {
        let health = Arc::new(Health::default());
        let inner = Mock::new(|_: &Request| ok());
        let svc = ZoneLayer::new(routing(zone), health.clone()).layer(inner.clone());
        Fixture { svc, inner, health }
    }

    /// Drives one request through `poll_ready` + `call`; returns the endpoint it was given.
    async fn send(&mut self, req: Request) -> Option<usize> {
        let reply = self.svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(reply, Bytes::from_static(b"+OK\r\n"));
        self.inner.seen().last().unwrap().endpoint.map(usize::from)
    }

    /// Endpoints chosen for `n` reads on shard 0 of `cluster`.
    async fn reads(&mut self, cluster: usize, n: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.send(get(cluster)).await.expect("endpoint set"));
        }
        out
    }
}

// --- writes and the fast path ------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn zone_writes_always_go_to_the_primary() {
    let mut f = Fixture::new();
    for c in [
        PRIMARY,
        PREFER_REPLICA,
        LOCAL_THEN_PRIMARY,
        LOCAL_THEN_REPLICA,
        ANY,
    ] {
        for args in [
            &["SET", "k", "v"][..],
            &["DEL", "k"],
            &["INCR", "k"],
            // Neither readonly nor write: scripts count as writes.
            &["EVAL", "return 1", "0"],
        ] {
            assert_eq!(f.send(request(args, c, Some(0))).await, Some(P), "{args:?}");
        }
    }
    // Even when the primary is down: the upstream turns that into the error reply.
    f.health.set_down(ANY, &[P]);
    assert_eq!(f.send(set(ANY)).await, Some(P));
    assert_eq!(f.health.lookups(), 0, "writes never ask for health");
}

#[tokio::test(flavor = "current_thread")]
async fn zone_fast_path_skips_health_lookups() {
    let mut f = Fixture::new();
    // Primary policy: the primary, whatever the health.
    f.health.set_down(PRIMARY, &[P]);
    assert_eq!(f.reads(PRIMARY, 3).await, vec![P, P, P]);
    // A shard with one endpoint: that endpoint, under every policy.
    for c in [PREFER_REPLICA, LOCAL_THEN_PRIMARY, LOCAL_THEN_REPLICA, ANY] {
        assert_eq!(f.send(request(&["GET", "k"], c, Some(1))).await, Some(0));
    }
    assert_eq!(f.health.lookups(), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn zone_keeps_cluster_and_shard_and_defaults_to_shard_zero() {
    let mut f = Fixture::new();
    f.send(request(&["GET", "k"], ANY, Some(1))).await;
    // No shard pinned (a key-less command): shard 0, as the upstream reads it.
    assert_eq!(f.send(request(&["PING"], PRIMARY, None)).await, Some(P));
    let seen: Vec<_> = f
        .inner
        .seen()
        .iter()
        .map(|r| (r.cluster, r.shard, r.endpoint.map(usize::from)))
        .collect();
    assert_eq!(
        seen,
        vec![(ANY, Some(1), Some(0)), (PRIMARY, None, Some(P))]
    );
}

#[tokio::test(flavor = "current_thread")]
async fn zone_unknown_shard_is_passed_through_untouched() {
    let mut f = Fixture::new();
    assert_eq!(f.send(request(&["GET", "k"], ANY, Some(9))).await, None);
    assert_eq!(f.send(request(&["GET", "k"], 99, Some(0))).await, None);
}

// --- read policies ---------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn zone_prefer_replica_rotates_over_healthy_replicas() {
    let mut f = Fixture::new();
    assert_eq!(
        f.reads(PREFER_REPLICA, 8).await,
        vec![0, 2, 3, 4, 0, 2, 3, 4]
    );
    // Skips a failing replica, and takes it back once it recovers.
    f.health.set_down(PREFER_REPLICA, &[2]);
    assert_eq!(f.reads(PREFER_REPLICA, 6).await, vec![0, 3, 4, 0, 3, 4]);
    f.health.set_down(PREFER_REPLICA, &[]);
    assert_eq!(f.reads(PREFER_REPLICA, 4).await, vec![0, 2, 3, 4]);
    // No healthy replica: the primary.
    f.health.set_down(PREFER_REPLICA, &[0, 2, 3, 4]);
    assert_eq!(f.reads(PREFER_REPLICA, 2).await, vec![P, P]);
    // ... and the primary even when it is failing too.
    f.health.set_down(PREFER_REPLICA, &[0, 1, 2, 3, 4]);
    assert_eq!(f.reads(PREFER_REPLICA, 1).await, vec![P]);
    f.health.set_down(PREFER_REPLICA, &[0, 3]);
    assert_eq!(f.reads(PREFER_REPLICA, 3).await, vec![2, 4, 2]);
}

#[tokio::test(flavor = "current_thread")]
async fn zone_local_rotates_over_healthy_local_replicas() {
    for c in [LOCAL_THEN_PRIMARY, LOCAL_THEN_REPLICA] {
        let mut f = Fixture::new();
        // Local replicas only: never the local primary, never a z2 replica.
        assert_eq!(f.reads(c, 4).await, vec![0, 3, 0, 3], "cluster {c}");
        f.health.set_down(c, &[3]);
        assert_eq!(f.reads(c, 3).await, vec![0, 0, 0], "cluster {c}");
        f.health.set_down(c, &[]);
        let got = f.reads(c, 4).await;
        assert!(
            got.contains(&0) && got.contains(&3),
            "{got:?} after recovery"
        );
        assert!(got.iter().all(|e| LOCAL.contains(e)), "{got:?}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn zone_local_falls_back_to_the_primary() {
    let mut f = Fixture::new();
    f.health.set_down(LOCAL_THEN_PRIMARY, &LOCAL);
    // Healthy z2 replicas are not used with this fallback.
    assert_eq!(f.reads(LOCAL_THEN_PRIMARY, 3).await, vec![P, P, P]);
    // A local replica recovers: it is used again.
    f.health.set_down(LOCAL_THEN_PRIMARY, &[0]);
    assert_eq!(f.reads(LOCAL_THEN_PRIMARY, 2).await, vec![3, 3]);
}

#[tokio::test(flavor = "current_thread")]
async fn zone_local_falls_back_to_a_remote_replica_then_the_primary() {
    let mut f = Fixture::new();
    f.health.set_down(LOCAL_THEN_REPLICA, &LOCAL);
    let got = f.reads(LOCAL_THEN_REPLICA, 4).await;
    assert_eq!(got, vec![2, 4, 2, 4]);
    f.health.set_down(LOCAL_THEN_REPLICA, &[0, 3, 2]);
    assert_eq!(f.reads(LOCAL_THEN_REPLICA, 2).await, vec![4, 4]);
    // No replica healthy anywhere: the primary.
    f.health.set_down(LOCAL_THEN_REPLICA, &[0, 2, 3, 4]);
    assert_eq!(f.reads(LOCAL_THEN_REPLICA, 2).await, vec![P, P]);
    // Local replicas back: preferred again over remote ones.
    f.health.set_down(LOCAL_THEN_REPLICA, &[]);
    let got = f.reads(LOCAL_THEN_REPLICA, 4).await;
    assert!(got.iter().all(|e| LOCAL.contains(e)), "{got:?}");
    assert!(REMOTE.iter().all(|e| !got.contains(e)));
}

#[tokio::test(flavor = "current_thread")]
async fn zone_local_without_a_sidecar_zone_uses_the_fallback() {
    // No zone configured: no endpoint is local.
    let mut f = Fixture::with_zone(None);
    assert_eq!(f.reads(LOCAL_THEN_PRIMARY, 2).await, vec![P, P]);
    assert_eq!(f.reads(LOCAL_THEN_REPLICA, 4).await, vec![0, 2, 3, 4]);
}

#[tokio::test(flavor = "current_thread")]
async fn zone_any_rotates_over_every_healthy_endpoint() {
    let mut f = Fixture::new();
    assert_eq!(f.reads(ANY, 10).await, vec![0, 1, 2, 3, 4, 0, 1, 2, 3, 4]);
    f.health.set_down(ANY, &[1, 3]);
    assert_eq!(f.reads(ANY, 6).await, vec![0, 2, 4, 0, 2, 4]);
    // Only the primary is failing... and then it recovers.
    f.health.set_down(ANY, &[P]);
    assert_eq!(f.reads(ANY, 4).await, vec![0, 2, 3, 4]);
    f.health.set_down(ANY, &[]);
    assert_eq!(f.reads(ANY, 5).await, vec![0, 1, 2, 3, 4]);
    // Nothing healthy: the primary.
    f.health.set_down(ANY, &[0, 1, 2, 3, 4]);
    assert_eq!(f.reads(ANY, 2).await, vec![P, P]);
}

#[tokio::test(flavor = "current_thread")]
async fn zone_health_is_asked_only_until_a_candidate_is_found() {
    let mut f = Fixture::new();
    assert_eq!(f.reads(PREFER_REPLICA, 1).await, vec![0]);
    assert_eq!(f.health.lookups(), 1);
    // Replica 2 down: the next read asks 2 (no), then 3 (yes).
    f.health.set_down(PREFER_REPLICA, &[2]);
    assert_eq!(f.reads(PREFER_REPLICA, 1).await, vec![3]);
    assert_eq!(f.health.lookups(), 3);
}

// --- the round-robin cursor ------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn zone_cursor_is_per_connection() {
    let routing = routing(Some("z1"));
    let layer = ZoneLayer::new(routing, Arc::new(AllHealthy));
    let a = Mock::new(|_: &Request| ok());
    let b = Mock::new(|_: &Request| ok());
    let mut conn_a = layer.layer(a.clone());
    let mut conn_b = layer.layer(b.clone());
    for _ in 0..3 {
        conn_a.ready().await.unwrap().call(get(ANY)).await.unwrap();
    }
    conn_b.ready().await.unwrap().call(get(ANY)).await.unwrap();
    let ends = |m: &Mock| m.seen().iter().map(|r| r.endpoint).collect::<Vec<_>>();
    assert_eq!(ends(&a), vec![Some(0), Some(1), Some(2)]);
    // A new connection starts its own rotation.
    assert_eq!(ends(&b), vec![Some(0)]);
    // A chosen start spreads connections.
    let mut conn_c = layer
        .clone()
        .with_rr_start(3)
        .layer(Mock::new(|_: &Request| ok()));
    let c = conn_c.get_ref().clone();
    conn_c.ready().await.unwrap().call(get(ANY)).await.unwrap();
    assert_eq!(c.seen()[0].endpoint, Some(3));
    let _inner: Mock = conn_c.into_inner();
}

#[tokio::test(flavor = "current_thread")]
async fn zone_writes_do_not_move_the_cursor() {
    let mut f = Fixture::new();
    assert_eq!(f.reads(ANY, 2).await, vec![0, 1]);
    f.send(set(ANY)).await;
    f.send(set(ANY)).await;
    assert_eq!(f.reads(ANY, 2).await, vec![2, 3]);
}

#[test]
fn a_shard_with_more_endpoints_than_a_request_can_name_is_refused() {
    // A request names the endpoint it goes to with a u16.
    let mut c = cluster("big", ReadPolicy::Any, 7000);
    let e = c.shards[0].endpoints[0].clone();
    c.shards[0].endpoints = vec![e; respway_filters::routing::MAX_SHARD_ENDPOINTS + 1];
    let config = Config {
        listeners: Vec::new(),
        clusters: vec![c],
        zone: None,
    };
    let e = Routing::compile_clusters(&config).unwrap_err();
    assert_eq!(
        e,
        "cluster \"big\": shard \"s0\": endpoints: at most 65535 (got 65536)"
    );
    let mut ok = cluster("ok", ReadPolicy::Any, 7000);
    let e = ok.shards[0].endpoints[0].clone();
    ok.shards[0].endpoints = vec![e; respway_filters::routing::MAX_SHARD_ENDPOINTS];
    let config = Config {
        listeners: Vec::new(),
        clusters: vec![ok],
        zone: None,
    };
    assert!(Routing::compile_clusters(&config).is_ok());
}
