//! The session's one scatter-gather: a command sent to several targets, their answers folded
//! into the client's reply. Its users say only which targets, what each is sent and how the
//! answers combine:
//!
//! - `keyspace.rs`: `KEYS`, `DBSIZE`, `FLUSHDB` / `FLUSHALL` to every shard, `RANDOMKEY` to
//!   one shard after another ([`in_turn`]);
//! - `fanout.rs`: `SCRIPT LOAD | EXISTS | FLUSH` and `FUNCTION LOAD | DELETE | FLUSH |
//!   RESTORE` ([`gather_ok`]), `SCRIPT KILL` / `FUNCTION KILL` (on [`dedicated`]
//!   connections), `INFO`'s keyspace section;
//! - `pubsub/introspect.rs`: `PUBSUB CHANNELS | NUMSUB | NUMPAT` and their shard forms
//!   ([`gather_ok`]);
//! - `wait.rs`: `WAIT` / `WAITAOF`, on dedicated connections, answers taken as they come.
//!
//! A site hands over its requests already sent, as `(target, future)` pairs: [`gather`]
//! takes them all when it is called (in the session's dispatch, so each request keeps its
//! place among the session's other commands on the shared connections); [`in_turn`] takes
//! the next only once the one before it is answered. The combiner takes one answer at a
//! time with its target and may end the gather with the client's answer (`Break`): the
//! requests not yet taken are dropped then (a dedicated connection dropped with its request
//! is closed, which unblocks it on Redis).
//!
//! `SCAN` is not a gather: each call's cursor comes from the reply before it, so
//! `keyspace.rs` walks the shards itself (sending as the others do, with a [`Sent`]).

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;

use bytes::Bytes;
use futures_util::future::{ready, Either, Ready};
use futures_util::stream::{FuturesUnordered, StreamExt};
use respway_filters::error::{Answer, Failure, Kind};
use respway_filters::request::{is_error, Flavor, Reply};
use tokio::time::Instant;

use crate::upstream::{EndpointHandle, UpstreamFuture};

/// A reply computed by a future of its own.
pub(crate) type BoxReply = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// One target's request on the session's shared connections, or the failure that kept it
/// from being sent (answered in the target's turn, like a reply).
pub(crate) type Sent = Either<UpstreamFuture, Ready<Answer>>;

/// A request that could not be sent: `f` is its answer.
pub(crate) fn unsent(f: Failure) -> Sent {
    Either::Right(ready(Err(f)))
}

/// The order [`gather`] takes the answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// The targets' order: the first answer that ends the gather in that order does.
    Targets,
    /// As they arrive: an answer that ends the gather does so as soon as it comes.
    Arrival,
}

/// Takes every request of `asked` now, and folds their answers into `acc` with `take` (in
/// `order`); `finish` makes the client's answer once every answer was taken, unless `take`
/// ended the gather with one (`Break`).
pub(crate) fn gather<T, F, A>(
    order: Order,
    asked: impl IntoIterator<Item = (T, F)>,
    acc: A,
    take: impl FnMut(&mut A, &T, F::Output) -> ControlFlow<Answer> + Send + 'static,
    finish: impl FnOnce(A) -> Answer + Send + 'static,
) -> BoxReply
where
    T: Send + 'static,
    F: Future + Send + 'static,
    F::Output: Send,
    A: Send + 'static,
{
    match order {
        Order::Targets => {
            let asked: Vec<(T, F)> = asked.into_iter().collect();
            Box::pin(fold(asked.into_iter(), acc, take, finish))
        }
        Order::Arrival => {
            let mut left: FuturesUnordered<_> = asked
                .into_iter()
                .map(|(t, f)| async move { (t, f.await) })
                .collect();
            let mut take = take;
            Box::pin(async move {
                let mut acc = acc;
                while let Some((t, r)) = left.next().await {
                    if let ControlFlow::Break(a) = take(&mut acc, &t, r) {
                        return a;
                    }
                }
                finish(acc)
            })
        }
    }
}

/// Like [`gather`] in target order, but each request of `asked` is made (the iterator
/// advanced) only once the answer before it was taken: one target at a time, until `take`
/// has the answer.
pub(crate) fn in_turn<T, F, A>(
    asked: impl Iterator<Item = (T, F)> + Send + 'static,
    acc: A,
    take: impl FnMut(&mut A, &T, F::Output) -> ControlFlow<Answer> + Send + 'static,
    finish: impl FnOnce(A) -> Answer + Send + 'static,
) -> BoxReply
where
    T: Send + 'static,
    F: Future + Send + 'static,
    F::Output: Send,
    A: Send + 'static,
{
    Box::pin(fold(asked, acc, take, finish))
}

async fn fold<T, F: Future, A>(
    asked: impl Iterator<Item = (T, F)>,
    mut acc: A,
    mut take: impl FnMut(&mut A, &T, F::Output) -> ControlFlow<Answer>,
    finish: impl FnOnce(A) -> Answer,
) -> Answer {
    for (t, f) in asked {
        let r = f.await;
        if let ControlFlow::Break(a) = take(&mut acc, &t, r) {
            return a;
        }
    }
    finish(acc)
}

/// [`gather`] in target order under the rule of the key-less fan-outs: every answer is
/// awaited; the first failure or Redis error among them is the client's answer; else
/// `take` folds the replies in target order (an answer it ends the gather with is the
/// client's unless a later target failed) and `finish` answers. No target at all is
/// [`Kind::NoTarget`].
pub(crate) fn gather_ok<T, F, A>(
    asked: impl IntoIterator<Item = (T, F)>,
    acc: A,
    mut take: impl FnMut(&mut A, &T, Reply) -> ControlFlow<Answer> + Send + 'static,
    finish: impl FnOnce(A) -> Answer + Send + 'static,
) -> BoxReply
where
    T: Send + 'static,
    F: Future<Output = Answer> + Send + 'static,
    A: Send + 'static,
{
    let all = AllOk {
        acc,
        any: false,
        failed: None,
        refused: None,
    };
    gather(
        Order::Targets,
        asked,
        all,
        move |all, t, r| {
            all.any = true;
            match r {
                Ok(r) if !is_error(&r) => {
                    if all.failed.is_none() && all.refused.is_none() {
                        if let ControlFlow::Break(a) = take(&mut all.acc, t, r) {
                            all.refused = Some(a);
                        }
                    }
                }
                failed => {
                    all.failed.get_or_insert(failed);
                }
            }
            ControlFlow::Continue(())
        },
        move |all| match (all.any, all.failed, all.refused) {
            (false, ..) => Err(Failure::new(Kind::NoTarget)),
            (true, Some(a), _) | (true, None, Some(a)) => a,
            (true, None, None) => finish(all.acc),
        },
    )
}

/// [`gather_ok`]'s state.
struct AllOk<A> {
    acc: A,
    /// An answer was taken.
    any: bool,
    /// The first failure or Redis error.
    failed: Option<Answer>,
    /// What `take` ended with (the client's answer when nothing failed).
    refused: Option<Answer>,
}

/// `args` on a dedicated connection of `ep`, taken and sent now: the answer, the connection
/// given back to the pool once Redis answered (nothing is left in flight on it; an error of
/// respway's own ends the connection instead). No dedicated connection to be had is the
/// failure, naming the endpoint.
pub(crate) fn dedicated(
    ep: &EndpointHandle,
    flavor: Flavor,
    args: Vec<Bytes>,
    deadline: Instant,
) -> impl Future<Output = Answer> + Send + 'static {
    let ask = ep
        .take_dedicated(flavor)
        .map(|conn| {
            let reply = conn.send(args, deadline);
            (conn, reply)
        })
        .map_err(|e| e.at(ep.label().clone()));
    async move {
        let (conn, reply) = ask?;
        let r = reply.await;
        if r.is_ok() {
            conn.give_back();
        }
        r
    }
}
