//! `HotKeyLayer`: keys under a hot prefix live on EVERY shard of their cluster.
//!
//! It sits after `mirror` (so a copy sent to a shadow cluster gets that cluster's own hot-key
//! rules) and before `split` and `hash`, which skip a request whose shard is already pinned.
//!
//! For a command naming one key ([`CommandClass::Single`], or DEL/UNLINK/EXISTS/TOUCH/MGET/
//! MSET with a single key) whose key, as forwarded (the route
//! layer has already removed a route prefix), starts with one of the cluster's hot-key
//! prefixes — the longest matching rule wins — and whose shard is not pinned yet:
//!
//! - a **write** (anything without Redis's `readonly` flag, see [`Request::is_read`]) is sent
//!   to every shard at once, one sub-request per shard with [`Request::shard`] pinned. The
//!   client gets the first shard's reply when no shard answered with an error; otherwise
//!   `-ERR respway: hot-key write failed on shard(s) s1, s3: <first error>`, the
//!   partial-failure counter is bumped and a warning is logged.
//! - a **read** goes to one shard, chosen by the rule's [`HotKeyRead`]: round-robin, random,
//!   or round-robin over the shards with an endpoint in the sidecar's zone (all shards when
//!   none has one). The choice is per client connection, so no counter is shared between
//!   connections or workers. The round-robin counter starts at a random offset per
//!   connection, so that many short connections do not all read from shard 0.
//!
//! A **write** that names a hot key in any other way — with other keys (MSET, DEL, RENAME,
//! SMOVE, ...) or in a command that is not a single-key one (EVAL, SORT, LMPOP, ...) — would
//! reach one copy of it, and reads from the other shards would keep seeing the old value. It
//! is refused (`-ERR respway: hot key ... is stored on every shard ...`) and sent nowhere.
//!
//! Everything else passes through untouched (a read naming a hot key with other keys is served
//! by the key's own shard: every copy holds the same value); a cluster without hot-key rules
//! costs one branch.
//!
//! # Partial failures and non-idempotent writes
//!
//! A hot-key write is not atomic across shards. When some shards fail, the shards that
//! succeeded keep the write. For an idempotent write (`SET`, `HSET`, `EXPIRE`, `DEL`) a retry
//! by the client repairs the copies. For a non-idempotent one (`INCR`, `APPEND`, `LPUSH`,
//! ...) the shards that succeeded keep the increment, a retry applies it twice there, and the
//! copies diverge until the key is rewritten as a whole (`SET`). Reads, which go to a single
//! shard, may then see different values. Prefer idempotent, whole-value writes for hot keys.
//!
//! # Readiness
//!
//! A fan-out calls the one inner service N times, through a [`Join`] (shared with the
//! multi-key layer, which documents the rule in [`crate::fanout`]): the first call relies on
//! [`HotKey::poll_ready`], each further one polls the inner service with a no-op waker first.
//! Respway's inner services are always ready, so this is only a check; if one were not ready,
//! that shard's sub-request is not sent and counts as a failed shard
//! (`-ERR respway: shard not ready`), so the client still gets exactly one reply and `call`
//! never waits.
//!
//! # Invariants
//!
//! Every request gets exactly one reply, produced by its own [`ResponseFuture`]; the session
//! orders replies, and a fan-out only completes once every shard has answered.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tower::{Layer, Service};

use crate::command::{CommandClass, SplitKind};
use crate::error::{error_text, failed, Failure, Kind};
use crate::fanout::Join;
use crate::model::HotKeyRead;
use crate::place::Refusal;
use crate::request::{Reply, Request};
use crate::routing::Routing;

/// Builds [`HotKey`] services over one routing table.
#[derive(Debug, Clone)]
pub struct HotKeyLayer {
    routing: Arc<Routing>,
    stats: Arc<HotKeyStats>,
}

impl HotKeyLayer {
    /// A layer applying the hot-key rules of `routing`, counting into `stats` (one per
    /// worker, built with [`HotKeyStats::new`] from the same `routing`).
    pub fn new(routing: Arc<Routing>, stats: Arc<HotKeyStats>) -> Self {
        HotKeyLayer { routing, stats }
    }
}

impl<S> Layer<S> for HotKeyLayer {
    type Service = HotKey<S>;
    fn layer(&self, inner: S) -> HotKey<S> {
        HotKey::new(inner, self.routing.clone(), self.stats.clone())
    }
}

/// Fans hot-key writes out to every shard and spreads hot-key reads over the shards.
#[derive(Debug, Clone)]
pub struct HotKey<S> {
    inner: S,
    routing: Arc<Routing>,
    stats: Arc<HotKeyStats>,
    /// This connection's read rotation (round-robin and same-zone rules).
    rr: usize,
    /// This connection's RNG, created on the first hot-key read (random rules and the
    /// round-robin starting point), so connections that never read a hot key pay nothing.
    rng: Option<SmallRng>,
}

/// What a [`HotKey`] call returns.
#[derive(Debug)]
pub enum ResponseFuture<F> {
    /// Forwarded as one request (not hot, or a hot read pinned to one shard).
    Inner(F),
    /// A hot write waiting for every shard.
    FanOut(FanOut<F>),
    /// A write that would reach one copy of a hot key only (taken when polled).
    Refused(Option<Refusal>),
}

/// Sub-requests in flight for one hot-key write.
#[derive(Debug)]
pub struct FanOut<F> {
    /// One sub-request per shard, in shard order.
    join: Join<F>,
    routing: Arc<Routing>,
    stats: Arc<HotKeyStats>,
    cluster: usize,
    rule: usize,
}

// === impl HotKey ===

impl<S> HotKey<S> {
    /// Wraps `inner` with the hot-key rules of `routing`.
    pub fn new(inner: S, routing: Arc<Routing>, stats: Arc<HotKeyStats>) -> Self {
        HotKey {
            inner,
            routing,
            stats,
            rr: 0,
            rng: None,
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

    /// The shard for a hot read of `cluster` under `rule`.
    fn read_shard(&mut self, cluster: usize, rule: usize) -> usize {
        let c = &self.routing.clusters[cluster];
        let n = c.shards.len().max(1);
        let rng = self.rng.get_or_insert_with(|| {
            let mut rng = SmallRng::from_rng(&mut rand::rng());
            // Start the rotation anywhere, so short connections spread over the shards.
            self.rr = rng.random_range(0..n);
            rng
        });
        match c.hot_keys[rule].read {
            HotKeyRead::Random => rng.random_range(0..n),
            HotKeyRead::RoundRobin => {
                let s = self.rr % n;
                self.rr = self.rr.wrapping_add(1);
                s
            }
            HotKeyRead::SameZone => {
                let s = if c.local_shards.is_empty() {
                    self.rr % n
                } else {
                    c.local_shards[self.rr % c.local_shards.len()]
                };
                self.rr = self.rr.wrapping_add(1);
                s
            }
        }
    }
}

/// What a request under hot-key rules becomes.
enum Hot {
    /// A single-key command on a key of this rule: a write goes to every shard, a read to one.
    Rule(usize),
    /// A write that names the hot key at this argument position with other keys, or in a
    /// command that is not a single-key one (RENAME, scripts, SORT, LMPOP, ...): it would
    /// reach one copy only, so it is refused.
    Refuse(usize),
}

/// What the hot-key rules of `req`'s cluster make of it: `None` for most requests (a cluster
/// without rules costs one branch).
#[inline]
fn hot(routing: &Routing, req: &Request) -> Option<Hot> {
    let rules = &routing.clusters.get(req.cluster)?.hot_keys;
    if rules.is_empty() || req.shard.is_some() {
        return None;
    }
    let is_hot = |key: &[u8]| rules.iter().position(|r| key.starts_with(&r.prefix));
    if one_key(req) {
        return is_hot(req.first_key()?).map(Hot::Rule);
    }
    if req.is_read() {
        // Every copy holds the same value: the key's own shard answers.
        return None;
    }
    req.keys
        .iter()
        .find(|&i| req.args.get(i).is_some_and(|k| is_hot(k).is_some()))
        .map(Hot::Refuse)
}

/// The reply this layer refuses `req` with in its cluster, if it does (for the mirror layer,
/// which must not copy a command its own side refuses).
pub fn refuses(routing: &Routing, req: &Request) -> Option<Refusal> {
    match hot(routing, req)? {
        Hot::Refuse(i) => Some(Refusal::HotKeyOneCopy(req.args[i].clone())),
        Hot::Rule(_) => None,
    }
}

/// A command that names exactly one key: single-key commands, and the split commands
/// (DEL, UNLINK, EXISTS, TOUCH, MGET, MSET) when given one key.
fn one_key(req: &Request) -> bool {
    match req.cmd.class {
        CommandClass::Single => true,
        CommandClass::Split(SplitKind::Mset) => req.args.len() == 3,
        CommandClass::Split(_) => req.args.len() == 2,
        _ => false,
    }
}

impl<S> Service<Request> for HotKey<S>
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
        let rule = match hot(&self.routing, &req) {
            None => return ResponseFuture::Inner(self.inner.call(req)),
            Some(Hot::Rule(rule)) => rule,
            Some(Hot::Refuse(i)) => {
                let key = req.args[i].clone();
                return ResponseFuture::Refused(Some(Refusal::HotKeyOneCopy(key)));
            }
        };
        let cluster = req.cluster;
        if req.is_read() {
            let shard = self.read_shard(cluster, rule);
            self.stats.read(cluster, rule, shard);
            req.pin_shard(shard);
            return ResponseFuture::Inner(self.inner.call(req));
        }
        let n = self.routing.clusters[cluster].shards.len();
        if n == 0 {
            return ResponseFuture::Inner(self.inner.call(req));
        }
        self.stats.fanned_out(cluster, rule);
        let mut join = Join::with_capacity(n);
        // Shards 0..n-1 get clones (argument `Bytes` are refcounted), the last the original.
        for shard in 0..n - 1 {
            let mut sub = req.clone();
            sub.pin_shard(shard);
            join.call(&mut self.inner, sub);
        }
        req.pin_shard(n - 1);
        join.call(&mut self.inner, req);
        ResponseFuture::FanOut(FanOut {
            join,
            routing: self.routing.clone(),
            stats: self.stats.clone(),
            cluster,
            rule,
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
            ResponseFuture::FanOut(f) => match f.join.poll(cx) {
                Poll::Ready(()) => Poll::Ready(f.merge()),
                Poll::Pending => Poll::Pending,
            },
            ResponseFuture::Refused(r) => Poll::Ready(Err(r
                .take()
                .map_or_else(|| Failure::new(Kind::PolledTwice), Failure::from))),
        }
    }
}

impl<F> FanOut<F> {
    /// The first shard's reply, or an error naming every failed shard.
    fn merge(&mut self) -> Result<Reply, Failure> {
        let Some(first_err) = self.join.replies().flatten().find(|r| failed(r)) else {
            // Shard 0 is always called, so its reply is there (unless polled after the end).
            return self
                .join
                .take(0)
                .unwrap_or_else(|| Err(Failure::new(Kind::PolledTwice)));
        };
        let text = error_text(first_err);
        self.stats.partial_failure(self.cluster, self.rule);
        let c = &self.routing.clusters[self.cluster];
        let names: Vec<&str> = self
            .join
            .replies()
            .enumerate()
            .filter(|(_, r)| r.is_some_and(failed))
            .map(|(i, _)| c.shards.get(i).map_or("?", |s| s.name.as_str()))
            .collect();
        let shards = names.join(", ");
        tracing::warn!(
            cluster = %c.name,
            shards = %shards,
            error = %text,
            "hot-key write failed on some shards; the others kept it"
        );
        Err(Failure::new(Kind::HotKeyWrite {
            shards,
            first: text,
        }))
    }
}

// === impl HotKeyStats ===

/// Hot-key counters of one worker, per cluster and rule.
///
/// Built from the same [`Routing`] as the layer that counts into it; the layer only writes
/// them (relaxed atomics, one writer per worker), scrapes read them with
/// [`snapshot`](Self::snapshot) and add the workers up with [`HotKeyRuleStats::sum`].
#[derive(Debug)]
pub struct HotKeyStats {
    /// `[cluster][rule]`, rules in the routing table's (longest-first) order.
    clusters: Vec<Vec<RuleCounters>>,
    names: Vec<String>,
}

#[derive(Debug)]
struct RuleCounters {
    prefix: String,
    fanned_out_writes: AtomicU64,
    partial_failures: AtomicU64,
    reads_per_shard: Vec<AtomicU64>,
}

/// The counters of one hot-key rule, read at one moment (or summed over workers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotKeyRuleStats {
    /// The cluster's name.
    pub cluster: String,
    /// The rule's prefix (lossy UTF-8).
    pub prefix: String,
    /// Writes sent to every shard.
    pub fanned_out_writes: u64,
    /// Fanned-out writes on which at least one shard failed.
    pub partial_failures: u64,
    /// Reads, by the shard they were pinned to (shard index order).
    pub reads_per_shard: Vec<u64>,
}

impl HotKeyStats {
    /// Zeroed counters for every hot-key rule of every cluster of `routing`.
    pub fn new(routing: &Routing) -> Self {
        HotKeyStats {
            clusters: routing
                .clusters
                .iter()
                .map(|c| {
                    c.hot_keys
                        .iter()
                        .map(|r| RuleCounters {
                            prefix: String::from_utf8_lossy(&r.prefix).into_owned(),
                            fanned_out_writes: AtomicU64::new(0),
                            partial_failures: AtomicU64::new(0),
                            reads_per_shard: c.shards.iter().map(|_| AtomicU64::new(0)).collect(),
                        })
                        .collect()
                })
                .collect(),
            names: routing.clusters.iter().map(|c| c.name.clone()).collect(),
        }
    }

    /// The counters now, one entry per rule, clusters in routing order.
    pub fn snapshot(&self) -> Vec<HotKeyRuleStats> {
        self.clusters
            .iter()
            .zip(&self.names)
            .flat_map(|(rules, name)| {
                rules.iter().map(move |r| HotKeyRuleStats {
                    cluster: name.clone(),
                    prefix: r.prefix.clone(),
                    fanned_out_writes: r.fanned_out_writes.load(Relaxed),
                    partial_failures: r.partial_failures.load(Relaxed),
                    reads_per_shard: r.reads_per_shard.iter().map(|c| c.load(Relaxed)).collect(),
                })
            })
            .collect()
    }

    // Lookups use `get`: stats built from another routing table count nothing instead of
    // panicking.
    fn counters(&self, cluster: usize, rule: usize) -> Option<&RuleCounters> {
        self.clusters.get(cluster)?.get(rule)
    }

    fn read(&self, cluster: usize, rule: usize, shard: usize) {
        if let Some(c) = self
            .counters(cluster, rule)
            .and_then(|r| r.reads_per_shard.get(shard))
        {
            c.fetch_add(1, Relaxed);
        }
    }

    fn fanned_out(&self, cluster: usize, rule: usize) {
        if let Some(r) = self.counters(cluster, rule) {
            r.fanned_out_writes.fetch_add(1, Relaxed);
        }
    }

    fn partial_failure(&self, cluster: usize, rule: usize) {
        if let Some(r) = self.counters(cluster, rule) {
            r.partial_failures.fetch_add(1, Relaxed);
        }
    }
}

impl HotKeyRuleStats {
    /// Adds up the snapshots of several workers, matching rules by cluster name and prefix
    /// (so snapshots of slightly different configurations still add up). The result keeps
    /// the order in which rules first appear; shorter `reads_per_shard` lists count as zeros.
    pub fn sum<'a>(
        snapshots: impl IntoIterator<Item = &'a [HotKeyRuleStats]>,
    ) -> Vec<HotKeyRuleStats> {
        let mut out: Vec<HotKeyRuleStats> = Vec::new();
        for snap in snapshots {
            for s in snap {
                let Some(t) = out
                    .iter_mut()
                    .find(|t| t.cluster == s.cluster && t.prefix == s.prefix)
                else {
                    out.push(s.clone());
                    continue;
                };
                t.fanned_out_writes += s.fanned_out_writes;
                t.partial_failures += s.partial_failures;
                if t.reads_per_shard.len() < s.reads_per_shard.len() {
                    t.reads_per_shard.resize(s.reads_per_shard.len(), 0);
                }
                for (a, b) in t.reads_per_shard.iter_mut().zip(&s.reads_per_shard) {
                    *a += b;
                }
            }
        }
        out
    }
}
