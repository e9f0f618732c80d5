//! A live connection: writing batches and reading replies until it fails or is no longer needed.

use super::*;

/// Serves requests on one live connection until it fails (`Err`) or every sender is gone
/// and nothing is in flight (`Ok`).
pub(super) async fn serve<S: Io>(
    mut stream: S,
    carry: &mut Vec<UpstreamRequest>,
    lost: &mut Vec<ReplyTx>,
    rx: &mut queue::Receiver<UpstreamRequest>,
    stats: &EndpointStats,
    latency: &crate::stats::Latency,
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
