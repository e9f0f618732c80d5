//! The reply of one upstream request ([`UpstreamFuture`]): a connection task's answer, a
//! near-cache hit, or a failure; a replica read retried once on the primary, a near-cache
//! fill kept, and a Redis Cluster's redirections followed ([`super::redirect`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use respway_filters::error::Failure;
use respway_filters::request::{Flavor, Reply};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{EndpointHandle, UpstreamError};

/// Where a replica read goes again when the replica cannot be reached: the primary (or,
/// while the primary cannot be reached either, the replica again on a new connection), the
/// arguments, the flavor and the connection index; a tracking client's keys; and the time the
/// read is given again (the first try's: a retry never inherits a spent deadline, whose
/// timeout would be charged to the endpoint retried).
#[derive(Debug)]
pub(super) struct Fallback {
    pub(super) primary: EndpointHandle,
    pub(super) replica: EndpointHandle,
    pub(super) args: Vec<Bytes>,
    pub(super) flavor: Flavor,
    pub(super) conn: usize,
    pub(super) on_fallback: Option<Box<dyn super::Rider>>,
    pub(super) budget: Duration,
}

/// The reply of one upstream request.
#[derive(Debug)]
pub(crate) struct UpstreamFuture {
    state: State,
    label: Arc<str>,
    /// For replica reads: the primary and the request, to retry there once when the replica
    /// cannot be reached. Boxed: every reply's future carries the field, only replica reads
    /// fill it, and a session moves each future into its queue (at 128 bytes or less a move
    /// is a few instructions, not a `memcpy` call).
    pub(super) fallback: Option<Box<Fallback>>,
    /// What rides with the request (a near-cache fill): told of the reply (boxed for the same
    /// reason).
    pub(super) fill: Option<Box<dyn super::Rider>>,
    /// A command to a Redis Cluster: what follows its redirections (boxed likewise).
    pub(super) redirect: Option<Box<super::redirect::Redirect>>,
    deadline: Instant,
    /// The request went with commands after it ([`super::Rider::after`]): its reply comes
    /// with theirs appended, which go to `fill`.
    pub(super) posted: bool,
}

#[derive(Debug)]
enum State {
    /// Served by the near cache.
    Ready(Option<Reply>),
    /// Waiting for the connection task.
    Waiting(oneshot::Receiver<Result<Reply, UpstreamError>>),
    /// Already failed.
    Failed(Option<UpstreamError>),
    /// A Redis Cluster's `TRYAGAIN`: sent again once this pause is over.
    Later(Pin<Box<tokio::time::Sleep>>),
    /// Not sent yet: a write held during a failover, or a request behind one of its
    /// session's ([`super::hold`]); the future sends it and yields what then follows it.
    Held(Deferred),
}

/// A request that is sent once this future is ready (see [`State::Held`]).
pub(super) struct Deferred(pub(super) Pin<Box<dyn Future<Output = UpstreamFuture> + Send>>);

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deferred")
    }
}

impl UpstreamFuture {
    fn new(state: State, label: Arc<str>, deadline: Instant) -> Self {
        UpstreamFuture {
            state,
            label,
            fallback: None,
            fill: None,
            redirect: None,
            deadline,
            posted: false,
        }
    }

    pub(super) fn waiting(
        rx: oneshot::Receiver<Result<Reply, UpstreamError>>,
        label: Arc<str>,
        deadline: Instant,
    ) -> Self {
        UpstreamFuture::new(State::Waiting(rx), label, deadline)
    }

    pub(crate) fn ready(reply: Reply, label: Arc<str>, deadline: Instant) -> Self {
        UpstreamFuture::new(State::Ready(Some(reply)), label, deadline)
    }

    pub(super) fn failed(e: UpstreamError, label: Arc<str>, deadline: Instant) -> Self {
        UpstreamFuture::new(State::Failed(Some(e)), label, deadline)
    }

    /// A request `send` sends when it is ready (see [`State::Held`]).
    pub(super) fn held(
        send: impl Future<Output = UpstreamFuture> + Send + 'static,
        label: Arc<str>,
        deadline: Instant,
    ) -> Self {
        UpstreamFuture::new(State::Held(Deferred(Box::pin(send))), label, deadline)
    }
}

/// A replica's `-LOADING` or `-MASTERDOWN` reply (Redis's own errors, not respway's).
pub(super) fn replica_not_serving(reply: &[u8]) -> bool {
    reply.starts_with(b"-LOADING") || reply.starts_with(b"-MASTERDOWN")
}

pub(super) fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365)
}

/// Redis's reply (`Ok`, errors of Redis included), or respway's own failure (`Err`, a
/// timeout, a lost connection, ...) naming the endpoint: a holder of a dedicated connection
/// decides by the variant whether the connection is still clean; only the session renders it.
impl Future for UpstreamFuture {
    type Output = Result<Reply, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            let mut result = match &mut this.state {
                State::Waiting(rx) => match Pin::new(rx).poll(cx) {
                    Poll::Ready(Ok(r)) => r,
                    Poll::Ready(Err(_)) => Err(UpstreamError::Closed),
                    Poll::Pending => return Poll::Pending,
                },
                State::Failed(e) => Err(e.take().unwrap_or(UpstreamError::Closed)),
                State::Ready(r) => {
                    return Poll::Ready(
                        r.take()
                            .ok_or_else(|| UpstreamError::Closed.at(this.label.clone())),
                    )
                }
                State::Held(send) => match send.0.as_mut().poll(cx) {
                    Poll::Ready(next) => {
                        *this = next;
                        continue;
                    }
                    Poll::Pending => return Poll::Pending,
                },
                State::Later(sleep) => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let next = match this.redirect.as_deref_mut() {
                        Some(r) => r.again(this.deadline),
                        None => UpstreamFuture::failed(
                            UpstreamError::Closed,
                            this.label.clone(),
                            this.deadline,
                        ),
                    };
                    this.state = next.state;
                    this.label = next.label;
                    continue;
                }
            };
            // The replies of the commands after the request go to what asked for them.
            if std::mem::take(&mut this.posted) {
                if let Ok(all) = &result {
                    // The connection cut these replies with the same limits: the first is whole.
                    let limits = &respway_filters::codec_limits::Limits::REPLIES;
                    let n = respway_filters::resp::reply_len(all, limits)
                        .ok()
                        .flatten()
                        .unwrap_or(all.len());
                    if let Some(fill) = this.fill.as_mut() {
                        fill.after_replies(&all[n..]);
                    }
                    result = Ok(all.slice(..n));
                }
            }
            // A Redis Cluster's redirection: the command goes again (a near-cache fill or a
            // tracking client's read is not what the other node's reply is).
            if let (Some(r), Ok(reply)) = (this.redirect.as_deref_mut(), &result) {
                use super::redirect::Follow;
                let follow = r.follow(reply, this.deadline);
                if !matches!(follow, Follow::Answer) {
                    if let Some(fill) = this.fill.take() {
                        fill.abandon();
                    }
                    match follow {
                        Follow::Sent(next) => {
                            this.state = next.state;
                            this.label = next.label;
                        }
                        Follow::Later(pause) => {
                            this.state = State::Later(Box::pin(tokio::time::sleep(pause)));
                        }
                        Follow::Fail(e) => this.state = State::Failed(Some(e)),
                        Follow::Answer => {}
                    }
                    continue;
                }
            }
            if let (Some(r), Err(_)) = (this.redirect.as_deref(), &result) {
                if let Some(t) = r.topology() {
                    t.failed();
                }
            }
            if let (Some(fill), Ok(reply)) = (this.fill.take(), &result) {
                if this.fallback.is_none() || !replica_not_serving(reply) {
                    fill.done(reply);
                }
            }
            // A replica read goes once to the primary when the replica cannot be reached, or
            // answers with an error the primary would not give (it is loading its data set,
            // or has lost its primary).
            let again = match &result {
                Ok(reply) => this.fallback.is_some() && replica_not_serving(reply),
                Err(e) => e.retryable_read(),
            };
            if again {
                if let Some(b) = this.fallback.take() {
                    // The primary's reply is not what the replica's tracking follows.
                    if let Some(fill) = this.fill.take() {
                        fill.abandon();
                    }
                    let b = *b;
                    if let Some(r) = b.on_fallback {
                        r.abandon();
                    }
                    // A replica whose connection broke while its primary is down or being
                    // replaced (Sentinel closes every client of the replica it promotes): the
                    // replica again, on a new connection.
                    let leaving =
                        !b.primary.is_healthy() || b.primary.hold().is_some_and(|h| h.on());
                    let to = if result.is_err() && leaving && b.replica.is_healthy() {
                        b.replica
                    } else {
                        b.primary
                    };
                    this.deadline = Instant::now() + b.budget;
                    let next = to.send(b.args, b.flavor, b.conn, this.deadline);
                    this.state = next.state;
                    this.label = next.label;
                    continue;
                }
            }
            return Poll::Ready(result.map_err(|e| e.at(this.label.clone())));
        }
    }
}
