//! The connection task: one per pooled connection, which connects, writes what is queued, and answers
//! the requests in order; an endpoint's health follows its connects.

use super::*;

/// One request written (or being written) on a connection, waiting for its reply.
pub(super) struct Inflight {
    /// `None` once answered with a timeout: its reply, when it comes, is dropped.
    pub(super) tx: Option<ReplyTx>,
    /// Moved later while reply bytes flow (see [`STRETCH`]).
    pub(super) deadline: Instant,
    /// When its batch was taken to be written.
    pub(super) sent: Instant,
    /// Its op_timeout (as it stood when written).
    pub(super) op: Duration,
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
    inflight: &mut VecDeque<Inflight>,
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
pub(super) enum Fail {
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
pub(super) fn answer(tx: ReplyTx, e: UpstreamError, stats: &EndpointStats) {
    stats.count(e.kind());
    let _ = tx.send(Err(e));
}

/// One connection's task. A shared connection (`dedicated` is `None`) reconnects after
/// failures as described in the module docs; a dedicated one ends at its first failure (its
/// holder's later commands then fail with `connection lost`), and `dedicated` counts it
/// open until then.
pub(super) async fn run_connection(
    cfg: EndpointConfig,
    flavor: Flavor,
    dedicated: Option<OpenGuard>,
    mut rx: queue::Receiver<UpstreamRequest>,
    stats: Arc<EndpointStats>,
    latency: Arc<crate::stats::Latency>,
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
pub(super) fn answer_lost(lost: &mut Vec<ReplyTx>, reason: &str, stats: &EndpointStats) {
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
pub(super) async fn refuses(cfg: &EndpointConfig) -> Option<String> {
    let wait = cfg.connect_timeout.min(Duration::from_millis(100));
    match tokio::time::timeout(wait, TcpStream::connect(cfg.address)).await {
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(e.to_string()),
        _ => None,
    }
}

/// Answers everything queued right now as unavailable.
pub(super) fn fail_queued(
    rx: &mut queue::Receiver<UpstreamRequest>,
    reason: &Arc<str>,
    stats: &EndpointStats,
) {
    while let Some(req) = rx.try_recv() {
        answer(req.tx, UpstreamError::Unavailable(reason.clone()), stats);
    }
}
