//! One client connection (a session): decode every pipelined command the read buffer holds,
//! send each through the chain, and write the replies strictly in request order while
//! upstream replies may complete in any order.
//!
//! Invariants:
//! - every decoded command gets exactly one reply, in order;
//! - at most `max_pending_per_client` replies are outstanding: beyond that the session stops
//!   reading (backpressure reaches the client through TCP, memory stays bounded);
//! - replies that are ready together are written together (one `write` for many replies);
//! - a protocol error answers `-ERR Protocol error: ...`, flushes what is owed, and closes
//!   this connection only.
//!
//! Only the oldest pending reply is polled, so a completion of a later one does not wake the
//! task; a single timer follows the oldest request's deadline (`op_timeout`).

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use respway_filters::command::{self, CommandClass};
use respway_filters::request::{error_reply, Reply, Request};
use respway_filters::resp::RequestDecoder;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tower::Service;

use crate::local::{self, Local, SessionState};
use crate::stack::{self, Chain, ChainFuture, Parts};
use crate::stats::ListenerStats;

const READ_CHUNK: usize = 16 * 1024;
/// How long past its upstream deadline (and `op_timeout` more) a request may wait before the
/// session answers it itself: covers a reconnect after a stuck connection.
const BACKSTOP: std::time::Duration = std::time::Duration::from_secs(1);
/// Requests a new client may have in flight before any of its replies arrived.
const WINDOW_START: usize = 64;
/// A read buffer grown past this (a large command) is given back once it is empty.
const KEEP_RBUF: usize = 64 * 1024;
/// A write buffer grown past this (large replies) is given back once it is empty.
const KEEP_WBUF: usize = 256 * 1024;

/// Shared state of the listener a session belongs to, on one worker.
#[derive(Debug)]
pub struct ListenerCtx {
    /// The current configuration of this listener on this worker (swapped on config change).
    pub slot: Arc<ListenerSlot>,
    /// Counters.
    pub stats: Arc<ListenerStats>,
    /// Every worker's counters (for INFO).
    pub registry: Arc<crate::stats::Registry>,
    /// Workers in this process (for INFO).
    pub workers: usize,
    /// Set when the process drains: sessions read nothing more, answer what they have read,
    /// and close.
    pub draining: std::sync::atomic::AtomicBool,
    /// Wakes every session when draining starts.
    pub drain: tokio::sync::Notify,
}

/// One worker's current chain parts for one listener. A config change stores new parts and
/// bumps `version`; each session compares versions (a plain load of a worker-local atomic)
/// before it dispatches a batch, and rebuilds its chain when they differ. Requests already in
/// flight keep the old chain's `Arc`s and finish on it.
#[derive(Debug)]
pub struct ListenerSlot {
    /// The parts new chains are built from.
    pub parts: ArcSwap<Parts>,
    /// Bumped after every store.
    pub version: AtomicU64,
}

impl ListenerSlot {
    /// A slot holding `parts` at version 0.
    pub fn new(parts: Parts) -> Self {
        ListenerSlot {
            parts: ArcSwap::from_pointee(parts),
            version: AtomicU64::new(0),
        }
    }

    /// Publishes new parts.
    pub fn store(&self, parts: Parts) {
        self.parts.store(Arc::new(parts));
        self.version.fetch_add(1, Ordering::Release);
    }
}

/// A session's view of its listener's configuration.
struct Live {
    /// The session's upstream connection choice (see [`stack::build`]).
    conn: usize,
    version: u64,
    parts: Arc<Parts>,
    chain: Chain,
}

impl Live {
    fn load(slot: &ListenerSlot, conn: usize) -> Live {
        let version = slot.version.load(Ordering::Acquire);
        let parts = slot.parts.load_full();
        let chain = stack::build(&parts, conn);
        Live {
            conn,
            version,
            parts,
            chain,
        }
    }

    /// Picks up a new configuration, if there is one, unless commands are still in flight
    /// on the current one (`in_flight`): a new configuration may send the session's next
    /// commands on other connections (a new pool, or another shard), and they must not pass
    /// the ones before them. Returns false while the session must wait for those.
    fn refresh(&mut self, slot: &ListenerSlot, in_flight: bool) -> bool {
        if slot.version.load(Ordering::Acquire) == self.version {
            return true;
        }
        if in_flight {
            return false;
        }
        *self = Live::load(slot, self.conn);
        true
    }
}

enum Pending {
    Ready(Reply),
    Wait { fut: ChainFuture, deadline: Instant },
}

/// Serves one client until it leaves, sends QUIT, or breaks the protocol.
/// `seq` (this worker's accept count for the listener) picks the session's connection to
/// each endpoint.
pub async fn serve(mut stream: TcpStream, ctx: Arc<ListenerCtx>, seq: usize) {
    let _ = stream.set_nodelay(true);
    let mut live = Live::load(&ctx.slot, seq);
    let listener = live.parts.listener.clone();
    let mut s = Session {
        decoder: RequestDecoder::new(listener.limits),
        // Buffers are allocated by the first read and write, and given back when a burst
        // made them grow: an idle connection costs little.
        rbuf: BytesMut::new(),
        wbuf: BytesMut::new(),
        pending: VecDeque::new(),
        timer: Box::pin(tokio::time::sleep_until(Instant::now())),
        timer_armed: false,
        state: SessionState::new(listener.downstream_password.is_none()),
        closing: false,
        eof: false,
        draining: false,
        keys: Vec::new(),
        ready_bytes: 0,
        waits: 0,
        avg_reply: 64,
        window: WINDOW_START,
        stall_timer: None,
    };
    // Registered once with the first poll, the drain notification wakes this task when the
    // process drains; after that the flag alone is read (one atomic load per poll).
    let drained = ctx.drain.notified();
    tokio::pin!(drained);
    let mut registered = false;
    let result = poll_fn(|cx| {
        if !registered {
            registered = true;
            let _ = drained.as_mut().poll(cx);
        }
        if !s.draining && ctx.draining.load(Ordering::Relaxed) {
            s.draining = true;
        }
        s.poll(cx, &mut stream, &mut live, &ctx)
    })
    .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "client connection ended");
    }
}

struct Session {
    decoder: RequestDecoder,
    rbuf: BytesMut,
    wbuf: BytesMut,
    pending: VecDeque<Pending>,
    timer: Pin<Box<Sleep>>,
    timer_armed: bool,
    state: SessionState,
    /// Stop reading: QUIT or a protocol error; close once everything owed is written.
    closing: bool,
    /// The client closed its side.
    eof: bool,
    /// The process drains: read nothing more, answer what was read, then close.
    draining: bool,
    keys: Vec<usize>,
    /// Bytes of replies in `pending` that are ready (answered by the proxy itself).
    ready_bytes: usize,
    /// Requests in `pending` waiting for the upstream.
    waits: usize,
    /// Running average of this client's reply sizes: the expected bytes of each reply in
    /// flight, so that the buffer bound holds before the replies arrive.
    avg_reply: usize,
    /// Requests this client may have in flight now (below `max_pending_per_client`): starts
    /// at [`WINDOW_START`] and grows by one per reply that arrives while the bytes held stay
    /// under the bound (doubling per round trip), halves when they reach it. Reply sizes are
    /// unknown until they arrive, so this is what keeps a burst of large replies near the
    /// bound instead of `max_pending_per_client` times their size.
    window: usize,
    /// Armed while the session is held at its buffer limit by a client that does not read:
    /// set `stall_timeout` ahead when the hold starts and each time the client takes bytes.
    stall_timer: Option<Pin<Box<Sleep>>>,
}

/// Why a session ends on its own.
#[derive(Debug)]
enum Cut {
    /// More reply bytes held than the hard limit.
    HardLimit(usize),
    /// Held at the limit, nothing read by the client for the stall timeout.
    Stalled(usize),
}

impl Session {
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        stream: &mut TcpStream,
        live: &mut Live,
        ctx: &ListenerCtx,
    ) -> Poll<io::Result<()>> {
        let limits = &live.parts.listener.client;
        let (limit, hard, stall) = (
            limits.buffer_limit,
            limits.buffer_hard_limit,
            limits.stall_timeout,
        );
        loop {
            let mut progress = false;

            // 1. Read and dispatch while the client may have more outstanding and the bytes
            //    held for it stay under its bound.
            let max = live.parts.listener.max_pending_per_client.min(self.window);
            if !self.closing
                && !self.eof
                && !self.draining
                && self.pending.len() < max
                && self.held() < limit
                && stream.poll_read_ready(cx).is_ready()
            {
                // A connection that never sent anything holds no read buffer: the first read
                // goes to the stack, and the buffer is allocated once bytes arrived.
                const FIRST: usize = 512;
                let unallocated = self.rbuf.capacity() == 0;
                if !unallocated && self.rbuf.capacity() - self.rbuf.len() < 1024 {
                    self.rbuf.reserve(READ_CHUNK);
                }
                let spare = if unallocated {
                    FIRST
                } else {
                    self.rbuf.capacity() - self.rbuf.len()
                };
                let read = if unallocated {
                    let mut first = [0u8; FIRST];
                    stream.try_read(&mut first).inspect(|&n| {
                        if n > 0 {
                            self.rbuf.reserve(READ_CHUNK);
                            self.rbuf.extend_from_slice(&first[..n]);
                        }
                    })
                } else {
                    stream.try_read_buf(&mut self.rbuf)
                };
                match read {
                    Ok(0) => {
                        self.eof = true;
                        progress = true;
                    }
                    Ok(n) => {
                        // A short read drained the socket: skip the read that would only
                        // return EAGAIN (see `upstream::clear_read_readiness`).
                        if n < spare {
                            crate::upstream::clear_read_readiness(stream);
                        }
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => progress = true,
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            if !self.rbuf.is_empty() && !self.closing && live.refresh(&ctx.slot, self.waits > 0) {
                let before = self.pending.len();
                self.decode_all(live, ctx, max, limit);
                progress |= self.pending.len() != before;
            }
            if self.rbuf.is_empty() && self.rbuf.capacity() > KEEP_RBUF {
                self.rbuf = BytesMut::new();
            }

            // 2. Move finished replies, oldest first, into the write buffer.
            while let Some(front) = self.pending.front_mut() {
                let reply = match front {
                    Pending::Ready(_) => match self.pending.pop_front() {
                        Some(Pending::Ready(r)) => {
                            self.ready_bytes -= r.len();
                            r
                        }
                        _ => unreachable!("front was Ready"),
                    },
                    Pending::Wait { fut, deadline } => match Pin::new(fut).poll(cx) {
                        Poll::Ready(Ok(r)) => {
                            self.pending.pop_front();
                            self.waits -= 1;
                            self.avg_reply = (self.avg_reply * 7 + r.len()) / 8;
                            if self.held() + r.len() < limit {
                                self.window = self.window.saturating_add(1);
                            } else {
                                self.window = (self.window / 2).max(1);
                            }
                            r
                        }
                        Poll::Ready(Err(never)) => match never {},
                        Poll::Pending => {
                            let deadline = *deadline;
                            if self.poll_timeout(cx, deadline) {
                                self.pending.pop_front();
                                self.waits -= 1;
                                ctx.stats.timeouts.inc();
                                error_reply("ERR respway: upstream timeout")
                            } else {
                                break;
                            }
                        }
                    },
                };
                self.wbuf.extend_from_slice(&reply);
                progress = true;
                if self.wbuf.len() > hard {
                    return Poll::Ready(Err(self.cut(ctx, Cut::HardLimit(self.wbuf.len()))));
                }
            }

            // 3. Write what is ready, in as few syscalls as possible.
            let mut blocked = false;
            let mut took = false;
            while !self.wbuf.is_empty() {
                match stream.poll_write_ready(cx) {
                    Poll::Ready(Ok(())) => match stream.try_write(&self.wbuf) {
                        Ok(n) => {
                            self.wbuf.advance(n);
                            took = true;
                            progress = true;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Poll::Ready(Err(e)),
                    },
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {
                        blocked = true;
                        break;
                    }
                }
            }
            if self.wbuf.is_empty() && self.wbuf.capacity() > KEEP_WBUF {
                self.wbuf = BytesMut::new();
            }
            // A client held at its bound that takes nothing (it may be writing a pipeline it
            // will only read after the last command, and waits for us as we wait for it) is
            // disconnected after the stall timeout instead of waiting forever.
            // The clock is read only while held at the bound, not per write.
            if blocked && self.held() >= limit {
                let t = match &mut self.stall_timer {
                    Some(t) => {
                        if took {
                            t.as_mut().reset(Instant::now() + stall);
                        }
                        t
                    }
                    None => self.stall_timer.insert(Box::pin(tokio::time::sleep(stall))),
                };
                if t.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(self.cut(ctx, Cut::Stalled(self.held()))));
                }
            } else if self.stall_timer.is_some() {
                self.stall_timer = None;
            }
            if self.wbuf.is_empty()
                && self.pending.is_empty()
                && (self.closing || self.eof || self.draining)
            {
                return Poll::Ready(Ok(()));
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    /// Bytes held for this client: replies waiting to be written, replies ready in order, and
    /// the expected size of the replies in flight.
    fn held(&self) -> usize {
        self.wbuf.len() + self.ready_bytes + self.waits * self.avg_reply
    }

    /// Ends the session for exceeding its output bound: logged and counted.
    fn cut(&mut self, ctx: &ListenerCtx, why: Cut) -> io::Error {
        ctx.stats.output_limit_closes.inc();
        let text = match why {
            Cut::HardLimit(n) => format!(
                "client output buffer over its hard limit ({n} bytes held): connection closed"
            ),
            Cut::Stalled(n) => format!(
                "client output buffer at its limit ({n} bytes held) and nothing read for the \
                 stall timeout: connection closed"
            ),
        };
        tracing::warn!(client_id = self.state.id, "{text}");
        io::Error::other(text)
    }

    /// True when `deadline` has passed; otherwise makes sure the timer will wake us by then.
    fn poll_timeout(&mut self, cx: &mut Context<'_>, deadline: Instant) -> bool {
        if !self.timer_armed || self.timer.deadline() > deadline {
            self.timer.as_mut().reset(deadline);
            self.timer_armed = true;
        }
        loop {
            match self.timer.as_mut().poll(cx) {
                Poll::Pending => return false,
                Poll::Ready(()) => {
                    if Instant::now() >= deadline {
                        self.timer_armed = false;
                        return true;
                    }
                    self.timer.as_mut().reset(deadline);
                }
            }
        }
    }

    fn decode_all(&mut self, live: &mut Live, ctx: &ListenerCtx, max: usize, limit: usize) {
        while self.pending.len() < max && self.held() < limit {
            match self.decoder.decode(&mut self.rbuf) {
                Ok(Some(args)) => {
                    ctx.stats.commands.inc();
                    let p = self.dispatch(args, live, ctx);
                    match &p {
                        Pending::Ready(r) => self.ready_bytes += r.len(),
                        Pending::Wait { .. } => self.waits += 1,
                    }
                    self.pending.push_back(p);
                    if self.closing {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    ctx.stats.protocol_errors.inc();
                    let r = error_reply(&format!("ERR {e}"));
                    self.ready_bytes += r.len();
                    self.pending.push_back(Pending::Ready(r));
                    self.closing = true;
                    return;
                }
            }
        }
    }

    fn dispatch(&mut self, args: Vec<bytes::Bytes>, live: &mut Live, ctx: &ListenerCtx) -> Pending {
        let Some(cmd) = command::lookup(&args[0]) else {
            return Pending::Ready(local::unknown_command(&args));
        };
        if self.state.refused_multi {
            if let Some(r) = local::in_refused_multi(cmd.name, &mut self.state) {
                return Pending::Ready(r);
            }
        }
        let cmd = cmd.resolve(&args);
        if !cmd.arity_ok(args.len()) {
            return Pending::Ready(error_reply(&format!(
                "ERR wrong number of arguments for '{}' command",
                cmd.name
            )));
        }
        if !self.state.authenticated
            && !matches!(
                cmd.class,
                CommandClass::Proxy(command::ProxyCommand::Auth)
                    | CommandClass::Proxy(command::ProxyCommand::Hello)
                    | CommandClass::Proxy(command::ProxyCommand::Quit)
            )
        {
            return Pending::Ready(error_reply("NOAUTH Authentication required."));
        }
        match cmd.class {
            CommandClass::Proxy(p) => {
                match local::handle(p, &args, &mut self.state, ctx, &live.parts.listener) {
                    Local::Reply(r) => Pending::Ready(r),
                    Local::ReplyAndClose(r) => {
                        self.closing = true;
                        Pending::Ready(r)
                    }
                }
            }
            CommandClass::Unsupported => {
                ctx.stats.unsupported.inc();
                if cmd.name == "multi" {
                    self.state.refused_multi = true;
                }
                Pending::Ready(error_reply(&format!(
                    "ERR command '{}' is not supported by respway",
                    String::from_utf8_lossy(&args[0])
                )))
            }
            CommandClass::Single | CommandClass::Split(_) | CommandClass::SameShard => {
                if let Err(e) = cmd.key_indices(&args, &mut self.keys) {
                    return Pending::Ready(error_reply(&format!("ERR {e}")));
                }
                if self.keys.is_empty()
                    && local::is_script(cmd.name)
                    && !live.parts.listener.client.allow_keyless_scripts
                {
                    return Pending::Ready(error_reply(&format!(
                        "ERR respway: {} with no keys is refused: scripts are routed by their \
                         keys, and one that declares none would run on an arbitrary shard (the \
                         listener's allow_keyless_scripts allows it)",
                        cmd.name.to_ascii_uppercase()
                    )));
                }
                let key = self.keys.first().copied();
                let mut req = Request::new(cmd, args, key);
                let op_timeout = live.parts.listener.op_timeout;
                let deadline = Instant::now() + op_timeout;
                req.deadline = Some(deadline.into_std());
                // Every layer is always ready (queues are bounded per session, above).
                let noop = std::task::Waker::noop();
                let _ = live.chain.poll_ready(&mut Context::from_waker(noop));
                Pending::Wait {
                    fut: live.chain.call(req),
                    // The upstream answers at `deadline` with an error naming the shard; this
                    // is only a backstop for a request lost on the way.
                    deadline: deadline + op_timeout + BACKSTOP,
                }
            }
        }
    }
}
