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

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use tower::{Layer, Service};

use crate::command::{CommandClass, SplitKind};
use crate::request::{error_reply, is_error, Reply, Request};
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
            keys: Vec::new(),
            shards: Vec::new(),
        }
    }
}

/// Splits multi-key commands per shard and merges the replies.
#[derive(Debug, Clone)]
pub struct MultiKey<S> {
    inner: S,
    routing: Arc<Routing>,
    keys: Vec<usize>,
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
    /// One per shard: the future, the original key positions it carries, its reply when done.
    parts: Vec<Part<F>>,
}

#[derive(Debug)]
struct Part<F> {
    fut: F,
    positions: Vec<usize>,
    reply: Option<Reply>,
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
        if let Err(e) = req.cmd.key_indices(&req.args, &mut self.keys) {
            return ResponseFuture::Ready(Some(error_reply(&format!("ERR {e}"))));
        }
        if self.keys.is_empty() {
            return ResponseFuture::Inner(self.inner.call(req));
        }
        let picker = &self.routing.clusters[req.cluster].picker;
        self.shards.clear();
        self.shards
            .extend(self.keys.iter().map(|&i| picker.pick(&req.args[i])));
        let first = self.shards[0];
        if self.shards.iter().all(|&s| s == first) {
            req.shard = Some(first);
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
        let mut parts = Vec::with_capacity(groups.len());
        for (shard, positions) in groups {
            let per_key = if kind == SplitKind::Mset { 2 } else { 1 };
            let mut args = Vec::with_capacity(1 + positions.len() * per_key);
            args.push(req.args[0].clone());
            for &p in &positions {
                let i = self.keys[p];
                args.push(req.args[i].clone());
                if kind == SplitKind::Mset {
                    args.push(req.args[i + 1].clone());
                }
            }
            let mut sub = Request::new(req.cmd, args, Some(1));
            sub.deadline = req.deadline;
            sub.flavor = req.flavor;
            sub.cluster = req.cluster;
            sub.shard = Some(shard);
            parts.push(Part {
                fut: self.inner.call(sub),
                positions,
                reply: None,
            });
        }
        ResponseFuture::Merge(Merge {
            kind,
            nkeys: self.keys.len(),
            parts,
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
            ResponseFuture::Merge(m) => {
                let mut pending = false;
                for part in &mut m.parts {
                    if part.reply.is_none() {
                        match Pin::new(&mut part.fut).poll(cx) {
                            Poll::Ready(Ok(r)) => part.reply = Some(r),
                            Poll::Pending => pending = true,
                        }
                    }
                }
                if pending {
                    return Poll::Pending;
                }
                Poll::Ready(Ok(m.merge()))
            }
        }
    }
}

impl<F> Merge<F> {
    fn merge(&mut self) -> Reply {
        let replies = self.parts.iter().map(|p| p.reply.as_ref());
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
                for part in &self.parts {
                    let Some(r) = part.reply.as_ref() else {
                        return unexpected(&[]);
                    };
                    match parse_reply(r) {
                        Ok(Frame::Array(items)) if items.len() == part.positions.len() => {
                            for (item, &pos) in items.into_iter().zip(&part.positions) {
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
