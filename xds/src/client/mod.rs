//! The sidecar's ADS client: state-of-the-world xDS over one
//! `AggregatedDiscoveryService.StreamAggregatedResources` stream at a time, to one of a list of
//! management servers.
//!
//! [`run`] connects, subscribes to LDS and CDS (wildcard) and to EDS for the assignments its
//! clusters need, and hands each complete, valid set of resources to the caller's `apply`.
//!
//! # Behaviour
//! - **Desired and applied.** Per resource, the client keeps what the server asked for (the
//!   latest response of each type: LDS and CDS the whole set, EDS merged by cluster name, and
//!   assignments no cluster needs any more dropped) and what it last applied.
//! - **Warming without blocking.** A cluster whose `ClusterLoadAssignment` has not arrived is
//!   *warming*: its applied version stays in use (a new one is left out), and so does the
//!   applied version of a listener that routes to a cluster not there yet (a new listener
//!   waits). Everything else applies at once (translated with [`crate::translate`] and passed
//!   to `apply` when it differs from what is applied). Clusters no listener in use routes to
//!   are checked but not applied: they do nothing, and apply with the listener that uses them.
//! - **Warm timeout, as Envoy's `initial_fetch_timeout`.** A cluster still without its
//!   assignment `warm_timeout` after it was first wanted is warm *with no endpoints*: it gets
//!   one endpoint at [`NO_ENDPOINT`], which the data path never connects to and answers each
//!   request to with `unavailable: no endpoints (...)`, so listeners routing to it apply (and
//!   their other routes serve). An assignment that arrives later replaces it.
//! - **ACK.** CDS and EDS responses are answered at once (ACKed when valid): clusters warm in
//!   the background, and a server waiting for the answer can push the next change. An LDS
//!   response is ACKed once every listener it brought is in use as sent; until then its ACK
//!   is held (after a response the next request of its type is its answer). EDS is never held,
//!   so a request that changes the EDS subscription (a new cluster) always follows an
//!   answered response.
//! - **Partial apply, like Envoy.** Each resource is checked on its own: one that is invalid
//!   keeps its last good version (or is left out when it has none), the valid ones apply, and
//!   the response is NACKed (`error_detail` code 3 INVALID_ARGUMENT, one line per invalid
//!   resource naming resource and field) with `version_info` left at the last ACKed version.
//!   Undecodable resources NACK their response whole; an error that names no single resource
//!   NACKs every held response; `apply` failing NACKs them with code 13 INTERNAL. The last good
//!   config keeps serving in every case.
//! - **Held LDS timeout.** An LDS response still not wholly in use after `warm_timeout`, and
//!   not waiting only for clusters still warming, is NACKed with what it waits for
//!   (`listener "l": waits for cluster(s) x`, a cluster no CDS response brought); what it
//!   brought stays desired and applies if it can later.
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
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{
    address, socket_address, Address, Locality, Node, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message;
use rand::Rng;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::secure::ClientTlsRef;
use crate::translate::{missing_assignment, referenced_clusters};
use crate::{translate, ConfigError, ConfigErrors, ResourceType, Resources};
use respway_filters::model::{Config, NO_ENDPOINT};

/// The default [`AdsClientConfig::keepalive_interval`].
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// The default [`AdsClientConfig::keepalive_timeout`].
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long opening a connection to a server (TCP and the TLS handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long, after a TLS handshake, the client waits for the server's first bytes before it
/// writes (see `connect_channel`); HTTP/2 servers send their SETTINGS at once, so this is
/// waited in full only for a server that sends nothing first.
const FIRST_BYTES_WAIT: Duration = Duration::from_millis(250);
/// The most of the server's first bytes read then (its SETTINGS frame is far smaller).
const FIRST_BYTES: usize = 4096;

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
    /// How long a cluster waits for its `ClusterLoadAssignment` before it is used with no
    /// endpoints, and an LDS response for the clusters it needs before it is NACKed (Envoy's
    /// `initial_fetch_timeout`, default 15 s; the bootstrap's `xds.initial_fetch_timeout`).
    pub warm_timeout: Duration,
    /// TLS to every server (`https://` or no scheme); `None`: plaintext (`http://`).
    pub tls: Option<ClientTlsRef>,
    /// HTTP/2 PINGs to the server after this long without a frame from it (default 30 s)...
    pub keepalive_interval: Duration,
    /// ...and the connection is given up (the client moves to the next server) when a PING is
    /// not answered within this (default 10 s). A connected but silent server (stopped,
    /// frozen, or cut off without a reset) is so left at most `keepalive_interval +
    /// keepalive_timeout` after its last frame.
    pub keepalive_timeout: Duration,
    /// The sidecar's admin endpoint (`IP:port`), sent as the `node.metadata` string field
    /// [`NODE_ADMIN_METADATA`](crate::names::NODE_ADMIN_METADATA) so that the server (its
    /// `GET /status`) can tell tools where to ask each sidecar; `None`: no such field.
    pub admin: Option<String>,
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
            tls: None,
            keepalive_interval: KEEPALIVE_INTERVAL,
            keepalive_timeout: KEEPALIVE_TIMEOUT,
            admin: None,
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
/// set (its `node_zone` is `cfg.zone`) and its translation (whose `zone` is therefore
/// `cfg.zone`), ACKs what was applied, NACKs what was not, and
/// reconnects (to the next server) with backoff. `apply` returns an error text to NACK the set
/// (the caller keeps its previous config); it runs on this task, so it should not block for
/// long.
pub async fn run(
    cfg: AdsClientConfig,
    mut apply: impl FnMut(&Resources, Config) -> Result<(), String> + Send,
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
        let tls_note = TlsNote::default();
        let result = session(&cfg, server, &tls_note, &mut state, &mut apply).await;
        state.publish(|s| s.connected = false);
        let healthy = state.received && started.elapsed() >= cfg.backoff_min;
        let mut lasting = false;
        let error = match result {
            Ok(()) => "the server closed the stream".to_string(),
            Err(SessionError::Connect(e)) => format!("cannot connect: {}", error_chain(&e)),
            Err(SessionError::Grpc(status)) => {
                // Codes that retrying soon will not fix.
                lasting = matches!(
                    status.code(),
                    Code::Unimplemented
                        | Code::InvalidArgument
                        | Code::PermissionDenied
                        | Code::Unauthenticated
                );
                format!("ADS stream failed: {}", status_text(&status))
            }
        };
        // h2 may report the end of a connection the server's TLS refused as "broken pipe" or
        // "connection closed"; the TLS layer saw why.
        let error = match tls_note.take() {
            Some(tls) if !error.contains(&tls) => format!("{error}; {tls}"),
            _ => error,
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

mod state;
mod transport;

use state::State;
pub use transport::channel;
use transport::{connect_channel, TlsNote};

enum SessionError {
    Connect(tonic::transport::Error),
    Grpc(tonic::Status),
}

/// Parses a duration as the configuration files write it: an integer and a unit (`us`,
/// `ms`, `s`, `m`, `h`), e.g. `250ms` (the bootstrap's xDS timeouts).
///
/// # Errors
/// The text is not such a duration, saying what is expected.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::common::parse_duration(s)
}

/// `e` and its sources, `: `-separated (tonic's transport error says only "transport error";
/// the reason, such as a TLS verification failure, is in its sources).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    out.push_str(&sources(e, out.clone()));
    out
}

/// The sources of `e`, each as `: source`, skipping those whose text is already in `said`.
fn sources(e: &(dyn std::error::Error + 'static), mut said: String) -> String {
    let mut out = String::new();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !said.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
            said.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// A gRPC status as `Code: message: sources` (the TLS alert of a refused client certificate
/// is in the sources of an `Unknown` "transport error").
pub fn status_text(status: &tonic::Status) -> String {
    let message = status.message();
    format!(
        "{:?}: {message}{}",
        status.code(),
        sources(status, message.to_string())
    )
}

/// One connection to `server` and ADS stream, until it ends.
async fn session(
    cfg: &AdsClientConfig,
    server: &str,
    tls_note: &TlsNote,
    state: &mut State,
    apply: &mut (dyn FnMut(&Resources, Config) -> Result<(), String> + Send),
) -> Result<(), SessionError> {
    // A new connection per attempt: a restarted server is on a new one.
    let keepalive = (cfg.keepalive_interval, cfg.keepalive_timeout);
    let channel = connect_channel(server, cfg.tls.as_ref(), keepalive, tls_note.clone())
        .await
        .map_err(SessionError::Connect)?;
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
        let deadline = state.next_deadline();
        let out = tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(resp)) => {
                    state.received = true;
                    state.on_response(resp, apply)
                }
                Ok(None) => return Ok(()),
                Err(status) => return Err(SessionError::Grpc(status)),
            },
            () = sleep_until(deadline), if deadline.is_some() => state.on_deadline(apply),
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
