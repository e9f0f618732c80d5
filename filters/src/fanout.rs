//! [`Join`]: one request sent as N sub-requests through one inner service, and the N replies
//! collected in call order. The hot-key layer (a write to every shard) and the multi-key layer
//! (one sub-command per shard) both use it; each merges the replies its own way.
//!
//! # Readiness
//!
//! Tower lets a caller call a service once per `poll_ready` that returned `Ready`. A fan-out
//! calls the one inner service N times from one outer `call`, so:
//!
//! - the **first** sub-request relies on the outer `poll_ready`, which the layer forwards to
//!   the inner service (the caller has made it ready, as tower requires);
//! - before **each further** sub-request, [`Join::call`] polls the inner service again, with a
//!   no-op waker. If it is ready, the sub-request is sent. If not, it is not sent and its
//!   reply is [`Kind::NotReady`] at once: the part fails, the fan-out still completes, and `call`
//!   never waits (it cannot: `call` is synchronous, and a no-op waker wakes nobody).
//!
//! Respway's inner services are always ready (the upstream's queues are bounded and answer a
//! full queue with an error), so the check costs one call and never fails in practice; it
//! keeps the layers correct over any inner service. How a failed part shows to the client is
//! the merging layer's rule (the first error for a split command, the failed shards listed
//! for a hot-key write).
//!
//! # Invariants
//!
//! A `Join` completes (its [`poll`](Join::poll) returns `Ready`) once every part has a reply;
//! the replies are in the order of the `call`s, one per call. Parts are polled only until they
//! answer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tower::Service;

use crate::error::{Failure, Kind};
use crate::request::{Reply, Request};

/// Sub-requests in flight through one inner service, replies in call order.
#[derive(Debug)]
pub struct Join<F> {
    parts: Vec<Part<F>>,
    /// Parts still waiting for their reply.
    pending: usize,
}

#[derive(Debug)]
enum Part<F> {
    Waiting(F),
    Done(Result<Reply, Failure>),
}

impl<F> Join<F> {
    /// An empty join with room for `n` sub-requests.
    pub fn with_capacity(n: usize) -> Self {
        Join {
            parts: Vec::with_capacity(n),
            pending: 0,
        }
    }

    /// Sends `req` through `inner` as the next part, following the readiness rule of the
    /// module docs: the first part relies on the caller's `poll_ready`, each further one is
    /// sent only if `inner` is ready now (else its reply is [`Kind::NotReady`]).
    pub fn call<S>(&mut self, inner: &mut S, req: Request)
    where
        S: Service<Request, Response = Reply, Error = Failure, Future = F>,
    {
        if !self.parts.is_empty() {
            return self.call_checked(inner, req);
        }
        self.parts.push(Part::Waiting(inner.call(req)));
        self.pending += 1;
    }

    /// Like [`call`](Join::call), but every part, the first included, is sent only if
    /// `inner` is ready now: for parts sent from a future (which has no `poll_ready` of its
    /// caller to rely on) that must not wait.
    pub fn call_checked<S>(&mut self, inner: &mut S, req: Request)
    where
        S: Service<Request, Response = Reply, Error = Failure, Future = F>,
    {
        let mut cx = Context::from_waker(Waker::noop());
        if inner.poll_ready(&mut cx).is_pending() {
            self.parts
                .push(Part::Done(Err(Failure::new(Kind::NotReady))));
            return;
        }
        self.parts.push(Part::Waiting(inner.call(req)));
        self.pending += 1;
    }

    /// The number of parts.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// True when no part was added.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The replies in call order, `None` for a part still waiting (none once
    /// [`poll`](Join::poll) returned `Ready`, or after [`take`](Join::take)).
    pub fn replies(&self) -> impl Iterator<Item = Option<&Result<Reply, Failure>>> + Clone {
        self.parts.iter().map(|p| match p {
            Part::Done(r) => Some(r),
            Part::Waiting(_) => None,
        })
    }

    /// Moves the reply of part `i` out ([`Kind::PolledTwice`] is left behind); `None` when
    /// there is no such part or it has not answered.
    pub fn take(&mut self, i: usize) -> Option<Result<Reply, Failure>> {
        match self.parts.get_mut(i)? {
            Part::Done(r) => Some(std::mem::replace(r, Err(Failure::new(Kind::PolledTwice)))),
            Part::Waiting(_) => None,
        }
    }
}

impl<F> Join<F>
where
    F: Future<Output = Result<Reply, Failure>> + Unpin,
{
    /// Polls the parts still waiting; `Ready` once every part has its reply.
    pub fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.pending > 0 {
            for part in &mut self.parts {
                if let Part::Waiting(f) = part {
                    if let Poll::Ready(r) = Pin::new(f).poll(cx) {
                        *part = Part::Done(r);
                        self.pending -= 1;
                    }
                }
            }
        }
        if self.pending > 0 {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::{ready, Ready};

    use bytes::Bytes;

    /// Answers each call with its number; ready only for the first `ready` polls.
    struct Counter {
        calls: usize,
        ready: usize,
        polls: usize,
    }

    impl Service<Request> for Counter {
        type Response = Reply;
        type Error = Failure;
        type Future = Ready<Result<Reply, Failure>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
            self.polls += 1;
            if self.polls <= self.ready {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }

        fn call(&mut self, _req: Request) -> Self::Future {
            self.calls += 1;
            ready(Ok(Bytes::from(format!(":{}\r\n", self.calls))))
        }
    }

    fn req() -> Request {
        let cmd = crate::command::lookup(b"set").expect("set");
        Request::new(
            cmd,
            vec![
                Bytes::from_static(b"set"),
                Bytes::from_static(b"k"),
                Bytes::from_static(b"v"),
            ],
            &[1],
        )
    }

    #[test]
    fn replies_in_call_order_and_not_ready_parts_fail() {
        // Ready for one further poll: parts 0 (outer readiness) and 1 are sent, 2 is not.
        let mut svc = Counter {
            calls: 0,
            ready: 1,
            polls: 0,
        };
        let mut join = Join::with_capacity(3);
        for _ in 0..3 {
            join.call(&mut svc, req());
        }
        assert_eq!(svc.calls, 2);
        assert_eq!(svc.polls, 2, "the first part does not poll");
        let mut cx = Context::from_waker(Waker::noop());
        assert!(join.poll(&mut cx).is_ready());
        let replies: Vec<_> = join.replies().map(|r| r.cloned()).collect();
        assert_eq!(
            replies,
            vec![
                Some(Ok(Bytes::from_static(b":1\r\n"))),
                Some(Ok(Bytes::from_static(b":2\r\n"))),
                Some(Err(Failure::new(Kind::NotReady))),
            ]
        );
        assert_eq!(join.take(0), Some(Ok(Bytes::from_static(b":1\r\n"))));
        assert_eq!(join.take(3), None);
    }
}
