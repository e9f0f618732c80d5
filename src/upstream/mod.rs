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
//! Bounds and failures (every failure is an [`UpstreamError`], which the future yields as a
//! `Failure` naming the shard; it becomes RESP bytes only where the session writes the reply):
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
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use respway_filters::codec_limits::Limits;
use respway_filters::error::Failure;
use respway_filters::request::{Flavor, Reply, Request};
use respway_filters::resp::{encode_command, reply_len, ReplyScanner};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tower::Service;

use crate::net::outq::OutQueue;
use crate::net::tls::{Io, TlsStream};

pub(crate) mod check;
mod connect;
mod control;
mod dedicated;
mod endpoints;
mod error;
mod future;
pub(crate) mod hold;
mod promoted;
pub(crate) mod queue;
mod redirect;
mod rider;
mod serve;
mod stats;
mod task;
pub(crate) mod track;

pub(crate) use crate::stats::{Down, UpstreamStats};
pub(crate) use connect::*;
pub(crate) use control::Control;
pub(crate) use dedicated::*;
pub(crate) use endpoints::*;
pub(crate) use error::*;
pub(crate) use future::*;
pub(crate) use redirect::{
    asking, followed, node, redirection, RedisCluster, TopologyHints, MAX_HOPS,
};
pub(crate) use rider::Rider;
pub(crate) use serve::*;
pub(crate) use stats::*;
use task::*;

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
    /// Commands written with it (a near-cache fill's, `ASKING`): boxed, as few requests carry
    /// any and every request is moved through its connection's queue.
    pub(crate) extra: Option<Box<Extra>>,
}

/// Commands written with a request.
#[derive(Debug)]
pub(crate) struct Extra {
    /// Written just before it, in one piece (a near-cache fill's `CLIENT TRACKING` and
    /// `CLIENT CACHING`), how many, and the connection's tracking state, cleared when one of
    /// their replies is an error.
    pub(crate) pre: Option<Pre>,
    /// Written just after it, in one piece, and how many: the request's reply is answered
    /// with theirs appended (see [`Rider::after`]).
    pub(crate) post: Option<(Bytes, u8)>,
}

/// Commands written just before a request (see [`Extra::pre`]).
pub(crate) type Pre = (Bytes, u8, Arc<AtomicU64>);

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
    pub(crate) tls: Option<crate::net::tls::UpstreamTlsConfig>,
    /// For the placeholder address [`respway_filters::model::NO_ENDPOINT`]: why there is no
    /// endpoint (`None`: an EDS cluster whose endpoints did not arrive).
    pub(crate) missing: Option<Arc<str>>,
    /// A replica of a Redis Cluster: `READONLY` on connect, so that it serves reads of the
    /// slots of its primary instead of redirecting them.
    pub(crate) readonly: bool,
    /// A replica: a connection is opened only while its `INFO replication` says it is in
    /// sync (see [`check::in_sync`]).
    pub(crate) replica: bool,
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
            .field("missing", &self.missing)
            .field("readonly", &self.readonly)
            .field("replica", &self.replica)
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
    latency: Arc<crate::stats::Latency>,
    /// The active health check's state (`None`: its cluster has no `health_check`).
    check: Option<Arc<check::EndpointCheck>>,
    /// What a feature keeps beside this worker's pools of the endpoint (the near cache's
    /// tracker), set once by whoever builds the handle.
    companion: OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
    /// A Sentinel-managed shard's primary: its writes are held while this is on.
    hold: OnceLock<Arc<hold::Hold>>,
}

#[derive(Debug, Default)]
struct FlavorPools {
    shared: OnceLock<Box<[queue::Sender<UpstreamRequest>]>>,
    /// Dedicated connections between two transactions (one worker's sessions only; taken
    /// when a transaction starts and given back when it ends).
    idle: Mutex<Vec<queue::Sender<UpstreamRequest>>>,
    /// Per shared connection, a slot its riders keep (the near cache's tracking state, 0:
    /// none), made on the first rider that wants one.
    slots: OnceLock<Box<[Arc<AtomicU64>]>>,
}

impl EndpointHandle {
    /// This worker's pools for `cfg` with `n` shared connections per flavor; the RESP2
    /// database-0 connections are spawned now (they connect on their first request), the
    /// others on first use.
    pub(crate) fn spawn(
        cfg: EndpointConfig,
        n: usize,
        stats: Arc<UpstreamStats>,
        check: Option<Arc<check::EndpointCheck>>,
    ) -> EndpointHandle {
        let flavors = (0..2 * cfg.databases.clamp(1, 256) as usize)
            .map(|_| FlavorPools::default())
            .collect();
        let stats = Arc::new(EndpointStats::new(stats));
        let h = EndpointHandle {
            inner: Arc::new(EndpointInner {
                cfg,
                n: n.max(1),
                flavors,
                dedicated_open: Arc::new(AtomicUsize::new(0)),
                stats,
                requests: AtomicU64::new(0),
                latency: Arc::default(),
                check,
                companion: OnceLock::new(),
                hold: OnceLock::new(),
            }),
        };
        h.shared(Flavor::default());
        h
    }

    /// False while connecting to the endpoint fails.
    pub(crate) fn is_healthy(&self) -> bool {
        self.inner.stats.is_healthy()
    }

    /// The active health check's state, when its cluster has one.
    pub(crate) fn check(&self) -> Option<&check::EndpointCheck> {
        self.inner.check.as_deref()
    }

    /// True for two handles of the same pools.
    pub(crate) fn same(&self, other: &EndpointHandle) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A number that tells this worker's pools apart (their address).
    pub(crate) fn id(&self) -> u64 {
        Arc::as_ptr(&self.inner) as u64
    }

    /// What a feature keeps beside this worker's pools of the endpoint, if it set one.
    pub(crate) fn companion(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        self.inner.companion.get().map(|c| &**c)
    }

    /// Sets what a feature keeps beside the pools (once; a second is dropped).
    pub(crate) fn set_companion(&self, c: Arc<dyn std::any::Any + Send + Sync>) {
        let _ = self.inner.companion.set(c);
    }

    /// While a failover holds this primary's writes: the refusal of a transaction or a
    /// blocking command, which run on dedicated connections (not held: refused, not sent, so
    /// never acknowledged by the old primary and then dropped).
    pub(crate) fn failing_over(&self) -> Option<UpstreamError> {
        self.hold().filter(|h| h.is_held()).map(|_| {
            UpstreamError::Unavailable(Arc::from(
                "a Sentinel failover is in progress: transactions and blocking commands are \
                 refused until the new primary is named",
            ))
        })
    }

    /// The hold of the shard this handle is the primary of, when it has one.
    #[inline]
    pub(crate) fn hold(&self) -> Option<&Arc<hold::Hold>> {
        self.inner.hold.get()
    }

    /// Sets the hold of the shard this handle is the primary of (once; a second is dropped).
    pub(crate) fn set_hold(&self, h: Arc<hold::Hold>) {
        let _ = self.inner.hold.set(h);
    }

    /// The counter [`cache_epoch`](Self::cache_epoch) reads, for whoever else bumps it.
    pub(crate) fn cache_epoch_counter(&self) -> &Arc<AtomicU64> {
        &self.inner.stats.cache_epoch
    }

    /// Bumped whenever this worker's near-cache entries from this endpoint must end (a
    /// connection closed, the tracker lost or back, a flush from Redis).
    #[inline]
    pub(crate) fn cache_epoch(&self) -> u64 {
        self.inner.stats.cache_epoch.load(Ordering::Acquire)
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
        self.send_fill(args, raw, flavor, conn, deadline, None)
    }

    /// [`send_frame`](Self::send_frame) with a [`Rider`]: the frames it writes just before
    /// the request, and its reply told to it.
    pub(crate) fn send_fill(
        &self,
        args: Vec<Bytes>,
        raw: Option<Bytes>,
        flavor: Flavor,
        conn: usize,
        deadline: Instant,
        mut rider: Option<Box<dyn Rider>>,
    ) -> UpstreamFuture {
        let label = self.inner.cfg.label.clone();
        let Some(conns) = self.shared(flavor) else {
            return UpstreamFuture::failed(UpstreamError::NoShard, label, deadline);
        };
        let i = conn % conns.len();
        let pre = rider.as_mut().filter(|r| r.wants_slot()).and_then(|r| {
            let slots = self
                .pools(flavor)?
                .slots
                .get_or_init(|| (0..conns.len()).map(|_| Arc::default()).collect());
            let slot: &Arc<AtomicU64> = &slots[i];
            let (frame, n) = r.before(slot, self.connects())?;
            Some((frame, n, slot.clone()))
        });
        let post = rider.as_mut().and_then(|r| r.after()).filter(|p| p.1 > 0);
        let posted = post.is_some();
        crate::stats::bump(&self.inner.requests, 1);
        let mut f = send_on(
            &conns[i],
            args,
            raw,
            deadline,
            label,
            &self.inner.stats,
            self.inner.cfg.max_queue,
            (pre, post),
        );
        f.fill = rider;
        f.posted = posted;
        f
    }

    /// Connections this worker has opened to the endpoint (a near-cache fill is kept only if
    /// none opened between its send and its reply).
    pub(crate) fn connects(&self) -> u64 {
        self.inner.stats.connects.load(Ordering::Acquire)
    }

    /// A dedicated connection of `flavor` for one transaction: an idle one, or a new one
    /// while fewer than the cluster's `dedicated_connections` are open.
    pub(crate) fn take_dedicated(&self, flavor: Flavor) -> Result<Dedicated, UpstreamError> {
        let i = &self.inner;
        if let Some(e) = self.failing_over() {
            i.stats.count(error::kind(&e));
            return Err(e);
        }
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
    pub(crate) fn add_latency(&self, t: &mut crate::stats::CmdTotals) {
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

// The request's parts as the callers hold them (bundling them would only move them twice).
#[allow(clippy::too_many_arguments)]
fn send_on(
    queue: &queue::Sender<UpstreamRequest>,
    args: Vec<Bytes>,
    raw: Option<Bytes>,
    deadline: Instant,
    label: Arc<str>,
    stats: &EndpointStats,
    max_queue: usize,
    (pre, post): (Option<Pre>, Option<(Bytes, u8)>),
) -> UpstreamFuture {
    let (tx, rx) = oneshot::channel();
    let failed = match queue.try_send(UpstreamRequest {
        args,
        raw,
        deadline,
        tx,
        extra: (pre.is_some() || post.is_some()).then(|| Box::new(Extra { pre, post })),
    }) {
        Ok(()) => return UpstreamFuture::waiting(rx, label, deadline),
        Err(queue::TrySendError::Full(_)) => UpstreamError::QueueFull(max_queue),
        Err(queue::TrySendError::Closed(_)) => UpstreamError::Closed,
    };
    stats.count(error::kind(&failed));
    UpstreamFuture::failed(failed, label, deadline)
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
    /// The session's requests waiting behind a held write (see [`hold`]), and the primaries
    /// it wrote to.
    track: Arc<track::Track>,
}

impl Upstream {
    /// An upstream service over this worker's endpoints for one session; `conn` picks the
    /// session's connection to every endpoint (`conn % connections_per_endpoint`).
    pub(crate) fn new(
        endpoints: Arc<Endpoints>,
        conn: usize,
        default_timeout: Duration,
        track: Arc<track::Track>,
    ) -> Self {
        Upstream {
            endpoints,
            conn,
            default_timeout,
            track,
        }
    }
}

impl Service<Request> for Upstream {
    type Response = Reply;
    type Error = Failure;
    type Future = UpstreamFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        // Each connection's queue is bounded; a full one answers at once instead of waiting.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> UpstreamFuture {
        self.call_riding(req, None, None)
    }
}

impl Upstream {
    /// The endpoint `req` goes to (the zone layer chose it, or the shard's primary), and
    /// whether it is a replica the read falls back from.
    pub(crate) fn endpoint_of(&self, req: &Request) -> Option<(&EndpointHandle, bool)> {
        let shard = req.shard_index().unwrap_or(0);
        let primary = usize::from(req.primary);
        let endpoint = req.endpoint.map_or(primary, usize::from);
        let ep = self.endpoints.get(req.cluster, shard, endpoint)?;
        Some((ep, endpoint != primary && req.is_read()))
    }

    /// When `req` stops waiting for its reply.
    pub(crate) fn deadline_of(&self, req: &Request) -> Instant {
        match req.deadline {
            Some(d) => Instant::from_std(d),
            None => Instant::now() + self.default_timeout,
        }
    }

    /// Sends `req` with what rides along: `fill` is told of the reply (or abandoned), and
    /// `on_fallback` is abandoned when a replica read goes to the primary instead.
    pub(crate) fn call_riding(
        &mut self,
        req: Request,
        fill: Option<Box<dyn Rider>>,
        on_fallback: Option<Box<dyn Rider>>,
    ) -> UpstreamFuture {
        if self.track.behind() {
            return self.later(req, fill, on_fallback, None);
        }
        self.send_now(req, fill, on_fallback)
    }

    /// [`call_riding`](Self::call_riding) without waiting behind the session's held requests.
    fn send_now(
        &self,
        req: Request,
        fill: Option<Box<dyn Rider>>,
        on_fallback: Option<Box<dyn Rider>>,
    ) -> UpstreamFuture {
        let shard = req.shard_index().unwrap_or(0);
        // Both set by the zone layer, which looked the primary up.
        let primary = usize::from(req.primary);
        let endpoint = req.endpoint.map_or(primary, usize::from);
        let Some(ep) = self.endpoints.get(req.cluster, shard, endpoint) else {
            let deadline = Instant::now();
            return UpstreamFuture::failed(UpstreamError::NoShard, Arc::from(""), deadline);
        };
        // A Redis Cluster shard whose replica a MOVED showed promoted: there at once.
        let promoted;
        let ep = match (endpoint == primary)
            .then(|| self.endpoints.2.get(req.cluster, shard))
            .flatten()
        {
            Some(p) => {
                promoted = p;
                &promoted
            }
            None => ep,
        };
        let deadline = self.deadline_of(&req);
        if endpoint == primary && !req.is_read() {
            self.track.wrote(req.cluster, shard);
        }
        if endpoint == primary {
            // A Sentinel-managed shard in a failover: its writes wait for the new primary
            // (one atomic load per write to such a primary).
            if let Some(h) = ep.hold().filter(|h| !req.is_read() && h.is_held()) {
                h.writes.fetch_add(1, Ordering::Relaxed);
                let h = h.clone();
                return self.later(req, fill, on_fallback, Some(h));
            }
            // A configured primary that answers ROLE as a replica takes no writes (one
            // atomic load per request to a primary, on clusters with a health check only).
            if let Some(c) = ep.check().filter(|c| c.demoted() && !req.is_read()) {
                let e = UpstreamError::Demoted(Arc::from(c.replica_of()));
                ep.stats().count(error::kind(&e));
                return UpstreamFuture::failed(e, ep.label().clone(), deadline);
            }
        }
        // A Redis Cluster: what is needed to follow a redirection (the client's frame, or a
        // copy of the arguments when there is none).
        let redirect = self
            .endpoints
            .1
            .get(req.cluster)
            .and_then(Option::as_ref)
            .map(|c| {
                let args = if req.raw.is_some() {
                    Vec::new()
                } else {
                    req.args.clone()
                };
                Box::new(redirect::Redirect::new(
                    self.endpoints.clone(),
                    req.cluster,
                    c.name.clone(),
                    args,
                    req.raw.clone(),
                    req.flavor,
                    self.conn,
                    ep.clone(),
                ))
            });
        if endpoint != primary && req.is_read() {
            // A read sent to a replica: if the replica turns out to be unreachable, the read
            // is retried once on the primary instead of failing (the zone layer skips the
            // replica from then on), with the time it had. Costs one clone of the argument list and one box, for
            // replica reads only.
            if let Some(p) = self.endpoints.get(req.cluster, shard, primary) {
                let fallback = Some(Box::new(Fallback {
                    primary: p.clone(),
                    replica: ep.clone(),
                    args: req.args.clone(),
                    flavor: req.flavor,
                    conn: self.conn,
                    on_fallback,
                    budget: deadline.saturating_duration_since(Instant::now()),
                }));
                let mut f = ep.send_fill(req.args, req.raw, req.flavor, self.conn, deadline, fill);
                f.fallback = fallback;
                f.redirect = redirect;
                return f;
            }
        }
        let mut f = ep.send_fill(req.args, req.raw, req.flavor, self.conn, deadline, fill);
        f.redirect = redirect;
        f
    }
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
            missing: None,
            readonly: false,
            replica: false,
        };
        let text = format!("{cfg:?}");
        assert!(
            !text.contains("hunter2") && text.contains("<redacted>"),
            "{text}"
        );
    }
}
