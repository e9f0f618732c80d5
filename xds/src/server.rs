//! The management server: state-of-the-world ADS
//! (`envoy.service.discovery.v3.AggregatedDiscoveryService.StreamAggregatedResources`) over the
//! [`Cache`], plus per-node ACK/NACK status for the admin endpoint.
//!
//! # Protocol
//! One task per ADS stream follows the cache's snapshots and the stream's requests:
//! - The first request must carry `node`; its `id` and `locality.zone` pick the node's snapshot
//!   (see [`crate::cache`] for the merge rules). Later `node`s are ignored.
//! - LDS and CDS subscriptions are wildcard (an empty `resource_names`, or `"*"`); EDS names its
//!   cluster load assignments (a first EDS request with no names, or `"*"`, is wildcard too).
//!   Other type URLs are not served (no response).
//! - A request with an empty `response_nonce` opens (or reopens) a subscription and is answered
//!   at once with the current resources, whatever `version_info` it carries (the client
//!   compares content). A request whose nonce is not the latest sent for its type is stale and
//!   ignored. A current ACK or NACK (`error_detail` set) is answered only when its
//!   `resource_names` changed the subscription.
//! - When a new snapshot is committed, every stream pushes the types whose content for its
//!   subscription changed, in make-before-break order: CDS, EDS, then LDS. A push does not
//!   wait for the previous response's ACK: the client answers the latest nonce.
//! - Every response carries a new nonce (unique per stream: the stream's number and a
//!   counter) and the resources' `version_info` (see [`crate::cache`]: a hash of that type's
//!   content for the node, the same from every server serving the same files).
//! - A node no file is for gets no response; it keeps what it has.
//! - Delta xDS is answered with `UNIMPLEMENTED`.
//!
//! Per node id, the server records the last version sent, the last version ACKed and the last
//! NACK (version, nonce and error), apart: which response a request answers is known by its
//! nonce, and a request with `error_detail` is a NACK whatever its `version_info`.
//! [`Server::status`] and the admin `GET /status` show it. Nodes stay listed after they disconnect (as not connected),
//! until the server restarts.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::ControlPlane;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use respway_tls::rustls::pki_types::CertificateDer;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status as GrpcStatus, Streaming};

use crate::admin::{AdminLimits, AdminState, AdminStats};
use crate::secure::{tcp_incoming, tls_incoming, PeerInfo, Security};

use crate::cache::{Cache, FileState, NodeSnapshot, ResourceType, Snapshot, TypeResources};

/// How often [`Server::serve`] scans the resource directory by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// The `control_plane.identifier` of every response.
const CONTROL_PLANE: &str = concat!("respway-xds/", env!("CARGO_PKG_VERSION"));

// === Server ===

/// The management server: a [`Cache`] over a resource directory, served over ADS, with an
/// optional admin HTTP endpoint ([`crate::admin`]). Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct Server {
    cache: Arc<Cache>,
    registry: Arc<Registry>,
    poll_interval: Duration,
    security: Arc<Security>,
    admin: Arc<AdminState>,
    /// Failed accepts on the ADS port.
    ads_accept_errors: Arc<AtomicU64>,
}

impl Server {
    /// A server over the resource files in `resources_dir`, loaded now (blocking file I/O);
    /// invalid files are logged and reported in [`Server::status`].
    pub fn new(resources_dir: impl Into<PathBuf>) -> Server {
        let cache = Arc::new(Cache::new(resources_dir));
        cache.reload();
        Server::from_cache(cache)
    }

    /// A server over an existing cache (loaded or not).
    pub fn from_cache(cache: Arc<Cache>) -> Server {
        Server {
            cache,
            registry: Arc::new(Registry::default()),
            poll_interval: DEFAULT_POLL_INTERVAL,
            security: Arc::new(Security::default()),
            admin: Arc::new(AdminState::new(AdminLimits::default())),
            ads_accept_errors: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Sets the admin port's connection cap and idle timeout (default [`AdminLimits::default`]).
    pub fn with_admin_limits(mut self, limits: AdminLimits) -> Server {
        self.admin = Arc::new(AdminState::new(limits));
        self
    }

    pub(crate) fn admin_state(&self) -> &Arc<AdminState> {
        &self.admin
    }

    /// Sets who may connect and what they get ([`crate::secure`]); default: plaintext, no
    /// admin credentials (so `POST /apply` answers 401), secrets only to authenticated nodes.
    pub fn with_security(mut self, security: Security) -> Server {
        self.security = Arc::new(security);
        self
    }

    /// The security settings.
    pub fn security(&self) -> &Security {
        &self.security
    }

    /// Sets how often [`Server::serve`] scans the directory (default
    /// [`DEFAULT_POLL_INTERVAL`]).
    pub fn with_poll_interval(mut self, interval: Duration) -> Server {
        self.poll_interval = interval;
        self
    }

    /// The snapshot cache.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// The served version, the resource files' state and every node's ACK/NACK state.
    pub fn status(&self) -> ServerStatus {
        let report = self.cache.report();
        ServerStatus {
            version: report.version,
            files: report
                .files
                .into_iter()
                .map(|f| match f.state {
                    FileState::Ok => FileStatus {
                        name: f.name,
                        ok: true,
                        error: None,
                        serving_previous: false,
                    },
                    FileState::Invalid {
                        error,
                        serving_previous,
                    } => FileStatus {
                        name: f.name,
                        ok: false,
                        error: Some(error),
                        serving_previous,
                    },
                })
                .collect(),
            errors: report.errors,
            unserved: report.unserved,
            nodes: self.registry.status(&self.cache.snapshot()),
            refusals: self.registry.refusals(),
            admin: self.admin.stats(),
            ads_accept_errors: self.ads_accept_errors.load(Ordering::Relaxed),
        }
    }

    /// Serves ADS on `grpc` (and the admin endpoint on `admin`) and scans the resource
    /// directory, until `shutdown` completes or the future is dropped. At shutdown every ADS
    /// stream is ended (clients see the stream close and reconnect) and the listeners close.
    ///
    /// # Errors
    /// The gRPC server failed.
    pub async fn serve(
        self,
        grpc: TcpListener,
        admin: Option<TcpListener>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        // Dropped (or set) when this future ends: every stream task and the admin loop stop.
        let (stop_tx, stop_rx) = watch::channel(false);
        let watcher = tokio::spawn(self.cache.clone().watch(self.poll_interval));
        let _abort_watcher = AbortOnDrop(watcher);
        if let Some(admin) = admin {
            let server = self.clone();
            let stop = stop_rx.clone();
            tokio::spawn(crate::admin::serve(admin, server, stop));
        }
        let service = self.ads_service(stop_rx);
        let signal = async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        };
        let builder = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)));
        match &self.security.tls {
            Some(tls) => {
                let incoming = ReceiverStream::new(tls_incoming(
                    grpc,
                    tls.clone(),
                    "ads",
                    None,
                    self.ads_accept_errors.clone(),
                ));
                builder
                    .serve_with_incoming_shutdown(service, incoming, signal)
                    .await
            }
            None => {
                let incoming =
                    ReceiverStream::new(tcp_incoming(grpc, "ads", self.ads_accept_errors.clone()));
                builder
                    .serve_with_incoming_shutdown(service, incoming, signal)
                    .await
            }
        }
    }

    /// The ADS service alone, for embedding in another tonic server; its streams end when
    /// `stop` changes or its sender is dropped.
    pub fn ads_service(
        &self,
        stop: watch::Receiver<bool>,
    ) -> AggregatedDiscoveryServiceServer<Ads> {
        AggregatedDiscoveryServiceServer::new(Ads {
            cache: self.cache.clone(),
            registry: self.registry.clone(),
            security: self.security.clone(),
            stop,
            next_stream: Arc::new(AtomicU64::new(1)),
        })
        .max_decoding_message_size(64 << 20)
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

// === status ===

/// Everything `GET /status` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerStatus {
    /// The served snapshot version (0: nothing loaded).
    pub version: u64,
    /// The resource files at the last scan.
    pub files: Vec<FileStatus>,
    /// Errors of the merged snapshots at the last scan: the nodes each names keep what they
    /// were served; the change reached the others.
    pub errors: Vec<String>,
    /// The classes of nodes served nothing because their files define no listener or no
    /// cluster (e.g. nodes no per-node listener file names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unserved: Vec<String>,
    /// Every node seen since the server started, by id.
    pub nodes: Vec<NodeStatus>,
    /// The latest refused ADS streams (at most [`MAX_REFUSALS`], oldest first), by the peer
    /// that opened them: not attributed to the node id the peer claimed.
    #[serde(default)]
    pub refusals: Vec<Refusal>,
    /// The admin port's connections and failed accepts.
    #[serde(default)]
    pub admin: AdminStats,
    /// Failed accepts on the ADS port, each followed by a pause.
    #[serde(default)]
    pub ads_accept_errors: u64,
}

/// How many refused streams [`ServerStatus::refusals`] keeps.
pub const MAX_REFUSALS: usize = 64;

/// A refused ADS stream: a peer that claimed a node id whose resources carry secrets without a
/// client certificate for that id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refusal {
    /// When, in seconds since the Unix epoch.
    pub at: u64,
    /// The peer's address.
    pub peer: Option<String>,
    /// The DNS subjectAltNames of the peer's client certificate; `None`: it presented none.
    pub certificate: Option<Vec<String>>,
    /// The node id the peer claimed (not proven).
    pub claimed_node: String,
    /// Why it was refused (what the peer was told).
    pub message: String,
}

/// One resource file in [`ServerStatus`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileStatus {
    /// The file name in the resource directory.
    pub name: String,
    /// Whether its current content parsed.
    pub ok: bool,
    /// Why not, one error per line.
    pub error: Option<String>,
    /// When not ok: whether an earlier good version of it is still served.
    pub serving_previous: bool,
}

/// One node (by id) in [`ServerStatus`]. Streams of several sidecars sharing an id are merged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// `node.id`.
    pub id: String,
    /// `node.locality.zone`, when set.
    pub zone: Option<String>,
    /// Whether an ADS stream of this node is open.
    pub connected: bool,
    /// Why this node is served nothing although files are for it (they define no listener or
    /// no cluster for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unserved: Option<String>,
    /// Per type URL.
    pub types: BTreeMap<String, TypeStatus>,
}

/// One node's state for one resource type. ACKs and NACKs are tracked apart: a NACKed
/// version is never shown as ACKed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TypeStatus {
    /// The `version_info` of the last response sent.
    pub sent: Option<String>,
    /// The version of the last response the node ACKed: the one sent with the nonce that a
    /// request without `error_detail` answered. A NACK (a request with `error_detail`, whatever
    /// its `version_info`) never changes it, nor does a request answering a nonce the server
    /// did not send.
    pub acked: Option<String>,
    /// The last NACK, until the node ACKs the latest version sent.
    pub nack: Option<Nack>,
}

/// A rejected response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Nack {
    /// The rejected version: the one sent with the nonce the NACK answered (`None` when that
    /// nonce is not one of the stream's recent ones).
    pub version: Option<String>,
    /// The nonce the NACK answered (`response_nonce`).
    #[serde(default)]
    pub nonce: String,
    /// `error_detail.message`: what the node found wrong.
    pub message: String,
}

#[derive(Debug, Default)]
struct NodeEntry {
    zone: Option<String>,
    streams: u32,
    types: [TypeStatus; 3],
}

/// Per-node ACK/NACK state, shared by the stream tasks, and the latest refused streams.
#[derive(Debug, Default)]
struct Registry {
    nodes: Mutex<BTreeMap<String, NodeEntry>>,
    refusals: Mutex<VecDeque<Refusal>>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, NodeEntry>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn connect(&self, id: &str, zone: Option<&str>) {
        let mut nodes = self.lock();
        let e = nodes.entry(id.to_string()).or_default();
        e.zone = zone.map(str::to_string);
        e.streams += 1;
    }

    fn disconnect(&self, id: &str) {
        if let Some(e) = self.lock().get_mut(id) {
            e.streams = e.streams.saturating_sub(1);
        }
    }

    fn refuse(&self, refusal: Refusal) {
        let mut list = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        if list.len() == MAX_REFUSALS {
            list.pop_front();
        }
        list.push_back(refusal);
    }

    fn refusals(&self) -> Vec<Refusal> {
        let list = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        list.iter().cloned().collect()
    }

    fn update(&self, id: &str, t: ResourceType, f: impl FnOnce(&mut TypeStatus)) {
        if let Some(e) = self.lock().get_mut(id) {
            f(&mut e.types[t.index()]);
        }
    }

    fn status(&self, snapshot: &Snapshot) -> Vec<NodeStatus> {
        self.lock()
            .iter()
            .map(|(id, e)| NodeStatus {
                id: id.clone(),
                zone: e.zone.clone(),
                connected: e.streams > 0,
                unserved: snapshot
                    .unserved_reason(id, e.zone.as_deref())
                    .map(str::to_string),
                types: ResourceType::PUSH_ORDER
                    .into_iter()
                    .map(|t| (t.type_url().to_string(), e.types[t.index()].clone()))
                    .collect(),
            })
            .collect()
    }
}

// === ADS service ===

/// The ADS service over a [`Cache`]; see the module docs for the protocol.
#[derive(Debug, Clone)]
pub struct Ads {
    cache: Arc<Cache>,
    registry: Arc<Registry>,
    security: Arc<Security>,
    stop: watch::Receiver<bool>,
    next_stream: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, GrpcStatus>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, GrpcStatus> {
        if *self.stop.borrow() {
            return Err(GrpcStatus::unavailable("respway-xds is shutting down"));
        }
        let (tx, rx) = mpsc::channel(8);
        let peer = request.extensions().get::<PeerInfo>();
        let cert = peer.and_then(|p| p.cert.clone());
        let remote = peer
            .and_then(|p| p.remote)
            .or_else(|| request.remote_addr());
        let stream = AdsStream {
            id: self.next_stream.fetch_add(1, Ordering::Relaxed),
            cache: self.cache.clone(),
            registry: self.registry.clone(),
            security: self.security.clone(),
            cert,
            remote,
            denied: None,
            node: None,
            registered: false,
            types: Default::default(),
            nonces: 0,
            snapshot: None,
        };
        tokio::spawn(stream.run(request.into_inner(), tx, self.stop.clone()));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type DeltaAggregatedResourcesStream =
        ReceiverStream<Result<DeltaDiscoveryResponse, GrpcStatus>>;

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, GrpcStatus> {
        Err(GrpcStatus::unimplemented(
            "respway-xds serves state-of-the-world ADS only (StreamAggregatedResources)",
        ))
    }
}

/// What a stream subscribed to for one type.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Subscription {
    wildcard: bool,
    names: BTreeSet<String>,
}

impl Subscription {
    /// The subscription a request asks for. LDS and CDS: always wildcard. EDS: `"*"`, or an
    /// empty list on the first request of the type, is wildcard; otherwise the names.
    fn from_request(t: ResourceType, names: &[String], previous: Option<&Subscription>) -> Self {
        let star = names.iter().any(|n| n == "*");
        let wildcard = match t {
            ResourceType::Cluster | ResourceType::Listener => true,
            ResourceType::Endpoint => star || (names.is_empty() && previous.is_none()),
        };
        Subscription {
            wildcard,
            names: if wildcard {
                BTreeSet::new()
            } else {
                names.iter().cloned().collect()
            },
        }
    }

    /// The resources of `res` this subscription covers, by name.
    fn view<'a>(&'a self, res: &'a TypeResources) -> Vec<(&'a String, &'a [u8])> {
        if self.wildcard {
            res.resources
                .iter()
                .map(|(n, a)| (n, a.value.as_slice()))
                .collect()
        } else {
            self.names
                .iter()
                .filter_map(|n| res.resources.get_key_value(n))
                .map(|(n, a)| (n, a.value.as_slice()))
                .collect()
        }
    }
}

#[derive(Debug, Default)]
struct TypeState {
    /// `None` until the client asks for this type.
    subscription: Option<Subscription>,
    /// The latest nonce sent for this type.
    nonce: String,
    /// What was last sent, and for which subscription.
    sent: Option<(Arc<TypeResources>, Subscription)>,
    /// The version sent with each of the latest nonces (at most [`NONCE_HISTORY`]), oldest
    /// first, so that an ACK or NACK of an older response is put down to the right version.
    history: VecDeque<(String, String)>,
}

/// How many nonces per type a stream remembers the version of.
const NONCE_HISTORY: usize = 16;

impl TypeState {
    /// The version sent with `nonce`, when it is one of the recent ones.
    fn version_of(&self, nonce: &str) -> Option<String> {
        self.history
            .iter()
            .rev()
            .find(|(n, _)| n == nonce)
            .map(|(_, v)| v.clone())
    }
}

/// One ADS stream.
struct AdsStream {
    id: u64,
    cache: Arc<Cache>,
    registry: Arc<Registry>,
    security: Arc<Security>,
    /// The client certificate of the stream's connection, if TLS verified one.
    cert: Option<CertificateDer<'static>>,
    /// The peer's address, for logs.
    remote: Option<SocketAddr>,
    /// Set when the node's resources carry secrets this stream may not get: the stream ends
    /// with it, and nothing more is sent.
    denied: Option<GrpcStatus>,
    /// `(id, zone)` from the first request.
    node: Option<(String, Option<String>)>,
    /// Whether the node is in the registry (the stream was not refused at once).
    registered: bool,
    types: [TypeState; 3],
    nonces: u64,
    /// The node's snapshot and the cache version it is from.
    snapshot: Option<(u64, Option<Arc<NodeSnapshot>>)>,
}

type Outbox = mpsc::Sender<Result<DiscoveryResponse, GrpcStatus>>;

impl AdsStream {
    async fn run(
        mut self,
        mut inbound: Streaming<DiscoveryRequest>,
        tx: Outbox,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut snapshots = self.cache.subscribe();
        loop {
            let out = tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => match self.on_request(req, &snapshots) {
                        Ok(out) => out,
                        Err(status) => {
                            let _ = tx.send(Err(status)).await;
                            break;
                        }
                    },
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(stream = self.id, %status, "ADS stream ended");
                        break;
                    }
                },
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let snap = snapshots.borrow_and_update().clone();
                    self.on_snapshot(&snap)
                }
                _ = stop.changed() => break,
                () = tx.closed() => break,
            };
            if let Some(status) = self.denied.take() {
                let _ = tx.send(Err(status)).await;
                break;
            }
            for resp in out {
                if tx.send(Ok(resp)).await.is_err() {
                    break;
                }
            }
        }
        if let Some((id, _)) = self.node.as_ref().filter(|_| self.registered) {
            self.registry.disconnect(id);
            tracing::debug!(stream = self.id, node = %id, "ADS stream closed");
        }
    }

    fn on_request(
        &mut self,
        req: DiscoveryRequest,
        snapshots: &watch::Receiver<Arc<Snapshot>>,
    ) -> Result<Vec<DiscoveryResponse>, GrpcStatus> {
        if self.node.is_none() {
            let Some(node) = &req.node else {
                return Err(GrpcStatus::invalid_argument(
                    "the first DiscoveryRequest of a stream must carry node",
                ));
            };
            let zone = node
                .locality
                .as_ref()
                .map(|l| l.zone.clone())
                .filter(|z| !z.is_empty());
            self.node = Some((node.id.clone(), zone.clone()));
            // A stream refused at once never shows on the row of the node it claimed to be.
            let snap = snapshots.borrow().clone();
            self.node_snapshot(&snap);
            if let Some(status) = self.denied.take() {
                return Err(status);
            }
            self.registry.connect(&node.id, zone.as_deref());
            self.registered = true;
            tracing::debug!(stream = self.id, node = %node.id, zone = ?zone, "ADS stream opened");
        }
        let node_id = self.node.as_ref().map(|n| n.0.clone()).unwrap_or_default();
        let Some(t) = ResourceType::from_type_url(&req.type_url) else {
            tracing::debug!(stream = self.id, type_url = %req.type_url, "type not served; ignored");
            return Ok(Vec::new());
        };
        let ts = &mut self.types[t.index()];
        if !req.response_nonce.is_empty() {
            let current = req.response_nonce == ts.nonce;
            // What the request answers is known by its nonce, not by its version_info (a
            // NACK's is the version still in use, or whatever the client put there).
            let answered = ts.version_of(&req.response_nonce);
            match &req.error_detail {
                Some(detail) => {
                    tracing::warn!(
                        node = %node_id,
                        type_url = t.type_url(),
                        rejected = ?answered,
                        nonce = %req.response_nonce,
                        "NACK: {}",
                        detail.message
                    );
                    let nack = Nack {
                        version: answered,
                        nonce: req.response_nonce.clone(),
                        message: detail.message.clone(),
                    };
                    self.registry.update(&node_id, t, |s| s.nack = Some(nack));
                }
                None => {
                    if let Some(version) = answered {
                        self.registry.update(&node_id, t, |s| {
                            if current {
                                s.nack = None;
                            }
                            s.acked = Some(version);
                        });
                    }
                }
            }
            if !current {
                // Stale: a newer response is on its way; the client answers that one.
                return Ok(Vec::new());
            }
        }
        let sub = Subscription::from_request(t, &req.resource_names, ts.subscription.as_ref());
        let changed = ts.subscription.as_ref() != Some(&sub);
        ts.subscription = Some(sub.clone());
        let initial = req.response_nonce.is_empty();
        if !(initial || changed) {
            return Ok(Vec::new());
        }
        let snap = snapshots.borrow().clone();
        // A client opening a stream with the version it has (a reconnect, a failover to another
        // server over the same files: versions are content hashes) is not sent it again. Only
        // for the wildcard types: an EDS version covers every assignment, and which names the
        // client's version was for is not known.
        if initial && !req.version_info.is_empty() && sub.wildcard && t != ResourceType::Endpoint {
            if let Some(node) = self.node_snapshot(&snap) {
                let res = node.get(t);
                if res.version == req.version_info {
                    let ts = &mut self.types[t.index()];
                    ts.sent = Some((res.clone(), sub));
                    let v = res.version.clone();
                    self.registry.update(&node_id, t, |s| {
                        s.sent = Some(v.clone());
                        s.acked = Some(v);
                        s.nack = None;
                    });
                    return Ok(Vec::new());
                }
            }
        }
        Ok(self.respond(t, &snap, initial).into_iter().collect())
    }

    fn on_snapshot(&mut self, snap: &Snapshot) -> Vec<DiscoveryResponse> {
        ResourceType::PUSH_ORDER
            .into_iter()
            .filter_map(|t| self.respond(t, snap, false))
            .collect()
    }

    /// The node's snapshot in `snap`, computed once per cache version; `None` (and
    /// [`AdsStream::denied`] set) when it carries secrets this stream may not get.
    fn node_snapshot(&mut self, snap: &Snapshot) -> Option<Arc<NodeSnapshot>> {
        if self.denied.is_some() {
            return None;
        }
        let (id, zone) = self.node.as_ref()?;
        let s = match &self.snapshot {
            Some((v, s)) if *v == snap.version => s.clone(),
            _ => {
                let s = snap.for_node(id, zone.as_deref());
                self.snapshot = Some((snap.version, s.clone()));
                s
            }
        };
        let s = s?;
        if s.carries_secrets() && !self.security.may_get_secrets(id, self.cert.as_ref()) {
            let why = match &self.cert {
                None => "the stream presented no client certificate",
                Some(_) => "its client certificate is not valid for that node id",
            };
            let message = format!(
                "node {id:?}: its resources carry secrets (passwords or keys), which are served \
                 only to a client certificate whose DNS subjectAltName is the node id; {why}"
            );
            let certificate = self.cert.as_ref().map(respway_tls::peer_dns_names);
            tracing::warn!(stream = self.id, claimed_node = %id, peer = ?self.remote, ?certificate, "ADS stream refused: {message}");
            self.registry.refuse(Refusal {
                at: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                peer: self.remote.map(|a| a.to_string()),
                certificate,
                claimed_node: id.clone(),
                message: message.clone(),
            });
            self.denied = Some(GrpcStatus::permission_denied(message));
            return None;
        }
        Some(s)
    }

    /// A response for type `t` when the client subscribed to it and its resources changed
    /// since the last one (or always, with `force`).
    fn respond(
        &mut self,
        t: ResourceType,
        snap: &Snapshot,
        force: bool,
    ) -> Option<DiscoveryResponse> {
        let node = self.node_snapshot(snap)?;
        let res = node.get(t);
        let ts = &mut self.types[t.index()];
        let sub = ts.subscription.as_ref()?;
        if !force {
            if let Some((sent, sent_sub)) = &ts.sent {
                let same = (Arc::ptr_eq(sent, res) && sent_sub == sub)
                    || sent_sub.view(sent) == sub.view(res);
                if same {
                    return None;
                }
            }
        }
        let resources = if sub.wildcard {
            res.resources.values().cloned().collect()
        } else {
            sub.names
                .iter()
                .filter_map(|n| res.resources.get(n).cloned())
                .collect()
        };
        self.nonces += 1;
        let nonce = format!("{}-{}", self.id, self.nonces);
        ts.nonce = nonce.clone();
        ts.sent = Some((res.clone(), sub.clone()));
        let version = res.version.clone();
        if ts.history.len() == NONCE_HISTORY {
            ts.history.pop_front();
        }
        ts.history.push_back((nonce.clone(), version.clone()));
        if let Some((id, _)) = &self.node {
            let v = version.clone();
            self.registry.update(id, t, |s| s.sent = Some(v));
        }
        Some(DiscoveryResponse {
            version_info: version,
            resources,
            canary: false,
            type_url: t.type_url().to_string(),
            nonce,
            control_plane: Some(ControlPlane {
                identifier: CONTROL_PLANE.to_string(),
            }),
            resource_errors: Vec::new(),
        })
    }
}
