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
//! One turn of [`Session::poll`], in order: `read_and_dispatch` (read what the socket has;
//! `decode_all` decodes every whole command, looks it up and picks its [`Lane`]; each goes to
//! `dispatch` in `dispatch.rs`), `move_replies` (the oldest ready replies into the write
//! buffer; a typed failure becomes its error frame here), `write_ready` (one write for all).
//!
//! Only the oldest pending reply is polled, so a completion of a later one does not wake the
//! task; a single timer follows the oldest request's deadline (`op_timeout`).

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::cache::near_cache::Touch;
use bytes::{Bytes, BytesMut};
use respway_filters::acl::Denied;
use respway_filters::command::{self, CommandClass, ProxyCommand};
use respway_filters::error::failed;
use respway_filters::model::ProtocolMode;
use respway_filters::place::Refusal;
use respway_filters::request::{error_reply, is_error, Flavor, Reply, Request};
use respway_filters::resp::RequestDecoder;
use tokio::time::{Instant, Sleep};
use tower::Service;

use crate::session::fanout;
use crate::session::listener::ListenerCtx;
use crate::session::scatter::BoxReply;
use crate::session::state::SessionState;

use crate::net::outq::OutQueue;
use crate::net::spare;
use crate::net::tls::Io;
use crate::session::local::{self, Local};
use crate::session::pubsub;
use crate::session::tx::{self, Pinned, Tx};
use crate::stack::{self, Chain, ChainFuture, Handler, ListenerSlot, Parts};
use crate::stats::slowlog::FirstArg;

const READ_CHUNK: usize = 16 * 1024;
/// How long past its upstream deadline (and `op_timeout` more) a request may wait before the
/// session answers it itself: covers a reconnect after a stuck connection, and a write held
/// during a failover (whose time to wait for its reply starts once it is sent).
const BACKSTOP: std::time::Duration =
    std::time::Duration::from_secs(1 + respway_filters::model::MAX_FAILOVER_HOLD.as_secs());
/// Requests a new client may have in flight before any of its replies arrived.
const WINDOW_START: usize = 64;
/// Most read-buffer room reserved at once for an argument the client announced.
const MAX_AHEAD: usize = 64 << 20;
/// Pub/sub messages are moved into the write buffer while it holds less than this; the rest
/// wait in the subscriber's bounded queue.
const DRAIN_MAX: usize = 64 * 1024;

/// A session's view of its listener's configuration.
struct Live {
    /// The session's upstream connection choice (see [`stack::build`]).
    conn: usize,
    /// What the session's upstream service keeps across chains (see [`stack::build`]).
    pub(super) track: Arc<crate::upstream::track::Track>,
    version: u64,
    parts: Arc<Parts>,
    chain: Chain,
    /// Loaded by the last `refresh`: the session rebinds its user to the new ACL.
    fresh: bool,
}

impl Live {
    fn load(slot: &ListenerSlot, conn: usize, track: Arc<crate::upstream::track::Track>) -> Live {
        let version = slot.version.load(Ordering::Acquire);
        let parts = slot.parts.load_full();
        let chain = stack::build(&parts, conn, track.clone());
        Live {
            conn,
            track,
            version,
            parts,
            chain,
            fresh: false,
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
        *self = Live::load(slot, self.conn, self.track.clone());
        self.fresh = true;
        true
    }
}

mod asked;
mod clock;
mod dispatch;
mod handler;
mod kinds;
mod tx_lane;

use clock::{backstop, batch_now, record, started, Batch, TurnClock};
use handler::{Handle, HandlerCall};
use kinds::{Cut, Lane};

enum Pending {
    Ready(Reply),
    /// `deadline` is the session's backstop; `idx` the command's index in the counters.
    Wait {
        fut: ChainFuture,
        deadline: Instant,
        idx: u16,
        /// The first argument, for the slow log.
        first: FirstArg,
        /// What it may write (near cache), marked again when it is answered.
        touch: Touch,
    },
    /// Fan-outs, transactions, forwards: a future of its own.
    Other {
        fut: BoxReply,
        deadline: Instant,
        idx: u16,
        /// The first argument, for the slow log.
        first: FirstArg,
        /// What it may write (near cache), marked again when it is answered.
        touch: Touch,
    },
}

impl Pending {
    /// A reply computed by a future of its own, answered by the session at `backstop` at the
    /// latest.
    fn other(fut: BoxReply, backstop: Instant) -> Pending {
        Pending::Other {
            fut,
            deadline: backstop,
            idx: 0,
            first: FirstArg::NONE,
            touch: Touch::None,
        }
    }
}

/// Serves one client until it leaves, sends QUIT, or breaks the protocol.
/// `seq` (this worker's accept count for the listener) picks the session's connection to
/// each endpoint.
/// `stream` is plain TCP or TLS (the session is the same code, monomorphized for each).
pub(crate) async fn serve<S: Io>(mut stream: S, ctx: Arc<ListenerCtx>, seq: usize) {
    let _ = stream.tcp().set_nodelay(true);
    let peer = stream.tcp().peer_addr().ok();
    let local = stream.tcp().local_addr().ok();
    let mut live = Live::load(&ctx.slot, seq, Default::default());
    let listener = live.parts.listener.clone();
    let mut s = Session {
        decoder: RequestDecoder::new(listener.limits),
        // Buffers are allocated by the first read and write, and given back when a burst
        // made them grow: an idle connection costs little.
        rbuf: BytesMut::new(),
        wbuf: OutQueue::default(),
        pending: VecDeque::new(),
        timer: Box::pin(tokio::time::sleep_until(Instant::now())),
        timer_armed: false,
        state: SessionState::new(live.parts.acl.as_deref(), peer, local),
        closing: false,
        eof: false,
        draining: false,
        keys: Vec::new(),
        keys_found: Ok(()),
        touch: Touch::None,
        tx_touch: Touch::None,
        ready_bytes: 0,
        waits: 0,
        avg_reply: 64,
        window: WINDOW_START,
        stall_timer: None,
        tx: None,
        lane: Lane::Local,
        pins: 0,
        stashed: None,
        lookup: None,
        asked: None,
        frame: None,
        sub: None,
        tarpit: false,
        track_next: false,
        after: None,
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
    stream.close();
}

struct Session {
    decoder: RequestDecoder,
    rbuf: BytesMut,
    /// Replies to write: small ones copied together, large ones (≥ 32 KiB) as the upstream
    /// read them.
    wbuf: OutQueue,
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
    /// The key positions of the command being dispatched, found once (see `dispatch`) for the
    /// ACL check, the chain, transactions and blocking commands; `keys_found` is `Err` with
    /// Redis's text when they cannot be found (a bad numkeys, ...).
    keys: Vec<usize>,
    keys_found: Result<(), &'static str>,
    /// What the command being dispatched may write, for the near cache (see
    /// `near_cache::dispatched`): moved into its pending reply, marked again when it is
    /// answered.
    touch: Touch,
    /// What the commands queued by `MULTI` may write, marked again when `EXEC` is answered.
    tx_touch: Touch,
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
    /// The transaction in progress (`WATCH` or `MULTI` seen).
    tx: Option<Tx>,
    /// The lane of the commands in flight.
    lane: Lane,
    /// Transactions pinned so far (names their lanes).
    pins: u64,
    /// A decoded command waiting for the commands in flight on another lane.
    stashed: Option<(Vec<Bytes>, Option<Bytes>)>,
    /// A command whose keys a shard is asked for (`asked.rs`): nothing is decoded meanwhile.
    lookup: Option<Box<asked::Lookup>>,
    /// The keys a shard named for the stashed command, or the reply saying why it named none.
    asked: Option<Result<Vec<usize>, Reply>>,
    /// The frame of the command being dispatched, as the client sent it (see
    /// `RequestDecoder::decode_frame`): `forward` hands it on with the arguments.
    frame: Option<Bytes>,
    /// Pub/sub subscriptions, from the first `(P|S)SUBSCRIBE` on.
    sub: Option<Box<pubsub::Subscriber>>,
    /// A failed `AUTH` is answered late: nothing more is decoded until it is.
    tarpit: bool,
    /// Client-side caching: the command being dispatched goes to be followed upstream.
    track_next: bool,
    /// Client-side caching: what to write right after the reply of the command being
    /// dispatched (an invalidation push).
    after: Option<Bytes>,
}

impl Session {
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        stream: &mut impl Io,
        live: &mut Live,
        ctx: &ListenerCtx,
    ) -> Poll<io::Result<()>> {
        let limits = &live.parts.listener.client;
        let (limit, hard, stall) = (
            limits.buffer_limit,
            limits.buffer_hard_limit,
            limits.stall_timeout,
        );
        // Set when the front's future answered `Pending` during this call: it has registered
        // the task's waker (a future's contract), so polling it again in a later turn of this
        // loop, before that wake, only repeats its work through every layer of the chain.
        let mut front_waits = false;
        loop {
            let mut progress = match self.read_and_dispatch(cx, stream, live, ctx, limit) {
                ControlFlow::Continue(p) => p,
                ControlFlow::Break(end) => return Poll::Ready(end),
            };
            match self.move_replies(cx, live, ctx, limit, hard, &mut front_waits) {
                ControlFlow::Continue(p) => progress |= p,
                ControlFlow::Break(end) => return Poll::Ready(end),
            }
            // 2a. Client-side caching: announcements, after the replies owed now.
            if self.state.tracking.is_some() {
                progress |= self.announce(cx);
            }
            // 2b. Pub/sub messages, once every confirmation before them is written.
            if let Some(sub) = self.sub.as_mut().filter(|s| s.confirming == 0) {
                match sub.drain(cx, &mut self.wbuf.buf, self.state.resp3, DRAIN_MAX) {
                    Ok(moved) => progress |= moved,
                    Err(n) => return Poll::Ready(Err(self.cut(ctx, Cut::Subscriber(n)))),
                }
            }
            match self.write_ready(cx, stream, ctx, limit, stall) {
                ControlFlow::Continue(p) => progress |= p,
                ControlFlow::Break(end) => return Poll::Ready(end),
            }
            if self.wbuf.is_empty()
                && !stream.pending_out()
                && self.pending.is_empty()
                && (self.stashed.is_none() || self.closing)
                && self.lookup.is_none()
                && (self.closing || self.eof || self.draining)
            {
                return Poll::Ready(Ok(()));
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    /// Step 1: reads what the client sent and dispatches it, while the client may have more
    /// outstanding and the bytes held for it stay under its bound. `Continue(progress)`, or
    /// `Break` with how the session ends.
    #[inline(always)]
    fn read_and_dispatch(
        &mut self,
        cx: &mut Context<'_>,
        stream: &mut impl Io,
        live: &mut Live,
        ctx: &ListenerCtx,
        limit: usize,
    ) -> ControlFlow<io::Result<()>, bool> {
        let mut progress = self.lookup.is_some() && self.poll_lookup(cx);
        let max = live.parts.listener.max_pending_per_client.min(self.window);
        if !self.closing
            && !self.eof
            && !self.draining
            && self.pending.len() < max
            && self.held() < limit
            && stream.poll_read_ready(cx).is_ready()
        {
            if let ControlFlow::Break(end) = self.read_some(stream, ctx) {
                return ControlFlow::Break(end);
            }
            progress = true;
        }
        if (!self.rbuf.is_empty() || self.stashed.is_some())
            && !self.closing
            && live.refresh(&ctx.slot, self.waits > 0)
            && self.rebind(live)
        {
            let before = self.pending.len();
            self.decode_all(live, ctx, max, limit);
            let n = self.pending.len() - before;
            if n > 0 {
                crate::stats::bump(&ctx.stats.pipeline[crate::stats::pipeline_bucket(n)], 1);
                progress = true;
            }
        }
        // Everything read was decoded: the buffer goes back to the worker's spares.
        if self.rbuf.is_empty() && self.rbuf.capacity() > 0 {
            spare::give(std::mem::take(&mut self.rbuf));
        }
        ControlFlow::Continue(progress)
    }

    /// One read from a socket that is ready, into the read buffer (progress either way).
    #[inline(always)]
    fn read_some(
        &mut self,
        stream: &mut impl Io,
        ctx: &ListenerCtx,
    ) -> ControlFlow<io::Result<()>> {
        // An idle connection holds no read buffer: it takes one of the worker's
        // spares (see `spare`); with none, the first read goes to the stack, and the
        // buffer is allocated once bytes arrived.
        const FIRST: usize = 512;
        if self.rbuf.capacity() == 0 {
            self.rbuf = spare::take();
        }
        let unallocated = self.rbuf.capacity() == 0;
        // A large argument whose length the decoder has read (a 1 MiB SET value) gets
        // room for all of it at once: one allocation and one copy of what arrived so
        // far, instead of one per doubling. Capacity not written yet costs no memory.
        let ahead = match self.decoder.bulk_end_hint() {
            Some(end) if !unallocated && end > self.rbuf.capacity() => {
                (end - self.rbuf.len()).min(MAX_AHEAD)
            }
            _ => 0,
        };
        if ahead > 0 {
            self.rbuf.reserve(ahead);
        } else if !unallocated && self.rbuf.capacity() - self.rbuf.len() < 1024 {
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
                // A client that leaves while blocked (BLPOP ...) ends the session at
                // once, as in Redis: dropping the command's future closes its
                // dedicated connection, so nothing is popped for nobody.
                if self.lane == Lane::Blocking && self.waits > 0 {
                    return ControlFlow::Break(Ok(()));
                }
            }
            Ok(n) => {
                crate::stats::bump(&ctx.stats.bytes_in, n as u64);
                // A short read drained the socket: skip the read that would only
                // return EAGAIN (see `upstream::clear_read_readiness`).
                if n < spare {
                    stream.drained();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return ControlFlow::Break(Err(e)),
        }
        ControlFlow::Continue(())
    }

    /// Step 2: moves finished replies, oldest first, into the write buffer.
    #[inline(always)]
    fn move_replies(
        &mut self,
        cx: &mut Context<'_>,
        live: &Live,
        ctx: &ListenerCtx,
        limit: usize,
        hard: usize,
        front_waits: &mut bool,
    ) -> ControlFlow<io::Result<()>, bool> {
        let mut progress = false;
        // 2. Move finished replies, oldest first, into the write buffer (the clock is
        //    read once per turn, for the latency of the replies it completes).
        let mut now = TurnClock::new(&ctx.stats.cmds);
        if self.wbuf.buf.capacity() == 0 && (!self.pending.is_empty() || self.sub.is_some()) {
            self.wbuf.buf = spare::take();
        }
        while let Some(front) = self.pending.front_mut() {
            let reply = match front {
                Pending::Ready(_) => match self.pending.pop_front() {
                    Some(Pending::Ready(r)) => {
                        self.ready_bytes -= r.len();
                        r
                    }
                    _ => unreachable!("front was Ready"),
                },
                Pending::Wait { .. } | Pending::Other { .. } if *front_waits => break,
                Pending::Wait { deadline, idx, .. } | Pending::Other { deadline, idx, .. } => {
                    let (deadline, idx) = (*deadline, *idx);
                    let polled = match front {
                        Pending::Wait { fut, .. } => Pin::new(fut).poll(cx),
                        Pending::Other { fut, .. } => fut.as_mut().poll(cx),
                        Pending::Ready(_) => unreachable!("front waits"),
                    };
                    match polled {
                        Poll::Ready(answer) => {
                            if let Pending::Wait { touch, .. } | Pending::Other { touch, .. } =
                                front
                            {
                                touch.again();
                            }
                            // The one place a failure becomes bytes: the reply written.
                            let r = answer.unwrap_or_else(|f| f.to_reply());
                            if let Some(us) = record(ctx, live, &mut now, idx, deadline, &r) {
                                // Slow: the entry is still at the front.
                                let first = match self.pending.front() {
                                    Some(
                                        Pending::Wait { first, .. } | Pending::Other { first, .. },
                                    ) => *first,
                                    _ => FirstArg::NONE,
                                };
                                self.log_slow_reply(ctx, live, idx, us, deadline, &r, first);
                            }
                            self.pending.pop_front();
                            self.waits -= 1;
                            self.confirmed(idx);
                            self.avg_reply = (self.avg_reply * 7 + r.len()) / 8;
                            if self.held() + r.len() < limit {
                                self.window = self.window.saturating_add(1);
                            } else {
                                self.window = (self.window / 2).max(1);
                            }
                            r
                        }
                        Poll::Pending => {
                            if self.poll_timeout(cx, deadline) {
                                self.pending.pop_front();
                                self.waits -= 1;
                                self.confirmed(idx);
                                ctx.stats.timeouts.inc();
                                error_reply("ERR respway: upstream timeout")
                            } else {
                                *front_waits = true;
                                break;
                            }
                        }
                    }
                }
            };
            self.wbuf.push(&reply);
            progress = true;
            if self.wbuf.len() > hard {
                return ControlFlow::Break(Err(self.cut(ctx, Cut::HardLimit(self.wbuf.len()))));
            }
        }

        // Counted before any of these replies is written (a client that reads its reply
        // and then scrapes the metrics finds it counted).
        drop(now);
        ControlFlow::Continue(progress)
    }

    /// Step 3: writes what is ready, and disconnects a client held at its bound that reads
    /// nothing for the stall timeout.
    #[inline(always)]
    fn write_ready(
        &mut self,
        cx: &mut Context<'_>,
        stream: &mut impl Io,
        ctx: &ListenerCtx,
        limit: usize,
        stall: std::time::Duration,
    ) -> ControlFlow<io::Result<()>, bool> {
        let mut progress = false;
        // 3. Write what is ready, in as few syscalls as possible.
        let mut blocked = false;
        let mut took = false;
        // (TLS: records rustls holds once `wbuf` is empty are written too.)
        while !self.wbuf.is_empty() || stream.pending_out() {
            match stream.poll_write_ready(cx) {
                Poll::Ready(Ok(())) => match stream.try_write(self.wbuf.front()) {
                    Ok(n) => {
                        self.wbuf.advance(n);
                        crate::stats::bump(&ctx.stats.bytes_out, n as u64);
                        took = true;
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return ControlFlow::Break(Err(e)),
                },
                Poll::Ready(Err(e)) => return ControlFlow::Break(Err(e)),
                Poll::Pending => {
                    blocked = true;
                    break;
                }
            }
        }
        // Everything was written: the buffer goes back to the worker's spares.
        if self.wbuf.is_empty() && self.wbuf.buf.capacity() > 0 {
            spare::give(std::mem::take(&mut self.wbuf.buf));
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
                return ControlFlow::Break(Err(self.cut(ctx, Cut::Stalled(self.held()))));
            }
        } else if self.stall_timer.is_some() {
            self.stall_timer = None;
        }
        ControlFlow::Continue(progress)
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
            Cut::Subscriber(n) => format!(
                "subscriber's messages over pubsub_buffer_limit ({n} bytes queued): \
                 connection closed"
            ),
        };
        tracing::warn!(client_id = self.state.id, "{text}");
        io::Error::other(text)
    }

    /// The lane `args` would travel on.
    fn lane_of(&self, cmd: Option<&'static command::CommandInfo>) -> Lane {
        let Some(cmd) = cmd else {
            return Lane::Local;
        };
        let in_multi = self.tx.as_ref().is_some_and(|t| t.multi);
        match stack::handler(cmd, in_multi) {
            Handler::Transaction => Lane::Dedicated(self.pins),
            Handler::Local(ProxyCommand::Command | ProxyCommand::Info) => {
                Lane::Shared(self.state.flavor())
            }
            Handler::Local(_) | Handler::Acl | Handler::Unsupported => Lane::Local,
            Handler::Blocking | Handler::Wait => Lane::Blocking,
            Handler::Chain | Handler::PubSub(_) | Handler::Keyspace(_) | Handler::Fanout(_) => {
                Lane::Shared(self.state.flavor())
            }
        }
    }

    fn decode_all(&mut self, live: &mut Live, ctx: &ListenerCtx, max: usize, limit: usize) {
        let _batch = Batch::start();
        if self.tarpit {
            if self.waits > 0 {
                return;
            }
            self.tarpit = false;
        }
        while self.pending.len() < max && self.held() < limit && self.lookup.is_none() {
            let decoded = match self.stashed.take() {
                Some(cmd) => Ok(Some(cmd)),
                None => self.decoder.decode_frame(&mut self.rbuf),
            };
            match decoded {
                Ok(Some((args, frame))) => {
                    // Looked up once; dispatch uses the same entry.
                    // A command the built-in table lacks may be one the shards taught.
                    let top =
                        command::lookup(&args[0]).or_else(|| live.parts.learned.lookup(&args[0]));
                    let cmd = top.map(|c| c.resolve(&args));
                    // Keys only a shard can name: asked for before anything else happens.
                    if let Some(c) = cmd.filter(|c| self.must_ask(c, &args)) {
                        self.ask_keys(c, args, frame, live);
                        return;
                    }
                    let lane = self.lane_of(cmd);
                    // A transaction that starts pins a new connection: its lane is the next.
                    let lane = match lane {
                        Lane::Dedicated(_)
                            if self.tx.as_ref().is_none_or(|t| t.pinned.is_none()) =>
                        {
                            Lane::Dedicated(self.pins + 1)
                        }
                        l => l,
                    };
                    if lane != Lane::Local
                        && (lane != self.lane || lane == Lane::Blocking)
                        && self.waits > 0
                    {
                        self.stashed = Some((args, frame));
                        return;
                    }
                    ctx.stats.commands.inc();
                    let first_arg = FirstArg::of(args.get(1));
                    self.frame = frame;
                    let mut p = self.dispatch(cmd, args, live, ctx);
                    self.frame = None;
                    let index = crate::stats::index_of(top);
                    let mut touch = std::mem::take(&mut self.touch);
                    if !matches!(touch, Touch::None) || !matches!(self.tx_touch, Touch::None) {
                        if self.tx.as_ref().is_some_and(|t| t.multi) {
                            // Queued by MULTI: marked again when EXEC is answered.
                            self.tx_touch.merge(touch.clone());
                        } else if !matches!(self.tx_touch, Touch::None) {
                            // The transaction ended (EXEC, DISCARD, or refused): EXEC's reply
                            // marks its commands' keys again.
                            let queued = std::mem::take(&mut self.tx_touch);
                            if cmd.is_some_and(|c| c.name == "exec") {
                                touch.merge(queued);
                            }
                        }
                    }
                    match &mut p {
                        Pending::Ready(r) => {
                            self.ready_bytes += r.len();
                            ctx.stats.cmds.record(index, 0, is_error(r));
                            // Answered already: a write it made (none, as a rule) is marked.
                            touch.again();
                        }
                        Pending::Wait {
                            idx,
                            first,
                            touch: t,
                            ..
                        }
                        | Pending::Other {
                            idx,
                            first,
                            touch: t,
                            ..
                        } => {
                            *t = touch;
                            *idx = index;
                            *first = first_arg;
                            self.waits += 1;
                            self.lane = match lane {
                                Lane::Dedicated(_) => Lane::Dedicated(self.pins),
                                l => l,
                            };
                        }
                    }
                    self.pending.push_back(p);
                    if let Some(a) = self.after.take() {
                        self.ready_bytes += a.len();
                        self.pending.push_back(Pending::Ready(a));
                    }
                    if self.closing || self.tarpit {
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
}
