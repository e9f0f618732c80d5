//! The connection task: one per pooled connection, which connects, hands each live connection
//! to `serve.rs`, and after a failure reconnects or backs off; an endpoint's health follows
//! its connects.

use super::*;

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
    stats.count(error::kind(&e));
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
    rx: queue::Receiver<UpstreamRequest>,
    stats: Arc<EndpointStats>,
    latency: Arc<crate::stats::Latency>,
) {
    let mut task = Task {
        cfg,
        flavor,
        rx,
        stats,
        latency,
        carry: Vec::new(),
        lost: Vec::new(),
    };
    if task.cfg.address == respway_filters::model::NO_ENDPOINT {
        // The placeholder of a cluster with no endpoints: every request is answered at once,
        // with nothing to connect to, probe or log (`connect` refuses it too, for the paths
        // that connect on their own, such as pub/sub).
        let reason: Arc<str> = (task.cfg.missing.clone())
            .unwrap_or_else(|| respway_filters::model::NO_ENDPOINT_REASON.into());
        while let Some(req) = task.rx.recv().await {
            answer(
                req.tx,
                UpstreamError::Unavailable(reason.clone()),
                &task.stats,
            );
        }
    } else if dedicated.is_some() {
        task.run_dedicated().await;
    } else {
        task.run_shared().await;
    }
    // Counted open until here.
    drop(dedicated);
}

/// What one connection's task owns.
struct Task {
    cfg: EndpointConfig,
    flavor: Flavor,
    rx: queue::Receiver<UpstreamRequest>,
    stats: Arc<EndpointStats>,
    latency: Arc<crate::stats::Latency>,
    /// Requests for the next connection before anything queued: the first one, or those a
    /// failed connection had taken from the queue but not written.
    carry: Vec<UpstreamRequest>,
    /// The requests in flight on a connection that failed, answered once respway knows why.
    lost: Vec<ReplyTx>,
}

/// What a shared connection's task does after a connect and what followed it.
enum After {
    /// Every handle dropped (the endpoint left the configuration): the task ends.
    Done,
    /// Reconnect at once, on the next request or for the requests not written.
    Reconnect,
    /// Back off: why, whether the shard refuses connections right now (a request then waits
    /// for one more attempt instead of failing at once), and whether it said it is coming
    /// back (probed at a short fixed interval).
    BackOff {
        reason: String,
        refused: bool,
        coming: bool,
    },
}

impl Task {
    /// Serves the requests on `stream` until it fails or is no longer needed.
    async fn serve(&mut self, stream: Conn, dedicated: bool) -> Result<(), Fail> {
        stream
            .serve(
                &mut self.carry,
                &mut self.lost,
                &mut self.rx,
                &self.stats,
                &self.latency,
                dedicated,
            )
            .await
    }

    /// A dedicated connection: opened for its first request, ended at its first failure.
    async fn run_dedicated(&mut self) {
        let Some(first) = self.rx.recv().await else {
            return;
        };
        match connect(&self.cfg, self.flavor).await {
            Ok(stream) => {
                self.stats.count_connect();
                self.carry.push(first);
                if let Err(e) = self.serve(stream, true).await {
                    tracing::debug!(endpoint = %self.cfg.label, error = %e, "dedicated connection closed");
                    answer_lost(&mut self.lost, &e.to_string(), &self.stats);
                    // Queued behind the failure, never sent: lost with the connection.
                    let broke = || UpstreamError::ConnectionLost(DEDICATED_BROKE.into());
                    for req in self.carry.drain(..) {
                        answer(req.tx, broke(), &self.stats);
                    }
                    while let Some(req) = self.rx.try_recv() {
                        answer(req.tx, broke(), &self.stats);
                    }
                }
            }
            Err(e) => {
                self.stats.count_connect_failure();
                let reason: Arc<str> = e.text.into();
                answer(
                    first.tx,
                    UpstreamError::Unavailable(reason.clone()),
                    &self.stats,
                );
                fail_queued(&mut self.rx, &reason, &self.stats);
            }
        }
    }

    /// A shared connection: connects, serves, and after a failure reconnects or backs off.
    async fn run_shared(&mut self) {
        let mut backoff = BACKOFF_MIN;
        // Set when the next connect is a probe after a backoff, not triggered by a request.
        let mut probe = false;
        // Connections in a row that failed within MIN_HEALTHY_LIFE of opening.
        let mut short_lives = 0u32;
        loop {
            // Connect lazily, on the first request: an endpoint nobody uses costs nothing,
            // and a proxy started before its shards does not begin in backoff. After a
            // failure the endpoint is probed when the backoff ends without waiting for a
            // request, because the zone layer sends an unhealthy endpoint none until it
            // recovers.
            if !probe && self.carry.is_empty() {
                match self.rx.recv().await {
                    Some(r) => self.carry.push(r),
                    None => return, // every handle dropped: the endpoint left the config
                }
            }
            let (reason, refused, coming) = match self.attempt(&mut short_lives).await {
                After::Done => return,
                After::Reconnect => {
                    backoff = BACKOFF_MIN;
                    probe = false;
                    continue;
                }
                After::BackOff {
                    reason,
                    refused,
                    coming,
                } => (reason, refused, coming),
            };
            if coming {
                // The last attempt said the shard is coming back: probe at a fixed short
                // interval.
                backoff = COMING_BACK_PROBE;
            }
            let Some((coming, next_probe)) =
                self.back_off(reason, refused, coming, &mut backoff).await
            else {
                return;
            };
            probe = next_probe;
            if !coming {
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    /// One connect, and the connection served until it fails: what to do next.
    async fn attempt(&mut self, short_lives: &mut u32) -> After {
        match connect(&self.cfg, self.flavor).await {
            Ok(stream) => {
                self.stats.count_connect();
                self.stats.connected(&self.cfg.label);
                tracing::debug!(endpoint = %self.cfg.label, "connected");
                let opened = Instant::now();
                match self.serve(stream, false).await {
                    Ok(()) => After::Done,
                    Err(e) => self.after_loss(e, opened, short_lives).await,
                }
            }
            Err(e) => {
                self.stats.count_connect_failure();
                for req in self.carry.drain(..) {
                    answer(
                        req.tx,
                        UpstreamError::Unavailable(e.text.clone().into()),
                        &self.stats,
                    );
                }
                let refused = e.retry_soon();
                After::BackOff {
                    reason: e.text,
                    refused,
                    coming: e.coming_back,
                }
            }
        }
    }

    /// A live connection failed with `e`: answers what it had in flight and says whether
    /// to reconnect at once or back off.
    async fn after_loss(&mut self, e: Fail, opened: Instant, short_lives: &mut u32) -> After {
        tracing::warn!(endpoint = %self.cfg.label, error = %e, "upstream connection lost");
        if matches!(e, Fail::Protocol(_)) {
            self.stats
                .worker
                .protocol_errors
                .fetch_add(1, Ordering::Relaxed);
        }
        if matches!(e, Fail::Stuck) {
            self.stats.worker.stuck.fetch_add(1, Ordering::Relaxed);
        }
        let short = opened.elapsed() < MIN_HEALTHY_LIFE && !matches!(e, Fail::Stuck);
        *short_lives = if short { *short_lives + 1 } else { 0 };
        let mut reason = e.to_string();
        // A shard that closed the connection may be gone: say so to the requests that were
        // in flight (they may have run), and treat it as a refused connect (what was not
        // written fails with that).
        let gone = match e {
            Fail::Io(_) => refuses(&self.cfg).await,
            _ => None,
        };
        if let Some(why) = &gone {
            reason = format!("{reason} (the shard now refuses connections: {why})");
        }
        answer_lost(&mut self.lost, &reason, &self.stats);
        if let Some(why) = gone {
            for req in self.carry.drain(..) {
                answer(
                    req.tx,
                    UpstreamError::Unavailable(why.clone().into()),
                    &self.stats,
                );
            }
            *short_lives = 0;
            return After::BackOff {
                reason: why,
                refused: true,
                coming: false,
            };
        }
        let flapping = matches!(e, Fail::Protocol(_)) || *short_lives >= 2;
        if !flapping {
            // A connection that worked for a while, got stuck, or broke once right after it
            // opened, is reopened at once: on the next request, or now for the requests it
            // had not written (the PING of the new connection tells a frozen shard from a
            // stuck connection).
            return After::Reconnect;
        }
        // A peer that breaks the protocol or keeps dropping us right away is reopened after
        // the backoff; what it had not written was not sent.
        for req in self.carry.drain(..) {
            answer(
                req.tx,
                UpstreamError::Unavailable(reason.clone().into()),
                &self.stats,
            );
        }
        After::BackOff {
            reason,
            refused: false,
            coming: false,
        }
    }

    /// Waits out `backoff` after a failure. Whatever queued during the failed attempt is
    /// answered now, and so is everything that arrives during the backoff: a dead shard must
    /// not hang its clients. While the shard refuses connections (a process restarting), a
    /// request waits for one more attempt (at most one per RETRY_MIN), so a shard that is
    /// back serves the first request after it; what queued meanwhile shares that attempt's
    /// outcome. `None` when the task is to end; else whether the shard last said it is
    /// coming back, and whether the next connect is a probe.
    async fn back_off(
        &mut self,
        reason: String,
        mut refused: bool,
        mut coming: bool,
        backoff: &mut Duration,
    ) -> Option<(bool, bool)> {
        let mut reason: Arc<str> = reason.into();
        self.stats.failed(&self.cfg.label, &reason, *backoff);
        fail_queued(&mut self.rx, &reason, &self.stats);
        let sleep = tokio::time::sleep(*backoff);
        tokio::pin!(sleep);
        let mut last_attempt = Instant::now();
        let mut probe = true;
        loop {
            tokio::select! {
                biased;
                _ = &mut sleep => break,
                req = self.rx.recv() => match req {
                    None => return None,
                    Some(req) if !refused => {
                        answer(req.tx, UpstreamError::Unavailable(reason.clone()), &self.stats);
                    }
                    Some(req) => {
                        tokio::time::sleep_until(last_attempt + RETRY_MIN).await;
                        last_attempt = Instant::now();
                        match connect(&self.cfg, self.flavor).await {
                            Ok(stream) => {
                                self.stats.count_connect();
                                self.stats.connected(&self.cfg.label);
                                *backoff = BACKOFF_MIN;
                                self.carry.push(req);
                                match self.serve(stream, false).await {
                                    Ok(()) => return None,
                                    Err(e) => {
                                        tracing::warn!(endpoint = %self.cfg.label, error = %e, "upstream connection lost");
                                        answer_lost(&mut self.lost, &e.to_string(), &self.stats);
                                        probe = false;
                                        break;
                                    }
                                }
                            }
                            Err(e) => {
                                self.stats.count_connect_failure();
                                refused = e.retry_soon();
                                coming = e.coming_back;
                                if coming {
                                    *backoff = COMING_BACK_PROBE;
                                    sleep.as_mut().reset(Instant::now() + *backoff);
                                }
                                reason = e.text.into();
                                self.stats.failed(&self.cfg.label, &reason, *backoff);
                                answer(req.tx, UpstreamError::Unavailable(reason.clone()), &self.stats);
                                fail_queued(&mut self.rx, &reason, &self.stats);
                            }
                        }
                    }
                },
            }
        }
        Some((coming, probe))
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
