//! A live connection ([`LiveConn`]): writing batches, reading replies ([`read_replies`]) and
//! answering requests in order, until it fails or is no longer needed.

use super::*;

/// Serves requests on one live connection until it fails (`Err`) or every sender is gone
/// and nothing is in flight (`Ok`).
pub(super) async fn serve<S: Io>(
    stream: S,
    carry: &mut Vec<UpstreamRequest>,
    lost: &mut Vec<ReplyTx>,
    rx: &mut queue::Receiver<UpstreamRequest>,
    stats: &EndpointStats,
    latency: &crate::stats::Latency,
    dedicated: bool,
) -> Result<(), Fail> {
    let mut live = LiveConn::new(stream, stats, latency, dedicated);
    // Follows the oldest unanswered request: at its deadline it is answered with a timeout;
    // STUCK_MARGIN later, the connection is replaced.
    let timer = tokio::time::sleep_until(far_future());
    tokio::pin!(timer);
    let result = live.run(carry, rx, timer).await;
    if result.is_err() {
        // The caller answers them: it may first learn what happened to the shard.
        lost.extend(live.inflight.drain(..).filter_map(|f| f.tx));
        // Taken from the queue in the poll that found the failure, not written: they may
        // go on the next connection.
        carry.append(&mut live.batch);
    }
    result
}

/// One live connection's state.
struct LiveConn<'a, S> {
    stream: S,
    stats: &'a EndpointStats,
    latency: &'a crate::stats::Latency,
    dedicated: bool,
    /// Written requests waiting for their replies, oldest first.
    inflight: VecDeque<Inflight>,
    gauge: OpenConnection<'a>,
    /// The peer, and how slow a reply must be to be noted for the slow log (read once per
    /// connection).
    slow: (SocketAddr, u64),
    /// Requests taken from the queue in one turn.
    batch: Vec<UpstreamRequest>,
    /// What is to be written. Large arguments (a 1 MiB SET value) are queued as the
    /// client's bytes, not copied.
    wbuf: OutQueue,
    rbuf: BytesMut,
    /// Where the reply at the front of `rbuf` stands (kept across reads).
    scanner: ReplyScanner,
    /// False once every sender is gone.
    open: bool,
    /// When reply bytes last arrived.
    last_bytes: Instant,
    /// True while the timer follows the oldest unanswered request.
    timer_armed: bool,
    /// Replies kept to be answered with the ones after them ([`Keep`]).
    kept: BytesMut,
}

impl<'a, S: Io> LiveConn<'a, S> {
    fn new(
        stream: S,
        stats: &'a EndpointStats,
        latency: &'a crate::stats::Latency,
        dedicated: bool,
    ) -> Self {
        let slow = (
            stream.tcp().peer_addr().unwrap_or(([0, 0, 0, 0], 0).into()),
            crate::stats::slowlog::upstream_min(),
        );
        LiveConn {
            stream,
            stats,
            latency,
            dedicated,
            inflight: VecDeque::new(),
            gauge: OpenConnection::new(stats, !dedicated),
            slow,
            batch: Vec::with_capacity(64),
            wbuf: OutQueue::with_capacity(RBUF),
            rbuf: BytesMut::with_capacity(RBUF),
            scanner: ReplyScanner::new(),
            open: true,
            last_bytes: Instant::now(),
            timer_armed: false,
            kept: BytesMut::new(),
        }
    }

    /// The loop: one poll finds everything that is ready and each event is handled.
    async fn run(
        &mut self,
        carry: &mut Vec<UpstreamRequest>,
        rx: &mut queue::Receiver<UpstreamRequest>,
        mut timer: Pin<&mut tokio::time::Sleep>,
    ) -> Result<(), Fail> {
        let now = Instant::now();
        let mut late = false;
        for req in carry.drain(..) {
            late |= !enqueue(req, &mut self.wbuf, &mut self.inflight, now, self.stats);
        }
        if late && self.dedicated {
            return Err(Fail::Stuck);
        }
        loop {
            self.gauge.inflight(self.inflight.len());
            if !self.open
                && self.inflight.is_empty()
                && self.wbuf.is_empty()
                && !self.stream.pending_out()
            {
                return Ok(());
            }
            if !self.timer_armed {
                if let Some(front) = self.inflight.front() {
                    timer.as_mut().reset(front.deadline);
                    self.timer_armed = true;
                }
            }
            // One poll finds everything that is ready (replies, requests, room to write, the
            // timer) and the loop body handles it all, instead of `select!` running one
            // branch per turn with a fresh readiness future (and its waiter list entry) for
            // each socket direction every time.
            let ev = std::future::poll_fn(|cx| self.poll_events(cx, rx, timer.as_mut())).await;
            if ev.abandoned {
                return Err(Fail::Abandoned);
            }
            if let Some(r) = ev.readable {
                self.on_readable(r)?;
            }
            match ev.requests {
                Some(0) => self.open = false,
                Some(n) => self.on_requests(n, rx).await?,
                None => {}
            }
            if let Some(w) = ev.writable {
                match w.and_then(|()| write_queued(&mut self.stream, &mut self.wbuf)) {
                    Ok(()) => self.wbuf.shrink(MAX_WBUF, RBUF),
                    Err(e) => return Err(Fail::Io(e.to_string())),
                }
            }
            if ev.timer {
                self.on_timer(timer.as_mut())?;
            }
        }
    }

    /// What is ready now; `Pending` when nothing is.
    #[inline]
    fn poll_events(
        &mut self,
        cx: &mut Context<'_>,
        rx: &mut queue::Receiver<UpstreamRequest>,
        timer: Pin<&mut tokio::time::Sleep>,
    ) -> Poll<Events> {
        let ev = Events {
            readable: match self.stream.poll_read_ready(cx) {
                Poll::Ready(r) => Some(r),
                Poll::Pending => None,
            },
            requests: if self.open && self.wbuf.len() < MAX_WBUF {
                match rx.poll_recv_many(cx, &mut self.batch, BATCH) {
                    Poll::Ready(n) => Some(n),
                    Poll::Pending => None,
                }
            } else {
                None
            },
            // (TLS: records rustls holds once `wbuf` is empty are written too.)
            writable: if !self.wbuf.is_empty() || self.stream.pending_out() {
                match self.stream.poll_write_ready(cx) {
                    Poll::Ready(r) => Some(r),
                    Poll::Pending => None,
                }
            } else {
                None
            },
            // A dedicated connection whose oldest request lost its client (a session that
            // ended while blocked in BLPOP, or mid-EXEC) is closed at once: Redis then
            // unblocks it and pops nothing for nobody.
            abandoned: self.dedicated
                && match self.inflight.front_mut().and_then(|f| f.tx.as_mut()) {
                    Some(tx) => tx.poll_closed(cx).is_ready(),
                    None => false,
                },
            timer: self.timer_armed && timer.poll(cx).is_ready(),
        };
        if ev.any() {
            Poll::Ready(ev)
        } else {
            Poll::Pending
        }
    }

    /// Reads the replies there are and answers their requests.
    #[inline]
    fn on_readable(&mut self, r: std::io::Result<()>) -> Result<(), Fail> {
        r.map_err(|e| Fail::Io(e.to_string()))?;
        let read = read_replies(
            &mut self.stream,
            &mut self.rbuf,
            &mut self.scanner,
            (&mut self.inflight, &mut self.kept),
            &Limits::REPLIES,
            self.latency,
            self.slow,
        )?;
        if let Some(t) = read {
            self.last_bytes = t;
        }
        Ok(())
    }

    /// `n` requests moved into the batch: waits a turn for more, encodes them, and writes
    /// what the socket takes.
    #[inline]
    async fn on_requests(
        &mut self,
        n: usize,
        rx: &mut queue::Receiver<UpstreamRequest>,
    ) -> Result<(), Fail> {
        // Let every other task of this worker run first — tokio resumes a yielded task only
        // after it has polled the I/O driver again — so that requests from clients served in
        // the same event-loop turn join this write. This is the batching across clients
        // that makes the shard's work (and ours) per request smaller, like twemproxy
        // writing once per epoll iteration.
        tokio::task::yield_now().await;
        rx.try_recv_many(&mut self.batch, BATCH - n);
        let now = Instant::now();
        let mut late = false;
        for req in self.batch.drain(..) {
            late |= !enqueue(req, &mut self.wbuf, &mut self.inflight, now, self.stats);
        }
        // A dedicated connection never skips a command of its transaction: one that is too
        // late closes it instead (Redis discards the MULTI).
        if late && self.dedicated {
            return Err(Fail::Stuck);
        }
        // Write now if the socket takes it; the next poll covers the rest.
        if !self.wbuf.is_empty() {
            write_queued(&mut self.stream, &mut self.wbuf).map_err(|e| Fail::Io(e.to_string()))?;
        }
        Ok(())
    }

    /// The oldest request's deadline (or the stuck margin after it) passed.
    fn on_timer(&mut self, mut timer: Pin<&mut tokio::time::Sleep>) -> Result<(), Fail> {
        self.timer_armed = false;
        let now = Instant::now();
        // The oldest request's reply may only be waiting behind earlier replies on this
        // connection, or be arriving: its op_timeout counts from the last reply byte (see
        // [`STRETCH`]). The requests behind it wait for it.
        if let Some(front) = self.inflight.front_mut().filter(|f| f.tx.is_some()) {
            let due = (self.last_bytes + front.op).min(front.sent + front.op * STRETCH);
            if due > front.deadline {
                front.deadline = due;
            }
        }
        // Answer every request past its deadline (their replies, if they come, are dropped
        // in order); replace the connection once the oldest is far past it.
        for f in self.inflight.iter_mut() {
            if f.deadline > now {
                break;
            }
            if let Some(tx) = f.tx.take() {
                answer(tx, UpstreamError::Timeout, self.stats);
            }
        }
        match self.inflight.front() {
            Some(front) if front.tx.is_none() && self.dedicated => Err(Fail::Stuck),
            Some(front) if front.tx.is_none() && front.deadline + STUCK_MARGIN <= now => {
                Err(Fail::Stuck)
            }
            Some(front) if front.tx.is_none() => {
                timer.as_mut().reset(front.deadline + STUCK_MARGIN);
                self.timer_armed = true;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// Whether a reply is kept to be answered with the next ones (a request with commands after
/// it, see [`Rider::after`](super::Rider::after)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    No,
    /// Kept: the replies after it complete it.
    Part,
    /// The last of them: the request is answered with every kept reply and this one.
    Last,
}

/// One request written (or being written) on a connection, waiting for its reply.
pub(super) struct Inflight {
    /// `None` once answered with a timeout: its reply, when it comes, is dropped.
    pub(super) tx: Option<ReplyTx>,
    /// A near-cache fill's tracking command: its reply is dropped, and clears the
    /// connection's tracking state when it is an error.
    pub(super) pre_ok: Option<Arc<AtomicU64>>,
    /// Moved later while reply bytes flow (see [`STRETCH`]).
    pub(super) deadline: Instant,
    /// When its batch was taken to be written.
    pub(super) sent: Instant,
    /// Its op_timeout (as it stood when written).
    pub(super) op: Duration,
    pub(super) keep: Keep,
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
pub(super) struct LatencyRun<'a> {
    pub(super) latency: &'a crate::stats::Latency,
    /// The run's send time and `now` less it.
    pub(super) sent: Instant,
    pub(super) now: Instant,
    pub(super) us: u64,
    pub(super) n: u64,
}

impl<'a> LatencyRun<'a> {
    /// For the replies of one read, which arrived `now`.
    pub(super) fn new(latency: &'a crate::stats::Latency, now: Instant) -> Self {
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
    pub(super) fn add(&mut self, sent: Instant) -> u64 {
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
#[inline]
pub(super) fn read_replies(
    stream: &mut impl Io,
    rbuf: &mut BytesMut,
    scanner: &mut ReplyScanner,
    (inflight, kept): (&mut VecDeque<Inflight>, &mut BytesMut),
    limits: &Limits,
    latency: &crate::stats::Latency,
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
                    // RESP3 out-of-band data (no SUBSCRIBE goes on these connections; a
                    // near cache's tracking redirects its invalidations, and Redis pushes
                    // `tracking-redir-broken` here when the tracker is gone): not the reply
                    // to a request.
                    tracing::debug!("push message from upstream dropped");
                    continue;
                }
                match inflight.pop_front() {
                    Some(Inflight {
                        keep: Keep::Part, ..
                    }) => kept.extend_from_slice(&reply),
                    Some(Inflight {
                        keep: Keep::Last,
                        tx,
                        sent,
                        ..
                    }) => {
                        kept.extend_from_slice(&reply);
                        let all = kept.split().freeze();
                        if let Some(tx) = tx {
                            run.add(sent);
                            let _ = tx.send(Ok(all));
                        }
                    }
                    // A receiver that timed out or left is simply gone.
                    Some(Inflight {
                        tx: Some(tx), sent, ..
                    }) => {
                        let us = run.add(sent);
                        if us >= note_min {
                            crate::stats::slowlog::note_upstream(&reply, now, endpoint, us);
                        }
                        let _ = tx.send(Ok(reply));
                    }
                    Some(Inflight {
                        pre_ok: Some(ok), ..
                    }) => {
                        if respway_filters::request::is_error(&reply) {
                            ok.store(0, Ordering::Release);
                        }
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

/// What one poll of a connection task found ready.
pub(super) struct Events {
    /// The socket may have replies (or an error).
    pub(super) readable: Option<std::io::Result<()>>,
    /// Requests moved into the batch (`Some(0)`: every sender is gone).
    pub(super) requests: Option<usize>,
    /// The socket may take bytes (or an error).
    pub(super) writable: Option<std::io::Result<()>>,
    /// A dedicated connection's oldest request lost its client.
    pub(super) abandoned: bool,
    /// The oldest request's deadline (or the stuck margin after it) passed.
    pub(super) timer: bool,
}

impl Events {
    pub(super) fn any(&self) -> bool {
        self.readable.is_some()
            || self.requests.is_some()
            || self.writable.is_some()
            || self.abandoned
            || self.timer
    }
}

/// Writes what `q` holds while the socket takes all of it (TLS: also records rustls holds).
/// `WouldBlock` is not an error: the rest waits for the next writable edge.
#[inline]
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
#[inline]
pub(super) fn enqueue(
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
    let (pre, post) = match &req.extra {
        Some(x) => (x.pre.as_ref(), x.post.as_ref()),
        None => (None, None),
    };
    if let Some((frame, n, state)) = pre {
        // Commands whose replies only clear `state` when one is an error.
        wbuf.push(frame);
        for _ in 0..*n {
            inflight.push_back(Inflight {
                tx: None,
                pre_ok: Some(state.clone()),
                deadline: req.deadline,
                sent: now,
                op: req.deadline.saturating_duration_since(now),
                keep: Keep::No,
            });
        }
    }
    match &req.raw {
        Some(raw) => {
            debug_assert!(
                req.args.is_empty() || {
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
    let op = req.deadline.saturating_duration_since(now);
    let entry = |tx, keep| Inflight {
        tx,
        pre_ok: None,
        deadline: req.deadline,
        sent: now,
        op,
        keep,
    };
    match post {
        None => inflight.push_back(entry(Some(req.tx), Keep::No)),
        Some((frame, n)) => {
            // Its reply is kept, and answered with those of the commands after it, the
            // last of which holds the reply's sender.
            wbuf.push(frame);
            inflight.push_back(entry(None, Keep::Part));
            for _ in 1..*n {
                inflight.push_back(entry(None, Keep::Part));
            }
            inflight.push_back(entry(Some(req.tx), Keep::Last));
        }
    }
    true
}
