//! What the filter chain costs per request, with no sockets: the same layer stack as
//! `src/stack/mod.rs` (PrefixRoute → Mirror → HotKey → MultiKey → Hash → Zone) over a trivial
//! inner service that answers at once with a ready future, driven the way a session drives
//! it under `redis-benchmark -P 16`: 16 `GET`s are called one after the other, then their 16
//! futures are polled (with a no-op waker; no runtime).
//!
//! The claim being measured (see the issue and `src/stack/mod.rs`): a route with no hot-key rule,
//! no mirror and the primary read policy pays (almost) nothing for the layers it does not
//! use. Groups:
//!
//! - `chain_get_p16`: the chain only (requests are built outside the timed part).
//!   - `bare`: one cluster, three shards, maglev, a catch-all, nothing else.
//!   - `configured_unused`: the same cluster as catch-all, plus prefix routes (`up:`, `fc:`,
//!     `sess:`) to other clusters with mirror policies (new-first dual write with reads,
//!     sampled old-first dual write, read-only), hot-key rules and `zone_local` /
//!     `any` read policies on those other clusters, and a node zone. The benchmarked keys
//!     (`key:<i>`) take the catch-all: no mirror, no hot-key rule, primary reads.
//!   - `unused_rules_on_route`: like `configured_unused`, and in addition the catch-all's own
//!     cluster has hot-key rules the keys do not match and the catch-all has an inactive
//!     (`forward`) mirror: the layers must look before they pass.
//!   - `in_use/*` (for reference, on the `unused_rules_on_route` routing): hot-key reads
//!     (`GET HIGH_FREQ_<i>`), a mirrored and re-targeted read (`GET up:<i>`, one copy per
//!     request), zone-local replica reads (`GET fc:<i>`), and hot-key writes fanned out to
//!     the three shards (`SET HIGH_FREQ_<i> v`).
//! - `ab_get_p16`: `bare` against `configured_unused` (and `unused_rules_on_route`), timed
//!   in alternating blocks of 32 pipelines so that a shared machine's drifting load hits both
//!   alike, for the chain alone (`chain/*`) and the whole session path (`pipeline/*`, as
//!   `pipeline_p16`); prints the configured/bare ratio to stderr (10th percentile and median
//!   of the blocks). These are the numbers to read on a busy machine; `bare_vs_bare` (two
//!   identical bare chains) is the control that shows how far from 1.0 noise alone goes.
//! - `pipeline_p16`: decode a 16-command `GET` pipeline from a client buffer, look each
//!   command up, find its key, build the request, run it through the chain and poll it: the
//!   whole per-request work of a session except the socket I/O and the reply write.
//! - `decode_p16`: the RESP decoder alone on the same 16-command pipeline.
//! - `route`: `Routing::route` of one key, bare vs configured.
//!
//! Before measuring, every variant is run once against a recording inner service and checked:
//! the benchmarked keys reach the catch-all cluster's primaries with no copy queued and no
//! hot-key counter moved (or, for `in_use`, with the feature actually applied).
//!
//! Run: `cargo bench -p respway-filters --bench chain -- --warm-up-time 1 --measurement-time 3`

use respway_filters::error::Failure;
use std::cell::RefCell;
use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BatchSize, BenchmarkGroup, Criterion, Throughput,
};
use respway_filters::codec_limits::Limits;
use respway_filters::command;
use respway_filters::hash_layer::HashLayer;
use respway_filters::hot_key::{HotKeyLayer, HotKeyStats};
use respway_filters::mirror::{MirrorLayer, MirrorSink, MirrorStats};
use respway_filters::model::{
    Cluster, Config, Endpoint, HashPolicy, HashTag, HotKeyRead, HotKeyRule, Listener, MirrorMode,
    MirrorPolicy, PrefixRoute, ReadPolicy, Role, RouteTable, Shard, ZoneFallback,
};
use respway_filters::multi_key::MultiKeyLayer;
use respway_filters::prefix_route::PrefixRouteLayer;
use respway_filters::request::{Reply, Request};
use respway_filters::resp::RequestDecoder;
use respway_filters::routing::{RouteId, Routing};
use respway_filters::zone::{AllHealthy, HealthView, ZoneLayer};
use tower::{Service, ServiceBuilder};

/// Requests in flight per connection, as `redis-benchmark -P 16`.
const PIPELINE: usize = 16;

/// The reply every request gets from the trivial upstream.
const REPLY: &[u8] = b"$1\r\nv\r\n";

// === configuration ===

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn endpoint(port: u16, role: Role, zone: Option<&str>) -> Endpoint {
    Endpoint {
        address: addr(port),
        role,
        zone: zone.map(str::to_owned),
    }
}

/// A shard named `name` whose primary is the first endpoint.
fn shard(name: &str, endpoints: Vec<Endpoint>) -> Shard {
    Shard {
        name: name.to_owned(),
        hash_key: endpoints[0].address.to_string(),
        weight: 1,
        slots: Vec::new(),
        endpoints,
        sentinel: None,
    }
}

fn cluster(name: &str, hash: HashPolicy, shards: Vec<Shard>) -> Cluster {
    Cluster {
        tls: None,
        health_check: None,
        near_cache: None,
        redis_cluster: None,
        name: name.to_owned(),
        hash,
        hashtag: Some(HashTag::default()),
        shards,
        connections_per_endpoint: 1,
        databases: respway_filters::model::DEFAULT_DATABASES,
        dedicated_connections: respway_filters::model::DEFAULT_DEDICATED_CONNECTIONS,
        max_queue_per_connection: respway_filters::model::DEFAULT_MAX_QUEUE_PER_CONNECTION,
        connect_timeout: Duration::from_secs(1),
        auth: None,
        endpoint_auth: Vec::new(),
        db: 0,
        hot_keys: Vec::new(),
        read_policy: ReadPolicy::Primary,
    }
}

const MAGLEV: HashPolicy = HashPolicy::Maglev { table_size: 65537 };

/// The benchmarked keys' cluster: three primary-only shards, maglev, primary reads.
fn main_cluster() -> Cluster {
    cluster(
        "main",
        MAGLEV,
        (0..3)
            .map(|i| {
                shard(
                    &format!("s{i}"),
                    vec![endpoint(7001 + i, Role::Primary, None)],
                )
            })
            .collect(),
    )
}

fn listener(routes: RouteTable) -> Listener {
    Listener {
        observe: Default::default(),
        cluster_emulation: None,
        tls: None,
        name: "main".to_owned(),
        address: addr(6380),
        routes,
        downstream_password: None,
        users: Vec::new(),
        op_timeout: Duration::from_secs(1),
        max_pending_per_client: 1024,
        resp: Default::default(),
        client: Default::default(),
        limits: Limits::default(),
    }
}

fn mirror(cluster: &str, mode: MirrorMode, include_reads: bool, fraction_ppm: u32) -> MirrorPolicy {
    MirrorPolicy {
        cluster: cluster.to_owned(),
        mode,
        include_reads,
        fraction_ppm,
    }
}

fn hot(prefix: &str, read: HotKeyRead) -> HotKeyRule {
    HotKeyRule {
        prefix: prefix.to_owned(),
        read,
    }
}

/// (a) bare: one cluster, three shards, maglev, catch-all, no rules.
fn bare_config() -> (Config, Listener) {
    let routes = RouteTable {
        catch_all: Some("main".to_owned()),
        ..RouteTable::default()
    };
    let l = listener(routes);
    let config = Config {
        listeners: vec![l.clone()],
        clusters: vec![main_cluster()],
        zone: None,
    };
    (config, l)
}

/// (b) every feature configured, none on the benchmarked keys' route or cluster;
/// (c) with `rules_on_route`, also non-matching hot-key rules on the catch-all's cluster and
/// an inactive (`forward`) mirror on the catch-all.
fn configured_config(rules_on_route: bool) -> (Config, Listener) {
    let mut main = main_cluster();
    if rules_on_route {
        main.hot_keys = vec![
            hot("HIGH_FREQ_", HotKeyRead::RoundRobin),
            hot("cfg:", HotKeyRead::Random),
        ];
    }
    // Twemproxy-style profile cluster with hot keys of its own.
    let mut profile = cluster(
        "profile",
        HashPolicy::Ketama {
            key_hash: respway_filters::model::KeyHash::Fnv1a64,
        },
        vec![
            shard("redis-a", vec![endpoint(7201, Role::Primary, None)]),
            shard("redis-b", vec![endpoint(7202, Role::Primary, None)]),
        ],
    );
    profile.hot_keys = vec![hot("HIGH_FREQ_", HotKeyRead::SameZone)];
    profile.read_policy = ReadPolicy::PreferReplica;
    // Zone-local reads over primaries with replicas in two zones.
    let mut fc = cluster(
        "fc",
        MAGLEV,
        (0..2)
            .map(|i| {
                shard(
                    &format!("fc{i}"),
                    vec![
                        endpoint(7301 + i, Role::Primary, Some("z2")),
                        endpoint(7311 + i, Role::Replica, Some("z1")),
                        endpoint(7321 + i, Role::Replica, Some("z2")),
                    ],
                )
            })
            .collect(),
    );
    fc.read_policy = ReadPolicy::ZoneLocal {
        fallback: ZoneFallback::AnyReplica,
    };
    // The migration target.
    let mut v2 = cluster(
        "main-v2",
        MAGLEV,
        vec![shard(
            "v2-0",
            vec![
                endpoint(7401, Role::Primary, Some("z1")),
                endpoint(7402, Role::Replica, Some("z2")),
            ],
        )],
    );
    v2.read_policy = ReadPolicy::Any;
    v2.hot_keys = vec![hot("HIGH_FREQ_", HotKeyRead::Random)];
    let routes = RouteTable {
        routes: vec![
            PrefixRoute {
                prefix: "up:".to_owned(),
                remove_prefix: true,
                cluster: "profile".to_owned(),
                mirrors: vec![mirror(
                    "main-v2",
                    MirrorMode::DualWrite {
                        target_is_primary: true,
                    },
                    true,
                    1_000_000,
                )],
            },
            PrefixRoute {
                prefix: "fc:".to_owned(),
                remove_prefix: false,
                cluster: "fc".to_owned(),
                mirrors: vec![mirror(
                    "main-v2",
                    MirrorMode::DualWrite {
                        target_is_primary: false,
                    },
                    false,
                    125_000,
                )],
            },
            PrefixRoute {
                prefix: "sess:".to_owned(),
                remove_prefix: false,
                cluster: "fc".to_owned(),
                mirrors: vec![mirror("main-v2", MirrorMode::ReadOnly, false, 1_000_000)],
            },
        ],
        case_insensitive: false,
        catch_all: Some("main".to_owned()),
        catch_all_mirrors: if rules_on_route {
            vec![mirror("main-v2", MirrorMode::Forward, true, 1_000_000)]
        } else {
            Vec::new()
        },
    };
    let l = listener(routes);
    let config = Config {
        listeners: vec![l.clone()],
        clusters: vec![main, profile, fc, v2],
        zone: Some("z1".to_owned()),
    };
    (config, l)
}

fn routing(build: fn() -> (Config, Listener)) -> Arc<Routing> {
    let (config, l) = build();
    Arc::new(Routing::build(&config, &l).expect("routing builds"))
}

// === the chain ===

/// Queues nothing: counts the copies and drops them.
#[derive(Debug, Default)]
struct NoopSink {
    copies: AtomicU64,
}

impl MirrorSink for NoopSink {
    fn try_send(&self, req: Request) -> bool {
        self.copies.fetch_add(1, Relaxed);
        drop(black_box(req));
        true
    }
}

/// The upstream: answers every request at once.
#[derive(Debug, Clone, Copy)]
struct Trivial;

impl Service<Request> for Trivial {
    type Response = Reply;
    type Error = Failure;
    type Future = Ready<Result<Reply, Failure>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        // Keep the chain's decisions observable so they cannot be optimised away.
        black_box((req.cluster, req.shard, req.endpoint));
        drop(req);
        ready(Ok(Bytes::from_static(REPLY)))
    }
}

/// Where a request ended: (cluster, shard, endpoint, route, first key).
type Seen = (usize, Option<usize>, Option<usize>, RouteId, Option<Bytes>);

/// The upstream for the checks: records where each request ended.
#[derive(Debug, Clone, Default)]
struct Recording(Rc<RefCell<Vec<Seen>>>);

impl Service<Request> for Recording {
    type Response = Reply;
    type Error = Failure;
    type Future = Ready<Result<Reply, Failure>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let key = req.first_key().cloned();
        self.0.borrow_mut().push((
            req.cluster,
            req.shard_index(),
            req.endpoint.map(usize::from),
            req.route,
            key,
        ));
        ready(Ok(Bytes::from_static(REPLY)))
    }
}

/// One connection's chain and the per-worker things it counts into.
struct Stack<S> {
    svc: S,
    sink: Arc<NoopSink>,
    hot: Arc<HotKeyStats>,
}

/// The stack of `src/stack/mod.rs` (`build` over `shadow`), same layers, same order, over `inner`.
fn stack<U>(
    routing: &Arc<Routing>,
    inner: U,
) -> Stack<impl Service<Request, Response = Reply, Error = Failure, Future: Unpin>>
where
    U: Service<Request, Response = Reply, Error = Failure> + Clone + Unpin,
    U::Future: Unpin,
{
    let sink = Arc::new(NoopSink::default());
    let hot = Arc::new(HotKeyStats::new(routing));
    let mirror_stats = Arc::new(MirrorStats::new(routing.clusters.len()));
    let health: Arc<dyn HealthView> = Arc::new(AllHealthy);
    let dyn_sink: Arc<dyn MirrorSink> = sink.clone();
    let svc = ServiceBuilder::new()
        .layer(PrefixRouteLayer::new(routing.clone()))
        .layer(MirrorLayer::new(
            routing.clone(),
            dyn_sink,
            mirror_stats,
            Arc::default(),
        ))
        .layer(HotKeyLayer::new(routing.clone(), hot.clone()))
        .layer(MultiKeyLayer::new(routing.clone()))
        .layer(HashLayer::new(routing.clone()))
        .layer(ZoneLayer::new(routing.clone(), health))
        .service(inner);
    Stack { svc, sink, hot }
}

/// A request as the session builds it from argv.
fn request(args: &[Bytes]) -> Request {
    let cmd = command::lookup(&args[0]).expect("known command");
    let cmd = cmd.resolve(args);
    assert!(cmd.arity_ok(args.len()));
    let mut keys = Vec::new();
    cmd.key_indices(args, &mut keys).expect("keys");
    Request::new(cmd, args.to_vec(), &keys)
}

/// The argv of the 16 commands of one pipeline, keys `<prefix><i>`.
fn batch_args(cmd: &str, prefix: &str) -> Vec<Vec<Bytes>> {
    (0..PIPELINE)
        .map(|i| {
            let mut args = vec![
                Bytes::copy_from_slice(cmd.as_bytes()),
                Bytes::from(format!("{prefix}{i}")),
            ];
            if cmd == "SET" {
                args.push(Bytes::from_static(b"v"));
            }
            args
        })
        .collect()
}

fn batch(args: &[Vec<Bytes>]) -> Vec<Request> {
    args.iter().map(|a| request(a)).collect()
}

/// Calls every request (as the session does, `poll_ready` before each call), then polls the
/// futures in order. Returns the total reply length.
#[inline]
fn run<S>(svc: &mut S, reqs: Vec<Request>, futs: &mut Vec<S::Future>) -> usize
where
    S: Service<Request, Response = Reply, Error = Failure>,
    S::Future: Unpin,
{
    let mut cx = Context::from_waker(Waker::noop());
    for req in reqs {
        let _ = svc.poll_ready(&mut cx);
        futs.push(svc.call(req));
    }
    let mut n = 0;
    for mut fut in futs.drain(..) {
        match Pin::new(&mut fut).poll(&mut cx) {
            Poll::Ready(Ok(reply)) => n += black_box(reply).len(),
            Poll::Ready(Err(f)) => panic!("the trivial upstream does not fail: {f}"),
            Poll::Pending => panic!("the trivial upstream is always ready"),
        }
    }
    n
}

// === checks ===

/// Runs `args` through `routing`'s chain over a recording upstream; returns where the
/// requests went, the copies queued and the hot-key counters' total.
fn trace(routing: &Arc<Routing>, args: &[Vec<Bytes>]) -> (Vec<Seen>, u64, u64) {
    let rec = Recording::default();
    let mut s = stack(routing, rec.clone());
    let mut futs = Vec::new();
    let n = run(&mut s.svc, batch(args), &mut futs);
    assert_eq!(n, REPLY.len() * PIPELINE, "one reply per request");
    let hot: u64 = s
        .hot
        .snapshot()
        .iter()
        .map(|r| r.fanned_out_writes + r.reads_per_shard.iter().sum::<u64>())
        .sum();
    let seen = rec.0.borrow().clone();
    (seen, s.sink.copies.load(Relaxed), hot)
}

fn cluster_index(routing: &Routing, name: &str) -> usize {
    routing
        .clusters
        .iter()
        .position(|c| c.name == name)
        .expect("cluster exists")
}

/// The benchmarked keys take the catch-all to `main`'s primaries, untouched by the features.
fn check_unused(name: &str, routing: &Arc<Routing>, bare: &Arc<Routing>) {
    let args = batch_args("GET", "key:");
    let (seen, copies, hot) = trace(routing, &args);
    let (bare_seen, _, _) = trace(bare, &args);
    let main = cluster_index(routing, "main");
    assert_eq!(seen.len(), PIPELINE, "{name}");
    for (s, b) in seen.iter().zip(&bare_seen) {
        assert_eq!(s.0, main, "{name}: catch-all cluster");
        assert_eq!(s.3, RouteId::CatchAll, "{name}: catch-all route");
        assert_eq!(s.2, Some(0), "{name}: primary read");
        assert_eq!(s.1, b.1, "{name}: same shard as the bare config");
    }
    assert_eq!(copies, 0, "{name}: no mirror copy");
    assert_eq!(hot, 0, "{name}: no hot-key read or fan-out");
    let shards: std::collections::BTreeSet<_> = seen.iter().map(|s| s.1).collect();
    assert!(shards.len() > 1, "{name}: keys spread over the shards");
}

/// The `in_use` variants do use their feature.
fn check_in_use(routing: &Arc<Routing>) {
    let main = cluster_index(routing, "main");
    let v2 = cluster_index(routing, "main-v2");
    let fc = cluster_index(routing, "fc");

    let (seen, copies, hot) = trace(routing, &batch_args("GET", "HIGH_FREQ_"));
    assert!(seen.iter().all(|s| s.0 == main) && copies == 0);
    assert_eq!(hot, PIPELINE as u64, "every hot read counted");
    let shards: std::collections::BTreeSet<_> = seen.iter().map(|s| s.1).collect();
    assert_eq!(shards.len(), 3, "hot reads rotate over the shards");

    let (seen, copies, _) = trace(routing, &batch_args("GET", "up:"));
    assert!(seen.iter().all(|s| s.0 == v2), "new-first: main-v2 answers");
    assert!(seen
        .iter()
        .all(|s| s.4.as_deref().is_some_and(|k| !k.starts_with(b"up:"))));
    assert_eq!(copies, PIPELINE as u64, "one copy per read");

    let (seen, copies, _) = trace(routing, &batch_args("GET", "fc:"));
    assert!(copies == 0 && seen.iter().all(|s| s.0 == fc));
    let fc_route = &routing.clusters[fc];
    for s in &seen {
        let e = &fc_route.shards[s.1.unwrap()].endpoints[s.2.unwrap()];
        assert!(e.role == Role::Replica && e.local, "zone-local replica");
    }

    let (seen, copies, hot) = trace(routing, &batch_args("SET", "HIGH_FREQ_"));
    assert_eq!(seen.len(), 3 * PIPELINE, "a write per shard");
    assert_eq!(copies, 0);
    assert_eq!(hot, PIPELINE as u64, "every write fanned out");
}

// === benches ===

fn chain_get_p16(c: &mut Criterion) {
    let bare = routing(bare_config);
    let unused = routing(|| configured_config(false));
    let strict = routing(|| configured_config(true));
    check_unused("configured_unused", &unused, &bare);
    check_unused("unused_rules_on_route", &strict, &bare);
    check_in_use(&strict);

    let mut g = c.benchmark_group("chain_get_p16");
    g.throughput(Throughput::Elements(PIPELINE as u64));
    let cases: [(&str, &Arc<Routing>, &str, &str); 7] = [
        ("bare", &bare, "GET", "key:"),
        ("configured_unused", &unused, "GET", "key:"),
        ("unused_rules_on_route", &strict, "GET", "key:"),
        ("in_use/hot_key_read", &strict, "GET", "HIGH_FREQ_"),
        ("in_use/mirror_new_first_read", &strict, "GET", "up:"),
        ("in_use/zone_local_read", &strict, "GET", "fc:"),
        ("in_use/hot_key_write_fanout", &strict, "SET", "HIGH_FREQ_"),
    ];
    for (name, routing, cmd, prefix) in cases {
        let args = batch_args(cmd, prefix);
        let mut s = stack(routing, Trivial);
        let mut futs = Vec::with_capacity(PIPELINE);
        g.bench_function(name, |b| {
            b.iter_batched(
                || batch(&args),
                |reqs| run(&mut s.svc, reqs, &mut futs),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

/// The 16-command pipeline as a client sends it.
fn pipeline_bytes(prefix: &str) -> BytesMut {
    let mut buf = BytesMut::new();
    for i in 0..PIPELINE {
        let key = format!("{prefix}{i}");
        buf.extend_from_slice(format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).as_bytes());
    }
    buf
}

fn decode_p16(c: &mut Criterion) {
    let input = pipeline_bytes("key:");
    let mut g = c.benchmark_group("decode_p16");
    g.throughput(Throughput::Elements(PIPELINE as u64));
    let mut dec = RequestDecoder::new(Limits::default());
    g.bench_function("get", |b| {
        b.iter_batched(
            || input.clone(),
            |mut buf| {
                let mut n = 0;
                while let Some(args) = dec.decode(&mut buf).expect("valid") {
                    n += black_box(args).len();
                }
                assert_eq!(n, 2 * PIPELINE);
                n
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// One client connection's per-request work, minus the sockets: decoder, key buffer, chain.
struct Session<S: Service<Request>> {
    svc: S,
    dec: RequestDecoder,
    keys: Vec<usize>,
    futs: Vec<S::Future>,
}

impl<S> Session<S>
where
    S: Service<Request, Response = Reply, Error = Failure>,
    S::Future: Unpin,
{
    fn new(svc: S) -> Self {
        Session {
            svc,
            dec: RequestDecoder::new(Limits::default()),
            keys: Vec::new(),
            futs: Vec::with_capacity(PIPELINE),
        }
    }

    /// Decode → lookup → keys → request → chain for every command in `buf`, then poll the
    /// replies in order (as the session in `src/session/conn/` does, minus the socket I/O and the reply write).
    fn pipeline(&mut self, mut buf: BytesMut) -> usize {
        let mut cx = Context::from_waker(Waker::noop());
        while let Some(args) = self.dec.decode(&mut buf).expect("valid") {
            let cmd = command::lookup(&args[0]).expect("known");
            let cmd = cmd.resolve(&args);
            assert!(cmd.arity_ok(args.len()));
            cmd.key_indices(&args, &mut self.keys).expect("keys");
            let req = Request::new(cmd, args, &self.keys);
            let _ = self.svc.poll_ready(&mut cx);
            self.futs.push(self.svc.call(req));
        }
        let mut n = 0;
        for mut fut in self.futs.drain(..) {
            if let Poll::Ready(Ok(r)) = Pin::new(&mut fut).poll(&mut cx) {
                n += black_box(r).len();
            }
        }
        assert_eq!(n, REPLY.len() * PIPELINE);
        n
    }
}

/// Decode → lookup → keys → request → chain → poll, per pipeline of 16.
fn pipeline_p16(c: &mut Criterion) {
    let bare = routing(bare_config);
    let unused = routing(|| configured_config(false));
    let strict = routing(|| configured_config(true));
    let input = pipeline_bytes("key:");
    let mut g = c.benchmark_group("pipeline_p16");
    g.throughput(Throughput::Elements(PIPELINE as u64));
    for (name, routing) in [
        ("bare", &bare),
        ("configured_unused", &unused),
        ("unused_rules_on_route", &strict),
    ] {
        let mut session = Session::new(stack(routing, Trivial).svc);
        g.bench_function(name, |b| {
            b.iter_batched(
                || input.clone(),
                |buf| session.pipeline(buf),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

/// Batches per timed block of the interleaved comparison.
const AB_BLOCK: u64 = 32;

/// Times `n` pipelines of `args` through `svc` (requests built before the clock starts).
fn time_chain<S>(svc: &mut S, args: &[Vec<Bytes>], n: u64, futs: &mut Vec<S::Future>) -> Duration
where
    S: Service<Request, Response = Reply, Error = Failure>,
    S::Future: Unpin,
{
    let batches: Vec<Vec<Request>> = (0..n).map(|_| batch(args)).collect();
    let start = Instant::now();
    for reqs in batches {
        black_box(run(svc, reqs, futs));
    }
    start.elapsed()
}

/// Times `n` client buffers of `input` through `session` (buffers copied before the clock
/// starts).
fn time_session<S>(session: &mut Session<S>, input: &BytesMut, n: u64) -> Duration
where
    S: Service<Request, Response = Reply, Error = Failure>,
    S::Future: Unpin,
{
    let bufs: Vec<BytesMut> = (0..n).map(|_| input.clone()).collect();
    let start = Instant::now();
    for buf in bufs {
        black_box(session.pipeline(buf));
    }
    start.elapsed()
}

/// Benchmarks `b` against `a` timed in alternating blocks of [`AB_BLOCK`] pipelines (ABBA
/// order), so that the load of a shared machine, which drifts over seconds, hits both alike.
/// Criterion reports `b`'s time. Printed to stderr, over the blocks of criterion's measured
/// samples: each side's time per request at the 10th percentile and the median of its blocks
/// (a block hit by preemption lands in the upper tail, so the low percentiles are what the
/// code costs), and the b/a ratio of each.
fn ab_bench(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    mut a: impl FnMut(u64) -> Duration,
    mut b: impl FnMut(u64) -> Duration,
) {
    // Per criterion sample: (a, b) ns per request of each full block.
    let mut samples: Vec<Vec<(f64, f64)>> = Vec::new();
    let ns = |t: Duration| t.as_secs_f64() * 1e9 / (AB_BLOCK * PIPELINE as u64) as f64;
    g.bench_function(name, |bench| {
        bench.iter_custom(|iters| {
            let mut total_b = Duration::ZERO;
            let mut blocks = Vec::new();
            let mut done = 0;
            let mut flip = false;
            while done < iters {
                let n = AB_BLOCK.min(iters - done);
                let (da, db) = if flip {
                    let db = b(n);
                    (a(n), db)
                } else {
                    let da = a(n);
                    (da, b(n))
                };
                if n == AB_BLOCK {
                    blocks.push((ns(da), ns(db)));
                }
                total_b += db;
                flip = !flip;
                done += n;
            }
            samples.push(blocks);
            total_b
        })
    });
    // Criterion's measured samples are the last 100 (the first calls are its warm-up).
    let measured = &samples[samples.len().saturating_sub(100)..];
    let mut ta: Vec<f64> = measured.iter().flatten().map(|x| x.0).collect();
    let mut tb: Vec<f64> = measured.iter().flatten().map(|x| x.1).collect();
    if ta.is_empty() {
        return;
    }
    ta.sort_by(f64::total_cmp);
    tb.sort_by(f64::total_cmp);
    let q = |v: &[f64], f: f64| v[((v.len() - 1) as f64 * f).round() as usize];
    eprintln!(
        "{name}: {} blocks of {AB_BLOCK} x 16 GET; ns per request, bare vs configured: \
         p10 {:.2} vs {:.2} (ratio {:.4}), median {:.2} vs {:.2} (ratio {:.4})",
        ta.len(),
        q(&ta, 0.1),
        q(&tb, 0.1),
        q(&tb, 0.1) / q(&ta, 0.1),
        q(&ta, 0.5),
        q(&tb, 0.5),
        q(&tb, 0.5) / q(&ta, 0.5),
    );
}

/// `bare` against the configured routings, interleaved (see [`ab_bench`]): the chain alone,
/// then the whole session path (decode included).
fn ab_get_p16(c: &mut Criterion) {
    let bare = routing(bare_config);
    // A second, identical bare routing: the A/A control, whose ratio shows the noise floor.
    let bare2 = routing(bare_config);
    let unused = routing(|| configured_config(false));
    let strict = routing(|| configured_config(true));
    let args = batch_args("GET", "key:");
    let input = pipeline_bytes("key:");
    let mut g = c.benchmark_group("ab_get_p16");
    g.throughput(Throughput::Elements(PIPELINE as u64));
    for (name, other) in [
        ("bare_vs_bare", &bare2),
        ("configured_unused_vs_bare", &unused),
        ("unused_rules_on_route_vs_bare", &strict),
    ] {
        let (mut sa, mut sb) = (stack(&bare, Trivial), stack(other, Trivial));
        let (mut fa, mut fb) = (Vec::new(), Vec::new());
        ab_bench(
            &mut g,
            &format!("chain/{name}"),
            |n| time_chain(&mut sa.svc, &args, n, &mut fa),
            |n| time_chain(&mut sb.svc, &args, n, &mut fb),
        );
        let mut a = Session::new(stack(&bare, Trivial).svc);
        let mut b = Session::new(stack(other, Trivial).svc);
        ab_bench(
            &mut g,
            &format!("pipeline/{name}"),
            |n| time_session(&mut a, &input, n),
            |n| time_session(&mut b, &input, n),
        );
    }
    g.finish();
}

fn route(c: &mut Criterion) {
    let bare = routing(bare_config);
    let unused = routing(|| configured_config(false));
    let mut g = c.benchmark_group("route");
    for (name, routing, key) in [
        ("bare/catch_all", &bare, &b"key:7"[..]),
        ("configured/catch_all", &unused, &b"key:7"[..]),
        ("configured/prefix", &unused, &b"sess:7"[..]),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| black_box(routing.route(black_box(key))))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    chain_get_p16,
    ab_get_p16,
    pipeline_p16,
    decode_p16,
    route
);
criterion_main!(benches);
