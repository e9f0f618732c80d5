//! Upstream pools: per worker and endpoint, a few persistent connections onto which every
//! client's requests are multiplexed and pipelined; replies are matched FIFO.
//!
//! Each connection is one task that owns its socket. Per turn of its loop it takes *every*
//! queued request (`recv_many`), encodes them into one buffer and writes it with as few
//! syscalls as the socket allows, and cuts every complete reply off its read buffer
//! (`reply_len`, no parsing) to complete the oldest waiting request. Batching across clients
//! is what makes a proxy cheaper than a connection per client (ARCHITECTURE.md, "What costs
//! CPU").
//!
//! Failure handling: connections are opened lazily by the first request that needs them,
//! within the cluster's connect timeout; requests queued meanwhile wait for it. A failed
//! connect starts a backoff (100 ms, doubling up to 5 s) during which requests get an
//! immediate `-ERR` naming the shard, so a dead shard never hangs its clients and never
//! affects other shards; after the backoff the endpoint is probed again (a failing endpoint is
//! marked unhealthy for the zone layer, which skips it, so no request would come to retry). In-flight requests
//! on a connection that breaks get `-ERR`; the next request reconnects at once.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use respway_filters::codec_limits::Limits;
use respway_filters::request::{error_reply, Reply, Request};
use respway_filters::resp::{encode_command, reply_len};
use respway_filters::zone::HealthView;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tower::Service;

/// Most requests taken from the queue in one turn.
const BATCH: usize = 1024;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// One request handed to a connection task.
#[derive(Debug)]
pub struct UpstreamRequest {
    /// The command to send.
    pub args: Vec<Bytes>,
    /// Where the reply goes.
    pub tx: oneshot::Sender<Reply>,
}

/// How to reach and prepare one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointConfig {
    /// Socket address.
    pub address: SocketAddr,
    /// `shard <name> (<addr>)`, used in error replies and logs.
    pub label: Arc<str>,
    /// TCP connect timeout (the handshake shares it).
    pub connect_timeout: Duration,
    /// `AUTH` arguments (without the command name), sent on connect.
    pub auth: Option<Vec<Bytes>>,
    /// `SELECT` on connect when non-zero.
    pub db: u32,
}

/// This worker's connections to one endpoint.
#[derive(Debug, Clone)]
pub struct EndpointHandle {
    conns: Arc<[mpsc::UnboundedSender<UpstreamRequest>]>,
    label: Arc<str>,
    /// False while a connect to this endpoint is failing (written by this worker's
    /// connection tasks, read by this worker's zone layer).
    healthy: Arc<AtomicBool>,
}

impl EndpointHandle {
    /// Spawns `n` connection tasks for `cfg` on the current runtime.
    pub fn spawn(cfg: EndpointConfig, n: usize) -> EndpointHandle {
        let healthy = Arc::new(AtomicBool::new(true));
        let conns: Vec<_> = (0..n.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(run_connection(cfg.clone(), rx, healthy.clone()));
                tx
            })
            .collect();
        EndpointHandle {
            conns: conns.into(),
            label: cfg.label,
            healthy,
        }
    }

    /// False while connecting to the endpoint fails.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Queues `args` on connection `conn % n` and returns the reply's future.
    pub fn send(&self, args: Vec<Bytes>, conn: usize) -> UpstreamFuture {
        let (tx, rx) = oneshot::channel();
        let conn = &self.conns[conn % self.conns.len()];
        match conn.send(UpstreamRequest { args, tx }) {
            Ok(()) => UpstreamFuture::waiting(rx, self.label.clone()),
            Err(_) => UpstreamFuture::done(Some(error_reply(&format!(
                "ERR respway: {} is not available",
                self.label
            )))),
        }
    }
}

/// One worker's endpoint handles, `[cluster][shard][endpoint]` in model order.
#[derive(Debug, Default)]
pub struct Endpoints(pub Vec<Vec<Vec<EndpointHandle>>>);

impl Endpoints {
    fn get(&self, cluster: usize, shard: usize, endpoint: usize) -> Option<&EndpointHandle> {
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
pub struct Upstream {
    endpoints: Arc<Endpoints>,
    /// Index of each shard's primary, `[cluster][shard]`.
    primaries: Arc<Vec<Vec<usize>>>,
    /// Which of an endpoint's connections this client uses: fixed for the session's life, so
    /// every command of one client to one endpoint travels on one connection (Redis orders
    /// commands per connection only); sessions, not commands, are spread over connections.
    conn: usize,
}

impl Upstream {
    /// An upstream service over this worker's endpoints for one session; `conn` picks the
    /// session's connection to every endpoint (`conn % connections_per_endpoint`).
    pub fn new(endpoints: Arc<Endpoints>, primaries: Arc<Vec<Vec<usize>>>, conn: usize) -> Self {
        Upstream {
            endpoints,
            primaries,
            conn,
        }
    }
}

impl Service<Request> for Upstream {
    type Response = Reply;
    type Error = Infallible;
    type Future = UpstreamFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The connection queues are unbounded; each session bounds its own pending replies.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> UpstreamFuture {
        let shard = req.shard.unwrap_or(0);
        let endpoint = match req.endpoint {
            Some(e) => e,
            None => self
                .primaries
                .get(req.cluster)
                .and_then(|c| c.get(shard))
                .copied()
                .unwrap_or(0),
        };
        let Some(ep) = self.endpoints.get(req.cluster, shard, endpoint) else {
            return UpstreamFuture::done(Some(error_reply("ERR respway: no such shard")));
        };
        let primary = self
            .primaries
            .get(req.cluster)
            .and_then(|c| c.get(shard))
            .copied()
            .unwrap_or(0);
        if endpoint != primary && req.is_read() {
            // A read sent to a replica: if the replica turns out to be unreachable, the read
            // is retried once on the primary instead of failing (the zone layer skips the
            // replica from then on). Costs one clone of the argument list, for replica reads
            // only.
            if let Some(p) = self.endpoints.get(req.cluster, shard, primary) {
                let fallback = Some((p.clone(), req.args.clone(), self.conn));
                let mut f = ep.send(req.args, self.conn);
                f.fallback = fallback;
                return f;
            }
        }
        ep.send(req.args, self.conn)
    }
}

/// The reply of one upstream request.
#[derive(Debug)]
pub struct UpstreamFuture {
    state: State,
    /// For replica reads: the primary and the request, to retry there once when the replica
    /// cannot be reached.
    fallback: Option<(EndpointHandle, Vec<Bytes>, usize)>,
}

#[derive(Debug)]
enum State {
    /// Waiting for the connection task.
    Waiting(oneshot::Receiver<Reply>, Arc<str>),
    /// Already answered (an error).
    Done(Option<Reply>),
}

impl UpstreamFuture {
    fn waiting(rx: oneshot::Receiver<Reply>, label: Arc<str>) -> Self {
        UpstreamFuture {
            state: State::Waiting(rx, label),
            fallback: None,
        }
    }

    /// An already-known reply.
    fn done(reply: Option<Reply>) -> Self {
        UpstreamFuture {
            state: State::Done(reply),
            fallback: None,
        }
    }
}

/// True for the proxy's own "could not reach the endpoint" errors (never Redis's errors): the
/// request did not run, so a read may safely go elsewhere.
fn unreachable_reply(r: &[u8]) -> bool {
    r.starts_with(b"-ERR respway: ")
        && [
            &b"unavailable"[..],
            b"connection lost",
            b"connection closed",
            b"is not available",
        ]
        .iter()
        .any(|m| r.windows(m.len()).any(|w| w == *m))
}

impl Future for UpstreamFuture {
    type Output = Result<Reply, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            let reply = match &mut this.state {
                State::Waiting(rx, label) => match Pin::new(rx).poll(cx) {
                    Poll::Ready(Ok(r)) => r,
                    Poll::Ready(Err(_)) => {
                        error_reply(&format!("ERR respway: {label}: connection closed"))
                    }
                    Poll::Pending => return Poll::Pending,
                },
                State::Done(r) => r
                    .take()
                    .unwrap_or_else(|| error_reply("ERR respway: reply polled twice")),
            };
            if unreachable_reply(&reply) {
                if let Some((primary, args, rr)) = this.fallback.take() {
                    this.state = primary.send(args, rr).state;
                    continue;
                }
            }
            return Poll::Ready(Ok(reply));
        }
    }
}

// === connection task ===

/// Reads what the socket has and completes every whole reply, oldest request first.
///
/// A read that does not fill the buffer's free space has drained the socket: instead of
/// reading again only to get `EAGAIN` (one wasted syscall per batch), the socket's readiness
/// is cleared directly, and the next edge from the kernel sets it again.
fn read_replies(
    stream: &TcpStream,
    rbuf: &mut BytesMut,
    inflight: &mut VecDeque<oneshot::Sender<Reply>>,
    limits: &Limits,
) -> std::io::Result<()> {
    if rbuf.capacity() - rbuf.len() < 4096 {
        rbuf.reserve(16 * 1024);
    }
    let spare = rbuf.capacity() - rbuf.len();
    let n = match stream.try_read_buf(rbuf) {
        Ok(0) => return Err(std::io::Error::other("connection closed by server")),
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
        Err(e) => return Err(e),
    };
    if n < spare {
        clear_read_readiness(stream);
    }
    loop {
        match reply_len(rbuf, limits) {
            Ok(Some(n)) => {
                let reply = rbuf.split_to(n).freeze();
                match inflight.pop_front() {
                    // A receiver that timed out or left is simply gone.
                    Some(tx) => {
                        let _ = tx.send(reply);
                    }
                    None => return Err(std::io::Error::other("reply with no request")),
                }
            }
            Ok(None) => return Ok(()),
            Err(e) => return Err(std::io::Error::other(e.to_string())),
        }
    }
}

/// Marks the socket not readable without a syscall (see [`read_replies`]). Safe against a
/// race with new data: tokio only clears the readiness event it observed, and new data raises
/// a new edge-triggered event.
pub(crate) fn clear_read_readiness(stream: &TcpStream) {
    let _ = stream.try_io(tokio::io::Interest::READABLE, || {
        Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
    });
}

async fn run_connection(
    cfg: EndpointConfig,
    mut rx: mpsc::UnboundedReceiver<UpstreamRequest>,
    healthy: Arc<AtomicBool>,
) {
    let mut backoff = BACKOFF_MIN;
    loop {
        // Connect lazily, on the first request: an endpoint nobody uses costs nothing, and a
        // proxy started before its shards does not begin in backoff. An endpoint marked
        // unhealthy is probed without waiting for a request, because the zone layer sends
        // it none until it recovers.
        let first = if healthy.load(Ordering::Relaxed) {
            match rx.recv().await {
                Some(r) => Some(r),
                None => return, // every handle dropped: the endpoint left the config
            }
        } else {
            None
        };
        let err = match connect(&cfg).await {
            Ok(stream) => {
                backoff = BACKOFF_MIN;
                healthy.store(true, Ordering::Relaxed);
                tracing::debug!(endpoint = %cfg.label, "connected");
                match serve(stream, first, &mut rx, &cfg.label).await {
                    Ok(()) => return,
                    Err(e) => {
                        // A connection that worked is retried at once, on the next request.
                        tracing::warn!(endpoint = %cfg.label, error = %e, "upstream connection lost");
                        continue;
                    }
                }
            }
            Err(e) => {
                healthy.store(false, Ordering::Relaxed);
                if let Some(first) = first {
                    let _ = first.tx.send(unavailable(&cfg.label, &e));
                }
                e
            }
        };
        tracing::warn!(endpoint = %cfg.label, error = %err, ?backoff, "upstream connect failed");
        let reply = unavailable(&cfg.label, &err);
        // Whatever queued during the failed attempt is answered now, and so is everything
        // that arrives during the backoff: a dead shard must not hang its clients.
        let sleep = tokio::time::sleep(backoff);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                biased;
                _ = &mut sleep => break,
                req = rx.recv() => match req {
                    Some(req) => { let _ = req.tx.send(reply.clone()); }
                    None => return,
                },
            }
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

fn unavailable(label: &str, err: &str) -> Reply {
    error_reply(&format!("ERR respway: {label} unavailable: {err}"))
}

async fn connect(cfg: &EndpointConfig) -> Result<TcpStream, String> {
    let attempt = async {
        let mut stream = TcpStream::connect(cfg.address)
            .await
            .map_err(|e| e.to_string())?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let mut hello = Vec::new();
        if let Some(auth) = &cfg.auth {
            let mut args = vec![Bytes::from_static(b"AUTH")];
            args.extend(auth.iter().cloned());
            hello.push(args);
        }
        if cfg.db != 0 {
            hello.push(vec![
                Bytes::from_static(b"SELECT"),
                Bytes::from(cfg.db.to_string()),
            ]);
        }
        if !hello.is_empty() {
            let mut out = BytesMut::new();
            for args in &hello {
                encode_command(args, &mut out);
            }
            stream.write_all(&out).await.map_err(|e| e.to_string())?;
            let mut buf = BytesMut::with_capacity(256);
            let mut answered = 0;
            while answered < hello.len() {
                if stream.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
                    return Err("closed during handshake".to_string());
                }
                while let Some(n) =
                    reply_len(&buf, &Limits::default()).map_err(|e| e.to_string())?
                {
                    let reply = buf.split_to(n);
                    if reply.first() == Some(&b'-') {
                        let text = String::from_utf8_lossy(&reply[1..reply.len() - 2]);
                        return Err(format!("handshake refused: {text}"));
                    }
                    answered += 1;
                }
            }
        }
        Ok(stream)
    };
    match tokio::time::timeout(cfg.connect_timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(format!("connect timeout after {:?}", cfg.connect_timeout)),
    }
}

/// Serves requests on one live connection until it fails (`Err`) or every sender is gone
/// and nothing is in flight (`Ok`).
async fn serve(
    stream: TcpStream,
    first: Option<UpstreamRequest>,
    rx: &mut mpsc::UnboundedReceiver<UpstreamRequest>,
    label: &str,
) -> Result<(), String> {
    // Replies from Redis are trusted to be well formed; only absurd sizes are refused.
    let limits = Limits {
        max_bulk_len: usize::MAX >> 1,
        max_multibulk_len: usize::MAX >> 1,
        max_inline_len: usize::MAX >> 1,
    };
    let mut inflight: VecDeque<oneshot::Sender<Reply>> = VecDeque::new();
    let mut batch: Vec<UpstreamRequest> = Vec::with_capacity(64);
    let mut wbuf = BytesMut::with_capacity(16 * 1024);
    let mut rbuf = BytesMut::with_capacity(16 * 1024);
    let mut open = true;
    if let Some(first) = first {
        encode_command(&first.args, &mut wbuf);
        inflight.push_back(first.tx);
    }
    let result = loop {
        if !open && inflight.is_empty() && wbuf.is_empty() {
            break Ok(());
        }
        tokio::select! {
            n = rx.recv_many(&mut batch, BATCH), if open && wbuf.len() < 1 << 20 => {
                if n == 0 {
                    open = false;
                    continue;
                }
                // Let every other task of this worker run first — tokio resumes a yielded task
                // only after it has polled the I/O driver again — so that requests from
                // clients served in the same event-loop turn join this write. This is the
                // batching across clients that makes the shard's work (and ours) per request
                // smaller, like twemproxy writing once per epoll iteration.
                tokio::task::yield_now().await;
                while batch.len() < BATCH {
                    match rx.try_recv() {
                        Ok(req) => batch.push(req),
                        Err(_) => break,
                    }
                }
                for req in batch.drain(..) {
                    encode_command(&req.args, &mut wbuf);
                    inflight.push_back(req.tx);
                }
                // Write now if the socket takes it; the select below covers the rest.
                match stream.try_write(&wbuf) {
                    Ok(n) => wbuf.advance(n),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => break Err(e.to_string()),
                }
            }
            w = stream.writable(), if !wbuf.is_empty() => match w.and_then(|()| stream.try_write(&wbuf)) {
                Ok(n) => wbuf.advance(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => break Err(e.to_string()),
            },
            r = stream.readable() => {
                if let Err(e) = r.and_then(|()| read_replies(&stream, &mut rbuf, &mut inflight, &limits)) {
                    break Err(e.to_string());
                }
            }
        }
    };
    if let Err(e) = &result {
        let reply = error_reply(&format!("ERR respway: {label}: connection lost: {e}"));
        for tx in inflight.drain(..) {
            let _ = tx.send(reply.clone());
        }
    }
    result
}
