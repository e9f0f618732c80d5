//! `MirrorLayer`: request mirroring and the online-migration modes of a route.
//!
//! It sits right after `route` (it acts per route, so it needs [`Request::route`] and
//! [`Request::cluster`]) and before `hotkey`, `split` and `hash`, so a request re-targeted to
//! another cluster is placed with that cluster's own hot-key rules and shard picker, and a
//! multi-key command is mirrored whole and split per cluster.
//!
//! For each request, [`Routing::mirrors`] gives the policies of its route. Most routes have
//! none: the request passes through with no other work. Otherwise, per policy (`m.cluster`
//! is the mirror cluster, `req.cluster` the route's own):
//!
//! - **Forward** ([`MirrorMode::Forward`]) does nothing.
//! - **ReadOnly** ([`MirrorMode::ReadOnly`]): writes (see [`Request::is_read`]) are refused
//!   with [`READ_ONLY`]; reads are served. A refused write is not mirrored either.
//! - **DualWrite**, old-first ([`MirrorMode::DualWrite`] with `target_is_primary: false`):
//!   eligible commands (writes, and reads too when `include_reads`), sampled by
//!   `fraction_ppm`, are copied to `m.cluster` through the [`MirrorSink`]; the original goes
//!   on unchanged.
//! - **DualWrite**, new-first (`target_is_primary: true`): the original is re-targeted to
//!   `m.cluster` — reads too, always, since switching reads is the point of this step — and
//!   eligible sampled commands are copied to the route's own cluster. Only the first such
//!   policy of a route re-targets; a further one (the translator should not allow two) acts
//!   as old-first.
//!
//! - **Move** ([`MirrorMode::Move`], the route's only policy): the request goes to
//!   `m.cluster`, after its keys whose owner changes are moved there ([`crate::moving`]).
//! - **PrepareMove** ([`MirrorMode::PrepareMove`], the route's only policy): a request
//!   naming a key whose owner changes is refused with [`crate::moving::ABOUT_TO_MOVE`];
//!   the others go on unchanged.
//!
//! A command that the primary side would refuse — a hot key written with other keys
//! ([`crate::hot_key::refuses`]), keys on several shards of a cluster that runs it on one
//! ([`crate::multi_key::refuses`]) — is answered with that refusal here and copied nowhere.
//!
//! A copy is the request with `cluster` set to the other side and `shard` and `endpoint`
//! cleared; its arguments are the same `Bytes` (refcounts, no copy). The sink's consumer must
//! send copies through a chain WITHOUT this layer (hot key and inward), or they would be
//! mirrored again. Proxy-answered and unsupported commands ([`CommandClass::Proxy`],
//! [`CommandClass::Unsupported`]) are neither mirrored nor refused; every data command is,
//! with or without keys.
//!
//! Where a write copy is made (queued, or dropped because the queue is full), its keys are
//! recorded in this worker's part of the receiving cluster's
//! [`WriteRecord`](crate::write_record::WriteRecord) ([`MirrorLayer::with_records`]), so that
//! a copy-mode migration can re-check only the keys written since dual write began. Copied
//! reads are not recorded; a route with no `dual_write` policy never gets there.
//!
//! # Invariants
//!
//! Mirrored sends never change the reply the client sees, never reorder it and never slow it
//! beyond the enqueue: [`MirrorSink::try_send`] never blocks, a full queue drops the copy and
//! counts it, and the reply of a copy only feeds counters (the consumer calls
//! [`MirrorStats::record_failed`]). The client's request gets exactly one reply: the inner
//! service's, or the read-only refusal.
//!
//! Sampling uses a small RNG per connection (created on first use), so no atomic is shared
//! between connections; `fraction_ppm` of 0 and 1 000 000 draw no random number at all.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

use std::sync::Arc;
use std::task::{Context, Poll};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tower::{Layer, Service};

use crate::command::CommandClass;
use crate::error::{Failure, Kind};
pub use crate::mirror_stats::{MirrorCounts, MirrorStats, MoveOutcome};
use crate::model::MirrorMode;
use crate::moving::{Held, MoveFuture, Moved, Moving};
use crate::place::Refusal;
use crate::request::{Reply, Request};
use crate::routing::Routing;
use crate::write_record::RecordParts;

pub use crate::place::READ_ONLY;

/// `fraction_ppm` meaning "every eligible command".
const ALL_PPM: u32 = 1_000_000;

/// Where mirrored copies go: a bounded queue drained by a task that sends them through the
/// shadow chain and records failures with [`MirrorStats::record_failed`].
pub trait MirrorSink: Send + Sync + Debug {
    /// Queue a copy; false when the bounded queue is full (the copy is dropped). Never blocks.
    fn try_send(&self, req: Request) -> bool;
}

/// Builds [`Mirror`] services over one routing table.
#[derive(Debug, Clone)]
pub struct MirrorLayer {
    routing: Arc<Routing>,
    sink: Arc<dyn MirrorSink>,
    stats: Arc<MirrorStats>,
    moved: Arc<Moved>,
    records: RecordParts,
}

impl MirrorLayer {
    /// A layer applying the mirror policies of `routing`, queueing copies on `sink` and
    /// counting into `stats` (one per worker, sized for `routing.clusters`).
    /// `moved` is the worker's memory of keys seen moved in move mode, shared by its
    /// connections.
    pub fn new(
        routing: Arc<Routing>,
        sink: Arc<dyn MirrorSink>,
        stats: Arc<MirrorStats>,
        moved: Arc<Moved>,
    ) -> Self {
        MirrorLayer {
            routing,
            sink,
            stats,
            moved,
            records: RecordParts::default(),
        }
    }

    /// Records the keys of every write copy in `records`: per cluster (indexed like
    /// `routing.clusters`), the worker's part of the record of the copies that cluster
    /// receives (`None`: no record; without this, nothing is recorded).
    pub fn with_records(mut self, records: RecordParts) -> Self {
        self.records = records;
        self
    }
}

impl<S> Layer<S> for MirrorLayer {
    type Service = Mirror<S>;
    fn layer(&self, inner: S) -> Mirror<S> {
        let mut m = Mirror::new(
            inner,
            self.routing.clone(),
            self.sink.clone(),
            self.stats.clone(),
            self.moved.clone(),
        );
        m.records = self.records.clone();
        m
    }
}

/// Applies the mirror policies of each request's route.
#[derive(Debug, Clone)]
pub struct Mirror<S> {
    inner: S,
    routing: Arc<Routing>,
    sink: Arc<dyn MirrorSink>,
    stats: Arc<MirrorStats>,
    /// This connection's sampling RNG, created on the first fractional sample.
    rng: Option<SmallRng>,
    /// This connection's commands waiting to be forwarded on a route in move mode.
    held: Held,
    /// The worker's memory of keys seen moved.
    moved: Arc<Moved>,
    /// Per receiving cluster, the worker's part of its record of write copies.
    records: RecordParts,
}

// === impl Mirror ===

impl<S> Mirror<S> {
    /// Wraps `inner` with the mirror policies of `routing`.
    pub fn new(
        inner: S,
        routing: Arc<Routing>,
        sink: Arc<dyn MirrorSink>,
        stats: Arc<MirrorStats>,
        moved: Arc<Moved>,
    ) -> Self {
        Mirror {
            inner,
            routing,
            sink,
            stats,
            rng: None,
            held: Held::default(),
            moved,
            records: RecordParts::default(),
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// True when `req` runs on one shard in both clusters (not a split command, whose parts
    /// may land apart) and that shard's primary is the same Redis in `answering` (where the
    /// write itself goes) and `to` (where its copy would go): clusters that share shards,
    /// as when 2 shards grow to 4 and the 2 old ones stay.
    fn same_redis(&self, req: &Request, answering: usize, to: usize) -> bool {
        if matches!(req.cmd.class, CommandClass::Split(_)) {
            return false;
        }
        let Some(key) = req.keys.first().and_then(|i| req.args.get(i)) else {
            return false;
        };
        let shard = |c: usize| self.routing.clusters.get(c).map(|c| c.picker.pick(key));
        match (shard(answering), shard(to)) {
            (Some(a), Some(b)) => self.routing.same_primary(answering, a, to, b),
            _ => false,
        }
    }

    /// Applies the policies of `req`'s route; `Err` is the reply of a refused write. On a
    /// route in move mode `Ok` holds the `MIGRATE`s to run before `req` (maybe none);
    /// elsewhere `None`.
    fn apply(&mut self, req: &mut Request) -> Result<Option<Vec<Request>>, Refusal> {
        let policies = self.routing.mirrors(req.route);
        if policies.is_empty()
            || matches!(
                req.cmd.class,
                CommandClass::Proxy(_) | CommandClass::Unsupported
            )
        {
            return Ok(None);
        }
        let read = req.is_read();
        if !read && policies.iter().any(|m| m.mode == MirrorMode::ReadOnly) {
            return Err(Refusal::ReadOnly);
        }
        if let Some(m) = policies.iter().find(|m| m.mode == MirrorMode::Move) {
            return self.apply_move(req, m.cluster).map(Some);
        }
        if let Some(m) = policies.iter().find(|m| m.mode == MirrorMode::PrepareMove) {
            if crate::moving::owner_changes(&self.routing, req, req.cluster, m.cluster) {
                return Err(Refusal::AboutToMove);
            }
            return Ok(None);
        }
        let source = req.cluster;
        // A command that its primary side refuses (a hot key written with other keys, keys
        // on several shards) gets that refusal here and is copied nowhere: the client is told
        // it failed, so it must not run on the other side either.
        req.cluster = policies
            .iter()
            .find_map(|m| match m.mode {
                MirrorMode::DualWrite {
                    target_is_primary: true,
                } => Some(m.cluster),
                _ => None,
            })
            .unwrap_or(source);
        let refused = crate::hot_key::refuses(&self.routing, req)
            .or_else(|| crate::multi_key::refuses(&self.routing, req));
        let answering = req.cluster;
        req.cluster = source;
        if let Some(reply) = refused {
            return Err(reply);
        }
        let mut retarget = None;
        for m in policies {
            let MirrorMode::DualWrite { target_is_primary } = m.mode else {
                continue;
            };
            let new_first = target_is_primary && retarget.is_none();
            if new_first {
                retarget = Some(m.cluster);
            }
            if (read && !m.include_reads) || !sample(&mut self.rng, m.fraction_ppm) {
                continue;
            }
            let to = if new_first { source } else { m.cluster };
            if m.shares_primaries && self.same_redis(req, answering, to) {
                // The write itself reaches this Redis: a copy would run it twice.
                continue;
            }
            if !read {
                // A write copy, queued or dropped below: its keys differ on `to` until it runs.
                if let Some(Some(part)) = self.records.get(to) {
                    part.record(req);
                }
            }
            let mut copy = req.clone();
            copy.cluster = to;
            copy.shard = None;
            copy.endpoint = None;
            if self.sink.try_send(copy) {
                self.stats.mirrored(to);
            } else {
                self.stats.dropped(to);
            }
        }
        if let Some(cluster) = retarget {
            req.cluster = cluster;
            req.shard = None;
            req.endpoint = None;
        }
        Ok(None)
    }

    /// Move mode (see [`crate::moving`]): `req` goes to `to`, after the `MIGRATE`s that put
    /// its keys there; refused, and nothing moved, when `to` would refuse it.
    fn apply_move(&mut self, req: &mut Request, to: usize) -> Result<Vec<Request>, Refusal> {
        let from = req.cluster;
        req.cluster = to;
        req.shard = None;
        req.endpoint = None;
        if let Some(r) = crate::hot_key::refuses(&self.routing, req)
            .or_else(|| crate::multi_key::refuses(&self.routing, req))
        {
            return Err(r);
        }
        Ok(crate::moving::migrations(
            &self.routing,
            req,
            from,
            to,
            &self.moved,
        ))
    }
}

/// True for `ppm` parts per million of the calls.
#[inline]
fn sample(rng: &mut Option<SmallRng>, ppm: u32) -> bool {
    if ppm >= ALL_PPM {
        return true;
    }
    if ppm == 0 {
        return false;
    }
    let rng = rng.get_or_insert_with(|| SmallRng::from_rng(&mut rand::rng()));
    rng.random_range(0..ALL_PPM) < ppm
}

impl<S> Service<Request> for Mirror<S>
where
    S: Service<Request, Response = Reply, Error = Failure> + Clone + Unpin,
    S::Future: Unpin,
{
    type Response = Reply;
    type Error = Failure;
    type Future = ResponseFuture<S>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        match self.apply(&mut req) {
            Ok(None) => ResponseFuture::Inner(self.inner.call(req)),
            // Nothing to move and no earlier command of this connection waiting.
            Ok(Some(moves)) if moves.is_empty() && !self.held.any() => {
                ResponseFuture::Inner(self.inner.call(req))
            }
            Ok(Some(moves)) => {
                let stats = (self.stats.clone(), req.cluster);
                ResponseFuture::Move(MoveFuture::Moving(Box::new(Moving::start(
                    &mut self.inner,
                    moves,
                    req,
                    stats,
                    &mut self.held,
                    self.moved.clone(),
                ))))
            }
            Err(r) => ResponseFuture::Refused(Some(r)),
        }
    }
}

/// The future of a request through [`Mirror`].
#[derive(Debug)]
pub enum ResponseFuture<S: Service<Request>> {
    /// Forwarded (copies, if any, are queued already).
    Inner(S::Future),
    /// Refused (taken when polled).
    Refused(Option<Refusal>),
    /// Move mode: forwarded once its keys moved.
    Move(MoveFuture<S>),
}

impl<S> Future for ResponseFuture<S>
where
    S: Service<Request, Response = Reply, Error = Failure> + Clone + Unpin,
    S::Future: Unpin,
{
    type Output = Result<Reply, Failure>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            ResponseFuture::Inner(f) => Pin::new(f).poll(cx),
            ResponseFuture::Refused(r) => Poll::Ready(Err(r
                .take()
                .map_or_else(|| Failure::new(Kind::PolledTwice), Failure::from))),
            ResponseFuture::Move(f) => Pin::new(f).poll(cx),
        }
    }
}
