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
//! and fails with [`Kind::NotReady`], which the merge returns like any shard error.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use tower::{Layer, Service};

use crate::codec_limits::Limits;
use crate::command::{CommandClass, SplitKind};
use crate::error::{failed, Failure, Kind};
use crate::fanout::Join;
use crate::hash::ShardPicker;
use crate::place::Refusal;
use crate::request::{Keys, Reply, Request};
use crate::resp::{
    argv_with_capacity, array_header, parse_reply, recycle_argv, reply_len, Args, Frame,
};
use crate::routing::Routing;

pub use crate::place::CROSSSLOT;

/// `CROSSSLOT` when `req` must run on one shard of its cluster (not a split command) and its
/// keys hash to several (for the mirror layer, which must not copy a command its own side
/// refuses). Does the check [`MultiKey`] makes, without its buffers.
pub fn refuses(routing: &Routing, req: &Request) -> Option<Refusal> {
    if !matches!(
        req.cmd.class,
        CommandClass::SameShard | CommandClass::Blocking
    ) || req.shard.is_some()
    {
        return None;
    }
    let picker = &routing.clusters.get(req.cluster)?.picker;
    one_shard(picker.as_ref(), req)
        .is_none()
        .then_some(Refusal::CrossSlot)
}

/// The shard all of `req`'s keys hash to (its first key's), or `None` when they hash to
/// several. A request without keys is on its first key's shard vacuously: callers skip it.
fn one_shard(picker: &dyn ShardPicker, req: &Request) -> Option<usize> {
    let mut shards = req.keys.iter().map(|i| picker.pick(&req.args[i]));
    let first = shards.next().unwrap_or(0);
    shards.all(|s| s == first).then_some(first)
}

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
            order: Vec::new(),
            subs: Vec::new(),
        }
    }
}

/// Splits multi-key commands per shard and merges the replies.
#[derive(Debug, Clone)]
pub struct MultiKey<S> {
    inner: S,
    routing: Arc<Routing>,
    /// Reused buffer: the shard of each key, then its group (its shard's index in `order`).
    shards: Vec<usize>,
    /// Reused buffer: the shards of a split command, in order of first appearance, and how
    /// many of its keys each one holds.
    order: Vec<(usize, usize)>,
    /// Reused buffer: the sub-commands' arguments while they are gathered.
    subs: Vec<Args>,
}

/// What a [`MultiKey`] call returns.
#[derive(Debug)]
pub enum ResponseFuture<F> {
    /// Forwarded whole.
    Inner(F),
    /// Refused without calling the inner service (taken when polled).
    Refused(Option<Refusal>),
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
    /// MGET only (empty otherwise): per key of the original command, the index of the
    /// sub-command that carries it. A sub-command carries its keys in their original order.
    groups: Vec<usize>,
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
    S: Service<Request, Response = Reply, Error = Failure>,
    S::Future: Unpin,
{
    type Response = Reply;
    type Error = Failure;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
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
        let cluster = &self.routing.clusters[req.cluster];
        let picker = &cluster.picker;
        // A Redis Cluster's sub-commands are per slot (`(shard << 14) | slot` numbers each
        // group); other clusters' per shard.
        let by_slot = cluster.redis_cluster.then_some(cluster.hashtag);
        let Some(kind) = kind else {
            // One shard, or refused (the mirror layer asks the same through `refuses`).
            return match one_shard(picker.as_ref(), &req) {
                Some(shard) => {
                    req.pin_shard(shard);
                    ResponseFuture::Inner(self.inner.call(req))
                }
                None => ResponseFuture::Refused(Some(Refusal::CrossSlot)),
            };
        };
        self.shards.clear();
        self.shards.extend(req.keys.iter().map(|i| {
            let key = &req.args[i];
            match by_slot {
                Some(tag) => {
                    let slot = crate::hash::slots::redis_cluster_slot(key, tag) as usize;
                    (picker.pick(key) << 14) | slot
                }
                None => picker.pick(key),
            }
        }));
        let first = self.shards[0];
        let shard_of = |g: usize| if by_slot.is_some() { g >> 14 } else { g };
        if self.shards.iter().all(|&s| s == first) {
            req.pin_shard(shard_of(first));
            return ResponseFuture::Inner(self.inner.call(req));
        }
        // Number the shards in order of first appearance; each key's entry in `shards`
        // becomes its group (the sub-command that carries it). `order` holds each group's
        // shard and key count.
        self.order.clear();
        for s in self.shards.iter_mut() {
            *s = match self.order.iter().position(|(o, _)| o == s) {
                Some(g) => {
                    self.order[g].1 += 1;
                    g
                }
                None => {
                    self.order.push((*s, 1));
                    self.order.len() - 1
                }
            };
        }
        let per_key = if kind == SplitKind::Mset { 2 } else { 1 };
        self.subs.clear();
        for &(_, count) in &self.order {
            let mut args = argv_with_capacity(1 + count * per_key);
            args.push(req.args[0].clone());
            self.subs.push(args);
        }
        // The arguments move into the sub-commands: no reference count is taken for them.
        for (p, &g) in self.shards.iter().enumerate() {
            if let Some(i) = req.keys.get(p) {
                let sub = &mut self.subs[g];
                sub.push(std::mem::take(&mut req.args[i]));
                if kind == SplitKind::Mset {
                    sub.push(std::mem::take(&mut req.args[i + 1]));
                }
            }
        }
        let mut join = Join::with_capacity(self.order.len());
        for (args, &(group, count)) in self.subs.drain(..).zip(&self.order) {
            let shard = shard_of(group);
            // `cmd k1 [v1] k2 [v2] ...`: the keys from 1, `per_key` apart.
            let keys = Keys::step(1, per_key, count);
            let mut sub = Request::with_keys(req.cmd, args, keys);
            sub.deadline = req.deadline;
            sub.flavor = req.flavor;
            sub.cluster = req.cluster;
            sub.pin_shard(shard);
            join.call(&mut self.inner, sub);
        }
        let groups = match kind {
            SplitKind::Mget => self.shards.clone(),
            _ => Vec::new(),
        };
        // The sub-commands hold their own slices of the arguments: this vector can serve
        // the next request.
        recycle_argv(req.args);
        ResponseFuture::Merge(Merge {
            kind,
            nkeys: self.shards.len(),
            join,
            groups,
        })
    }
}

// === impl ResponseFuture ===

impl<F> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Reply, Failure>> + Unpin,
{
    type Output = Result<Reply, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            ResponseFuture::Inner(f) => Pin::new(f).poll(cx),
            ResponseFuture::Refused(r) => Poll::Ready(Err(r
                .take()
                .map_or_else(|| Failure::new(Kind::PolledTwice), Failure::from))),
            ResponseFuture::Merge(m) => match m.join.poll(cx) {
                Poll::Ready(()) => Poll::Ready(m.merge()),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<F> Merge<F> {
    fn merge(&mut self) -> Result<Reply, Failure> {
        // Any failure or shard error is the reply (the first, in shard order of appearance).
        if let Some(failed) = self.join.replies().flatten().find(|r| failed(r)) {
            return failed.clone();
        }
        let replies = self.join.replies().map(|r| r.and_then(|r| r.as_ref().ok()));
        match self.kind {
            SplitKind::Mset => Ok(Bytes::from_static(b"+OK\r\n")),
            SplitKind::SumInt => {
                let mut sum: i64 = 0;
                for r in replies {
                    match r.map(|r| (r, parse_reply(r))) {
                        Some((_, Ok(Frame::Integer(n)))) => sum = sum.saturating_add(n),
                        other => return Err(unexpected(other.map_or(&[][..], |(r, _)| r))),
                    }
                }
                let mut out = BytesMut::with_capacity(24);
                crate::resp::write_integer(&mut out, b':', sum);
                Ok(out.freeze())
            }
            SplitKind::Mget => merge_mget(self.nkeys, &self.groups, replies),
        }
    }
}

/// The MGET reply in the original key order, from one array reply per sub-command
/// (`groups[p]` is the sub-command holding key `p`, which carries its keys in their original
/// order). The elements are copied as the shards sent them: nothing is parsed beyond each
/// element's length.
fn merge_mget<'a>(
    nkeys: usize,
    groups: &[usize],
    replies: impl Iterator<Item = Option<&'a Reply>>,
) -> Result<Reply, Failure> {
    // Per sub-reply: the reply, the offset of its next element, and how many are left.
    let mut cursors = Vec::with_capacity(replies.size_hint().0);
    let mut len = 16;
    for r in replies {
        let Some(r) = r else {
            return Err(unexpected(&[]));
        };
        let Some((left, first)) = array_header(r) else {
            return Err(unexpected(r));
        };
        cursors.push((r, first, left));
        len += r.len();
    }
    let mut out = BytesMut::with_capacity(len);
    crate::resp::write_integer(&mut out, b'*', nkeys as i64);
    for &g in groups {
        let Some((r, at, left)) = cursors.get_mut(g) else {
            return Err(unexpected(&[]));
        };
        if *left == 0 {
            return Err(unexpected(r));
        }
        // The upstream connection framed the reply already: no limit applies here.
        match reply_len(&r[*at..], &Limits::REPLIES) {
            Ok(Some(n)) => {
                out.put_slice(&r[*at..*at + n]);
                *at += n;
                *left -= 1;
            }
            _ => return Err(unexpected(r)),
        }
    }
    // Every element used, and nothing after the last.
    for (r, at, left) in &cursors {
        if *left != 0 || *at != r.len() {
            return Err(unexpected(r));
        }
    }
    Ok(out.freeze())
}

fn unexpected(r: &[u8]) -> Failure {
    Failure::new(Kind::Unmergeable(
        String::from_utf8_lossy(&r[..r.len().min(64)]).into_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged(groups: &[usize], replies: &[&'static [u8]]) -> Reply {
        let replies: Vec<Reply> = replies.iter().map(|r| Bytes::from_static(r)).collect();
        merge_mget(groups.len(), groups, replies.iter().map(Some)).unwrap_or_else(|f| f.to_reply())
    }

    #[test]
    fn mget_merge_puts_elements_back_in_key_order_byte_for_byte() {
        // Keys 0 and 3 on the first sub-command, 1, 2 and 4 on the second.
        let got = merged(
            &[0, 1, 1, 0, 1],
            &[
                b"*2\r\n$1\r\na\r\n$-1\r\n",
                b"*3\r\n$4\r\nb\r\nc\r\n_\r\n$0\r\n\r\n",
            ],
        );
        assert_eq!(
            &got[..],
            b"*5\r\n$1\r\na\r\n$4\r\nb\r\nc\r\n_\r\n$-1\r\n$0\r\n\r\n"
        );
    }

    #[test]
    fn mget_merge_refuses_replies_that_do_not_match_the_keys() {
        let short = merged(&[0, 1, 1], &[b"*1\r\n$1\r\na\r\n", b"*1\r\n$1\r\nb\r\n"]);
        let extra = merged(
            &[0, 1],
            &[b"*1\r\n$1\r\na\r\n$1\r\nz\r\n", b"*1\r\n$1\r\nb\r\n"],
        );
        let wrong_count = merged(&[0, 1], &[b"*2\r\n$1\r\na\r\n", b"*1\r\n$1\r\nb\r\n"]);
        let not_array = merged(&[0, 1], &[b"$1\r\na\r\n", b"*1\r\n$1\r\nb\r\n"]);
        let null_array = merged(&[0, 1], &[b"*-1\r\n", b"*1\r\n$1\r\nb\r\n"]);
        for r in [short, extra, wrong_count, not_array, null_array] {
            assert!(
                r.starts_with(b"-ERR respway: unexpected reply from a shard while merging"),
                "{r:?}"
            );
        }
        let missing = merge_mget(
            2,
            &[0, 1],
            [Some(&Bytes::from_static(b"*1\r\n:1\r\n")), None].into_iter(),
        )
        .unwrap_or_else(|f| f.to_reply());
        assert!(
            missing.starts_with(b"-ERR respway: unexpected reply"),
            "{missing:?}"
        );
    }
}
