//! The sidecar's ADS client: state-of-the-world xDS over one
//! `AggregatedDiscoveryService.StreamAggregatedResources` stream at a time, to one of a list of
//! management servers.
//!
//! [`run`] connects, subscribes to LDS and CDS (wildcard) and to EDS for the assignments its
//! clusters need, and hands each complete, valid set of resources to the caller's `apply`.
//!
//! # Behaviour
//! - **Last accepted state.** Per type it keeps the resources and `version_info` it last
//!   accepted. A response is a candidate that replaces its type's resources (LDS, CDS: the
//!   whole set; EDS: the assignments it carries, merged by cluster name, and assignments no
//!   cluster needs any more are dropped).
//! - **Warming.** The candidate set (pending responses over the accepted state) is *warm* when
//!   every EDS cluster has its `ClusterLoadAssignment` and every cluster a listener routes or
//!   mirrors to exists. A warm set is translated ([`crate::translate`]) and, when it differs
//!   from the set last applied, passed to `apply`; then every pending response is ACKed. A
//!   response that leaves the set cold is held (no ACK yet) until the missing pieces arrive
//!   — e.g. a CDS update adding a cluster waits for its EDS, and a CDS update dropping a
//!   cluster still used by a listener waits for the LDS update that stops using it.
//! - **NACK.** A response whose resources do not decode, or whose complete part fails
//!   translation, is NACKed at once (`error_detail` code 3 INVALID_ARGUMENT, the message naming
//!   resource and field; code 13 INTERNAL when `apply` fails), with `version_info` left at the
//!   last accepted version; nothing is applied and the last good config keeps serving. Errors
//!   are blamed on the pending types they name (`listener …` → LDS, `cluster …` → CDS,
//!   `cluster_load_assignment …` → EDS), or on every pending type when they name none of them.
//!   A response still cold after `warm_timeout` is translated as it is and NACKed with what is
//!   missing.
//! - **Reconnect and failover.** The client uses one server of `servers` at a time, starting
//!   with the first. When its stream ends or cannot be opened, the client moves to the next
//!   server in the list (round robin) and opens a new connection there at once, sending the
//!   accepted versions; it stays on a server that works (no moving back to the first). Only
//!   when every server has failed in turn since the last *healthy* stream (one that delivered a
//!   response and stayed open at least `backoff_min`) does it wait, before the next round: an
//!   exponential backoff with full jitter (a random delay up to `backoff_min · 2^round`,
//!   capped at `backoff_max`; `backoff_max` when every failure of the round was a gRPC code
//!   retrying will not fix soon, such as `UNIMPLEMENTED`). With one server that is a backoff
//!   before every reconnect. Meanwhile the last applied config keeps serving. A response equal
//!   to what is applied (from a restarted server, or another server over the same files) is
//!   ACKed without calling `apply`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message;
use rand::Rng;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::cache::ResourceType;
use crate::translate::{missing_assignment, referenced_clusters};
use crate::{translate, ConfigError, ConfigErrors, Resources};

/// `google.rpc.Code.INVALID_ARGUMENT`: a response whose resources are invalid.
const CODE_INVALID_ARGUMENT: i32 = 3;
/// `google.rpc.Code.INTERNAL`: `apply` failed (Envoy NACKs everything with it).
const CODE_INTERNAL: i32 = 13;

/// Where and who the client is, and how it retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdsClientConfig {
    /// The management servers, in order, e.g. `http://127.0.0.1:18000` (`http://` is added
    /// when no scheme is given). One is used at a time; see the module docs for failover.
    /// [`run`] returns at once when the list is empty.
    pub servers: Vec<String>,
    /// `node.id`: the server picks this node's resources by it.
    pub node_id: String,
    /// `node.locality.zone`, sent to the server (which may target resources by zone) and set
    /// as [`Resources::node_zone`] of every applied set.
    pub zone: Option<String>,
    /// The first reconnect delay's upper bound.
    pub backoff_min: Duration,
    /// The largest reconnect delay.
    pub backoff_max: Duration,
    /// How long a response may wait for the resources it needs before it is NACKed (Envoy's
    /// `initial_fetch_timeout` default: 15 s).
    pub warm_timeout: Duration,
}

impl AdsClientConfig {
    /// A config for node `node_id` of `server`, with no zone, backoff from 250 ms up to 30 s
    /// and a 15 s warming timeout.
    pub fn new(server: impl Into<String>, node_id: impl Into<String>) -> AdsClientConfig {
        AdsClientConfig::with_servers([server], node_id)
    }

    /// Like [`AdsClientConfig::new`], with several management servers (tried in this order).
    pub fn with_servers(
        servers: impl IntoIterator<Item = impl Into<String>>,
        node_id: impl Into<String>,
    ) -> AdsClientConfig {
        AdsClientConfig {
            servers: servers.into_iter().map(Into::into).collect(),
            node_id: node_id.into(),
            zone: None,
            backoff_min: Duration::from_millis(250),
            backoff_max: Duration::from_secs(30),
            warm_timeout: Duration::from_secs(15),
        }
    }
}

/// What the client is doing, published on the optional `watch` channel of [`run`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientStatus {
    /// Whether an ADS stream is open.
    pub connected: bool,
    /// The server of the open stream, or of the last one that was open.
    pub server: Option<String>,
    /// The accepted `version_info` per type URL.
    pub applied_versions: HashMap<String, String>,
    /// The message of the last NACK sent.
    pub last_nack: Option<String>,
    /// How many times `apply` succeeded.
    pub applies: u64,
}

/// Runs the ADS client until the future is dropped (see the module docs): connects to one of
/// `cfg.servers`, keeps the latest accepted resources, calls `apply` with each warm and valid
/// set (its `node_zone` is `cfg.zone`), ACKs what was applied, NACKs what was not, and
/// reconnects (to the next server) with backoff. `apply` returns an error text to NACK the set
/// (the caller keeps its previous config); it runs on this task, so it should not block for
/// long.
pub async fn run(
    cfg: AdsClientConfig,
    mut apply: impl FnMut(&Resources) -> Result<(), String> + Send,
    status: Option<watch::Sender<ClientStatus>>,
) {
    if cfg.servers.is_empty() {
        tracing::error!(node = %cfg.node_id, "no xDS management server to connect to");
        return;
    }
    let mut state = State::new(&cfg, status);
    let mut failover = Failover::new(cfg.servers.len());
    let mut last_error: Option<String> = None;
    loop {
        let server = cfg.servers[failover.current].as_str();
        state.received = false;
        let started = Instant::now();
        let result = session(&cfg, server, &mut state, &mut apply).await;
        state.publish(|s| s.connected = false);
        let healthy = state.received && started.elapsed() >= cfg.backoff_min;
        let mut lasting = false;
        let error = match result {
            Ok(()) => "the server closed the stream".to_string(),
            Err(SessionError::Connect(e)) => format!("cannot connect: {e}"),
            Err(SessionError::Grpc(status)) => {
                // Codes that retrying soon will not fix.
                lasting = matches!(
                    status.code(),
                    Code::Unimplemented
                        | Code::InvalidArgument
                        | Code::PermissionDenied
                        | Code::Unauthenticated
                );
                format!(
                    "ADS stream failed: {:?}: {}",
                    status.code(),
                    status.message()
                )
            }
        };
        let cap = failover.ended(healthy, lasting, &cfg);
        let next = cfg.servers[failover.current].as_str();
        let then = match cap {
            None => format!("trying management server {next} at once"),
            Some(_) if cfg.servers.len() == 1 => "reconnecting".to_string(),
            Some(_) => format!("every server failed; backing off, then trying {next}"),
        };
        let key = format!("{server}: {error}");
        if last_error.as_deref() != Some(key.as_str()) {
            tracing::warn!(server, node = %cfg.node_id, "{error}; keeping the last applied config and {then}");
        } else {
            tracing::debug!(server, "{error}; {then}");
        }
        last_error = Some(key);
        if let Some(cap) = cap {
            let nanos = cap.as_nanos().min(u64::MAX as u128) as u64;
            let delay = Duration::from_nanos(rand::rng().random_range(0..=nanos));
            tokio::time::sleep(delay).await;
        }
    }
}

/// Which server to try next, and whether to wait first (see the module docs).
#[derive(Debug)]
struct Failover {
    servers: usize,
    /// The server of the next attempt (an index into `servers`).
    current: usize,
    /// Attempts that failed since the last healthy stream, or the last backoff.
    failures: usize,
    /// Rounds of failures (each server once) since the last healthy stream: the backoff's
    /// exponent.
    rounds: u32,
    /// Whether every failure of this round had a code retrying soon will not fix.
    lasting: bool,
}

impl Failover {
    fn new(servers: usize) -> Failover {
        Failover {
            servers: servers.max(1),
            current: 0,
            failures: 0,
            rounds: 0,
            lasting: true,
        }
    }

    /// Records that the attempt on `current` ended (`healthy`: the stream delivered a response
    /// and stayed open a while; `lasting`: with a code retrying soon will not fix) and moves to
    /// the next server. Returns the bound of the random delay before trying it: `None` to try
    /// it at once.
    fn ended(&mut self, healthy: bool, lasting: bool, cfg: &AdsClientConfig) -> Option<Duration> {
        if healthy {
            self.failures = 0;
            self.rounds = 0;
        }
        if self.failures == 0 {
            self.lasting = true;
        }
        self.failures += 1;
        self.lasting &= lasting;
        self.current = (self.current + 1) % self.servers;
        if self.failures < self.servers {
            return None;
        }
        let cap = if self.lasting {
            cfg.backoff_max
        } else {
            backoff_cap(cfg, self.rounds)
        };
        self.rounds = self.rounds.saturating_add(1);
        self.failures = 0;
        Some(cap)
    }
}

/// `backoff_min · 2^attempt`, at most `backoff_max`.
fn backoff_cap(cfg: &AdsClientConfig, attempt: u32) -> Duration {
    cfg.backoff_min
        .saturating_mul(2u32.saturating_pow(attempt.min(24)))
        .min(cfg.backoff_max)
}

enum SessionError {
    Connect(tonic::transport::Error),
    Grpc(tonic::Status),
}

/// One connection to `server` and ADS stream, until it ends.
async fn session(
    cfg: &AdsClientConfig,
    server: &str,
    state: &mut State,
    apply: &mut (dyn FnMut(&Resources) -> Result<(), String> + Send),
) -> Result<(), SessionError> {
    let uri = if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    };
    let endpoint = tonic::transport::Endpoint::from_shared(uri)
        .map_err(SessionError::Connect)?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    // A new connection per attempt: a restarted server is on a new one.
    let channel = endpoint.connect().await.map_err(SessionError::Connect)?;
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(64 << 20);
    let (tx, rx) = mpsc::channel(16);
    for req in state.start_stream() {
        // The channel has room for the three initial requests.
        let _ = tx.try_send(req);
    }
    let mut inbound = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .map_err(SessionError::Grpc)?
        .into_inner();
    state.publish(|s| {
        s.connected = true;
        s.server = Some(server.to_string());
    });
    tracing::info!(server, node = %cfg.node_id, "ADS stream open");
    loop {
        let deadline = state.warm_deadline;
        let out = tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(resp)) => {
                    state.received = true;
                    state.on_response(resp, apply)
                }
                Ok(None) => return Ok(()),
                Err(status) => return Err(SessionError::Grpc(status)),
            },
            () = sleep_until(deadline), if deadline.is_some() => {
                state.warm_deadline = None;
                state.evaluate(apply, true)
            }
        };
        for req in out {
            if tx.send(req).await.is_err() {
                return Ok(());
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// A response received and not yet ACKed or NACKed, because it is not warm yet.
#[derive(Debug)]
struct Pending<T> {
    version: String,
    nonce: String,
    items: BTreeMap<String, T>,
}

/// The candidate set: pending responses over the accepted state.
struct Candidate {
    clusters: BTreeMap<String, Cluster>,
    endpoints: BTreeMap<String, ClusterLoadAssignment>,
    listeners: BTreeMap<String, Listener>,
}

/// The client's state; the accepted part survives reconnects, the rest is per stream.
struct State {
    node: Node,
    zone: Option<String>,
    warm_timeout: Duration,
    status: Option<watch::Sender<ClientStatus>>,
    /// Accepted `version_info` per type ([`ResourceType::index`]).
    versions: [String; 3],
    clusters: BTreeMap<String, Cluster>,
    endpoints: BTreeMap<String, ClusterLoadAssignment>,
    listeners: BTreeMap<String, Listener>,
    /// The set last passed to `apply` successfully.
    applied: Option<Resources>,
    // --- per stream ---
    /// The latest nonce received per type.
    nonces: [String; 3],
    pending_clusters: Option<Pending<Cluster>>,
    pending_endpoints: Option<Pending<ClusterLoadAssignment>>,
    pending_listeners: Option<Pending<Listener>>,
    /// The EDS names last requested on this stream.
    eds_names: Option<BTreeSet<String>>,
    /// The nonce the last EDS request carried: a request that carried a nonce the server had
    /// already replaced is ignored by it, so the subscription is sent again with the next one.
    eds_sent_nonce: Option<String>,
    /// When the held responses are NACKed if still cold.
    warm_deadline: Option<Instant>,
    /// Whether this stream delivered a response (resets the backoff).
    received: bool,
}

impl State {
    fn new(cfg: &AdsClientConfig, status: Option<watch::Sender<ClientStatus>>) -> State {
        let node = Node {
            id: cfg.node_id.clone(),
            cluster: "respway".to_string(),
            locality: cfg.zone.as_ref().map(|z| Locality {
                zone: z.clone(),
                ..Default::default()
            }),
            user_agent_name: "respway".to_string(),
            ..Default::default()
        };
        State {
            node,
            zone: cfg.zone.clone(),
            warm_timeout: cfg.warm_timeout,
            status,
            versions: Default::default(),
            clusters: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            listeners: BTreeMap::new(),
            applied: None,
            nonces: Default::default(),
            pending_clusters: None,
            pending_endpoints: None,
            pending_listeners: None,
            eds_names: None,
            eds_sent_nonce: None,
            warm_deadline: None,
            received: false,
        }
    }

    fn publish(&self, f: impl FnOnce(&mut ClientStatus)) {
        if let Some(s) = &self.status {
            s.send_modify(f);
        }
    }

    /// Forgets the per-stream state and returns the first requests of a new stream: CDS, EDS
    /// (when clusters need assignments) and LDS, each with the accepted version.
    fn start_stream(&mut self) -> Vec<DiscoveryRequest> {
        self.nonces = Default::default();
        self.pending_clusters = None;
        self.pending_endpoints = None;
        self.pending_listeners = None;
        self.warm_deadline = None;
        self.eds_sent_nonce = None;
        let names = eds_names(&self.clusters);
        self.eds_names = (!names.is_empty()).then_some(names);
        let mut out = vec![self.request(ResourceType::Cluster, None)];
        if self.eds_names.is_some() {
            out.push(self.request(ResourceType::Endpoint, None));
        }
        out.push(self.request(ResourceType::Listener, None));
        out
    }

    /// A request for type `t` carrying the accepted version, the subscription and the latest
    /// nonce received: an ACK right after the version is accepted, a NACK with `error`.
    fn request(&mut self, t: ResourceType, error: Option<RpcStatus>) -> DiscoveryRequest {
        if t == ResourceType::Endpoint {
            self.eds_sent_nonce = Some(self.nonces[t.index()].clone());
        }
        let resource_names = match t {
            ResourceType::Endpoint => self.eds_names.iter().flatten().cloned().collect(),
            _ => Vec::new(),
        };
        DiscoveryRequest {
            version_info: self.versions[t.index()].clone(),
            node: Some(self.node.clone()),
            resource_names,
            resource_locators: Vec::new(),
            type_url: t.type_url().to_string(),
            response_nonce: self.nonces[t.index()].clone(),
            error_detail: error,
        }
    }

    fn on_response(
        &mut self,
        resp: DiscoveryResponse,
        apply: &mut (dyn FnMut(&Resources) -> Result<(), String> + Send),
    ) -> Vec<DiscoveryRequest> {
        let Some(t) = ResourceType::from_type_url(&resp.type_url) else {
            tracing::debug!(type_url = %resp.type_url, "response of a type not subscribed; ignored");
            return Vec::new();
        };
        self.nonces[t.index()] = resp.nonce.clone();
        tracing::debug!(type_url = t.type_url(), version = %resp.version_info, n = resp.resources.len(), "response");
        let decoded = match t {
            ResourceType::Cluster => {
                decode(t, &resp.resources, |c: &Cluster| &c.name).map(|items| {
                    self.pending_clusters = Some(Pending {
                        version: resp.version_info.clone(),
                        nonce: resp.nonce.clone(),
                        items,
                    });
                })
            }
            ResourceType::Endpoint => decode(t, &resp.resources, |e: &ClusterLoadAssignment| {
                &e.cluster_name
            })
            .map(|items| {
                self.pending_endpoints = Some(Pending {
                    version: resp.version_info.clone(),
                    nonce: resp.nonce.clone(),
                    items,
                });
            }),
            ResourceType::Listener => {
                decode(t, &resp.resources, |l: &Listener| &l.name).map(|items| {
                    self.pending_listeners = Some(Pending {
                        version: resp.version_info.clone(),
                        nonce: resp.nonce.clone(),
                        items,
                    });
                })
            }
        };
        if let Err(errors) = decoded {
            // The response supersedes any held one of its type.
            self.take_pending(t);
            let message = errors.to_string();
            let mut out = vec![self.nack(t, CODE_INVALID_ARGUMENT, &message)];
            out.extend(self.evaluate(apply, false));
            return out;
        }
        self.evaluate(apply, false)
    }

    fn pending_types(&self) -> Vec<ResourceType> {
        let mut out = Vec::new();
        if self.pending_clusters.is_some() {
            out.push(ResourceType::Cluster);
        }
        if self.pending_endpoints.is_some() {
            out.push(ResourceType::Endpoint);
        }
        if self.pending_listeners.is_some() {
            out.push(ResourceType::Listener);
        }
        out
    }

    /// Drops the held response of type `t`, returning its version and nonce.
    fn take_pending(&mut self, t: ResourceType) -> Option<(String, String)> {
        match t {
            ResourceType::Cluster => self.pending_clusters.take().map(|p| (p.version, p.nonce)),
            ResourceType::Endpoint => self.pending_endpoints.take().map(|p| (p.version, p.nonce)),
            ResourceType::Listener => self.pending_listeners.take().map(|p| (p.version, p.nonce)),
        }
    }

    /// The NACK of the latest response of type `t`.
    fn nack(&mut self, t: ResourceType, code: i32, message: &str) -> DiscoveryRequest {
        tracing::warn!(type_url = t.type_url(), nonce = %self.nonces[t.index()], "NACK: {message}");
        let msg = message.to_string();
        self.publish(|s| s.last_nack = Some(msg));
        self.request(
            t,
            Some(RpcStatus {
                code,
                message: message.to_string(),
                details: Vec::new(),
            }),
        )
    }

    fn candidate(&self) -> Candidate {
        let clusters = match &self.pending_clusters {
            Some(p) => p.items.clone(),
            None => self.clusters.clone(),
        };
        let listeners = match &self.pending_listeners {
            Some(p) => p.items.clone(),
            None => self.listeners.clone(),
        };
        let needed = eds_names(&clusters);
        let mut endpoints = self.endpoints.clone();
        if let Some(p) = &self.pending_endpoints {
            endpoints.extend(p.items.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        endpoints.retain(|name, _| needed.contains(name));
        Candidate {
            clusters,
            endpoints,
            listeners,
        }
    }

    fn resources(&self, c: &Candidate) -> Resources {
        Resources {
            listeners: c.listeners.values().cloned().collect(),
            clusters: c.clusters.values().cloned().collect(),
            endpoints: c.endpoints.values().cloned().collect(),
            node_zone: self.zone.clone(),
        }
    }

    /// Applies the candidate when it is warm and valid, NACKs what is invalid, holds the rest
    /// (see the module docs). `forced`: the warming timeout passed; judge the set as it is.
    fn evaluate(
        &mut self,
        apply: &mut (dyn FnMut(&Resources) -> Result<(), String> + Send),
        mut forced: bool,
    ) -> Vec<DiscoveryRequest> {
        let mut out = Vec::new();
        loop {
            let pending = self.pending_types();
            if pending.is_empty() {
                self.warm_deadline = None;
                break;
            }
            let c = self.candidate();
            let needed = eds_names(&c.clusters);
            let missing_assignments: BTreeSet<&String> = needed
                .iter()
                .filter(|n| !c.endpoints.contains_key(*n))
                .collect();
            let cold_listeners: BTreeSet<&String> = c
                .listeners
                .iter()
                .filter(|(_, l)| {
                    referenced_clusters(l)
                        .iter()
                        .any(|name| !c.clusters.contains_key(name))
                })
                .map(|(n, _)| n)
                .collect();
            let warm = missing_assignments.is_empty() && cold_listeners.is_empty();
            let was_forced = forced;
            forced = false;
            if warm || was_forced {
                let resources = self.resources(&c);
                if let Err(errors) = translate(&resources) {
                    out.extend(self.nack_blamed(&pending, &errors));
                    continue;
                }
                let result = if self.applied.as_ref() == Some(&resources) {
                    Ok(false)
                } else {
                    apply(&resources).map(|()| true)
                };
                match result {
                    Ok(applied) => out.extend(self.accept(c, resources, applied)),
                    Err(message) => {
                        for t in pending {
                            out.push(self.nack(t, CODE_INTERNAL, &message));
                            self.take_pending(t);
                        }
                    }
                }
                continue;
            }
            // Cold: check what is there now, hold the rest. Listeners naming clusters that
            // have not arrived wait for them; a cluster waiting for its assignment is checked
            // on its own fields (translation reports the missing assignment, which is no error
            // yet).
            let trimmed = Candidate {
                listeners: c
                    .listeners
                    .iter()
                    .filter(|(n, _)| !cold_listeners.contains(n))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                clusters: c.clusters.clone(),
                endpoints: c.endpoints.clone(),
            };
            if let Err(errors) = translate(&self.resources(&trimmed)) {
                let waiting: BTreeSet<String> = c
                    .clusters
                    .values()
                    .filter_map(|cl| {
                        let n = eds_name(cl)?;
                        missing_assignments
                            .contains(&n)
                            .then(|| format!("cluster {:?}", cl.name))
                            .map(|resource| (resource, missing_assignment(&n)))
                    })
                    .map(|(resource, reason)| format!("{resource}: {reason}"))
                    .collect();
                let real: Vec<ConfigError> = errors
                    .iter()
                    .filter(|e| !(e.field.is_empty() && waiting.contains(&e.to_string())))
                    .cloned()
                    .collect();
                if !real.is_empty() {
                    out.extend(self.nack_blamed(&pending, &ConfigErrors(real)));
                    continue;
                }
            }
            tracing::debug!(
                missing_assignments = ?missing_assignments,
                cold_listeners = ?cold_listeners,
                "holding the update until it is warm"
            );
            if self.warm_deadline.is_none() {
                self.warm_deadline = Some(Instant::now() + self.warm_timeout);
            }
            break;
        }
        // Ask for the assignments the clusters now in view need; again when some are still
        // missing and the server has answered EDS since they were asked for (it ignores a
        // request carrying a nonce it has already replaced).
        let c = self.candidate();
        let needed = eds_names(&c.clusters);
        let missing = needed.iter().any(|n| !c.endpoints.contains_key(n));
        let subscribed = self.eds_names.clone().unwrap_or_default();
        let asked_before_last_response =
            self.eds_sent_nonce.as_ref() != Some(&self.nonces[ResourceType::Endpoint.index()]);
        if needed != subscribed || (missing && asked_before_last_response) {
            self.eds_names = Some(needed);
            out.push(self.request(ResourceType::Endpoint, None));
        }
        out
    }

    /// NACKs the pending types `errors` name (all pending types when they name none) and
    /// drops them.
    fn nack_blamed(
        &mut self,
        pending: &[ResourceType],
        errors: &ConfigErrors,
    ) -> Vec<DiscoveryRequest> {
        let mut by_type: BTreeMap<ResourceType, Vec<&ConfigError>> = BTreeMap::new();
        for e in errors {
            if let Some(t) = blamed_type(&e.resource).filter(|t| pending.contains(t)) {
                by_type.entry(t).or_default().push(e);
            }
        }
        let mut out = Vec::new();
        if by_type.is_empty() {
            let message = errors.to_string();
            for t in pending {
                out.push(self.nack(*t, CODE_INVALID_ARGUMENT, &message));
                self.take_pending(*t);
            }
        } else {
            for (t, errs) in by_type {
                let message = errs
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n");
                out.push(self.nack(t, CODE_INVALID_ARGUMENT, &message));
                self.take_pending(t);
            }
        }
        out
    }

    /// Makes the candidate the accepted state and ACKs every pending response.
    fn accept(
        &mut self,
        c: Candidate,
        resources: Resources,
        applied: bool,
    ) -> Vec<DiscoveryRequest> {
        let mut out = Vec::new();
        self.clusters = c.clusters;
        self.endpoints = c.endpoints;
        self.listeners = c.listeners;
        self.applied = Some(resources);
        for t in self.pending_types() {
            if let Some((version, nonce)) = self.take_pending(t) {
                self.versions[t.index()] = version;
                // The ACK echoes the response's nonce (the latest one: older ones were
                // superseded when it arrived).
                debug_assert_eq!(nonce, self.nonces[t.index()]);
                out.push(self.request(t, None));
            }
        }
        let versions: HashMap<String, String> = ResourceType::PUSH_ORDER
            .into_iter()
            .filter(|t| !self.versions[t.index()].is_empty())
            .map(|t| (t.type_url().to_string(), self.versions[t.index()].clone()))
            .collect();
        if applied {
            tracing::info!(versions = ?versions, "applied a new configuration");
        }
        self.publish(|s| {
            s.applied_versions = versions;
            if applied {
                s.applies += 1;
            }
        });
        out
    }
}

/// The pending type an error's resource belongs to.
fn blamed_type(resource: &str) -> Option<ResourceType> {
    if resource.starts_with("listener") {
        Some(ResourceType::Listener)
    } else if resource.starts_with("cluster_load_assignment") {
        Some(ResourceType::Endpoint)
    } else if resource.starts_with("cluster") {
        Some(ResourceType::Cluster)
    } else {
        None
    }
}

/// The assignment name an EDS cluster needs (`eds_cluster_config.service_name`, else its
/// name); `None` for other cluster types.
fn eds_name(c: &Cluster) -> Option<String> {
    match c.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32 => Some(
            c.eds_cluster_config
                .as_ref()
                .map(|e| e.service_name.clone())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| c.name.clone()),
        ),
        _ => None,
    }
}

fn eds_names(clusters: &BTreeMap<String, Cluster>) -> BTreeSet<String> {
    clusters.values().filter_map(eds_name).collect()
}

/// Decodes a response's resources, keyed by name; every error at once.
fn decode<T: Message + Default>(
    t: ResourceType,
    resources: &[Any],
    name: impl Fn(&T) -> &str,
) -> Result<BTreeMap<String, T>, ConfigErrors> {
    let kind = match t {
        ResourceType::Cluster => "clusters",
        ResourceType::Endpoint => "endpoints",
        ResourceType::Listener => "listeners",
    };
    let mut errors = Vec::new();
    let mut out = BTreeMap::new();
    for (i, any) in resources.iter().enumerate() {
        let at = format!("{kind}[{i}]");
        if any.type_url != t.type_url() {
            errors.push(ConfigError::new(
                at,
                "type_url",
                format!("expected {}, got {:?}", t.type_url(), any.type_url),
            ));
            continue;
        }
        match T::decode(any.value.as_slice()) {
            Ok(m) => {
                let n = name(&m).to_string();
                match out.entry(n) {
                    std::collections::btree_map::Entry::Occupied(o) => errors.push(
                        ConfigError::new(at, "name", format!("duplicate {:?}", o.key())),
                    ),
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(m);
                    }
                }
            }
            Err(e) => errors.push(ConfigError::new(at, "", format!("cannot decode: {e}"))),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ConfigErrors(errors))
    }
}

#[cfg(test)]
mod failover_tests {
    use super::*;

    fn cfg() -> AdsClientConfig {
        let mut c = AdsClientConfig::with_servers(["a", "b", "c"], "n");
        c.backoff_min = Duration::from_millis(100);
        c.backoff_max = Duration::from_secs(2);
        c
    }

    #[test]
    fn next_server_at_once_then_backoff_per_round() {
        let cfg = cfg();
        let mut f = Failover::new(3);
        // The first server's healthy stream ends: the next one at once.
        assert_eq!(f.ended(true, false, &cfg), None);
        assert_eq!(f.current, 1);
        // It cannot be reached either: the third at once.
        assert_eq!(f.ended(false, false, &cfg), None);
        assert_eq!(f.current, 2);
        // Every server failed in turn: back off, then go round again, doubling per round.
        assert_eq!(
            f.ended(false, false, &cfg),
            Some(Duration::from_millis(100))
        );
        assert_eq!(f.current, 0);
        assert_eq!(f.ended(false, false, &cfg), None);
        assert_eq!(f.ended(false, false, &cfg), None);
        assert_eq!(
            f.ended(false, false, &cfg),
            Some(Duration::from_millis(200))
        );
        // The first server works again: the client stays there until it fails.
        assert_eq!(f.current, 0);
        assert_eq!(f.ended(true, false, &cfg), None);
        assert_eq!(f.current, 1);
    }

    #[test]
    fn one_server_backs_off_every_time_and_lasting_codes_wait_longest() {
        let mut cfg = cfg();
        cfg.servers.truncate(1);
        let mut f = Failover::new(1);
        assert_eq!(f.ended(true, false, &cfg), Some(Duration::from_millis(100)));
        assert_eq!(
            f.ended(false, false, &cfg),
            Some(Duration::from_millis(200))
        );
        assert_eq!(f.ended(true, false, &cfg), Some(Duration::from_millis(100)));
        assert_eq!(f.ended(false, true, &cfg), Some(Duration::from_secs(2)));
        // Three servers: the longest wait only when the whole round had such codes.
        let cfg3 = super::failover_tests::cfg();
        let mut f = Failover::new(3);
        assert_eq!(f.ended(false, true, &cfg3), None);
        assert_eq!(f.ended(false, false, &cfg3), None);
        assert_eq!(
            f.ended(false, true, &cfg3),
            Some(Duration::from_millis(100))
        );
        assert_eq!(f.ended(false, true, &cfg3), None);
        assert_eq!(f.ended(false, true, &cfg3), None);
        assert_eq!(f.ended(false, true, &cfg3), Some(Duration::from_secs(2)));
    }
}
