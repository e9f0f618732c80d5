//! Where every command goes, and the chain of layers for the ones with keys: the only place
//! either is written.
//!
//! # Where each kind of command goes ([`handler`])
//!
//! The session admits a command (arity, authentication, the user's permissions, the
//! listener's protocol), asks [`handler`] where its kind goes, and calls that handler; it
//! only reads, applies backpressure, keeps replies in order and writes them.
//!
//! | command | handler |
//! |---|---|
//! | `GET`, `SET`, `MGET`, `DEL`, `RENAME`, `EVAL` with keys, ... | [`Handler::Chain`]: the layers below |
//! | `MULTI`, `EXEC`, `DISCARD`, `WATCH`, `UNWATCH`, and anything while `MULTI` queues | [`Handler::Transaction`]: the transaction lane (`conn/tx_lane.rs`, `tx.rs`) on a dedicated connection |
//! | `BLPOP`, `BZPOPMIN`, `XREAD ... BLOCK`, ... | [`Handler::Blocking`]: a dedicated connection that waits (`blocking.rs`) |
//! | `WAIT`, `WAITAOF` | [`Handler::Wait`]: every primary, on dedicated connections (`wait.rs`) |
//! | `SUBSCRIBE`, `PUBLISH`, `PUBSUB ...`, ... | [`Handler::PubSub`]: one subscriber connection per worker and shard (`pubsub/`) |
//! | `SCAN`, `KEYS`, `DBSIZE`, `RANDOMKEY`, `FLUSHDB`, ... | [`Handler::Keyspace`]: every primary of every routed cluster (`keyspace.rs`) |
//! | `SCRIPT LOAD`, `FUNCTION LOAD`, `SCRIPT KILL`, ... | [`Handler::Fanout`]: key-less fan-out (`fanout.rs`) |
//! | `PING`, `AUTH`, `HELLO`, `CLIENT ...`, `INFO`, `SELECT`, ... | [`Handler::Local`]: answered by the proxy (`local.rs`) |
//! | `ACL ...` | [`Handler::Acl`]: the listener's users (`local.rs`) |
//! | `CLUSTER ...`, `ASKING` on a listener with `cluster_emulation` ([`emulated`]) | answered by the proxy as a Redis Cluster owning every slot (`cluster_emulation.rs`) |
//! | `CONFIG`, `SWAPDB`, `MONITOR`, `CLUSTER ...` (without emulation), ... | [`Handler::Unsupported`]: refused |
//!
//! Keys are placed by one module (`respway_filters::place`) for all of them.
//!
//! # The chain (commands with keys), outermost first
//!
//! 1. `prefix_route` — picks the cluster (and route) from the key prefix. It runs first
//!    because every later layer works within one cluster, and the mirror layer acts per route.
//! 2. `mirror` — tees writes (optionally reads) to other clusters, or refuses writes during a
//!    cut-over, or re-targets the request to the new cluster (new-first dual write). It sits
//!    before hot keys and splitting so that a copy is one request, which the shadow chain
//!    then fans out and splits for its own cluster.
//! 3. `hot_key` — for keys under a hot prefix, writes run on the key's home shard and are
//!    copied to the others, and reads go to one shard. It pins shards, so it must run before `multi_key` and `hash`.
//! 4. `multi_key` — splits MGET/MSET/DEL/... per shard and checks same-shard commands; pins
//!    each sub-request to its shard before hashing.
//! 5. `hash` — picks the shard of single-key requests; skips requests already pinned.
//! 6. `zone` — picks the endpoint in the shard: writes to the primary, reads by the cluster's
//!    read policy, skipping unhealthy endpoints. Needs the shard, so it runs after hashing.
//! 7. `near_cache` — a cluster with a near cache answers a read it holds, and sends a miss
//!    with its fill riding along; a cluster without one (and a session that does not track)
//!    passes straight through.
//! 8. `upstream` — sends to that endpoint over this worker's pooled connections.
//!
//! A route with no mirror, no hot-key rule and the primary read policy pays one branch in
//! each of the mirror, hot-key and zone layers.

pub(crate) mod acl;

use crate::cache::near_cache::NearCache;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use futures_util::stream::{FuturesUnordered, StreamExt};
use respway_filters::command::{
    CommandClass, CommandInfo, FanoutKind, KeyspaceKind, ProxyCommand, PubSubKind,
};
use respway_filters::error::failed;
use respway_filters::hash_layer::{Hash, HashLayer};
use respway_filters::hot_key::{HotKey, HotKeyLayer, HotKeyStats};
use respway_filters::mirror::{Mirror, MirrorLayer, MirrorSink, MirrorStats};
use respway_filters::multi_key::{MultiKey, MultiKeyLayer};
use respway_filters::prefix_route::{PrefixRoute, PrefixRouteLayer};
use respway_filters::request::Request;
use respway_filters::routing::Routing;
use respway_filters::zone::{HealthView, Zone, ZoneLayer};
use tokio::sync::mpsc;
use tower::{Service, ServiceBuilder};

use crate::upstream::track::Track;
use crate::upstream::{Endpoints, Upstream};

/// The part of the chain below mirroring: also what mirrored copies go through.
pub(crate) type Shadow = HotKey<MultiKey<Hash<Zone<NearCache>>>>;

/// The whole chain for one connection.
pub(crate) type Chain = PrefixRoute<Mirror<Shadow>>;

/// What the chain returns for one request.
pub(crate) type ChainFuture = <Chain as Service<Request>>::Future;

/// Copies queued for mirroring per worker before new ones are dropped.
const MIRROR_QUEUE: usize = 16 * 1024;
/// Mirrored requests in flight per worker.
const MIRROR_INFLIGHT: usize = 1024;

/// Everything one worker's chains share for one listener.
#[derive(Debug, Clone)]
pub(crate) struct Parts {
    /// The listener's settings (timeouts, limits, password).
    pub(crate) listener: Arc<respway_filters::model::Listener>,
    /// Compiled routes and pickers.
    pub(crate) routing: Arc<Routing>,
    /// This worker's endpoint handles (also the health view).
    pub(crate) endpoints: Arc<Endpoints>,
    /// Per cluster, this worker's near cache for this configuration (`None`: no cache).
    pub(crate) caches: Arc<Vec<Option<Arc<crate::cache::near_cache::ClusterCache>>>>,
    /// Which of the listener's writes mark the near caches' key stamps (`None`: none do).
    pub(crate) marks: Option<Arc<crate::cache::near_cache::Marks>>,
    /// Where mirrored copies go.
    pub(crate) mirror: Arc<dyn MirrorSink>,
    /// Mirror counters (this worker).
    pub(crate) mirror_stats: Arc<MirrorStats>,
    /// Hot-key counters (this worker).
    pub(crate) hot_key_stats: Arc<HotKeyStats>,
    /// Keys this worker has seen moved in move mode (no `MIGRATE` is sent for them again).
    pub(crate) moved: Arc<respway_filters::moving::Moved>,
    /// Per cluster, this worker's part of the record of the write copies it receives
    /// (`None`: no `dual_write` sends it copies), which the mirror layer records into.
    pub(crate) records: respway_filters::write_record::RecordParts,
    /// Databases a client may `SELECT` (the smallest `databases` of the routed clusters).
    pub(crate) databases: u32,
    /// The listener's ACL users (`None`: no users and no password: nothing to check).
    pub(crate) acl: Option<Arc<crate::stack::acl::Acl>>,
    /// The commands learned from the shards (looked up when the built-in table has none).
    pub(crate) learned: Arc<respway_filters::command::learned::Learned>,
    /// The version of the configuration these parts were built from (the first is 1).
    pub(crate) config_version: u64,
    /// The listener's TLS (`None`: plaintext); new connections take the current one.
    pub(crate) tls: Option<Arc<respway_tls::ServerTls>>,
    /// The sidecars the listener's cluster emulation announces, with whether each answers
    /// (`None`: no emulation, or fewer than two announced).
    pub(crate) announced: Option<Arc<crate::discovery::peers::Announced>>,
}

impl Parts {
    /// The index of the primary of `(cluster, shard)` among the shard's endpoints (0 when
    /// unknown), from the routing table (`ShardRoute::primary`, which the zone layer uses).
    pub(crate) fn primary_index(&self, cluster: usize, shard: usize) -> usize {
        self.routing
            .clusters
            .get(cluster)
            .and_then(|c| c.shards.get(shard))
            .map_or(0, |s| s.primary)
    }

    /// This worker's handle of the primary of `(cluster, shard)`.
    pub(crate) fn primary(
        &self,
        cluster: usize,
        shard: usize,
    ) -> Option<&crate::upstream::EndpointHandle> {
        self.endpoints
            .get(cluster, shard, self.primary_index(cluster, shard))
    }
}

/// Where a command goes (see the table above).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handler {
    /// Down the chain ([`build`]).
    Chain,
    /// The transaction lane.
    Transaction,
    /// A dedicated connection that waits.
    Blocking,
    /// `WAIT` / `WAITAOF` on every primary.
    Wait,
    /// Pub/sub.
    PubSub(PubSubKind),
    /// Every primary of every routed cluster.
    Keyspace(KeyspaceKind),
    /// Key-less fan-out.
    Fanout(FanoutKind),
    /// Answered by the proxy.
    Local(ProxyCommand),
    /// `ACL` subcommands.
    Acl,
    /// Refused.
    Unsupported,
}

/// The handler of `cmd`; `in_multi`: a `MULTI` is queueing (everything goes to the
/// transaction lane, which refuses what cannot be part of it).
#[inline(always)]
pub(crate) fn handler(cmd: &CommandInfo, in_multi: bool) -> Handler {
    if in_multi {
        return Handler::Transaction;
    }
    match cmd.class {
        CommandClass::Single | CommandClass::Split(_) | CommandClass::SameShard => Handler::Chain,
        CommandClass::Transaction => Handler::Transaction,
        CommandClass::Blocking if is_wait(cmd) => Handler::Wait,
        CommandClass::Blocking => Handler::Blocking,
        CommandClass::PubSub(kind) => Handler::PubSub(kind),
        CommandClass::Keyspace(kind) => Handler::Keyspace(kind),
        CommandClass::Fanout(kind) => Handler::Fanout(kind),
        CommandClass::Proxy(p) => Handler::Local(p),
        CommandClass::Unsupported if cmd.name == "acl" || cmd.name.starts_with("acl|") => {
            Handler::Acl
        }
        CommandClass::Unsupported => Handler::Unsupported,
    }
}

/// Whether `cmd`, which [`handler`] refuses, is answered instead by the listener's cluster
/// emulation (`CLUSTER ...` and `ASKING` when the listener has one).
pub(crate) fn emulated(cmd: &CommandInfo, listener: &respway_filters::model::Listener) -> bool {
    listener.cluster_emulation.is_some() && cluster_command(cmd)
}

/// `WAIT` and `WAITAOF` (served by `wait.rs`), which the command table classes as blocking.
pub(crate) fn is_wait(cmd: &CommandInfo) -> bool {
    matches!(cmd.name, "wait" | "waitaof")
}

/// One worker's current chain parts for one listener. A config change stores new parts and
/// bumps `version`; each session compares versions (a plain load of a worker-local atomic)
/// before it dispatches a batch, and rebuilds its chain when they differ. Requests already in
/// flight keep the old chain's `Arc`s and finish on it.
#[derive(Debug)]
pub(crate) struct ListenerSlot {
    /// The parts new chains are built from.
    pub(crate) parts: ArcSwap<Parts>,
    /// Bumped after every store.
    pub(crate) version: AtomicU64,
}

impl ListenerSlot {
    /// A slot holding `parts` at version 0.
    pub(crate) fn new(parts: Parts) -> Self {
        ListenerSlot {
            parts: ArcSwap::from_pointee(parts),
            version: AtomicU64::new(0),
        }
    }

    /// Publishes new parts.
    pub(crate) fn store(&self, parts: Parts) {
        self.parts.store(Arc::new(parts));
        self.version.fetch_add(1, Ordering::Release);
    }
}

/// The registry sums a slot's endpoints: listeners of one worker share its endpoint
/// handles, counted once.
impl crate::stats::EndpointSource for ListenerSlot {
    fn add_views(
        &self,
        seen: &mut Vec<usize>,
        out: &mut Vec<Vec<Vec<crate::stats::EndpointView>>>,
    ) {
        let parts = self.parts.load();
        let key = Arc::as_ptr(&parts.endpoints) as usize;
        if seen.contains(&key) {
            return;
        }
        seen.push(key);
        parts.endpoints.add_views(out);
    }
}

/// Builds the chain below the mirror layer; `conn` picks the upstream connection to each
/// endpoint for everything this chain sends, and `track` is what its upstream service keeps
/// for the session (see [`Upstream::new`]).
pub(crate) fn shadow(p: &Parts, conn: usize, track: Arc<Track>) -> Shadow {
    let health: Arc<dyn HealthView> = p.endpoints.clone();
    ServiceBuilder::new()
        .layer(HotKeyLayer::new(p.routing.clone(), p.hot_key_stats.clone()))
        .layer(MultiKeyLayer::new(p.routing.clone()))
        .layer(HashLayer::new(p.routing.clone()))
        .layer(ZoneLayer::new(p.routing.clone(), health))
        .service(NearCache::new(
            Upstream::new(p.endpoints.clone(), conn, p.listener.op_timeout, track),
            p.caches.clone(),
        ))
}

/// Builds the whole chain for one client connection; `conn` as in [`shadow`], fixed per
/// session (a rebuild after a config change passes the same value, so the session stays on
/// the same connection of every endpoint that remains).
pub(crate) fn build(p: &Parts, conn: usize, track: Arc<Track>) -> Chain {
    ServiceBuilder::new()
        .layer(PrefixRouteLayer::new(p.routing.clone()))
        .layer(
            MirrorLayer::new(
                p.routing.clone(),
                p.mirror.clone(),
                p.mirror_stats.clone(),
                p.moved.clone(),
            )
            .with_records(p.records.clone()),
        )
        .service(shadow(p, conn, track))
}

/// The worker's mirror queue: bounded, never blocks the client's path.
#[derive(Debug)]
pub(crate) struct MirrorQueue {
    tx: mpsc::Sender<Request>,
}

impl MirrorSink for MirrorQueue {
    fn try_send(&self, req: Request) -> bool {
        self.tx.try_send(req).is_ok()
    }
}

impl MirrorQueue {
    /// A queue and the receiver its consumer task reads.
    pub(crate) fn new() -> (MirrorQueue, mpsc::Receiver<Request>) {
        let (tx, rx) = mpsc::channel(MIRROR_QUEUE);
        (MirrorQueue { tx }, rx)
    }
}

/// Sends queued copies through the shadow chain, at most `MIRROR_INFLIGHT` at a time, and
/// counts the ones that fail. Runs until every queue handle is dropped.
pub(crate) async fn run_mirror(
    mut rx: mpsc::Receiver<Request>,
    mut shadow: Shadow,
    stats: Arc<MirrorStats>,
) {
    let mut inflight = FuturesUnordered::new();
    let mut open = true;
    while open || !inflight.is_empty() {
        tokio::select! {
            req = rx.recv(), if open && inflight.len() < MIRROR_INFLIGHT => match req {
                Some(mut req) => {
                    // A copy's op_timeout runs from when it leaves the queue, not from when
                    // the client's command was read.
                    req.deadline = None;
                    let cluster = req.cluster;
                    let fut = shadow.call(req);
                    inflight.push(async move {
                        (cluster, fut.await)
                    });
                }
                None => open = false,
            },
            Some((cluster, reply)) = inflight.next(), if !inflight.is_empty() => {
                if failed(&reply) {
                    stats.record_failed(cluster);
                } else {
                    stats.record_applied(cluster);
                }
            }
        }
    }
}

/// Whether `cmd` is one cluster emulation answers (refused on a listener without it).
pub(crate) fn cluster_command(cmd: &CommandInfo) -> bool {
    cmd.name == "asking" || cmd.name == "cluster" || cmd.name.starts_with("cluster|")
}
