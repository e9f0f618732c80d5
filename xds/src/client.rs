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

/// The first TLS error one connection to a management server met, in words (such as the
/// alert of a server that requires a client certificate). Written only when a read or write
/// fails, read once per connection attempt: its lock is never contended.
#[derive(Debug, Clone, Default)]
struct TlsNote(Arc<Mutex<Option<String>>>);

impl TlsNote {
    /// Keeps what `e` says about TLS, if it is a TLS error and none was kept before.
    fn record(&self, e: &std::io::Error) {
        let Some(text) = tls_reason(e) else {
            return;
        };
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(text);
    }

    fn take(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The rustls error `e` carries, if any.
fn rustls_error(e: &std::io::Error) -> Option<&respway_tls::rustls::Error> {
    e.get_ref()?.downcast_ref::<respway_tls::rustls::Error>()
}

/// `e` in words when it is a TLS error: the alert a server sent, with what to check.
fn tls_reason(e: &std::io::Error) -> Option<String> {
    use respway_tls::rustls::{AlertDescription as A, Error as TlsError};
    Some(match rustls_error(e)? {
        TlsError::AlertReceived(alert) => {
            let what = match alert {
                A::CertificateRequired => "certificate required (the server requires a client certificate: set xds.tls.cert and xds.tls.key)",
                A::BadCertificate => "bad certificate (the server refused the client certificate)",
                A::UnknownCA => "unknown CA (the server does not trust the CA of the client certificate)",
                A::CertificateExpired => "certificate expired (the client certificate is out of its validity period)",
                A::CertificateRevoked => "certificate revoked",
                A::CertificateUnknown => "certificate unknown (the server refused the client certificate)",
                A::AccessDenied => "access denied",
                A::HandshakeFailure => "handshake failure (no TLS version, cipher or protocol in common)",
                A::NoApplicationProtocol => "no application protocol (the server does not offer h2)",
                _ => return Some(format!("TLS alert from the server: {alert:?}")),
            };
            format!("TLS alert from the server: {what}")
        }
        // Said as rustls says it, so that an error chain already saying it is not repeated.
        other => other.to_string(),
    })
}

/// A TLS connection to a management server: first the bytes read after the handshake
/// (`first`, see `connect_channel`), then the stream; its TLS errors are noted in
/// [`TlsNote`] (HTTP/2 may report the connection's end only as "connection closed").
struct Watched<S> {
    inner: S,
    note: TlsNote,
    first: Vec<u8>,
    /// How much of `first` was read.
    taken: usize,
}

impl<S> Watched<S> {
    fn noted<T>(&self, r: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if let Poll::Ready(Err(e)) = &r {
            self.note.record(e);
        }
        r
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.taken < self.first.len() {
            let n = (self.first.len() - self.taken).min(buf.remaining());
            let at = self.taken;
            buf.put_slice(&self.first[at..at + n]);
            self.taken += n;
            return Poll::Ready(Ok(()));
        }
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.noted(r)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.noted(r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.noted(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.noted(r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

enum SessionError {
    Connect(tonic::transport::Error),
    Grpc(tonic::Status),
}

/// A gRPC channel to management server `server` (`HOST:PORT`, `http://HOST:PORT`, or
/// `https://HOST:PORT`), over TLS when `tls` is given (the scheme does not choose: the
/// configuration does), with the keepalive the ADS client uses.
///
/// # Errors
/// The address is not a URI, or connecting (TCP or the TLS handshake) failed; the error's
/// sources say why.
pub async fn channel(
    server: &str,
    tls: Option<&ClientTlsRef>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let keepalive = (KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT);
    connect_channel(server, tls, keepalive, TlsNote::default()).await
}

/// [`channel`] with the keepalive `(interval, timeout)`, recording the first TLS error of
/// the connection in `note`.
async fn connect_channel(
    server: &str,
    tls: Option<&ClientTlsRef>,
    (interval, timeout): (Duration, Duration),
    note: TlsNote,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    // With TLS the handshake is the connector's (below); tonic is given the address as
    // `http://` so that it adds none of its own.
    let authority = server
        .strip_prefix("https://")
        .or_else(|| server.strip_prefix("http://"))
        .unwrap_or(server);
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{authority}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(interval)
        .keep_alive_timeout(timeout)
        .keep_alive_while_idle(true);
    match tls {
        None => endpoint.connect().await,
        Some(tls) => {
            let tls = tls.clone();
            let connector = tower::service_fn(move |uri: tonic::codegen::http::Uri| {
                let tls = tls.clone();
                let note = note.clone();
                async move {
                    let host = uri.host().unwrap_or_default();
                    let host = host
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_string();
                    let port = uri.port_u16().unwrap_or(443);
                    let mut stream = tls
                        .connect(&host, port)
                        .await
                        .inspect_err(|e| note.record(e))?;
                    // A server that refuses the client (no or a wrong client certificate,
                    // TLS 1.3) says so in an alert right after the handshake and closes. Were
                    // the HTTP/2 preface written first, the server would close with it unread
                    // (a reset that drops the alert) or HTTP/2 would report only "broken
                    // pipe" or "connection closed". So the server's first bytes (its
                    // SETTINGS, or the alert) are read now, briefly, and handed to HTTP/2
                    // first; an alert fails the connection attempt with its reason.
                    let mut first = vec![0u8; FIRST_BYTES];
                    let read = tokio::time::timeout(FIRST_BYTES_WAIT, stream.read(&mut first));
                    let n = match read.await {
                        Ok(Ok(n)) => n,
                        Ok(Err(e)) => {
                            note.record(&e);
                            return Err(e);
                        }
                        Err(_) => 0,
                    };
                    first.truncate(n);
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(Watched {
                        inner: stream,
                        note,
                        first,
                        taken: 0,
                    }))
                }
            });
            endpoint.connect_with_connector(connector).await
        }
    }
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

/// A response received and not answered yet: its ACK waits until what it brought is in use
/// (warm) or warming fails.
#[derive(Debug, Clone)]
struct Owed {
    version: String,
    nonce: String,
}

/// A set of resources by name.
#[derive(Debug, Clone, Default, PartialEq)]
struct Set {
    clusters: BTreeMap<String, Cluster>,
    endpoints: BTreeMap<String, ClusterLoadAssignment>,
    listeners: BTreeMap<String, Listener>,
}

impl Set {
    fn of(r: &Resources) -> Set {
        Set {
            clusters: r
                .clusters
                .iter()
                .map(|c| (c.name.clone(), c.clone()))
                .collect(),
            endpoints: r
                .endpoints
                .iter()
                .map(|e| (e.cluster_name.clone(), e.clone()))
                .collect(),
            listeners: r
                .listeners
                .iter()
                .map(|l| (l.name.clone(), l.clone()))
                .collect(),
        }
    }
}

/// The client's state; the desired and applied parts survive reconnects, the rest is per
/// stream.
struct State {
    node: Node,
    zone: Option<String>,
    warm_timeout: Duration,
    status: Option<watch::Sender<ClientStatus>>,
    /// ACKed `version_info` per type ([`ResourceType::index`]).
    versions: [String; 3],
    /// What the server asked for, per resource: the latest response of each type, with each
    /// resource found invalid replaced by its last good version (or left out when it has none).
    /// What of it is warm is applied.
    desired: Set,
    /// The set last passed to `apply` successfully.
    applied: Option<Resources>,
    // --- per stream ---
    /// The latest nonce received per type.
    nonces: [String; 3],
    /// Responses not answered yet, per type.
    owed: [Option<Owed>; 3],
    /// Errors found in the owed response of each type (its NACK lists them).
    invalid: [Vec<ConfigError>; 3],
    /// The EDS names last requested on this stream.
    eds_names: Option<BTreeSet<String>>,
    /// The nonce the last EDS request carried: a request that carried a nonce the server had
    /// already replaced is ignored by it, so the subscription is sent again with the next one.
    eds_sent_nonce: Option<String>,
    /// When the held responses are NACKed if still cold.
    warm_deadline: Option<Instant>,
    /// The assignments desired clusters wait for, each with the time it is given up on (then
    /// the cluster is used with no endpoints: [`no_endpoints`]).
    warming: BTreeMap<String, Instant>,
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
            desired: Set::default(),
            applied: None,
            nonces: Default::default(),
            owed: Default::default(),
            invalid: Default::default(),
            eds_names: None,
            eds_sent_nonce: None,
            warm_deadline: None,
            warming: BTreeMap::new(),
            received: false,
        }
    }

    fn publish(&self, f: impl FnOnce(&mut ClientStatus)) {
        if let Some(s) = &self.status {
            s.send_modify(f);
        }
    }

    /// Forgets the per-stream state and returns the first requests of a new stream: CDS, EDS
    /// (when clusters need assignments) and LDS, each with the ACKed version. What the last
    /// stream left unanswered is dropped back to what is applied (the new stream's responses
    /// bring it again).
    fn start_stream(&mut self) -> Vec<DiscoveryRequest> {
        self.nonces = Default::default();
        for t in ResourceType::PUSH_ORDER {
            if self.owed[t.index()].take().is_some() {
                self.revert_type(t);
            }
        }
        self.invalid = Default::default();
        self.warm_deadline = None;
        self.eds_sent_nonce = None;
        let names = eds_names(&self.desired.clusters);
        self.eds_names = (!names.is_empty()).then_some(names);
        let mut out = vec![self.request(ResourceType::Cluster, None)];
        if self.eds_names.is_some() {
            out.push(self.request(ResourceType::Endpoint, None));
        }
        out.push(self.request(ResourceType::Listener, None));
        out
    }

    /// A request for type `t` carrying the ACKed version, the subscription and the latest
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
        apply: &mut (dyn FnMut(&Resources, Config) -> Result<(), String> + Send),
    ) -> Vec<DiscoveryRequest> {
        let Some(t) = ResourceType::from_type_url(&resp.type_url) else {
            tracing::debug!(type_url = %resp.type_url, "response of a type not subscribed; ignored");
            return Vec::new();
        };
        self.nonces[t.index()] = resp.nonce.clone();
        tracing::debug!(type_url = t.type_url(), version = %resp.version_info, n = resp.resources.len(), "response");
        // A response supersedes the one of its type still owed (whose nonce the server has
        // replaced): what that one brought and is not in use is forgotten.
        if self.owed[t.index()].take().is_some() {
            self.revert_type(t);
        }
        self.invalid[t.index()].clear();
        let decoded = match t {
            ResourceType::Cluster => decode(t, &resp.resources, |c: &Cluster| &c.name)
                .map(|items| self.desired.clusters = items),
            ResourceType::Endpoint => decode(t, &resp.resources, |e: &ClusterLoadAssignment| {
                &e.cluster_name
            })
            .map(|items| self.desired.endpoints.extend(items)),
            ResourceType::Listener => decode(t, &resp.resources, |l: &Listener| &l.name)
                .map(|items| self.desired.listeners = items),
        };
        if let Err(errors) = decoded {
            let message = errors.to_string();
            let mut out = vec![self.nack(t, CODE_INVALID_ARGUMENT, &message)];
            out.extend(self.evaluate(apply, false));
            return out;
        }
        self.owed[t.index()] = Some(Owed {
            version: resp.version_info.clone(),
            nonce: resp.nonce.clone(),
        });
        self.evaluate(apply, false)
    }

    /// The types with a response owed.
    fn owed_types(&self) -> Vec<ResourceType> {
        ResourceType::PUSH_ORDER
            .into_iter()
            .filter(|t| self.owed[t.index()].is_some())
            .collect()
    }

    /// The NACK of the latest response of type `t` (which is then no longer owed).
    fn nack(&mut self, t: ResourceType, code: i32, message: &str) -> DiscoveryRequest {
        tracing::warn!(type_url = t.type_url(), nonce = %self.nonces[t.index()], "NACK: {message}");
        self.owed[t.index()] = None;
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

    /// The applied resources by name.
    fn applied_set(&self) -> Set {
        self.applied.as_ref().map(Set::of).unwrap_or_default()
    }

    /// Sets the desired resources of type `t` back to what is applied.
    fn revert_type(&mut self, t: ResourceType) {
        let a = self.applied_set();
        match t {
            ResourceType::Cluster => self.desired.clusters = a.clusters,
            ResourceType::Endpoint => self.desired.endpoints = a.endpoints,
            ResourceType::Listener => self.desired.listeners = a.listeners,
        }
    }

    /// The part of the desired set that can be in use now. A cluster whose assignment has
    /// not arrived is warming: its applied version stays (or it is left out when new). A
    /// listener naming a cluster that is not there keeps its applied version, if that one's
    /// clusters are there (or waits, left out). A cluster no longer desired that an applied
    /// listener still uses stays until that listener changes.
    fn effective(&self) -> Set {
        let desired = &self.desired;
        let applied = self.applied_set();
        let mut eff = Set::default();
        for (name, c) in &desired.clusters {
            let warm = eds_name(c).is_none_or(|n| desired.endpoints.contains_key(&n));
            if warm {
                eff.clusters.insert(name.clone(), c.clone());
            } else if let Some(old) = applied.clusters.get(name) {
                eff.clusters.insert(name.clone(), old.clone());
            }
        }
        let usable = |l: &Listener, eff: &Set| {
            referenced_clusters(l)
                .iter()
                .all(|n| eff.clusters.contains_key(n) || applied.clusters.contains_key(n))
        };
        for (name, l) in &desired.listeners {
            if usable(l, &eff) {
                eff.listeners.insert(name.clone(), l.clone());
            } else if let Some(old) = applied.listeners.get(name).filter(|o| usable(o, &eff)) {
                eff.listeners.insert(name.clone(), old.clone());
            }
        }
        // Clusters the listeners in use still need, kept at their applied version.
        let needed: BTreeSet<String> = eff
            .listeners
            .values()
            .flat_map(referenced_clusters)
            .collect();
        for n in needed {
            if let (std::collections::btree_map::Entry::Vacant(v), Some(old)) =
                (eff.clusters.entry(n.clone()), applied.clusters.get(&n))
            {
                v.insert(old.clone());
            }
        }
        for c in eff.clusters.values() {
            if let Some(n) = eds_name(c) {
                let a = if desired.clusters.get(&c.name) == Some(c) {
                    desired.endpoints.get(&n)
                } else {
                    applied.endpoints.get(&n)
                };
                if let Some(a) = a.or_else(|| applied.endpoints.get(&n)) {
                    eff.endpoints.insert(n, a.clone());
                }
            }
        }
        eff
    }

    fn resources(&self, s: &Set) -> Resources {
        Resources {
            listeners: s.listeners.values().cloned().collect(),
            clusters: s.clusters.values().cloned().collect(),
            endpoints: s.endpoints.values().cloned().collect(),
            node_zone: self.zone.clone(),
        }
    }

    /// Replaces each resource an error names by its applied version (or drops it when it has
    /// none) and records the error against its type. False when an error names no resource
    /// it could revert.
    fn revert_blamed(&mut self, errors: &ConfigErrors) -> bool {
        let applied = self.applied_set();
        let mut changed = false;
        for e in errors.iter() {
            let Some(t) = blamed_type(&e.resource) else {
                continue;
            };
            let reverted = match t {
                ResourceType::Cluster => {
                    revert(&mut self.desired.clusters, &applied.clusters, &e.resource)
                }
                ResourceType::Endpoint => {
                    revert(&mut self.desired.endpoints, &applied.endpoints, &e.resource)
                }
                ResourceType::Listener => {
                    revert(&mut self.desired.listeners, &applied.listeners, &e.resource)
                }
            };
            if reverted {
                changed = true;
                self.invalid[t.index()].push(e.clone());
            }
        }
        changed
    }

    /// Applies what of the desired set is warm and valid, NACKs the responses with invalid
    /// resources (those keep their last good version), ACKs the responses now wholly in use,
    /// and holds the rest until they are warm (see the module docs). `forced`: the warming
    /// timeout passed: responses still not wholly in use are NACKed with what they wait for.
    fn evaluate(
        &mut self,
        apply: &mut (dyn FnMut(&Resources, Config) -> Result<(), String> + Send),
        forced: bool,
    ) -> Vec<DiscoveryRequest> {
        let mut out = Vec::new();
        // Assignments no desired cluster needs are dropped.
        let needed = eds_names(&self.desired.clusters);
        self.desired.endpoints.retain(|n, _| needed.contains(n));
        let endpoints = &self.desired.endpoints;
        self.warming
            .retain(|n, _| needed.contains(n) && !endpoints.contains_key(n));
        let give_up = Instant::now() + self.warm_timeout;
        for n in needed.iter().filter(|n| !endpoints.contains_key(*n)) {
            self.warming.entry(n.clone()).or_insert(give_up);
        }
        let mut eff = self.effective();
        let mut rounds = 0;
        let resources = loop {
            // Warming clusters are checked on their own fields now (the assignment they wait
            // for is no error yet), then the set that can be in use.
            let mut check = eff.clone();
            check.clusters.extend(self.desired.clusters.clone());
            check.endpoints.extend(self.desired.endpoints.clone());
            let waiting: BTreeSet<String> = self
                .desired
                .clusters
                .values()
                .filter_map(|c| {
                    let n = eds_name(c).filter(|n| !self.desired.endpoints.contains_key(n))?;
                    Some(format!("cluster {:?}: {}", c.name, missing_assignment(&n)))
                })
                .collect();
            let early = match translate(&self.resources(&check)) {
                Ok(_) => Vec::new(),
                Err(errors) => errors
                    .iter()
                    .filter(|e| !(e.field.is_empty() && waiting.contains(&e.to_string())))
                    .cloned()
                    .collect(),
            };
            let r = self.resources(&eff);
            let result = if early.is_empty() {
                translate(&r).map(|_| ())
            } else {
                Err(ConfigErrors(early))
            };
            match result {
                Ok(()) => break Some(r),
                Err(errors) => {
                    rounds += 1;
                    if rounds > 8 || !self.revert_blamed(&errors) {
                        // Errors that name no single resource: every owed response is refused
                        // whole.
                        let message = errors.to_string();
                        for t in self.owed_types() {
                            out.push(self.nack(t, CODE_INVALID_ARGUMENT, &message));
                            self.revert_type(t);
                        }
                        break None;
                    }
                    eff = self.effective();
                }
            }
        };
        // Clusters no listener in use routes to are checked but not applied (they do
        // nothing): a change that only adds clusters waits for the listener that uses them,
        // and applies with it. A sidecar with nothing applied yet waits for a listener.
        let resources = resources.map(|mut r| {
            let used: BTreeSet<String> = r.listeners.iter().flat_map(referenced_clusters).collect();
            r.clusters.retain(|c| used.contains(&c.name));
            let names: BTreeSet<String> = r.clusters.iter().filter_map(eds_name).collect();
            r.endpoints.retain(|e| names.contains(&e.cluster_name));
            r
        });
        let resources = resources.filter(|r| self.applied.is_some() || !r.listeners.is_empty());
        if let Some(r) = resources {
            if self.applied.as_ref() != Some(&r) {
                // Translated once more without the unused clusters; the caller gets the
                // `Config` and need not translate again.
                let applied = translate(&r)
                    .map_err(|e| e.to_string())
                    .and_then(|c| apply(&r, c));
                match applied {
                    Ok(()) => {
                        self.applied = Some(r);
                        self.publish(|s| s.applies += 1);
                        tracing::info!("applied a new configuration");
                    }
                    Err(message) => {
                        for t in self.owed_types() {
                            out.push(self.nack(t, CODE_INTERNAL, &message));
                            self.revert_type(t);
                        }
                    }
                }
            }
        }
        // Answer what can be answered.
        let eff = self.effective();
        for t in self.owed_types() {
            let i = t.index();
            if !self.invalid[i].is_empty() {
                let message = self.invalid[i]
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n");
                self.invalid[i].clear();
                out.push(self.nack(t, CODE_INVALID_ARGUMENT, &message));
            } else if self.in_use(t, &eff) {
                // CDS (valid) is ACKed at once: its clusters warm meanwhile.
                if let Some(o) = self.owed[i].take() {
                    self.versions[i] = o.version;
                    debug_assert_eq!(o.nonce, self.nonces[i]);
                    out.push(self.request(t, None));
                }
            } else if forced && !self.waits_only_for_warming(&eff) {
                let message = self.waiting_for(t, &eff).join("\n");
                out.push(self.nack(t, CODE_INVALID_ARGUMENT, &message));
            }
        }
        self.publish_versions();
        if self.owed_types().is_empty() {
            self.warm_deadline = None;
        } else if self.warm_deadline.is_none() {
            tracing::debug!("holding an update until it is warm");
            self.warm_deadline = Some(Instant::now() + self.warm_timeout);
        }
        // Ask for the assignments the desired clusters need; again when some are still
        // missing and the server has answered EDS since they were asked for (it ignores a
        // request carrying a nonce it has already replaced). An EDS response is never held,
        // so this request is never mistaken for the answer to one.
        let needed = eds_names(&self.desired.clusters);
        let missing = needed
            .iter()
            .any(|n| !self.desired.endpoints.contains_key(n));
        let subscribed = self.eds_names.clone().unwrap_or_default();
        let asked_before_last_response =
            self.eds_sent_nonce.as_ref() != Some(&self.nonces[ResourceType::Endpoint.index()]);
        if self.owed[ResourceType::Endpoint.index()].is_none()
            && (needed != subscribed || (missing && asked_before_last_response))
        {
            self.eds_names = Some(needed);
            out.push(self.request(ResourceType::Endpoint, None));
        }
        out
    }

    /// True when the type's latest response can be ACKed: for LDS, every listener it brought
    /// is in use as sent; CDS and EDS are taken as they come (clusters warm in the
    /// background).
    fn in_use(&self, t: ResourceType, eff: &Set) -> bool {
        match t {
            ResourceType::Listener => self
                .desired
                .listeners
                .iter()
                .all(|(n, l)| eff.listeners.get(n) == Some(l)),
            ResourceType::Cluster | ResourceType::Endpoint => true,
        }
    }

    /// True when every listener not in use as sent waits only for desired clusters still
    /// warming: their own timeout settles it (they apply, with no endpoints if need be), so
    /// the held LDS response is not NACKed before.
    fn waits_only_for_warming(&self, eff: &Set) -> bool {
        self.desired
            .listeners
            .iter()
            .filter(|(n, l)| eff.listeners.get(*n) != Some(l))
            .all(|(_, l)| {
                referenced_clusters(l)
                    .iter()
                    .filter(|c| !eff.clusters.contains_key(*c))
                    .all(|c| {
                        self.desired
                            .clusters
                            .get(c)
                            .and_then(eds_name)
                            .is_some_and(|a| self.warming.contains_key(&a))
                    })
            })
    }

    /// The earliest time something is due: a held response's warm timeout or a cluster's.
    fn next_deadline(&self) -> Option<Instant> {
        self.warming
            .values()
            .copied()
            .chain(self.warm_deadline)
            .min()
    }

    /// A deadline passed: clusters whose assignment did not arrive in time are used with no
    /// endpoints (as Envoy does after `initial_fetch_timeout`), then held responses whose own
    /// timeout passed are NACKed with what they still wait for.
    fn on_deadline(
        &mut self,
        apply: &mut (dyn FnMut(&Resources, Config) -> Result<(), String> + Send),
    ) -> Vec<DiscoveryRequest> {
        let now = Instant::now();
        let expired: Vec<String> = self
            .warming
            .iter()
            .filter(|(_, d)| **d <= now)
            .map(|(n, _)| n.clone())
            .collect();
        for n in expired {
            self.warming.remove(&n);
            tracing::warn!(
                assignment = %n,
                timeout = ?self.warm_timeout,
                "no ClusterLoadAssignment arrived in time: the cluster is used with no endpoints (its keys get unavailable errors) until one does"
            );
            self.desired.endpoints.insert(n.clone(), no_endpoints(&n));
        }
        let forced = self.warm_deadline.is_some_and(|d| d <= now);
        if forced {
            self.warm_deadline = None;
        }
        self.evaluate(apply, forced)
    }

    /// What the type's owed response waits for, in words.
    fn waiting_for(&self, t: ResourceType, eff: &Set) -> Vec<String> {
        let mut out = Vec::new();
        match t {
            ResourceType::Listener => {
                for (n, l) in &self.desired.listeners {
                    if eff.listeners.get(n) != Some(l) {
                        let missing: Vec<String> = referenced_clusters(l)
                            .into_iter()
                            .filter(|c| !eff.clusters.contains_key(c))
                            .collect();
                        out.push(format!(
                            "listener {n:?}: waits for cluster(s) {}",
                            missing.join(", ")
                        ));
                    }
                }
            }
            ResourceType::Cluster | ResourceType::Endpoint => {}
        }
        out
    }

    fn publish_versions(&self) {
        let versions: HashMap<String, String> = ResourceType::PUSH_ORDER
            .into_iter()
            .filter(|t| !self.versions[t.index()].is_empty())
            .map(|t| (t.type_url().to_string(), self.versions[t.index()].clone()))
            .collect();
        self.publish(|s| s.applied_versions = versions);
    }
}

/// Sets the resource an error names (`error_resource`: `listener "x"`) back to its version in
/// `old`, or removes it when `old` has none. False when no resource of `map` has that name, or
/// it is already at the old version.
fn revert<T: Clone + PartialEq>(
    map: &mut BTreeMap<String, T>,
    old: &BTreeMap<String, T>,
    error_resource: &str,
) -> bool {
    let Some(name) = map
        .keys()
        .find(|n| error_resource.ends_with(&format!(" {n:?}")))
        .cloned()
    else {
        return false;
    };
    match old.get(&name) {
        Some(o) if map.get(&name) == Some(o) => false,
        Some(o) => {
            map.insert(name, o.clone());
            true
        }
        None => {
            map.remove(&name);
            true
        }
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

/// The assignment a cluster is given when its own did not arrive in time: one endpoint at
/// [`NO_ENDPOINT`], which the data path never connects to and answers every request to with
/// an `unavailable` error naming the cluster.
fn no_endpoints(name: &str) -> ClusterLoadAssignment {
    let address = Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: NO_ENDPOINT.ip().to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                NO_ENDPOINT.port(),
            ))),
            ..Default::default()
        })),
    };
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: vec![LbEndpoint {
                host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                    address: Some(address),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
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
