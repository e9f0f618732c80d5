//! Upstream pools: per worker and endpoint, a few persistent connections onto which every
//! client's requests are multiplexed and pipelined; replies are matched FIFO.
//!
//! Each connection is one task that owns its socket. Per turn of its loop it takes *every*
//! queued request (`recv_many`), encodes them into one buffer and writes it with as few
//! syscalls as the socket allows, and cuts every complete reply off its read buffer (a
//! resumable [`ReplyScanner`] per connection, no parsing: a huge array arriving in many reads
//! costs each read only its new bytes) to complete the oldest waiting request. Batching across clients
//! is what makes a proxy cheaper than a connection per client (ARCHITECTURE.md, "What costs
//! CPU").
//!
//! Order: a session always uses the same connection of an endpoint (see [`Upstream::new`]),
//! and Redis executes one connection's commands in order, so one client's commands run in the
//! order it sent them.
//!
//! Bounds and failures (every failure is an [`UpstreamError`] naming the shard; it becomes
//! RESP bytes only when it leaves this module):
//! - each connection's queue holds at most `max_queue_per_connection` requests; a request that
//!   does not fit is answered at once (`queue full`) and never sent;
//! - a request whose client stopped waiting (its deadline passed, or the client left) before
//!   it was written is answered with a timeout and never written;
//! - a written request still unanswered at its deadline is answered with a timeout; when the
//!   oldest unanswered request is [`STUCK_MARGIN`] past its deadline the connection is stuck
//!   (a shard that stopped mid-reply, or a frozen process): it is closed, what it holds fails,
//!   and a new one is opened;
//! - connections are opened lazily, verified with a `PING` (a frozen process still accepts TCP
//!   connections) within the cluster's connect timeout. A failed connect starts a backoff
//!   (100 ms, doubling up to 5 s) during which requests get an immediate error, so a dead shard
//!   never hangs its clients; a request that arrives during the backoff after a fast failure
//!   (connection refused) tries once more at once (at most one attempt per [`RETRY_MIN`]), so a
//!   shard that comes back is used by the first request after it;
//! - a connection that breaks the protocol, or is lost soon after it was opened, is reopened
//!   after the backoff too, not in a tight loop.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::queue;
use bytes::{Bytes, BytesMut};
use respway_filters::codec_limits::Limits;
use respway_filters::request::{error_reply, Flavor, Reply, Request};
use respway_filters::resp::{encode_command, reply_len, ReplyScanner};
use respway_filters::zone::HealthView;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tower::Service;

use crate::outq::OutQueue;
use crate::tls::{Io, TlsStream};

/// Most requests taken from the queue in one turn.
const BATCH: usize = 1024;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long past its deadline the oldest unanswered request may wait before its connection
/// counts as stuck and is replaced.
pub(crate) const STUCK_MARGIN: Duration = Duration::from_millis(500);
/// Least time between two connect attempts triggered by requests during a backoff.
pub(crate) const RETRY_MIN: Duration = Duration::from_millis(20);
/// A connection lost sooner than this after it was opened is reopened after the backoff.
const MIN_HEALTHY_LIFE: Duration = Duration::from_secs(1);
/// Bytes of pending writes past which a connection takes no more requests from its queue.
const MAX_WBUF: usize = 1 << 20;
/// A read buffer grown past this by a large reply is given back once it is empty.
const KEEP_RBUF: usize = 256 * 1024;
const RBUF: usize = 16 * 1024;
/// Most read-buffer room reserved at once for a value whose length a reply announced.
const MAX_AHEAD: usize = 64 << 20;

/// Why an upstream request failed. Rendered as `-ERR respway: shard NAME (ADDR) ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UpstreamError {
    /// The endpoint could not be reached (connect failed, or in backoff): not sent.
    Unavailable(Arc<str>),
    /// The connection broke while the request was in flight: it may have run.
    ConnectionLost(Arc<str>),
    /// The connection task is gone (the endpoint left the configuration): not sent.
    Closed,
    /// No reply by the deadline. It may have run if it was written.
    Timeout,
    /// The connection's queue was full: not sent.
    QueueFull(usize),
    /// The request named a shard or endpoint that does not exist: not sent.
    NoShard,
    /// Every dedicated connection this worker may open to the endpoint is in use: not sent.
    Busy(usize),
}

impl UpstreamError {
    /// True when the request certainly did not reach Redis, or broke on the way, so a read
    /// may be sent elsewhere.
    pub(crate) fn retryable_read(&self) -> bool {
        matches!(
            self,
            UpstreamError::Unavailable(_)
                | UpstreamError::ConnectionLost(_)
                | UpstreamError::Closed
                | UpstreamError::QueueFull(_)
                | UpstreamError::Busy(_)
        )
    }

    /// The error's kind, as counted in INFO.
    pub(crate) fn kind(&self) -> ErrorKind {
        match self {
            UpstreamError::Unavailable(_) => ErrorKind::Unavailable,
            UpstreamError::ConnectionLost(_) => ErrorKind::ConnectionLost,
            UpstreamError::Closed => ErrorKind::Closed,
            UpstreamError::Timeout => ErrorKind::Timeout,
            UpstreamError::QueueFull(_) => ErrorKind::QueueFull,
            UpstreamError::NoShard => ErrorKind::NoShard,
            UpstreamError::Busy(_) => ErrorKind::Busy,
        }
    }

    /// The RESP error frame for a client, naming the endpoint.
    pub(crate) fn to_reply(&self, label: &str) -> Reply {
        error_reply(&format!("ERR respway: {}", Shown(self, label)))
    }
}

struct Shown<'a>(&'a UpstreamError, &'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = self.1;
        match self.0 {
            UpstreamError::Unavailable(e) => write!(f, "{label} unavailable: {e}"),
            UpstreamError::ConnectionLost(e) => write!(f, "{label}: connection lost: {e}"),
            UpstreamError::Closed => write!(f, "{label}: connection closed"),
            UpstreamError::Timeout => write!(f, "{label}: upstream timeout"),
            UpstreamError::QueueFull(n) => {
                write!(f, "{label}: queue full ({n} requests waiting)")
            }
            UpstreamError::NoShard => write!(f, "no such shard"),
            UpstreamError::Busy(n) => write!(
                f,
                "{label}: all {n} dedicated connections (transactions and blocking commands) \
                 of this worker are in use"
            ),
        }
    }
}

/// Kinds of [`UpstreamError`], for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// [`UpstreamError::Unavailable`].
    Unavailable = 0,
    /// [`UpstreamError::ConnectionLost`].
    ConnectionLost,
    /// [`UpstreamError::Closed`].
    Closed,
    /// [`UpstreamError::Timeout`].
    Timeout,
    /// [`UpstreamError::QueueFull`].
    QueueFull,
    /// [`UpstreamError::NoShard`].
    NoShard,
    /// [`UpstreamError::Busy`].
    Busy,
}

impl ErrorKind {
    /// Every kind, in counter order.
    pub(crate) const ALL: [ErrorKind; 7] = [
        ErrorKind::Unavailable,
        ErrorKind::ConnectionLost,
        ErrorKind::Closed,
        ErrorKind::Timeout,
        ErrorKind::QueueFull,
        ErrorKind::NoShard,
        ErrorKind::Busy,
    ];

    /// The INFO field suffix.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::ConnectionLost => "connection_lost",
            ErrorKind::Closed => "closed",
            ErrorKind::Timeout => "timeout",
            ErrorKind::QueueFull => "queue_full",
            ErrorKind::NoShard => "no_shard",
            ErrorKind::Busy => "busy",
        }
    }
}

/// One worker's upstream counters (kept across configuration changes).
#[derive(Debug, Default)]
pub(crate) struct UpstreamStats {
    errors: [AtomicU64; 7],
    /// Connections opened (first connects and reconnects).
    pub(crate) connects: AtomicU64,
    /// Connect attempts that failed.
    pub(crate) connect_failures: AtomicU64,
    /// Connections closed because requests on them stopped being answered.
    pub(crate) stuck: AtomicU64,
    /// Connections closed because the peer broke the protocol.
    pub(crate) protocol_errors: AtomicU64,
}

impl UpstreamStats {
    /// Counts one error of `kind`.
    pub(crate) fn count(&self, kind: ErrorKind) {
        self.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }
    /// Errors of `kind` so far.
    pub(crate) fn errors(&self, kind: ErrorKind) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
    }
}

/// One worker's counters and health of one endpoint: written by the endpoint's connection
/// tasks (on the worker's thread, so the atomics are uncontended), read by the worker's zone
/// layer and by the admin endpoint. An endpoint is *out* (respway's passive outlier rule)
/// from a failed connect, or a connection that broke the protocol or was lost right after
/// it opened, until a connect succeeds again; the zone layer sends reads elsewhere meanwhile.
#[derive(Debug)]
pub(crate) struct EndpointStats {
    /// The worker's totals over every endpoint (`INFO proxy`), counted with this endpoint's.
    pub(crate) worker: Arc<UpstreamStats>,
    errors: [AtomicU64; 7],
    healthy: AtomicBool,
    /// Times it went from healthy to out.
    ejections: AtomicU64,
    /// Since when it is out, why, and how many attempts failed since (written on failures
    /// only).
    down: Mutex<Option<Down>>,
    /// Connections opened, and connect attempts that failed.
    connects: AtomicU64,
    connect_failures: AtomicU64,
    /// Connections open now, and the requests written on them not yet answered (see
    /// [`OpenConnection`]).
    open: AtomicU64,
    inflight: AtomicU64,
}

/// Why and since when an endpoint is out (see [`EndpointStats`]).
#[derive(Debug, Clone)]
pub(crate) struct Down {
    /// When it went out.
    pub(crate) since: std::time::SystemTime,
    /// The last failure.
    pub(crate) reason: Arc<str>,
    /// Failed attempts since it went out.
    pub(crate) failures: u64,
}

impl EndpointStats {
    fn new(worker: Arc<UpstreamStats>) -> EndpointStats {
        EndpointStats {
            worker,
            errors: Default::default(),
            healthy: AtomicBool::new(true),
            ejections: AtomicU64::new(0),
            down: Mutex::new(None),
            connects: AtomicU64::new(0),
            connect_failures: AtomicU64::new(0),
            open: AtomicU64::new(0),
            inflight: AtomicU64::new(0),
        }
    }

    /// Counts a connection opened, for the endpoint and the worker.
    fn count_connect(&self) {
        crate::metrics::bump(&self.connects, 1);
        self.worker.connects.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed connect attempt, for the endpoint and the worker.
    fn count_connect_failure(&self) {
        crate::metrics::bump(&self.connect_failures, 1);
        self.worker.connect_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Connections opened, and connect attempts that failed, so far.
    pub(crate) fn connects(&self) -> (u64, u64) {
        (
            self.connects.load(Ordering::Relaxed),
            self.connect_failures.load(Ordering::Relaxed),
        )
    }

    /// Connections open now, and requests written on them not yet answered.
    pub(crate) fn open(&self) -> (u64, u64) {
        (
            self.open.load(Ordering::Relaxed),
            self.inflight.load(Ordering::Relaxed),
        )
    }

    /// Counts one error of `kind`, for the endpoint and the worker.
    pub(crate) fn count(&self, kind: ErrorKind) {
        crate::metrics::bump(&self.errors[kind as usize], 1);
        self.worker.count(kind);
    }

    /// Errors of `kind` so far.
    pub(crate) fn errors(&self, kind: ErrorKind) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
    }

    /// Times the endpoint went out.
    pub(crate) fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// False while the endpoint is out.
    pub(crate) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Since when and why it is out (`None` while healthy).
    pub(crate) fn down(&self) -> Option<Down> {
        self.down.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A connection opened: the endpoint is back (or still) in. The way back is logged once
    /// (whatever put it out: a refused or timed-out connect, a frozen shard, ...).
    fn connected(&self, label: &str) {
        if !self.healthy.swap(true, Ordering::Relaxed) {
            let was = self.down.lock().unwrap_or_else(|e| e.into_inner()).take();
            let (out_for, failures) = was.map_or((Duration::ZERO, 0), |d| {
                (d.since.elapsed().unwrap_or_default(), d.failures)
            });
            tracing::info!(
                endpoint = %label,
                out_for_ms = out_for.as_millis() as u64,
                failed_attempts = failures,
                "upstream reachable again"
            );
        }
    }

    /// An attempt failed with `reason`: the endpoint is out (again). Going out is logged
    /// once (warn); the attempts that fail while it stays out only at debug.
    fn failed(&self, label: &str, reason: &Arc<str>, backoff: Duration) {
        let was_healthy = self.healthy.swap(false, Ordering::Relaxed);
        if was_healthy {
            crate::metrics::bump(&self.ejections, 1);
            tracing::warn!(endpoint = %label, error = %reason, ?backoff, "upstream unavailable");
        } else {
            tracing::debug!(endpoint = %label, error = %reason, ?backoff, "upstream still unavailable");
        }
        let mut d = self.down.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *d {
            Some(d) if !was_healthy => {
                d.reason = reason.clone();
                d.failures += 1;
            }
            _ => {
                *d = Some(Down {
                    since: std::time::SystemTime::now(),
                    reason: reason.clone(),
                    failures: 1,
                })
            }
        }
    }
}

/// One open connection in its endpoint's gauges ([`EndpointStats::open`]): counted open
/// while it lives, with the requests it last reported in flight (its own count, added to and
/// taken from the endpoint's: the connections of one endpoint add up, and a connection that
/// ends takes back exactly what it added).
struct OpenConnection<'a> {
    stats: &'a EndpointStats,
    inflight: u64,
}

impl<'a> OpenConnection<'a> {
    fn new(stats: &'a EndpointStats) -> Self {
        stats.open.fetch_add(1, Ordering::Relaxed);
        OpenConnection { stats, inflight: 0 }
    }

    /// Requests written on this connection and not yet answered: `n` now.
    #[inline]
    fn inflight(&mut self, n: usize) {
        let n = n as u64;
        if n > self.inflight {
            self.stats
                .inflight
                .fetch_add(n - self.inflight, Ordering::Relaxed);
        } else if n < self.inflight {
            self.stats
                .inflight
                .fetch_sub(self.inflight - n, Ordering::Relaxed);
        }
        self.inflight = n;
    }
}

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.inflight(0);
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

type ReplyTx = oneshot::Sender<Result<Reply, UpstreamError>>;

/// One request handed to a connection task.
#[derive(Debug)]
pub(crate) struct UpstreamRequest {
    /// The command to send.
    pub(crate) args: Vec<Bytes>,
    /// `args` as the client sent them (see `Request::raw`): written instead of encoding
    /// `args`.
    pub(crate) raw: Option<Bytes>,
    /// When the client stops waiting.
    pub(crate) deadline: Instant,
    /// Where the reply goes.
    pub(crate) tx: ReplyTx,
}

/// How to reach and prepare one endpoint (`{:?}` leaves the `AUTH` arguments out).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct EndpointConfig {
    /// Socket address.
    pub(crate) address: SocketAddr,
    /// `shard <name> (<addr>)`, used in error replies and logs.
    pub(crate) label: Arc<str>,
    /// TCP connect timeout (the handshake shares it).
    pub(crate) connect_timeout: Duration,
    /// `AUTH` arguments (without the command name), sent on connect.
    pub(crate) auth: Option<Vec<Bytes>>,
    /// The database a client's database 0 maps to (`SELECT db + n` on connect for a
    /// connection of client database n, when non-zero).
    pub(crate) db: u32,
    /// Client databases (`SELECT n` with `n < databases`).
    pub(crate) databases: u32,
    /// Dedicated connections this worker may have open at once.
    pub(crate) dedicated: usize,
    /// Requests that may wait in one connection's queue.
    pub(crate) max_queue: usize,
    /// TLS to the endpoint (`None`: plaintext).
    pub(crate) tls: Option<crate::tls::UpstreamTlsConfig>,
}

impl std::fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("address", &self.address)
            .field("label", &self.label)
            .field("connect_timeout", &self.connect_timeout)
            .field("auth", &self.auth.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .field("databases", &self.databases)
            .field("dedicated", &self.dedicated)
            .field("max_queue", &self.max_queue)
            .field("tls", &self.tls)
            .finish()
    }
}

/// This worker's connections to one endpoint: per [`Flavor`] (protocol and database), the
/// shared multiplexed connections (spawned on first use) and the idle dedicated ones.
#[derive(Debug, Clone)]
pub(crate) struct EndpointHandle {
    inner: Arc<EndpointInner>,
}

#[derive(Debug)]
struct EndpointInner {
    cfg: EndpointConfig,
    /// Shared connections per flavor.
    n: usize,
    /// Indexed by [`Flavor::index`].
    flavors: Box<[FlavorPools]>,
    /// Dedicated connections open now (idle or in use).
    dedicated_open: Arc<AtomicUsize>,
    /// Counters and health, written by this worker's connection tasks (health is read by
    /// this worker's zone layer).
    stats: Arc<EndpointStats>,
    /// Requests this worker sent to the endpoint (queued on one of its connections), for
    /// per-shard load.
    requests: AtomicU64,
    /// How long the endpoint took per request, write to reply (all its connections).
    latency: Arc<crate::metrics::Latency>,
}

#[derive(Debug, Default)]
struct FlavorPools {
    shared: OnceLock<Box<[queue::Sender<UpstreamRequest>]>>,
    /// Dedicated connections between two transactions (one worker's sessions only; taken
    /// when a transaction starts and given back when it ends).
    idle: Mutex<Vec<queue::Sender<UpstreamRequest>>>,
}

impl EndpointHandle {
    /// This worker's pools for `cfg` with `n` shared connections per flavor; the RESP2
    /// database-0 connections are spawned now (they connect on their first request), the
    /// others on first use.
    pub(crate) fn spawn(
        cfg: EndpointConfig,
        n: usize,
        stats: Arc<UpstreamStats>,
    ) -> EndpointHandle {
        let flavors = (0..2 * cfg.databases.clamp(1, 256) as usize)
            .map(|_| FlavorPools::default())
            .collect();
        let h = EndpointHandle {
            inner: Arc::new(EndpointInner {
                cfg,
                n: n.max(1),
                flavors,
                dedicated_open: Arc::new(AtomicUsize::new(0)),
                stats: Arc::new(EndpointStats::new(stats)),
                requests: AtomicU64::new(0),
                latency: Arc::default(),
            }),
        };
        h.shared(Flavor::default());
        h
    }

    /// False while connecting to the endpoint fails.
    pub(crate) fn is_healthy(&self) -> bool {
        self.inner.stats.is_healthy()
    }

    /// This worker's counters and health of the endpoint.
    pub(crate) fn stats(&self) -> &EndpointStats {
        &self.inner.stats
    }

    /// `shard <name> (<addr>)`.
    pub(crate) fn label(&self) -> &Arc<str> {
        &self.inner.cfg.label
    }

    /// How this endpoint is reached.
    pub(crate) fn config(&self) -> &EndpointConfig {
        &self.inner.cfg
    }

    fn pools(&self, flavor: Flavor) -> Option<&FlavorPools> {
        self.inner.flavors.get(flavor.index())
    }

    fn shared(&self, flavor: Flavor) -> Option<&[queue::Sender<UpstreamRequest>]> {
        let i = &self.inner;
        let pools = self.pools(flavor)?;
        Some(pools.shared.get_or_init(|| {
            (0..i.n)
                .map(|_| {
                    let (tx, rx) = queue::channel(i.cfg.max_queue);
                    tokio::spawn(run_connection(
                        i.cfg.clone(),
                        flavor,
                        None,
                        rx,
                        i.stats.clone(),
                        i.latency.clone(),
                    ));
                    tx
                })
                .collect()
        }))
    }

    /// Queues `args` on this flavor's connection `conn % n` and returns the reply's future.
    pub(crate) fn send(
        &self,
        args: Vec<Bytes>,
        flavor: Flavor,
        conn: usize,
        deadline: Instant,
    ) -> UpstreamFuture {
        self.send_frame(args, None, flavor, conn, deadline)
    }

    /// [`send`](Self::send) with the client's frame of `args` (see `Request::raw`).
    pub(crate) fn send_frame(
        &self,
        args: Vec<Bytes>,
        raw: Option<Bytes>,
        flavor: Flavor,
        conn: usize,
        deadline: Instant,
    ) -> UpstreamFuture {
        let label = self.inner.cfg.label.clone();
        let Some(conns) = self.shared(flavor) else {
            return UpstreamFuture::failed(UpstreamError::NoShard, label, deadline);
        };
        crate::metrics::bump(&self.inner.requests, 1);
        send_on(
            &conns[conn % conns.len()],
            args,
            raw,
            deadline,
            label,
            &self.inner.stats,
            self.inner.cfg.max_queue,
        )
    }

    /// A dedicated connection of `flavor` for one transaction: an idle one, or a new one
    /// while fewer than the cluster's `dedicated_connections` are open.
    pub(crate) fn take_dedicated(&self, flavor: Flavor) -> Result<Dedicated, UpstreamError> {
        let i = &self.inner;
        let pools = self.pools(flavor).ok_or(UpstreamError::NoShard)?;
        let mut idle = pools.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(tx) = idle.pop() {
            if !tx.is_closed() {
                return Ok(Dedicated {
                    tx,
                    handle: self.clone(),
                    flavor,
                });
            }
        }
        drop(idle);
        let open = i.dedicated_open.fetch_add(1, Ordering::Relaxed);
        if open >= i.cfg.dedicated.max(1) {
            i.dedicated_open.fetch_sub(1, Ordering::Relaxed);
            i.stats.count(ErrorKind::Busy);
            return Err(UpstreamError::Busy(i.cfg.dedicated.max(1)));
        }
        let (tx, rx) = queue::channel(i.cfg.max_queue);
        tokio::spawn(run_connection(
            i.cfg.clone(),
            flavor,
            Some(OpenGuard(i.dedicated_open.clone())),
            rx,
            i.stats.clone(),
            i.latency.clone(),
        ));
        Ok(Dedicated {
            tx,
            handle: self.clone(),
            flavor,
        })
    }

    /// Adds this worker's upstream latency of the endpoint into `t`.
    pub(crate) fn add_latency(&self, t: &mut crate::metrics::CmdTotals) {
        self.inner.latency.add_into(t);
    }

    /// Requests queued now on this worker's shared connections to the endpoint, waiting to
    /// be written (read from the queues, nothing counted per request).
    pub(crate) fn queued(&self) -> usize {
        self.inner
            .flavors
            .iter()
            .filter_map(|f| f.shared.get())
            .flat_map(|conns| conns.iter())
            .map(|tx| tx.len())
            .sum()
    }

    /// Requests this worker has sent to the endpoint.
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Dedicated connections open now (idle or in use), all flavors.
    pub(crate) fn dedicated_open(&self) -> usize {
        self.inner.dedicated_open.load(Ordering::Relaxed)
    }
}

fn send_on(
    queue: &queue::Sender<UpstreamRequest>,
    args: Vec<Bytes>,
    raw: Option<Bytes>,
    deadline: Instant,
    label: Arc<str>,
    stats: &EndpointStats,
    max_queue: usize,
) -> UpstreamFuture {
    let (tx, rx) = oneshot::channel();
    let failed = match queue.try_send(UpstreamRequest {
        args,
        raw,
        deadline,
        tx,
    }) {
        Ok(()) => return UpstreamFuture::waiting(rx, label, deadline),
        Err(queue::TrySendError::Full(_)) => UpstreamError::QueueFull(max_queue),
        Err(queue::TrySendError::Closed(_)) => UpstreamError::Closed,
    };
    stats.count(failed.kind());
    UpstreamFuture::failed(failed, label, deadline)
}

/// Why a command on a dedicated connection that broke earlier fails.
const DEDICATED_BROKE: &str = "the connection broke before this command was sent";

/// Decrements the count of open dedicated connections when their task ends.
#[derive(Debug)]
struct OpenGuard(Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection one session holds for a transaction (`WATCH` ... `EXEC`): its commands run
/// on it alone, in order. It never reconnects: if it breaks or a reply is late, it is closed
/// (which discards a `MULTI` in progress on Redis) and every later command on it fails.
#[derive(Debug)]
pub(crate) struct Dedicated {
    tx: queue::Sender<UpstreamRequest>,
    handle: EndpointHandle,
    flavor: Flavor,
}

impl Dedicated {
    /// Queues `args` and returns the reply's future.
    pub(crate) fn send(&self, args: Vec<Bytes>, deadline: Instant) -> UpstreamFuture {
        let i = &self.handle.inner;
        crate::metrics::bump(&i.requests, 1);
        if self.tx.is_closed() {
            // The connection broke (it is never reopened under a transaction): a lost
            // connection, not an endpoint that left the configuration (`Closed`).
            let e = UpstreamError::ConnectionLost(DEDICATED_BROKE.into());
            i.stats.count(e.kind());
            return UpstreamFuture::failed(e, i.cfg.label.clone(), deadline);
        }
        send_on(
            &self.tx,
            args,
            None,
            deadline,
            i.cfg.label.clone(),
            &i.stats,
            i.cfg.max_queue,
        )
    }

    /// Puts the connection back in the idle pool at once: for a holder whose every request
    /// was answered by Redis (not by respway: a timeout or a lost connection ends the
    /// connection's task), so nothing is in flight and no state is left on it.
    pub(crate) fn give_back(self) {
        if self.tx.is_closed() {
            return;
        }
        if let Some(pools) = self.handle.pools(self.flavor) {
            pools
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self.tx);
        }
    }

    /// Ends the transaction: sends `cleanup` (e.g. `DISCARD`, `UNWATCH` for a client that
    /// left mid-transaction; nothing after `EXEC`), then a `PING`; once the `PING` is
    /// answered the connection is idle again and goes back to the pool. Answers are awaited
    /// by a task of its own, so the session does not wait.
    pub(crate) fn release(self, cleanup: &[&'static [u8]], timeout: Duration) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let deadline = Instant::now() + timeout;
        let futs: Vec<UpstreamFuture> = cleanup
            .iter()
            .chain(std::iter::once(&&b"PING"[..]))
            .map(|c| self.send(vec![Bytes::from_static(c)], deadline))
            .collect();
        tokio::spawn(async move {
            // Errors of the cleanup commands themselves are expected (`DISCARD` without
            // `MULTI`); an error of the proxy's own (connection lost, timeout) is not.
            let mut clean = true;
            let mut last = Bytes::new();
            for f in futs {
                match f.typed().await {
                    Ok(r) => last = r,
                    Err(_) => clean = false,
                }
            }
            clean &= &last[..] == b"+PONG\r\n";
            if clean {
                self.give_back();
            }
        });
    }
}

/// One worker's endpoint handles, `[cluster][shard][endpoint]` in model order.
#[derive(Debug, Default)]
pub(crate) struct Endpoints(pub(crate) Vec<Vec<Vec<EndpointHandle>>>);

impl Endpoints {
    /// The handle of one endpoint.
    pub(crate) fn get(
        &self,
        cluster: usize,
        shard: usize,
        endpoint: usize,
    ) -> Option<&EndpointHandle> {
        self.0.get(cluster)?.get(shard)?.get(endpoint)
    }
}

impl HealthView for Endpoints {
    fn healthy(&self, cluster: usize, shard: usize, endpoint: usize) -> bool {
        self.get(cluster, shard, endpoint)
            .is_some_and(EndpointHandle::is_healthy)
    }
}

/// The innermost service of the chain: sends a routed request to the endpoint the zone
/// layer chose (the shard's primary when it chose none).
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    endpoints: Arc<Endpoints>,
    /// Which of an endpoint's connections this client uses: fixed for the session's life, so
    /// every command of one client to one endpoint travels on one connection (Redis orders
    /// commands per connection only); sessions, not commands, are spread over connections.
    conn: usize,
    /// Deadline of requests that carry none (mirrored copies, tests).
    default_timeout: Duration,
}

impl Upstream {
    /// An upstream service over this worker's endpoints for one session; `conn` picks the
    /// session's connection to every endpoint (`conn % connections_per_endpoint`).
    pub(crate) fn new(endpoints: Arc<Endpoints>, conn: usize, default_timeout: Duration) -> Self {
        Upstream {
            endpoints,
            conn,
            default_timeout,
        }
    }
}

impl Service<Request> for Upstream {
    type Response = Reply;
    type Error = Infallible;
    type Future = UpstreamFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Each connection's queue is bounded; a full one answers at once instead of waiting.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> UpstreamFuture {
        let shard = req.shard_index().unwrap_or(0);
        // Both set by the zone layer, which looked the primary up.
        let primary = usize::from(req.primary);
        let endpoint = req.endpoint.map_or(primary, usize::from);
        let Some(ep) = self.endpoints.get(req.cluster, shard, endpoint) else {
            let deadline = Instant::now();
            return UpstreamFuture::failed(UpstreamError::NoShard, Arc::from(""), deadline);
        };
        let deadline = match req.deadline {
            Some(d) => Instant::from_std(d),
            None => Instant::now() + self.default_timeout,
        };
        if endpoint != primary && req.is_read() {
            // A read sent to a replica: if the replica turns out to be unreachable, the read
            // is retried once on the primary instead of failing (the zone layer skips the
            // replica from then on). Costs one clone of the argument list and one box, for
            // replica reads only.
            if let Some(p) = self.endpoints.get(req.cluster, shard, primary) {
                let fallback = Some(Box::new((
                    p.clone(),
                    req.args.clone(),
                    req.flavor,
                    self.conn,
                )));
                let mut f = ep.send_frame(req.args, req.raw, req.flavor, self.conn, deadline);
                f.fallback = fallback;
                return f;
            }
        }
        ep.send_frame(req.args, req.raw, req.flavor, self.conn, deadline)
    }
}

/// Where a replica read goes again when the replica cannot be reached: the primary, the
/// arguments, the flavor and the connection index.
type Fallback = (EndpointHandle, Vec<Bytes>, Flavor, usize);

/// The reply of one upstream request.
#[derive(Debug)]
pub(crate) struct UpstreamFuture {
    state: State,
    label: Arc<str>,
    /// For replica reads: the primary and the request, to retry there once when the replica
    /// cannot be reached. Boxed: every reply's future carries the field, only replica reads
    /// fill it, and a session moves each future into its queue (at 128 bytes or less a move
    /// is a few instructions, not a `memcpy` call).
    fallback: Option<Box<Fallback>>,
    deadline: Instant,
}

#[derive(Debug)]
enum State {
    /// Waiting for the connection task.
    Waiting(oneshot::Receiver<Result<Reply, UpstreamError>>),
    /// Already failed.
    Failed(Option<UpstreamError>),
}

impl UpstreamFuture {
    fn waiting(
        rx: oneshot::Receiver<Result<Reply, UpstreamError>>,
        label: Arc<str>,
        deadline: Instant,
    ) -> Self {
        UpstreamFuture {
            state: State::Waiting(rx),
            label,
            fallback: None,
            deadline,
        }
    }

    fn failed(e: UpstreamError, label: Arc<str>, deadline: Instant) -> Self {
        UpstreamFuture {
            state: State::Failed(Some(e)),
            label,
            fallback: None,
            deadline,
        }
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365)
}

impl UpstreamFuture {
    /// Redis's reply (`Ok`, errors of Redis included), or respway's own failure (`Err`, a
    /// timeout, a lost connection, ...) rendered for the client: a holder of a dedicated
    /// connection decides by the variant, not by the reply's text, whether the connection is
    /// still clean. No replica fallback (dedicated connections have none).
    pub(crate) async fn typed(self) -> Result<Reply, Reply> {
        let result = match self.state {
            State::Waiting(rx) => rx.await.unwrap_or(Err(UpstreamError::Closed)),
            State::Failed(e) => Err(e.unwrap_or(UpstreamError::Closed)),
        };
        result.map_err(|e| e.to_reply(&self.label))
    }
}

impl Future for UpstreamFuture {
    type Output = Result<Reply, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            let result = match &mut this.state {
                State::Waiting(rx) => match Pin::new(rx).poll(cx) {
                    Poll::Ready(Ok(r)) => r,
                    Poll::Ready(Err(_)) => Err(UpstreamError::Closed),
                    Poll::Pending => return Poll::Pending,
                },
                State::Failed(e) => Err(e.take().unwrap_or(UpstreamError::Closed)),
            };
            match result {
                Ok(reply) => return Poll::Ready(Ok(reply)),
                Err(e) => {
                    if e.retryable_read() {
                        if let Some(b) = this.fallback.take() {
                            let (primary, args, flavor, conn) = *b;
                            let next = primary.send(args, flavor, conn, this.deadline);
                            this.state = next.state;
                            this.label = next.label;
                            continue;
                        }
                    }
                    return Poll::Ready(Ok(e.to_reply(&this.label)));
                }
            }
        }
    }
}

// === connection task ===

/// One request written (or being written) on a connection, waiting for its reply.
struct Inflight {
    /// `None` once answered with a timeout: its reply, when it comes, is dropped.
    tx: Option<ReplyTx>,
    /// Moved later while reply bytes flow (see [`STRETCH`]).
    deadline: Instant,
    /// When its batch was taken to be written.
    sent: Instant,
    /// Its op_timeout (as it stood when written).
    op: Duration,
}

/// A request's op_timeout counts from when it was written or from the last reply byte its
/// connection received, whichever is later: a reply that waits behind earlier large replies
/// on the same connection (or is itself arriving) is not timed out while bytes keep flowing.
/// At most this many op_timeouts after it was written, though (the session's backstop comes
/// after that).
pub(crate) const STRETCH: u32 = 8;

/// Latencies of consecutive replies counted as one run (replies of one write batch share
/// `sent` and are read together, so they took the same time): one subtraction and one
/// histogram update per run, the rest when dropped.
struct LatencyRun<'a> {
    latency: &'a crate::metrics::Latency,
    /// The run's send time and `now` less it.
    sent: Instant,
    now: Instant,
    us: u64,
    n: u64,
}

impl<'a> LatencyRun<'a> {
    /// For the replies of one read, which arrived `now`.
    fn new(latency: &'a crate::metrics::Latency, now: Instant) -> Self {
        // A first reply sent `now` joins this empty run, and its 0 µs are right.
        LatencyRun {
            latency,
            sent: now,
            now,
            us: 0,
            n: 0,
        }
    }

    /// Counts a reply to a request sent at `sent`; its latency.
    #[inline]
    fn add(&mut self, sent: Instant) -> u64 {
        if sent != self.sent {
            if self.n > 0 {
                self.latency.record_n(self.us, self.n);
            }
            self.sent = sent;
            self.us = self.now.saturating_duration_since(sent).as_micros() as u64;
            self.n = 0;
        }
        self.n += 1;
        self.us
    }
}

impl Drop for LatencyRun<'_> {
    fn drop(&mut self) {
        if self.n > 0 {
            self.latency.record_n(self.us, self.n);
        }
    }
}

/// Reads what the socket has and completes every whole reply, oldest request first.
///
/// `scanner` keeps its progress inside a reply that is not complete yet: the next read scans
/// only the bytes it added (re-scanning from the reply's start after every read made a
/// 1,000,000-element `LRANGE` cost quadratic time in its length).
///
/// A read that does not fill the buffer's free space has drained the socket: instead of
/// reading again only to get `EAGAIN` (one wasted syscall per batch), the socket's readiness
/// is cleared directly, and the next edge from the kernel sets it again.
fn read_replies(
    stream: &mut impl Io,
    rbuf: &mut BytesMut,
    scanner: &mut ReplyScanner,
    inflight: &mut VecDeque<Inflight>,
    limits: &Limits,
    latency: &crate::metrics::Latency,
    (endpoint, note_min): (SocketAddr, u64),
) -> Result<Option<Instant>, Fail> {
    match scanner.bulk_end_hint() {
        // A large value whose length the scanner has read (a 1 MiB GET reply) gets room for
        // all of it at once: one allocation and one copy of what arrived so far, instead of
        // one per doubling. Capacity not written yet costs no memory.
        Some(end) if end > rbuf.capacity() => rbuf.reserve((end - rbuf.len()).min(MAX_AHEAD)),
        _ if rbuf.capacity() - rbuf.len() < 4096 => rbuf.reserve(RBUF),
        _ => {}
    }
    let spare = rbuf.capacity() - rbuf.len();
    let n = match stream.try_read_buf(rbuf) {
        Ok(0) => return Err(Fail::Io("connection closed by server".into())),
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) => return Err(Fail::Io(e.to_string())),
    };
    if n < spare {
        stream.drained();
    }
    // The replies of this read arrived now (one clock read per read, not per reply).
    let now = Instant::now();
    let mut run = LatencyRun::new(latency, now);
    loop {
        // `Some(n)`: the scanner starts over, and the reply's bytes leave the buffer.
        match scanner.scan(rbuf, limits) {
            Ok(Some(n)) => {
                let reply = rbuf.split_to(n).freeze();
                if reply.first() == Some(&b'>') {
                    // RESP3 out-of-band data (nothing the proxy sends asks for it: no
                    // SUBSCRIBE, no CLIENT TRACKING): not the reply to a request.
                    tracing::debug!("push message from upstream dropped");
                    continue;
                }
                match inflight.pop_front() {
                    // A receiver that timed out or left is simply gone.
                    Some(Inflight {
                        tx: Some(tx), sent, ..
                    }) => {
                        let us = run.add(sent);
                        if us >= note_min {
                            crate::slowlog::note_upstream(&reply, now, endpoint, us);
                        }
                        let _ = tx.send(Ok(reply));
                    }
                    Some(_) => {}
                    None => return Err(Fail::Protocol("reply with no request".into())),
                }
            }
            Ok(None) => break,
            Err(e) => return Err(Fail::Protocol(e.to_string())),
        }
    }
    if rbuf.is_empty() && rbuf.capacity() > KEEP_RBUF {
        // Give back what a large reply made the buffer grow to.
        *rbuf = BytesMut::with_capacity(RBUF);
    }
    Ok(Some(now))
}

/// How a live connection ended badly.
#[derive(Debug)]
enum Fail {
    /// Socket error or EOF.
    Io(String),
    /// The peer sent something that is not a reply to our requests.
    Protocol(String),
    /// Requests stopped being answered.
    Stuck,
    /// The holder of a dedicated connection stopped waiting for its oldest request.
    Abandoned,
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fail::Io(e) => f.write_str(e),
            Fail::Protocol(e) => write!(f, "Protocol error: {e}"),
            Fail::Stuck => write!(
                f,
                "no reply within the request timeout plus {STUCK_MARGIN:?}; connection replaced"
            ),
            Fail::Abandoned => f.write_str("its client left while waiting; connection closed"),
        }
    }
}

/// Answers a request that will not be sent, counting the error.
fn answer(tx: ReplyTx, e: UpstreamError, stats: &EndpointStats) {
    stats.count(e.kind());
    let _ = tx.send(Err(e));
}

/// One connection's task. A shared connection (`dedicated` is `None`) reconnects after
/// failures as described in the module docs; a dedicated one ends at its first failure (its
/// holder's later commands then fail with `connection lost`), and `dedicated` counts it
/// open until then.
async fn run_connection(
    cfg: EndpointConfig,
    flavor: Flavor,
    dedicated: Option<OpenGuard>,
    mut rx: queue::Receiver<UpstreamRequest>,
    stats: Arc<EndpointStats>,
    latency: Arc<crate::metrics::Latency>,
) {
    if cfg.address == respway_filters::model::NO_ENDPOINT {
        // The placeholder of a cluster with no endpoints: every request is answered at once,
        // with nothing to connect to, probe or log (`connect` refuses it too, for the paths
        // that connect on their own, such as pub/sub).
        let reason: Arc<str> = respway_filters::model::NO_ENDPOINT_REASON.into();
        while let Some(req) = rx.recv().await {
            answer(req.tx, UpstreamError::Unavailable(reason.clone()), &stats);
        }
        return;
    }
    if dedicated.is_some() {
        let Some(first) = rx.recv().await else { return };
        match connect(&cfg, flavor).await {
            Ok(stream) => {
                stats.count_connect();
                let (mut carry, mut lost) = (vec![first], Vec::new());
                if let Err(e) = stream
                    .serve(&mut carry, &mut lost, &mut rx, &stats, &latency, true)
                    .await
                {
                    tracing::debug!(endpoint = %cfg.label, error = %e, "dedicated connection closed");
                    answer_lost(&mut lost, &e.to_string(), &stats);
                    // Queued behind the failure, never sent: lost with the connection.
                    for req in carry.drain(..) {
                        answer(
                            req.tx,
                            UpstreamError::ConnectionLost(DEDICATED_BROKE.into()),
                            &stats,
                        );
                    }
                    while let Some(req) = rx.try_recv() {
                        answer(
                            req.tx,
                            UpstreamError::ConnectionLost(DEDICATED_BROKE.into()),
                            &stats,
                        );
                    }
                }
            }
            Err(e) => {
                stats.count_connect_failure();
                let reason: Arc<str> = e.text.into();
                answer(first.tx, UpstreamError::Unavailable(reason.clone()), &stats);
                fail_queued(&mut rx, &reason, &stats);
            }
        }
        return;
    }
    let mut backoff = BACKOFF_MIN;
    // Set when the next connect is a probe after a backoff, not triggered by a request.
    let mut probe = false;
    // Requests for the next connection before anything queued: the first one, or those a
    // failed connection had taken from the queue but not written.
    let mut carry: Vec<UpstreamRequest> = Vec::new();
    // The requests in flight on a connection that failed, answered once respway knows why.
    let mut lost: Vec<ReplyTx> = Vec::new();
    // Connections in a row that failed within MIN_HEALTHY_LIFE of opening.
    let mut short_lives = 0u32;
    loop {
        // Connect lazily, on the first request: an endpoint nobody uses costs nothing, and a
        // proxy started before its shards does not begin in backoff. After a failure the
        // endpoint is probed when the backoff ends without waiting for a request, because the
        // zone layer sends an unhealthy endpoint none until it recovers.
        if !probe && carry.is_empty() {
            match rx.recv().await {
                Some(r) => carry.push(r),
                None => return, // every handle dropped: the endpoint left the config
            }
        }
        // The last attempt said the shard is coming back: probe at a fixed short interval.
        let mut coming = false;
        let (failure, refused) = match connect(&cfg, flavor).await {
            Ok(stream) => {
                stats.count_connect();
                stats.connected(&cfg.label);
                probe = false;
                tracing::debug!(endpoint = %cfg.label, "connected");
                let opened = Instant::now();
                match stream
                    .serve(&mut carry, &mut lost, &mut rx, &stats, &latency, false)
                    .await
                {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::warn!(endpoint = %cfg.label, error = %e, "upstream connection lost");
                        if matches!(e, Fail::Protocol(_)) {
                            stats.worker.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        }
                        if matches!(e, Fail::Stuck) {
                            stats.worker.stuck.fetch_add(1, Ordering::Relaxed);
                        }
                        let short =
                            opened.elapsed() < MIN_HEALTHY_LIFE && !matches!(e, Fail::Stuck);
                        short_lives = if short { short_lives + 1 } else { 0 };
                        let mut reason = e.to_string();
                        // A shard that closed the connection may be gone: say so to the
                        // requests that were in flight (they may have run), and treat it
                        // as a refused connect (what was not written fails with that).
                        let gone = match e {
                            Fail::Io(_) => refuses(&cfg).await,
                            _ => None,
                        };
                        if let Some(why) = &gone {
                            reason = format!("{reason} (the shard now refuses connections: {why})");
                        }
                        answer_lost(&mut lost, &reason, &stats);
                        if let Some(why) = gone {
                            for req in carry.drain(..) {
                                answer(
                                    req.tx,
                                    UpstreamError::Unavailable(why.clone().into()),
                                    &stats,
                                );
                            }
                            short_lives = 0;
                            (why, true)
                        } else {
                            let flapping = matches!(e, Fail::Protocol(_)) || short_lives >= 2;
                            if !flapping {
                                // A connection that worked for a while, got stuck, or broke once
                                // right after it opened, is reopened at once: on the next request,
                                // or now for the requests it had not written (the PING of the new
                                // connection tells a frozen shard from a stuck connection).
                                backoff = BACKOFF_MIN;
                                continue;
                            }
                            // A peer that breaks the protocol or keeps dropping us right away is
                            // reopened after the backoff; what it had not written was not sent.
                            for req in carry.drain(..) {
                                answer(
                                    req.tx,
                                    UpstreamError::Unavailable(reason.clone().into()),
                                    &stats,
                                );
                            }
                            (reason, false)
                        }
                    }
                }
            }
            Err(e) => {
                stats.count_connect_failure();
                for req in carry.drain(..) {
                    answer(
                        req.tx,
                        UpstreamError::Unavailable(e.text.clone().into()),
                        &stats,
                    );
                }
                if e.coming_back {
                    backoff = COMING_BACK_PROBE;
                    coming = true;
                }
                (e.text.clone(), e.retry_soon())
            }
        };
        let mut reason: Arc<str> = failure.into();
        stats.failed(&cfg.label, &reason, backoff);
        // Whatever queued during the failed attempt is answered now, and so is everything
        // that arrives during the backoff: a dead shard must not hang its clients. While the
        // shard refuses connections (a process restarting), a request waits for one more
        // attempt (at most one per RETRY_MIN), so a shard that is back serves the first
        // request after it; what queued meanwhile shares that attempt's outcome.
        fail_queued(&mut rx, &reason, &stats);
        let sleep = tokio::time::sleep(backoff);
        tokio::pin!(sleep);
        let mut last_attempt = Instant::now();
        let mut refused = refused;
        probe = true;
        loop {
            tokio::select! {
                biased;
                _ = &mut sleep => break,
                req = rx.recv() => match req {
                    None => return,
                    Some(req) if !refused => {
                        answer(req.tx, UpstreamError::Unavailable(reason.clone()), &stats);
                    }
                    Some(req) => {
                        tokio::time::sleep_until(last_attempt + RETRY_MIN).await;
                        last_attempt = Instant::now();
                        match connect(&cfg, flavor).await {
                            Ok(stream) => {
                                stats.count_connect();
                                stats.connected(&cfg.label);
                                backoff = BACKOFF_MIN;
                                carry.push(req);
                                match stream
                                    .serve(&mut carry, &mut lost, &mut rx, &stats, &latency, false)
                                    .await
                                {
                                    Ok(()) => return,
                                    Err(e) => {
                                        tracing::warn!(endpoint = %cfg.label, error = %e, "upstream connection lost");
                                        answer_lost(&mut lost, &e.to_string(), &stats);
                                        probe = false;
                                        break;
                                    }
                                }
                            }
                            Err(e) => {
                                stats.count_connect_failure();
                                refused = e.retry_soon();
                                coming = e.coming_back;
                                if coming {
                                    backoff = COMING_BACK_PROBE;
                                    sleep.as_mut().reset(Instant::now() + backoff);
                                }
                                reason = e.text.into();
                                stats.failed(&cfg.label, &reason, backoff);
                                answer(req.tx, UpstreamError::Unavailable(reason.clone()), &stats);
                                fail_queued(&mut rx, &reason, &stats);
                            }
                        }
                    }
                },
            }
        }
        if !coming {
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}

/// Answers the requests that were in flight on a connection that failed.
fn answer_lost(lost: &mut Vec<ReplyTx>, reason: &str, stats: &EndpointStats) {
    if lost.is_empty() {
        return;
    }
    let reason: Arc<str> = reason.into();
    for tx in lost.drain(..) {
        answer(tx, UpstreamError::ConnectionLost(reason.clone()), stats);
    }
}

/// `Some(reason)` when a TCP connect to the endpoint is refused right now (nothing listens:
/// the shard is gone); a quick check, without a handshake.
async fn refuses(cfg: &EndpointConfig) -> Option<String> {
    let wait = cfg.connect_timeout.min(Duration::from_millis(100));
    match tokio::time::timeout(wait, TcpStream::connect(cfg.address)).await {
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(e.to_string()),
        _ => None,
    }
}

/// Answers everything queued right now as unavailable.
fn fail_queued(
    rx: &mut queue::Receiver<UpstreamRequest>,
    reason: &Arc<str>,
    stats: &EndpointStats,
) {
    while let Some(req) = rx.try_recv() {
        answer(req.tx, UpstreamError::Unavailable(reason.clone()), stats);
    }
}

/// A failed connect attempt.
struct ConnectError {
    text: String,
    /// The TCP connect itself was refused: nothing listens (yet), so trying again soon is
    /// cheap and finds a restarted shard at once.
    refused: bool,
    /// The shard answered that it is coming back (see [`coming_back`]).
    coming_back: bool,
}

impl ConnectError {
    /// A request that arrives meanwhile waits for one more attempt instead of failing at
    /// once: the shard may be back by then.
    fn retry_soon(&self) -> bool {
        self.refused || self.coming_back
    }
}

impl From<String> for ConnectError {
    fn from(text: String) -> Self {
        ConnectError {
            text,
            refused: false,
            coming_back: false,
        }
    }
}

/// What a handshake that the shard closed says.
const CLOSED_DURING_HANDSHAKE: &str = "closed during handshake";

/// How often a shard that is coming back (loading, or closing connections while it restarts)
/// is probed while no request asks for it.
const COMING_BACK_PROBE: Duration = Duration::from_millis(50);

/// An open, prepared connection to an endpoint: plain TCP, or TLS after its handshake.
pub(crate) enum Conn {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS (tokio-rustls, as the handshake left it).
    Tls(Box<respway_tls::client::TlsStream<TcpStream>>),
}

impl Conn {
    /// Serves requests on it (see [`serve`]): a TLS connection is driven as a [`TlsStream`].
    async fn serve(
        self,
        carry: &mut Vec<UpstreamRequest>,
        lost: &mut Vec<ReplyTx>,
        rx: &mut queue::Receiver<UpstreamRequest>,
        stats: &EndpointStats,
        latency: &crate::metrics::Latency,
        dedicated: bool,
    ) -> Result<(), Fail> {
        match self {
            Conn::Plain(s) => serve(s, carry, lost, rx, stats, latency, dedicated).await,
            Conn::Tls(s) => {
                let (tcp, conn) = s.into_inner();
                let s = TlsStream::new(tcp, conn);
                serve(s, carry, lost, rx, stats, latency, dedicated).await
            }
        }
    }
}

/// A RESP2 connection to `cfg` (authenticated, database selected), for a connection the
/// caller drives itself (pub/sub links).
pub(crate) async fn connect_plain(cfg: &EndpointConfig) -> Result<Conn, String> {
    connect(cfg, Flavor::default()).await.map_err(|e| e.text)
}

async fn connect(cfg: &EndpointConfig, flavor: Flavor) -> Result<Conn, ConnectError> {
    if cfg.address == respway_filters::model::NO_ENDPOINT {
        return Err(respway_filters::model::NO_ENDPOINT_REASON
            .to_string()
            .into());
    }
    let started = Instant::now();
    let timed_out = || {
        ConnectError::from(format!(
            "connect timeout after {:?} (no answer to PING)",
            cfg.connect_timeout
        ))
    };
    let stream =
        match tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(cfg.address)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(ConnectError {
                    refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
                    coming_back: false,
                    text: e.to_string(),
                })
            }
            Err(_) => return Err(timed_out()),
        };
    if let Err(e) = stream.set_nodelay(true) {
        return Err(e.to_string().into());
    }
    let left = cfg.connect_timeout.saturating_sub(started.elapsed());
    let attempt =
        async {
            match &cfg.tls {
                None => {
                    let mut s = stream;
                    hello(&mut s, cfg, flavor).await?;
                    Ok::<Conn, String>(Conn::Plain(s))
                }
                Some(t) => {
                    let name = respway_tls::server_name(
                        t.settings.server_name.as_deref(),
                        &cfg.address.ip().to_string(),
                    )
                    .map_err(|e| format!("TLS: {e}"))?;
                    let mut s =
                        t.tls.connector().connect(name, stream).await.map_err(|e| {
                            format!("TLS handshake failed: {}", crate::tls::reason(&e))
                        })?;
                    hello(&mut s, cfg, flavor).await?;
                    Ok(Conn::Tls(Box::new(s)))
                }
            }
        };
    match tokio::time::timeout(left, attempt).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(ConnectError {
            coming_back: coming_back(&e),
            refused: false,
            text: e,
        }),
        Err(_) => Err(timed_out()),
    }
}

/// Whether a failed handshake says the shard is coming back: it answered `-LOADING` (loading
/// its AOF or RDB), or accepted the connection and closed it (a process restarting behind a
/// supervisor or a load balancer). It is probed again every [`COMING_BACK_PROBE`], without
/// a growing backoff, and a request waits for the next attempt rather than failing at once.
fn coming_back(handshake_error: &str) -> bool {
    handshake_error.starts_with("handshake refused: LOADING")
        || handshake_error == CLOSED_DURING_HANDSHAKE
        || handshake_error.starts_with("Connection reset by peer")
        || handshake_error.starts_with("Broken pipe")
}

/// AUTH and SELECT when configured, and always a PING: a process that is frozen or not Redis
/// still accepts TCP connections, but does not answer it.
async fn hello<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    cfg: &EndpointConfig,
    flavor: Flavor,
) -> Result<(), String> {
    let mut hello = Vec::new();
    if let Some(auth) = &cfg.auth {
        let mut args = vec![Bytes::from_static(b"AUTH")];
        args.extend(auth.iter().cloned());
        hello.push(args);
    }
    if flavor.resp3 {
        hello.push(vec![Bytes::from_static(b"HELLO"), Bytes::from_static(b"3")]);
    }
    let db = cfg.db.saturating_add(u32::from(flavor.db));
    if db != 0 {
        hello.push(vec![
            Bytes::from_static(b"SELECT"),
            Bytes::from(db.to_string()),
        ]);
    }
    hello.push(vec![Bytes::from_static(b"PING")]);
    let mut out = BytesMut::new();
    for args in &hello {
        encode_command(args, &mut out);
    }
    stream.write_all(&out).await.map_err(|e| e.to_string())?;
    // TLS: the records rustls holds go out now.
    stream.flush().await.map_err(|e| e.to_string())?;
    let mut buf = BytesMut::with_capacity(256);
    let mut answered = 0;
    while answered < hello.len() {
        if stream.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
            return Err(CLOSED_DURING_HANDSHAKE.to_string());
        }
        while let Some(n) = reply_len(&buf, &Limits::default())
            .map_err(|e| format!("handshake: Protocol error: {e}"))?
        {
            let reply = buf.split_to(n);
            // A Redis running a long script answers the final PING `-BUSY`: it is alive,
            // and `SCRIPT KILL` (allowed while busy) must be able to reach it.
            let busy_ping = answered + 1 == hello.len() && reply.starts_with(b"-BUSY");
            if reply.first() == Some(&b'-') && !busy_ping {
                let text = String::from_utf8_lossy(&reply[1..reply.len() - 2]);
                return Err(format!("handshake refused: {text}"));
            }
            answered += 1;
        }
    }
    if !buf.is_empty() {
        return Err("handshake: Protocol error: unexpected data".to_string());
    }
    Ok(())
}

/// Serves requests on one live connection until it fails (`Err`) or every sender is gone
/// and nothing is in flight (`Ok`).
async fn serve<S: Io>(
    mut stream: S,
    carry: &mut Vec<UpstreamRequest>,
    lost: &mut Vec<ReplyTx>,
    rx: &mut queue::Receiver<UpstreamRequest>,
    stats: &EndpointStats,
    latency: &crate::metrics::Latency,
    dedicated: bool,
) -> Result<(), Fail> {
    let limits = Limits::REPLIES;
    let mut inflight: VecDeque<Inflight> = VecDeque::new();
    let mut gauge = OpenConnection::new(stats);
    // Replies this slow are noted for the slow log (read once per connection).
    let slow = (
        stream.tcp().peer_addr().unwrap_or(([0, 0, 0, 0], 0).into()),
        crate::slowlog::upstream_min(),
    );
    let mut batch: Vec<UpstreamRequest> = Vec::with_capacity(64);
    // Large arguments (a 1 MiB SET value) are queued as the client's bytes, not copied.
    let mut wbuf = OutQueue::with_capacity(RBUF);
    let mut rbuf = BytesMut::with_capacity(RBUF);
    // Where the reply at the front of `rbuf` stands (kept across reads).
    let mut scanner = ReplyScanner::new();
    let mut open = true;
    // When reply bytes last arrived.
    let mut last_bytes = Instant::now();
    // Follows the oldest unanswered request: at its deadline it is answered with a timeout;
    // STUCK_MARGIN later, the connection is replaced.
    let timer = tokio::time::sleep_until(far_future());
    tokio::pin!(timer);
    let mut timer_armed = false;
    let now = Instant::now();
    let mut late = false;
    for req in carry.drain(..) {
        late |= !enqueue(req, &mut wbuf, &mut inflight, now, stats);
    }
    if late && dedicated {
        return Err(Fail::Stuck);
    }
    let result = loop {
        gauge.inflight(inflight.len());
        if !open && inflight.is_empty() && wbuf.is_empty() && !stream.pending_out() {
            break Ok(());
        }
        if !timer_armed {
            if let Some(front) = inflight.front() {
                timer.as_mut().reset(front.deadline);
                timer_armed = true;
            }
        }
        // One poll finds everything that is ready (replies, requests, room to write, the
        // timer) and the loop body handles it all, instead of `select!` running one branch
        // per turn with a fresh readiness future (and its waiter list entry) for each socket
        // direction every time.
        let ev = std::future::poll_fn(|cx| {
            let ev = Events {
                readable: match stream.poll_read_ready(cx) {
                    Poll::Ready(r) => Some(r),
                    Poll::Pending => None,
                },
                requests: if open && wbuf.len() < MAX_WBUF {
                    match rx.poll_recv_many(cx, &mut batch, BATCH) {
                        Poll::Ready(n) => Some(n),
                        Poll::Pending => None,
                    }
                } else {
                    None
                },
                // (TLS: records rustls holds once `wbuf` is empty are written too.)
                writable: if !wbuf.is_empty() || stream.pending_out() {
                    match stream.poll_write_ready(cx) {
                        Poll::Ready(r) => Some(r),
                        Poll::Pending => None,
                    }
                } else {
                    None
                },
                // A dedicated connection whose oldest request lost its client (a session
                // that ended while blocked in BLPOP, or mid-EXEC) is closed at once: Redis
                // then unblocks it and pops nothing for nobody.
                abandoned: dedicated
                    && match inflight.front_mut().and_then(|f| f.tx.as_mut()) {
                        Some(tx) => tx.poll_closed(cx).is_ready(),
                        None => false,
                    },
                timer: timer_armed && timer.as_mut().poll(cx).is_ready(),
            };
            if ev.any() {
                Poll::Ready(ev)
            } else {
                Poll::Pending
            }
        })
        .await;
        if ev.abandoned {
            break Err(Fail::Abandoned);
        }
        if let Some(r) = ev.readable {
            let r = r.map_err(|e| Fail::Io(e.to_string())).and_then(|()| {
                read_replies(
                    &mut stream,
                    &mut rbuf,
                    &mut scanner,
                    &mut inflight,
                    &limits,
                    latency,
                    slow,
                )
            });
            match r {
                Err(e) => break Err(e),
                Ok(Some(t)) => last_bytes = t,
                Ok(None) => {}
            }
        }
        match ev.requests {
            Some(0) => open = false,
            Some(n) => {
                // Let every other task of this worker run first — tokio resumes a yielded task
                // only after it has polled the I/O driver again — so that requests from
                // clients served in the same event-loop turn join this write. This is the
                // batching across clients that makes the shard's work (and ours) per request
                // smaller, like twemproxy writing once per epoll iteration.
                tokio::task::yield_now().await;
                rx.try_recv_many(&mut batch, BATCH - n);
                let now = Instant::now();
                let mut late = false;
                for req in batch.drain(..) {
                    late |= !enqueue(req, &mut wbuf, &mut inflight, now, stats);
                }
                // A dedicated connection never skips a command of its transaction: one that
                // is too late closes it instead (Redis discards the MULTI).
                if late && dedicated {
                    break Err(Fail::Stuck);
                }
                // Write now if the socket takes it; the next poll covers the rest.
                if !wbuf.is_empty() {
                    if let Err(e) = write_queued(&mut stream, &mut wbuf) {
                        break Err(Fail::Io(e.to_string()));
                    }
                }
            }
            None => {}
        }
        if let Some(w) = ev.writable {
            match w.and_then(|()| write_queued(&mut stream, &mut wbuf)) {
                Ok(()) => wbuf.shrink(MAX_WBUF, RBUF),
                Err(e) => break Err(Fail::Io(e.to_string())),
            }
        }
        if ev.timer {
            timer_armed = false;
            let now = Instant::now();
            // The oldest request's reply may only be waiting behind earlier replies on this
            // connection, or be arriving: its op_timeout counts from the last reply byte
            // (see [`STRETCH`]). The requests behind it wait for it.
            if let Some(front) = inflight.front_mut().filter(|f| f.tx.is_some()) {
                let due = (last_bytes + front.op).min(front.sent + front.op * STRETCH);
                if due > front.deadline {
                    front.deadline = due;
                }
            }
            // Answer every request past its deadline (their replies, if they come, are
            // dropped in order); replace the connection once the oldest is far past it.
            for f in inflight.iter_mut() {
                if f.deadline > now {
                    break;
                }
                if let Some(tx) = f.tx.take() {
                    answer(tx, UpstreamError::Timeout, stats);
                }
            }
            match inflight.front() {
                Some(front) if front.tx.is_none() && dedicated => {
                    let _ = front;
                    break Err(Fail::Stuck);
                }
                Some(front) if front.tx.is_none() && front.deadline + STUCK_MARGIN <= now => {
                    break Err(Fail::Stuck);
                }
                Some(front) if front.tx.is_none() => {
                    timer.as_mut().reset(front.deadline + STUCK_MARGIN);
                    timer_armed = true;
                }
                _ => {}
            }
        }
    };
    if result.is_err() {
        // The caller answers them: it may first learn what happened to the shard.
        lost.extend(inflight.drain(..).filter_map(|f| f.tx));
        // Taken from the queue in the poll that found the failure, not written: they may
        // go on the next connection.
        carry.append(&mut batch);
    }
    result
}

/// What one poll of a connection task found ready.
struct Events {
    /// The socket may have replies (or an error).
    readable: Option<std::io::Result<()>>,
    /// Requests moved into the batch (`Some(0)`: every sender is gone).
    requests: Option<usize>,
    /// The socket may take bytes (or an error).
    writable: Option<std::io::Result<()>>,
    /// A dedicated connection's oldest request lost its client.
    abandoned: bool,
    /// The oldest request's deadline (or the stuck margin after it) passed.
    timer: bool,
}

impl Events {
    fn any(&self) -> bool {
        self.readable.is_some()
            || self.requests.is_some()
            || self.writable.is_some()
            || self.abandoned
            || self.timer
    }
}

/// Writes what `q` holds while the socket takes all of it (TLS: also records rustls holds).
/// `WouldBlock` is not an error: the rest waits for the next writable edge.
pub(crate) fn write_queued(stream: &mut impl Io, q: &mut OutQueue) -> std::io::Result<()> {
    while !q.is_empty() || stream.pending_out() {
        let want = q.front().len();
        match stream.try_write(q.front()) {
            Ok(n) => {
                q.advance(n);
                if n < want || want == 0 {
                    // The socket took less than offered (it is full), or only pending TLS
                    // records went out: try again on the next edge.
                    return Ok(());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Encodes a dequeued request, unless its client stopped waiting (deadline passed, or the
/// client left): such a request is never written. False when it was skipped because its
/// deadline had passed.
fn enqueue(
    req: UpstreamRequest,
    wbuf: &mut OutQueue,
    inflight: &mut VecDeque<Inflight>,
    now: Instant,
    stats: &EndpointStats,
) -> bool {
    if req.tx.is_closed() {
        return true;
    }
    if req.deadline <= now {
        answer(req.tx, UpstreamError::Timeout, stats);
        return false;
    }
    match &req.raw {
        Some(raw) => {
            debug_assert!(
                {
                    let mut again = bytes::BytesMut::new();
                    respway_filters::resp::encode_command(&req.args, &mut again);
                    again == raw[..]
                },
                "a request's raw frame differs from its arguments: {:?}",
                req.args
            );
            wbuf.push(raw);
        }
        None => wbuf.push_command(&req.args),
    }
    respway_filters::resp::recycle_argv(req.args);
    inflight.push_back(Inflight {
        tx: Some(req.tx),
        deadline: req.deadline,
        sent: now,
        op: req.deadline.saturating_duration_since(now),
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_config_debug_leaves_the_auth_arguments_out() {
        let cfg = EndpointConfig {
            address: "127.0.0.1:6379".parse().unwrap(),
            label: "shard s0 (127.0.0.1:6379)".into(),
            connect_timeout: Duration::from_secs(1),
            auth: Some(vec![
                Bytes::from_static(b"app"),
                Bytes::from_static(b"hunter2"),
            ]),
            db: 0,
            databases: 16,
            dedicated: 32,
            max_queue: 16384,
            tls: None,
        };
        let text = format!("{cfg:?}");
        assert!(
            !text.contains("hunter2") && text.contains("<redacted>"),
            "{text}"
        );
    }
}
