//! `MultiKeyLayer`: commands whose keys may live on several shards.
//!
//! - MGET, MSET, DEL, UNLINK, EXISTS, TOUCH are split into ONE sub-command per shard (not one
//!   per key, as Envoy does), sent together and merged: MGET back into key order, MSET into one
//!   `+OK` (or the first error), the others summed. MSET is therefore **not atomic** across
//!   shards: when one shard fails, the pairs sent to the other shards stay written.
//! - Commands that need all their keys on one shard (RENAME, SMOVE, SINTERSTORE, EVAL, ...)
//!   are pinned to that shard, or refused with `-CROSSSLOT` when the keys hash apart.
//!
//! A command whose keys all hash to one shard is forwarded unchanged, with no merge cost.
//!
//! Key positions are the ones the session computed ([`Request::keys`]), not computed again.
//! The sub-commands go through one [`Join`], whose readiness rule (see [`crate::fanout`])
//! is the hot-key layer's too: a sub-command the inner service is not ready for is not sent
//! and answers [`NOT_READY`](crate::fanout::NOT_READY), which the merge returns like any
//! shard error.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use tower::{Layer, Service};

use crate::command::{CommandClass, SplitKind};
use crate::fanout::Join;
use crate::request::{error_reply, is_error, Keys, Reply, Request};
use crate::resp::{parse_reply, Frame};
use crate::routing::Routing;

/// The reply to a command whose keys hash to more than one shard.
pub const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same shard";

/// Builds [`MultiKey`] services over one routing table.
#[derive(Debug, Clone)]
pub struct MultiKeyLayer {
    routing: Arc<Routing>,
}

impl MultiKeyLayer {
    /// A layer splitting with the pickers of `routing`.
    pub fn new(routing: Arc<Routing>) -> Self {
        MultiKeyLayer { routing }
    }
}

impl<S> Layer<S> for MultiKeyLayer {
    type Service = MultiKey<S>;
    fn layer(&self, inner: S) -> MultiKey<S> {
        MultiKey {
            inner,
            routing: self.routing.clone(),
            shards: Vec::new(),
        }
    }
}

/// Splits multi-key commands per shard and merges the replies.
#[derive(Debug, Clone)]
pub struct MultiKey<S> {
    inner: S,
    routing: Arc<Routing>,
    /// Reused buffer: the shard of each key.
    shards: Vec<usize>,
}

/// What a [`MultiKey`] call returns.
#[derive(Debug)]
pub enum ResponseFuture<F> {
    /// Forwarded whole.
    Inner(F),
    /// Answered without calling the inner service.
    Ready(Option<Reply>),
    /// Waiting for several shards.
    Merge(Merge<F>),
}

/// Sub-requests in flight for one split command.
#[derive(Debug)]
pub struct Merge<F> {
    kind: SplitKind,
    /// Number of keys in the original command.
    nkeys: usize,
    /// One sub-command per shard (see [`Join`] for the readiness rule).
    join: Join<F>,
    /// Per sub-command, in the join's order: the indices (in the original command's key
    /// order) of the keys it carries.
    positions: Vec<Vec<usize>>,
}

// === impl MultiKey ===

impl<S> MultiKey<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Service<Request> for MultiKey<S>
where
    S: Service<Request, Response = Reply, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Reply;
    type Error = Infallible;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let kind = match req.cmd.class {
            CommandClass::Split(kind) => Some(kind),
            // Blocking: XREAD / XREADGROUP without BLOCK (the session sends the blocking ones
            // itself), forwarded like SameShard.
            CommandClass::SameShard | CommandClass::Blocking => None,
            _ => return ResponseFuture::Inner(self.inner.call(req)),
        };
        if req.shard.is_some() {
            return ResponseFuture::Inner(self.inner.call(req));
        }
        if req.keys.is_empty() {
            return ResponseFuture::Inner(self.inner.call(req));
        }
        let picker = &self.routing.clusters[req.cluster].picker;
        self.shards.clear();
        self.shards
            .extend(req.keys.iter().map(|i| picker.pick(&req.args[i])));
        let first = self.shards[0];
        if self.shards.iter().all(|&s| s == first) {
            req.pin_shard(first);
            return ResponseFuture::Inner(self.inner.call(req));
        }
        let Some(kind) = kind else {
            return ResponseFuture::Ready(Some(error_reply(CROSSSLOT)));
        };
        // Group key positions by shard, in order of first appearance.
        let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
        for (pos, &shard) in self.shards.iter().enumerate() {
            match groups.iter_mut().find(|(s, _)| *s == shard) {
                Some((_, v)) => v.push(pos),
                None => groups.push((shard, vec![pos])),
            }
        }
        let mut join = Join::with_capacity(groups.len());
        let mut all_positions = Vec::with_capacity(groups.len());
        let per_key = if kind == SplitKind::Mset { 2 } else { 1 };
        for (shard, positions) in groups {
            let mut args = Vec::with_capacity(1 + positions.len() * per_key);
            args.push(req.args[0].clone());
            for i in positions.iter().filter_map(|&p| req.keys.get(p)) {
                args.push(req.args[i].clone());
                if kind == SplitKind::Mset {
                    args.push(req.args[i + 1].clone());
                }
            }
            // `cmd k1 [v1] k2 [v2] ...`: the keys from 1, `per_key` apart.
            let keys = Keys::step(1, per_key, positions.len());
            let mut sub = Request::with_keys(req.cmd, args, keys);
            sub.deadline = req.deadline;
            sub.flavor = req.flavor;
            sub.cluster = req.cluster;
            sub.pin_shard(shard);
            join.call(&mut self.inner, sub);
            all_positions.push(positions);
        }
        ResponseFuture::Merge(Merge {
            kind,
            nkeys: req.keys.len(),
            join,
            positions: all_positions,
        })
    }
}

// === impl ResponseFuture ===

impl<F> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Reply, Infallible>> + Unpin,
{
    type Output = Result<Reply, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            ResponseFuture::Inner(f) => Pin::new(f).poll(cx),
            ResponseFuture::Ready(r) => Poll::Ready(Ok(r
                .take()
                .unwrap_or_else(|| error_reply("ERR respway: reply polled twice")))),
            ResponseFuture::Merge(m) => match m.join.poll(cx) {
                Poll::Ready(()) => Poll::Ready(Ok(m.merge())),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<F> Merge<F> {
    fn merge(&mut self) -> Reply {
        let replies = self.join.replies();
        // Any shard error is the reply (the first, in shard order of appearance).
        if let Some(err) = replies.clone().flatten().find(|r| is_error(r)) {
            return err.clone();
        }
        match self.kind {
            SplitKind::Mset => Bytes::from_static(b"+OK\r\n"),
            SplitKind::SumInt => {
                let mut sum: i64 = 0;
                for r in replies.flatten() {
                    match parse_reply(r) {
                        Ok(Frame::Integer(n)) => sum = sum.saturating_add(n),
                        _ => return unexpected(r),
                    }
                }
                let mut out = BytesMut::with_capacity(24);
                crate::resp::write_integer(&mut out, b':', sum);
                out.freeze()
            }
            SplitKind::Mget => {
                let mut slots: Vec<Option<Frame>> = vec![None; self.nkeys];
                for (reply, positions) in self.join.replies().zip(&self.positions) {
                    let Some(r) = reply else {
                        return unexpected(&[]);
                    };
                    match parse_reply(r) {
                        Ok(Frame::Array(items)) if items.len() == positions.len() => {
                            for (item, &pos) in items.into_iter().zip(positions) {
                                slots[pos] = Some(item);
                            }
                        }
                        _ => return unexpected(r),
                    }
                }
                let mut out = BytesMut::with_capacity(64 * self.nkeys);
                crate::resp::write_integer(&mut out, b'*', self.nkeys as i64);
                for f in slots {
                    match f {
                        Some(f) => f.encode(&mut out),
                        None => out.put_slice(b"$-1\r\n"),
                    }
                }
                out.freeze()
            }
        }
    }
}

fn unexpected(r: &[u8]) -> Reply {
    error_reply(&format!(
        "ERR respway: unexpected reply from a shard while merging: {}",
        String::from_utf8_lossy(&r[..r.len().min(64)])
    ))
}
