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
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use respway_filters::acl::Denied;
use respway_filters::command::{self, CommandClass, ProxyCommand};
use respway_filters::model::ProtocolMode;
use respway_filters::place::Refusal;
use respway_filters::request::{error_reply, is_error, Flavor, Reply, Request};
use respway_filters::resp::RequestDecoder;
use tokio::time::{Instant, Sleep};
use tower::Service;

use crate::fanout::{self, BoxReply};
use crate::listener::{ListenerCtx, ListenerSlot};
use crate::local::{self, Local, SessionState};
use crate::metrics;
use crate::outq::OutQueue;
use crate::pubsub;
use crate::slowlog::FirstArg;
use crate::spare;
use crate::stack::{self, Chain, ChainFuture, Parts};
use crate::tls::Io;
use crate::tx::{self, Pinned, Tx};

const READ_CHUNK: usize = 16 * 1024;
/// How long past its upstream deadline (and `op_timeout` more) a request may wait before the
/// session answers it itself: covers a reconnect after a stuck connection.
const BACKSTOP: std::time::Duration = std::time::Duration::from_secs(1);
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
    version: u64,
    parts: Arc<Parts>,
    chain: Chain,
    /// Loaded by the last `refresh`: the session rebinds its user to the new ACL.
    fresh: bool,
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
        *self = Live::load(slot, self.conn);
        self.fresh = true;
        true
    }
}

/// The clock of one turn of the session's reply loop: read at most once, for the latency of
/// the replies the turn completes, and the run of replies of one command and one backstop
/// (dispatched from one read) not yet counted: counted when the run ends or the turn is
/// dropped, so that a pipeline of GETs costs one subtraction and one counter update per run.
struct TurnClock<'a> {
    now: Option<Instant>,
    stats: &'a metrics::CommandStats,
    run: Run,
}

/// Replies of command `idx` whose session backstop is `backstop`, `us` each; `n == 0`: none.
struct Run {
    idx: u16,
    backstop: Instant,
    us: u64,
    n: u64,
    failed: u64,
}

impl<'a> TurnClock<'a> {
    fn new(stats: &'a metrics::CommandStats) -> Self {
        // Any instant will do while the run is empty: one read once per process, not a clock
        // read per turn.
        static ANY: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let any = *ANY.get_or_init(Instant::now);
        TurnClock {
            now: None,
            stats,
            run: Run {
                idx: 0,
                backstop: any,
                us: 0,
                n: 0,
                failed: 0,
            },
        }
    }

    /// Counts one reply of command `idx` dispatched with `backstop`; its latency in µs.
    #[inline(always)]
    fn count(&mut self, live: &Live, idx: u16, backstop: Instant, failed: bool) -> u64 {
        let r = &self.run;
        if r.n == 0 || r.idx != idx || r.backstop != backstop {
            self.flush();
            let now = *self.now.get_or_insert_with(Instant::now);
            self.run = Run {
                idx,
                backstop,
                us: now
                    .saturating_duration_since(started(live, backstop))
                    .as_micros() as u64,
                n: 0,
                failed: 0,
            };
        }
        let r = &mut self.run;
        r.n += 1;
        r.failed += u64::from(failed);
        r.us
    }

    fn flush(&mut self) {
        let r = &self.run;
        if r.n > 0 {
            self.stats.record_n(r.idx, r.us, r.n, r.failed);
        }
    }
}

impl Drop for TurnClock<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// When the session answers a command whose upstream deadline is `deadline` itself, if
/// nothing did: after the latest moment the upstream may answer it (see
/// [`crate::upstream::STRETCH`]).
fn backstop(deadline: Instant, op: std::time::Duration) -> Instant {
    deadline + op * crate::upstream::STRETCH + BACKSTOP
}

/// When a command whose session backstop is `backstop` was dispatched (the backstop less the
/// spans added to it there).
fn started(live: &Live, backstop: Instant) -> Instant {
    let op = live.parts.listener.op_timeout;
    backstop
        .checked_sub(op + op * crate::upstream::STRETCH + BACKSTOP)
        .unwrap_or(backstop)
}

/// Counts a reply that came from upstream (or a future): its latency runs from dispatch
/// (see [`started`]). `Some(µs)` when it is slow enough for the slow log.
#[inline(always)]
fn record(
    ctx: &ListenerCtx,
    live: &Live,
    clock: &mut TurnClock<'_>,
    idx: u16,
    backstop: Instant,
    reply: &[u8],
) -> Option<u64> {
    let us = clock.count(live, idx, backstop, is_error(reply));
    (us >= ctx.stats.slow.threshold_us()).then_some(us)
}

thread_local! {
    /// While a session dispatches the commands of one read (`Batch`): whether the clock may
    /// be cached, and its reading.
    static BATCH_NOW: std::cell::Cell<(bool, Option<Instant>)> =
        const { std::cell::Cell::new((false, None)) };
}

/// Now, read once for all the commands dispatched from one client read (their deadlines then
/// differ by the microseconds the dispatch takes, not by a clock read each); outside a
/// [`Batch`], the clock itself.
fn batch_now() -> Instant {
    BATCH_NOW.with(|c| match c.get() {
        (true, Some(t)) => t,
        (true, None) => {
            let t = Instant::now();
            c.set((true, Some(t)));
            t
        }
        (false, _) => Instant::now(),
    })
}

/// The span of one `decode_all` on this thread: [`batch_now`] caches the clock until it
/// ends (a dispatch never awaits, so no other session runs meanwhile).
struct Batch;

impl Batch {
    fn start() -> Batch {
        BATCH_NOW.with(|c| c.set((true, None)));
        Batch
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        BATCH_NOW.with(|c| c.set((false, None)));
    }
}

enum Pending {
    Ready(Reply),
    /// `deadline` is the session's backstop; `idx` the command's index in the counters.
    Wait {
        fut: ChainFuture,
        deadline: Instant,
        idx: u16,
        /// The first argument, for the slow log.
        first: FirstArg,
    },
    /// Fan-outs, transactions, forwards: a future of its own.
    Other {
        fut: BoxReply,
        deadline: Instant,
        idx: u16,
        /// The first argument, for the slow log.
        first: FirstArg,
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
        }
    }
}

/// Which connections a command travels on. A session's commands on one lane keep their
/// order (one connection per endpoint); before a command goes on another lane, the session
/// waits until what it has in flight is answered, so it cannot pass them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Answered by the proxy.
    Local,
    /// The shared connections of this protocol and database.
    Shared(Flavor),
    /// The dedicated connection of the session's n-th transaction.
    Dedicated(u64),
    /// A dedicated connection of a blocking command: a new one for each, so that each
    /// waits for every command before it, and every command after it waits for it.
    Blocking,
}

/// Serves one client until it leaves, sends QUIT, or breaks the protocol.
/// `seq` (this worker's accept count for the listener) picks the session's connection to
/// each endpoint.
/// `stream` is plain TCP or TLS (the session is the same code, monomorphized for each).
pub(crate) async fn serve<S: Io>(mut stream: S, ctx: Arc<ListenerCtx>, seq: usize) {
    let _ = stream.tcp().set_nodelay(true);
    let peer = stream.tcp().peer_addr().ok();
    let mut live = Live::load(&ctx.slot, seq);
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
        state: SessionState::new(live.parts.acl.as_deref(), peer),
        closing: false,
        eof: false,
        draining: false,
        keys: Vec::new(),
        ready_bytes: 0,
        waits: 0,
        avg_reply: 64,
        window: WINDOW_START,
        stall_timer: None,
        tx: None,
        lane: Lane::Local,
        pins: 0,
        stashed: None,
        frame: None,
        sub: None,
        tarpit: false,
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
    /// The transaction in progress (`WATCH` or `MULTI` seen).
    tx: Option<Tx>,
    /// The lane of the commands in flight.
    lane: Lane,
    /// Transactions pinned so far (names their lanes).
    pins: u64,
    /// A decoded command waiting for the commands in flight on another lane.
    stashed: Option<(Vec<Bytes>, Option<Bytes>)>,
    /// The frame of the command being dispatched, as the client sent it (see
    /// `RequestDecoder::decode_frame`): `forward` hands it on with the arguments.
    frame: Option<Bytes>,
    /// Pub/sub subscriptions, from the first `(P|S)SUBSCRIBE` on.
    sub: Option<Box<pubsub::Subscriber>>,
    /// A failed `AUTH` is answered late: nothing more is decoded until it is.
    tarpit: bool,
}

/// Why a session ends on its own.
#[derive(Debug)]
enum Cut {
    /// More reply bytes held than the hard limit.
    HardLimit(usize),
    /// Held at the limit, nothing read by the client for the stall timeout.
    Stalled(usize),
    /// A subscriber's queued messages would pass `pubsub_buffer_limit`.
    Subscriber(usize),
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
                        progress = true;
                        // A client that leaves while blocked (BLPOP ...) ends the session at
                        // once, as in Redis: dropping the command's future closes its
                        // dedicated connection, so nothing is popped for nobody.
                        if self.lane == Lane::Blocking && self.waits > 0 {
                            return Poll::Ready(Ok(()));
                        }
                    }
                    Ok(n) => {
                        crate::stats::bump(&ctx.stats.bytes_in, n as u64);
                        // A short read drained the socket: skip the read that would only
                        // return EAGAIN (see `upstream::clear_read_readiness`).
                        if n < spare {
                            stream.drained();
                        }
                        progress = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => progress = true,
                    Err(e) => return Poll::Ready(Err(e)),
                }
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
                    Pending::Wait { .. } | Pending::Other { .. } if front_waits => break,
                    Pending::Wait { deadline, idx, .. } | Pending::Other { deadline, idx, .. } => {
                        let (deadline, idx) = (*deadline, *idx);
                        let polled = match front {
                            Pending::Wait { fut, .. } => match Pin::new(fut).poll(cx) {
                                Poll::Ready(Ok(r)) => Poll::Ready(r),
                                Poll::Ready(Err(never)) => match never {},
                                Poll::Pending => Poll::Pending,
                            },
                            Pending::Other { fut, .. } => fut.as_mut().poll(cx),
                            Pending::Ready(_) => unreachable!("front waits"),
                        };
                        match polled {
                            Poll::Ready(r) => {
                                if let Some(us) = record(ctx, live, &mut now, idx, deadline, &r) {
                                    // Slow: the entry is still at the front.
                                    let first = match self.pending.front() {
                                        Some(
                                            Pending::Wait { first, .. }
                                            | Pending::Other { first, .. },
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
                                    front_waits = true;
                                    break;
                                }
                            }
                        }
                    }
                };
                self.wbuf.push(&reply);
                progress = true;
                if self.wbuf.len() > hard {
                    return Poll::Ready(Err(self.cut(ctx, Cut::HardLimit(self.wbuf.len()))));
                }
            }

            // Counted before any of these replies is written (a client that reads its reply
            // and then scrapes the metrics finds it counted).
            drop(now);

            // 2b. Pub/sub messages, once every confirmation before them is written.
            if let Some(sub) = self.sub.as_mut().filter(|s| s.confirming == 0) {
                match sub.drain(cx, &mut self.wbuf.buf, self.state.resp3, DRAIN_MAX) {
                    Ok(moved) => progress |= moved,
                    Err(n) => return Poll::Ready(Err(self.cut(ctx, Cut::Subscriber(n)))),
                }
            }

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
                        Err(e) => return Poll::Ready(Err(e)),
                    },
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
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
                    return Poll::Ready(Err(self.cut(ctx, Cut::Stalled(self.held()))));
                }
            } else if self.stall_timer.is_some() {
                self.stall_timer = None;
            }
            if self.wbuf.is_empty()
                && !stream.pending_out()
                && self.pending.is_empty()
                && (self.stashed.is_none() || self.closing)
                && (self.closing || self.eof || self.draining)
            {
                return Poll::Ready(Ok(()));
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    /// Logs a slow reply (see [`record`]) with its upstream time, when the upstream noted it.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn log_slow_reply(
        &self,
        ctx: &ListenerCtx,
        live: &Live,
        idx: u16,
        us: u64,
        backstop: Instant,
        reply: &[u8],
        first: FirstArg,
    ) {
        let upstream = crate::slowlog::take_upstream(reply, started(live, backstop));
        self.log_slow(ctx, live, idx, us, first, upstream);
    }

    /// Adds a slow command to the slow log, with the cluster and shard its key routes to.
    #[cold]
    fn log_slow(
        &self,
        ctx: &ListenerCtx,
        live: &Live,
        idx: u16,
        us: u64,
        arg: FirstArg,
        upstream: Option<(std::net::SocketAddr, u64)>,
    ) {
        let first = arg.to_bytes();
        let top = command::all().get(usize::from(idx));
        let name = top.map_or("other", |c| c.name);
        let keyed = top.is_some_and(|c| c.keys != command::KeySpec::None);
        let routing = &live.parts.routing;
        // Only a key kept whole can be routed (a longer one shows no target).
        let target = arg.whole().filter(|_| keyed).and_then(|k| {
            let p = routing.place_key(k)?;
            let c = routing.clusters.get(p.cluster)?;
            Some(format!(
                "{}/{}",
                c.name,
                c.shards.get(p.shard).map_or("?", |s| s.name.as_str())
            ))
        });
        ctx.stats.slow.push(crate::slowlog::Entry {
            id: 0,
            time: 0,
            duration_us: us,
            args: crate::slowlog::kept_args(name, first.as_ref()),
            client: self.state.peer,
            name: self.state.name.clone(),
            target,
            upstream,
        });
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

    /// The lane `args` would travel on.
    fn lane_of(&self, cmd: Option<&'static command::CommandInfo>) -> Lane {
        let Some(cmd) = cmd else {
            return Lane::Local;
        };
        let in_multi = self.tx.as_ref().is_some_and(|t| t.multi);
        match cmd.class {
            CommandClass::Transaction => Lane::Dedicated(self.pins),
            _ if in_multi => Lane::Dedicated(self.pins),
            CommandClass::Proxy(ProxyCommand::Command | ProxyCommand::Info) => {
                Lane::Shared(self.state.flavor())
            }
            CommandClass::Proxy(_) | CommandClass::Unsupported => Lane::Local,
            CommandClass::Blocking => Lane::Blocking,
            _ => Lane::Shared(self.state.flavor()),
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
        while self.pending.len() < max && self.held() < limit {
            let decoded = match self.stashed.take() {
                Some(cmd) => Ok(Some(cmd)),
                None => self.decoder.decode_frame(&mut self.rbuf),
            };
            match decoded {
                Ok(Some((args, frame))) => {
                    // Looked up once; dispatch uses the same entry.
                    let top = command::lookup(&args[0]);
                    let cmd = top.map(|c| c.resolve(&args));
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
                    let index = metrics::index_of(top);
                    match &mut p {
                        Pending::Ready(r) => {
                            self.ready_bytes += r.len();
                            ctx.stats.cmds.record(index, 0, is_error(r));
                        }
                        Pending::Wait { idx, first, .. } | Pending::Other { idx, first, .. } => {
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

    fn dispatch(
        &mut self,
        cmd: Option<&'static command::CommandInfo>,
        args: Vec<Bytes>,
        live: &mut Live,
        ctx: &ListenerCtx,
    ) -> Pending {
        let in_multi = self.tx.as_ref().is_some_and(|t| t.multi);
        let Some(cmd) = cmd else {
            self.mark_dirty();
            return Pending::Ready(local::unknown_command(&args));
        };
        if self.sub.as_ref().is_some_and(|s| s.active())
            && !self.state.resp3
            && !pubsub::allowed_when_subscribed(cmd)
        {
            return Pending::Ready(error_reply(&format!(
                "ERR Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / \
                 RESET are allowed in this context",
                cmd.name
            )));
        }
        if !cmd.arity_ok(args.len()) {
            self.mark_dirty();
            return Pending::Ready(error_reply(&format!(
                "ERR wrong number of arguments for '{}' command",
                cmd.name
            )));
        }
        // AUTH, HELLO and QUIT are served before authentication and before HELLO 3.
        let handshake = matches!(
            cmd.class,
            CommandClass::Proxy(ProxyCommand::Auth | ProxyCommand::Hello | ProxyCommand::Quit)
        );
        if !self.state.authenticated && !handshake {
            self.mark_dirty();
            return Pending::Ready(error_reply("NOAUTH Authentication required."));
        }
        // Users with permissions to check (none without ACL users): before anything is
        // dispatched or queued in MULTI.
        if let Some(p) = &self.state.perms {
            let scripts = live.parts.listener.client.allow_restricted_scripts;
            let checked = p.check(cmd, &args, &mut self.keys).and_then(|()| {
                match scripts || p.allows_script(cmd) {
                    true => Ok(()),
                    false => Err(Denied::Script),
                }
            });
            if let Err(d) = checked {
                self.mark_dirty();
                return Pending::Ready(crate::acl::denied(d, self.state.user_name(), cmd));
            }
        }
        if live.parts.listener.resp.protocol == ProtocolMode::Resp3
            && !self.state.resp3
            && !handshake
        {
            return Pending::Ready(error_reply(
                "NOPROTO this listener speaks RESP3 only: send HELLO 3 first",
            ));
        }
        let op_timeout = live.parts.listener.op_timeout;
        // The clock is read only for commands that go upstream: the reply's deadline, and the
        // session's backstop after it.
        let times = || {
            let deadline = batch_now() + op_timeout;
            (deadline, backstop(deadline, op_timeout))
        };
        // SORT's BY and GET patterns read keys on the sorted key's shard: refused when the
        // keys they form may live elsewhere (they would read as missing), as Redis Cluster
        // refuses them.
        if matches!(cmd.name, "sort" | "sort_ro") {
            if let Err(msg) = respway_filters::sort_patterns::check(&args, &live.parts.routing) {
                self.mark_dirty();
                return Pending::Ready(error_reply(msg));
            }
        }
        // FCALL with a numkeys that is not a count of its keys: Redis looks the function up
        // first, so only a shard can give its error (`Function not found`, or `Bad number of
        // keys provided`, ...). Nothing runs: the command has no keys to route by.
        if !in_multi
            && matches!(cmd.name, "fcall" | "fcall_ro")
            && cmd.key_indices(&args, &mut self.keys).is_err()
        {
            let (deadline, backstop) = times();
            let flavor = self.state.flavor();
            return Pending::other(
                fanout::one(args, &live.parts, flavor, live.conn, deadline),
                backstop,
            );
        }
        if in_multi || cmd.class == CommandClass::Transaction {
            return self.dispatch_tx(cmd, args, live, ctx, times().0);
        }
        let flavor = self.state.flavor();
        match cmd.class {
            CommandClass::Proxy(p) => {
                if p == ProxyCommand::Reset {
                    self.tx = None;
                    self.sub = None;
                }
                if p == ProxyCommand::Ping
                    && !self.state.resp3
                    && self.sub.as_ref().is_some_and(|s| s.active())
                {
                    // Subscriber mode (RESP2): PING answers ["pong", message].
                    let msg = args.get(1).cloned().unwrap_or_default();
                    let f = respway_filters::resp::Frame::Array(vec![
                        respway_filters::resp::Frame::Bulk(Bytes::from_static(b"pong")),
                        respway_filters::resp::Frame::Bulk(msg),
                    ]);
                    return Pending::Ready(f.to_bytes());
                }
                if self.tx.is_some() && matches!(p, ProxyCommand::Select | ProxyCommand::Hello) {
                    return Pending::Ready(error_reply(&format!(
                        "ERR respway: {} is not allowed while a WATCH is active (the transaction's connection keeps its protocol and database)",
                        cmd.name.to_ascii_uppercase()
                    )));
                }
                let databases = live.parts.databases;
                match local::handle(
                    p,
                    &args,
                    &mut self.state,
                    ctx,
                    &live.parts.listener,
                    live.parts.acl.as_deref(),
                    databases,
                ) {
                    Local::Reply(r) => Pending::Ready(r),
                    Local::ReplyAndClose(r) => {
                        self.closing = true;
                        Pending::Ready(r)
                    }
                    Local::Late {
                        reply,
                        delay,
                        close,
                    } => {
                        // Nothing more is read until it is answered (see `decode_all`).
                        self.closing |= close;
                        self.tarpit = true;
                        let at = Instant::now() + delay;
                        Pending::other(
                            Box::pin(async move {
                                tokio::time::sleep_until(at).await;
                                reply
                            }),
                            backstop(at, op_timeout),
                        )
                    }
                    Local::Forward => {
                        let (deadline, backstop) = times();
                        Pending::other(
                            fanout::one(args, &live.parts, flavor, live.conn, deadline),
                            backstop,
                        )
                    }
                    Local::InfoWithKeyspace(text) => {
                        let (deadline, backstop) = times();
                        Pending::other(
                            fanout::info_with_keyspace(
                                text,
                                self.state.resp3,
                                &live.parts,
                                flavor,
                                live.conn,
                                deadline,
                            ),
                            backstop,
                        )
                    }
                }
            }
            CommandClass::Fanout(kind) => {
                let (deadline, backstop) = times();
                Pending::other(
                    fanout::call(kind, args, &live.parts, flavor, live.conn, deadline),
                    backstop,
                )
            }
            CommandClass::Transaction => unreachable!("handled above"),
            CommandClass::Keyspace(kind) => {
                let (deadline, backstop) = times();
                Pending::other(
                    crate::keyspace::call(kind, args, &live.parts, flavor, live.conn, deadline),
                    backstop,
                )
            }
            CommandClass::Blocking if crate::wait::is_wait(cmd) => {
                match crate::wait::call(cmd, args, &live.parts, flavor, op_timeout) {
                    crate::wait::Call::Wait { fut, backstop } => Pending::other(fut, backstop),
                    crate::wait::Call::Refused(r) => Pending::Ready(r),
                }
            }
            CommandClass::Blocking => {
                if let Err(e) = cmd.key_indices(&args, &mut self.keys) {
                    return Pending::Ready(error_reply(&format!("ERR {e}")));
                }
                match crate::blocking::call(cmd, args, &self.keys, &live.parts, flavor, op_timeout)
                {
                    crate::blocking::Call::Forward(args) => self.forward(cmd, args, live, ctx),
                    crate::blocking::Call::Wait { fut, backstop } => Pending::other(fut, backstop),
                    crate::blocking::Call::Refused(r) => Pending::Ready(r),
                }
            }
            CommandClass::PubSub(kind) => self.dispatch_pubsub(kind, args, live),
            CommandClass::Unsupported if cmd.name == "acl" || cmd.name.starts_with("acl|") => {
                Pending::Ready(local::acl(&args, &self.state, live.parts.acl.as_deref()))
            }
            CommandClass::Unsupported => {
                ctx.stats.unsupported.inc();
                Pending::Ready(error_reply(&format!(
                    "ERR command '{}' is not supported by respway",
                    String::from_utf8_lossy(&args[0])
                )))
            }
            CommandClass::Single | CommandClass::Split(_) | CommandClass::SameShard => {
                self.forward(cmd, args, live, ctx)
            }
        }
    }

    /// After a configuration change: the session's user under the new ACL. False (and the
    /// session closes) when that user was removed or disabled.
    fn rebind(&mut self, live: &mut Live) -> bool {
        if !std::mem::take(&mut live.fresh) {
            return true;
        }
        if self.state.rebind(live.parts.acl.as_deref()) {
            return true;
        }
        tracing::info!(
            client_id = self.state.id,
            user = self.state.user_name(),
            "ACL user removed or disabled by a configuration change: connection closed"
        );
        self.closing = true;
        false
    }

    /// Pub/sub commands (see `pubsub.rs`).
    fn dispatch_pubsub(
        &mut self,
        kind: command::PubSubKind,
        args: Vec<Bytes>,
        live: &mut Live,
    ) -> Pending {
        let op_timeout = live.parts.listener.op_timeout;
        let deadline = Instant::now() + op_timeout;
        let flavor = self.state.flavor();
        match pubsub::call(
            kind,
            args,
            &mut self.sub,
            &live.parts,
            flavor,
            live.conn,
            deadline,
        ) {
            pubsub::Outcome::Ready(r) => Pending::Ready(r),
            pubsub::Outcome::Wait { fut, confirms } => {
                if confirms {
                    if let Some(s) = self.sub.as_mut() {
                        s.confirming += 1;
                    }
                }
                Pending::other(fut, backstop(deadline, op_timeout))
            }
        }
    }

    /// A reply of command `idx` left `pending`: if it confirmed subscriptions, messages may
    /// follow it.
    fn confirmed(&mut self, idx: u16) {
        if let Some(s) = self.sub.as_mut() {
            if s.confirming > 0 && pubsub::confirms(idx) {
                s.confirming -= 1;
            }
        }
    }

    /// Sends a command with keys down the chain (route, mirror, hot key, split, hash, zone,
    /// upstream).
    fn forward(
        &mut self,
        cmd: &'static command::CommandInfo,
        args: Vec<Bytes>,
        live: &mut Live,
        ctx: &ListenerCtx,
    ) -> Pending {
        let op_timeout = live.parts.listener.op_timeout;
        let times = || {
            let deadline = batch_now() + op_timeout;
            (deadline, backstop(deadline, op_timeout))
        };
        let flavor = self.state.flavor();
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
        if let Some(k) = key {
            if ctx.stats.hot.take() {
                self.sample_hot_key(&args[k], live, ctx);
            }
        }
        let (deadline, backstop) = times();
        let mut req = Request::new(cmd, args, &self.keys);
        req.raw = self.frame.take();
        req.deadline = Some(deadline.into_std());
        req.flavor = flavor;
        // Every layer is always ready (queues are bounded per session, above).
        let noop = std::task::Waker::noop();
        let _ = live.chain.poll_ready(&mut Context::from_waker(noop));
        Pending::Wait {
            fut: live.chain.call(req),
            // The upstream answers at `deadline` with an error naming the shard; this
            // is only a backstop for a request lost on the way.
            deadline: backstop,
            idx: 0,
            first: FirstArg::NONE,
        }
    }

    /// Counts a sampled key for hot-key detection, under the cluster it routes to (as
    /// forwarded, without a removed prefix).
    #[cold]
    fn sample_hot_key(&self, key: &[u8], live: &Live, ctx: &ListenerCtx) {
        let routing = &live.parts.routing;
        if let Some(m) = routing.route(key) {
            if let Some(c) = routing.clusters.get(m.cluster) {
                ctx.stats.hot.record(
                    &c.name,
                    &key[m.strip.min(key.len())..],
                    batch_now().into_std(),
                );
            }
        }
    }

    /// A command refused while a `MULTI` is queueing makes `EXEC` abort, as in Redis.
    fn mark_dirty(&mut self) {
        if let Some(t) = self.tx.as_mut().filter(|t| t.multi) {
            t.dirty = true;
        }
    }

    /// Refuses a command inside `MULTI` (and marks the transaction).
    fn refuse_in_tx(&mut self, reply: Reply) -> Pending {
        self.mark_dirty();
        Pending::Ready(reply)
    }

    /// Pins the transaction to the primary of `(cluster, shard)` and sends what was queued.
    fn pin(
        &mut self,
        cluster: usize,
        shard: usize,
        live: &Live,
        deadline: Instant,
    ) -> Result<Vec<crate::upstream::UpstreamFuture>, Reply> {
        let parts = &live.parts;
        let ep = parts
            .primary(cluster, shard)
            .ok_or_else(|| error_reply("ERR respway: no such shard"))?;
        let conn = ep
            .take_dedicated(self.state.flavor())
            .map_err(|e| e.to_reply(ep.label()))?;
        self.pins += 1;
        let tx = self.tx.as_mut().expect("pin inside a transaction");
        let sent = tx
            .queued
            .drain(..)
            .map(|args| conn.send(args, deadline))
            .collect();
        tx.pinned = Some(Pinned {
            cluster,
            shard,
            conn,
        });
        Ok(sent)
    }

    /// Sends `args` on the transaction's connection, after the replies of `before` (queued
    /// commands sent at pin time, whose replies the client already had): an error among
    /// those is the reply instead.
    fn send_pinned(
        &mut self,
        args: Vec<Bytes>,
        before: Vec<crate::upstream::UpstreamFuture>,
        deadline: Instant,
        op_timeout: std::time::Duration,
    ) -> Pending {
        let Some(p) = self.tx.as_ref().and_then(|t| t.pinned.as_ref()) else {
            return Pending::Ready(error_reply("ERR respway: transaction has no connection"));
        };
        let f = p.conn.send(args, deadline);
        Pending::other(
            Box::pin(async move {
                let mut first_err = None;
                for b in before {
                    let Ok(r) = b.await;
                    if is_error(&r) && first_err.is_none() {
                        first_err = Some(r);
                    }
                }
                let Ok(r) = f.await;
                first_err.unwrap_or(r)
            }),
            backstop(deadline, op_timeout),
        )
    }

    /// Transaction commands, and every command while a `MULTI` is queueing.
    fn dispatch_tx(
        &mut self,
        cmd: &'static command::CommandInfo,
        mut args: Vec<Bytes>,
        live: &mut Live,
        ctx: &ListenerCtx,
        deadline: Instant,
    ) -> Pending {
        let op_timeout = live.parts.listener.op_timeout;
        let in_multi = self.tx.as_ref().is_some_and(|t| t.multi);
        let pinned = self
            .tx
            .as_ref()
            .and_then(|t| t.pinned.as_ref())
            .map(|p| (p.cluster, p.shard));
        match cmd.name {
            "multi" if in_multi => {
                return Pending::Ready(error_reply("ERR MULTI calls can not be nested"))
            }
            "multi" => {
                let tx = self.tx.get_or_insert_with(|| Tx::new(op_timeout));
                tx.multi = true;
                if pinned.is_some() {
                    return self.send_pinned(args, Vec::new(), deadline, op_timeout);
                }
                tx.queued.push(args);
                return Pending::Ready(Bytes::from_static(b"+OK\r\n"));
            }
            "watch" if in_multi => {
                return Pending::Ready(error_reply("ERR WATCH inside MULTI is not allowed"))
            }
            "exec" | "discard" if !in_multi => {
                return Pending::Ready(error_reply(&format!(
                    "ERR {} without MULTI",
                    cmd.name.to_ascii_uppercase()
                )))
            }
            "unwatch" if !in_multi => {
                let Some(tx) = self.tx.take() else {
                    return Pending::Ready(Bytes::from_static(b"+OK\r\n"));
                };
                if tx.pinned.is_none() {
                    return Pending::Ready(Bytes::from_static(b"+OK\r\n"));
                }
                self.tx = Some(tx);
                let p = self.send_pinned(args, Vec::new(), deadline, op_timeout);
                if let Some(tx) = self.tx.take() {
                    tx.finish();
                }
                return p;
            }
            "exec" | "discard" => {
                let mut tx = self.tx.take().expect("in MULTI");
                let discard = cmd.name == "discard";
                if tx.dirty || discard {
                    let Some(p) = tx.pinned.as_ref() else {
                        // Nothing reached Redis.
                        return Pending::Ready(if discard {
                            Bytes::from_static(b"+OK\r\n")
                        } else {
                            error_reply(
                                "EXECABORT Transaction discarded because of previous errors.",
                            )
                        });
                    };
                    let f = p.conn.send(vec![Bytes::from_static(b"DISCARD")], deadline);
                    tx.finish();
                    return Pending::other(
                        Box::pin(async move {
                            let Ok(r) = f.await;
                            if discard || is_error(&r) {
                                r
                            } else {
                                error_reply(
                                    "EXECABORT Transaction discarded because of previous errors.",
                                )
                            }
                        }),
                        backstop(deadline, op_timeout),
                    );
                }
                let mut before = Vec::new();
                if tx.pinned.is_none() {
                    if tx.queued.len() <= 1 {
                        // MULTI then EXEC with nothing queued and nothing watched.
                        return Pending::Ready(Bytes::from_static(b"*0\r\n"));
                    }
                    // Only key-less commands: they run on the catch-all cluster's first shard.
                    let cluster = live
                        .parts
                        .routing
                        .routed_clusters()
                        .first()
                        .copied()
                        .unwrap_or(0);
                    self.tx = Some(tx);
                    match self.pin(cluster, 0, live, deadline) {
                        Ok(b) => before = b,
                        Err(e) => {
                            self.tx = None;
                            return Pending::Ready(e);
                        }
                    }
                    tx = self.tx.take().expect("pinned");
                }
                self.tx = Some(tx);
                let p = self.send_pinned(args, before, deadline, op_timeout);
                if let Some(tx) = self.tx.take() {
                    tx.finish();
                }
                return p;
            }
            _ => {}
        }
        // WATCH (outside MULTI), or a command queued inside MULTI.
        match cmd.class {
            CommandClass::Proxy(ProxyCommand::Ping | ProxyCommand::Echo | ProxyCommand::Time)
            | CommandClass::Transaction => {}
            CommandClass::Proxy(ProxyCommand::Quit) => {
                self.tx = None;
                self.closing = true;
                return Pending::Ready(Bytes::from_static(b"+OK\r\n"));
            }
            CommandClass::Proxy(ProxyCommand::Reset) => {
                self.tx = None;
                return self.dispatch(Some(cmd), args, live, ctx);
            }
            CommandClass::Single | CommandClass::SameShard | CommandClass::Split(_) => {}
            // Inside MULTI Redis runs them as if their timeout had passed: they never block,
            // so they are queued like any command of the transaction's shard.
            CommandClass::Blocking if in_multi && !crate::wait::is_wait(cmd) => {}
            _ => {
                return self.refuse_in_tx(error_reply(&format!(
                    "ERR respway: '{}' is not allowed inside a transaction",
                    cmd.name.to_ascii_uppercase()
                )))
            }
        }
        let place = tx::place(&live.parts.routing, cmd, &mut args, &mut self.keys);
        let here = match place {
            Ok(h) => h,
            Err(e) => return self.refuse_in_tx(e.reply()),
        };
        if cmd.name == "watch" && here.is_none() {
            return Pending::Ready(error_reply(
                "ERR wrong number of arguments for 'watch' command",
            ));
        }
        if self.tx.is_none() {
            self.tx = Some(Tx::new(op_timeout));
        }
        let mut before = Vec::new();
        match (here, pinned) {
            (Some(h), Some(p)) if h != p => {
                let why = match h.0 == p.0 {
                    true => Refusal::CrossSlot,
                    false => Refusal::CrossCluster,
                };
                return self.refuse_in_tx(why.reply());
            }
            (Some((c, sh)), None) => match self.pin(c, sh, live, deadline) {
                Ok(b) => before = b,
                Err(e) => {
                    if !in_multi {
                        self.tx = None;
                    }
                    return self.refuse_in_tx(e);
                }
            },
            (None, None) => {
                // A key-less command before the shard is known: held until it is, up to a
                // bound (this memory is the proxy's, not Redis's).
                let full = self
                    .tx
                    .as_ref()
                    .is_some_and(|t| t.queued.len() > tx::MAX_HELD);
                if full {
                    return self.refuse_in_tx(error_reply(&format!(
                        "ERR respway: more than {} commands without keys before the \
                         transaction's first key",
                        tx::MAX_HELD
                    )));
                }
                if let Some(t) = self.tx.as_mut() {
                    t.queued.push(args);
                }
                return Pending::Ready(Bytes::from_static(b"+QUEUED\r\n"));
            }
            _ => {}
        }
        self.send_pinned(args, before, deadline, op_timeout)
    }
}
