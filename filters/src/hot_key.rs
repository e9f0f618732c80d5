//! `HotKeyLayer`: keys under a hot prefix have a copy on EVERY shard of their cluster.
//!
//! It sits after `mirror` (so a copy sent to a shadow cluster gets that cluster's own hot-key
//! rules) and before `split` and `hash`, which skip a request whose shard is already pinned.
//!
//! A hot key has a **home shard**: the one the cluster's hash gives it, where it lives without
//! the rule. The home copy is the real one; the others are snapshots of it.
//!
//! For a command naming one key ([`CommandClass::Single`], or DEL/UNLINK/EXISTS/TOUCH/MGET/
//! MSET with a single key) whose key, as forwarded (the route
//! layer has already removed a route prefix), starts with one of the cluster's hot-key
//! prefixes — the longest matching rule wins — and whose shard is not pinned yet:
//!
//! - a **write** (anything without Redis's `readonly` flag, see [`Request::is_read`]) runs on
//!   the home shard only, followed there, in the same `call` (the session has one connection
//!   per endpoint, so Redis runs them in order), by a snapshot of the key:
//!   [`SNAPSHOT_SCRIPT`] (`DUMP` and `PEXPIRETIME`, read atomically). The snapshot is then
//!   copied to every other shard (`RESTORE key expiry payload REPLACE ABSTTL`, or `DEL key`
//!   when the write removed the key), and the key is snapshotted again on the home shard:
//!   if it changed meanwhile (another connection or sidecar wrote it, and the two writes'
//!   copies may have crossed), the new snapshot is copied, up to [`COPY_ROUNDS`] rounds;
//!   when the key keeps changing, the copies are deleted instead (a deletion cannot leave an
//!   old value; reads fall back to the home shard). So a copy, when there is one, ends equal
//!   to the home value once the last write's copy is done.
//!   The client gets the write's own reply once its copies are made; when one failed,
//!   `-ERR respway: hot-key write failed on shard(s) s1, s3: <first error> (the write applied
//!   on home shard s0)`, the partial-failure counter is bumped, a warning is logged, and the
//!   failed shards' copies are deleted (where the shard answers), so reads there fall back
//!   to the home shard instead of seeing an old value.
//!   Why not write every shard: a non-idempotent write (`INCR`, `LPUSH`) would run on shards
//!   that have no copy (creating a counter at 1), and a partial failure would leave copies
//!   that differ for good. Here every write runs once, and a copy is a snapshot of the home
//!   value. Why not `MIGRATE ... COPY` from the home shard (which orders copies by itself):
//!   a shard running `MIGRATE` blocks until the target answers, so two shards copying to
//!   each other at once (hot writes of keys with different homes, from any two clients)
//!   wait for each other until `MIGRATE`'s timeout: measured, 16 of 20 crossing `MIGRATE`s
//!   failed, each after its full 1 s timeout. The sidecar's copy pass, which runs one
//!   `MIGRATE` at a time, still uses it (`src/cache/hotcopy.rs`).
//! - a **read** goes to one shard, chosen by the rule's [`HotKeyRead`]: round-robin, random,
//!   or round-robin over the shards with an endpoint in the sidecar's zone (all shards when
//!   none has one). The choice is per client connection, so no counter is shared between
//!   connections or workers. The round-robin counter starts at a random offset per
//!   connection, so that many short connections do not all read from shard 0. A read on
//!   another shard than the home one whose reply means "no such key" (nil, null, `:0`, an
//!   empty array, map or set, `+none`, `:-2`), or that failed, is sent again to the home
//!   shard, whose reply the client gets: a missing copy is never visible.
//!   Reads go to the home shard only until the rule's copy pass has finished in this sidecar
//!   ([`HotKeyRoute::copied`](crate::routing::HotKeyRoute::copied)), and while a hot write of
//!   the same client connection is in flight (so a pipelined read after a write sees it).
//!
//! A **write** that names a hot key in any other way — with other keys (MSET, DEL, RENAME,
//! SMOVE, ...) or in a command that is not a single-key one (EVAL, SORT, LMPOP, ...) — would
//! change the home copy only, and reads from the other shards would keep seeing the old value.
//! It is refused (`-ERR respway: hot key ... is stored on every shard ...`) and sent nowhere.
//!
//! Everything else passes through untouched (a read naming a hot key with other keys is served
//! by the key's own shard: every copy holds the same value); a cluster without hot-key rules
//! costs one branch.
//!
//! # Readiness
//!
//! A write and its snapshot call the one inner service twice, through a [`Join`] (shared with
//! the multi-key layer, which documents the rule in [`crate::fanout`]): the first call relies
//! on [`HotKey::poll_ready`], the second polls the inner service with a no-op waker first.
//! The copies, checks and deletions are called from the future, on a clone of the inner
//! service, each only if it is ready then ([`Join::call_checked`]); one that is not is not
//! sent and fails that shard (`-ERR respway: shard not ready`), so the client still gets
//! exactly one reply and nothing waits. Respway's inner services are always ready, so this is
//! only a check. A read sent again to the home shard is called after the clone's
//! `poll_ready`.
//!
//! # Invariants
//!
//! Every request gets exactly one reply, produced by its own [`ResponseFuture`]; the session
//! orders replies, and a write only completes once every copy has answered.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Acquire;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tower::{Layer, Service};

use crate::command::{CommandClass, SplitKind};
use crate::error::{error_text, failed, Failure, Kind};
use crate::fanout::Join;
use crate::model::HotKeyRead;
use crate::moving::Held;
use crate::place::Refusal;
use crate::request::{is_error, Keys, Reply, Request};
use crate::resp::Frame;
use crate::routing::{ClusterRoute, Routing};

mod stats;
pub use stats::{HotKeyRuleStats, HotKeyStats};

/// The script that snapshots a key on its home shard: its value as `DUMP` gives it and its
/// absolute expiry (`PEXPIRETIME`: -1 without one), or false when there is no such key. One
/// script, so the two are read atomically.
pub const SNAPSHOT_SCRIPT: &str = "local d = redis.call('DUMP', KEYS[1]) \
     if not d then return false end \
     return {d, redis.call('PEXPIRETIME', KEYS[1])}";

/// Rounds of copying a hot write's key again because its home value changed meanwhile
/// (other clients write it at the same time); after the last, the copies are deleted instead
/// (reads fall back to the home shard until the next write copies the key again).
pub const COPY_ROUNDS: u8 = 4;

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

/// Sends hot-key writes to the key's home shard and copies them from there to every other
/// shard; spreads hot-key reads over the shards.
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
    /// This connection's hot writes in flight: while there is one, hot reads go to the home
    /// shard, behind the write on the same upstream connection.
    writing: Held,
}

/// What a [`HotKey`] call returns.
#[derive(Debug)]
pub enum ResponseFuture<S: Service<Request>> {
    /// Forwarded as one request (not hot, or a hot read of the home shard).
    Inner(S::Future),
    /// A hot write waiting for its copies.
    Write(Box<Write<S>>),
    /// A hot read of another shard than the home one, which falls back to the home shard.
    Read(Box<Fallback<S>>),
    /// A write that would reach one copy of a hot key only (taken when polled).
    Refused(Option<Refusal>),
}

/// A hot-key write on its home shard, and the copies of the key that it leaves there.
#[derive(Debug)]
pub struct Write<S: Service<Request>> {
    stage: Stage<S::Future>,
    /// The write's reply, once it came.
    reply: Option<Result<Reply, Failure>>,
    /// The shards that get a copy (every shard but the home one), while no copy failed there.
    targets: Vec<usize>,
    /// Shards whose copy failed, with the first error text of each.
    failed: Vec<(usize, String)>,
    /// Copy rounds made so far.
    rounds: u8,
    /// The copies are being deleted instead (the key kept changing): no check follows.
    dropped: bool,
    /// A clone of the inner service, for the copies.
    inner: S,
    /// `DEL key` with the client's database and deadline, pinned to the home shard: every
    /// request of the copy is made from it.
    base: Request,
    home: usize,
    routing: Arc<Routing>,
    stats: Arc<HotKeyStats>,
    rule: usize,
    /// The connection's count of hot writes in flight, which this one leaves when it ends.
    writing: Held,
}

/// Where a hot write is.
#[derive(Debug)]
enum Stage<F> {
    /// The write and the snapshot after it, on the home shard.
    Written(Join<F>),
    /// The snapshot's copies (`RESTORE`, or `DEL` when the key is gone), one per target.
    Copying(Join<F>, Snapshot),
    /// A second snapshot, to check the home value did not change while copying.
    Checking(Join<F>, Snapshot),
    /// The failed shards' copies being deleted.
    Deleting(Join<F>),
    /// Answered.
    Done,
}

/// A key's value on its home shard: `DUMP`'s payload and the absolute expiry (ms, -1: none),
/// or `None` when there is no such key.
type Snapshot = Option<(Bytes, i64)>;

/// A hot read sent to a copy; sent again to the home shard when the copy says the key does
/// not exist, or fails.
#[derive(Debug)]
pub struct Fallback<S: Service<Request>> {
    /// The read on the copy; `None` once it answered.
    first: Option<S::Future>,
    /// The read, to send again (pinned to the home shard); taken when it is.
    again: Option<Request>,
    second: Option<S::Future>,
    inner: S,
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
            writing: Held::default(),
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
    /// A single-key command on a key of this rule: a write goes to the home shard and is
    /// copied, a read to one shard.
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

/// The arguments of `MIGRATE host port "" db timeout_ms [AUTH ...] COPY REPLACE KEYS k...`,
/// which copies `keys` (of client database `client_db`), value and TTL, to shard `target`
/// of cluster `c`, replacing what is there; `None` when the shard's primary is not known.
/// Sent to the keys' home shard by the sidecar's copy pass.
pub fn copy_command(
    c: &ClusterRoute,
    target: usize,
    client_db: u8,
    timeout_ms: u64,
    keys: impl IntoIterator<Item = Bytes>,
) -> Option<Vec<Bytes>> {
    let shard = c.shards.get(target)?;
    let addr = shard.primary_address?;
    let mut args = Vec::with_capacity(11 + shard.migrate_auth.0.len());
    args.push(Bytes::from_static(b"MIGRATE"));
    args.push(Bytes::from(addr.ip().to_string()));
    args.push(Bytes::from(addr.port().to_string()));
    args.push(Bytes::new());
    args.push(Bytes::from((c.db + u32::from(client_db)).to_string()));
    args.push(Bytes::from(timeout_ms.to_string()));
    args.extend(shard.migrate_auth.0.iter().cloned());
    args.push(Bytes::from_static(b"COPY"));
    args.push(Bytes::from_static(b"REPLACE"));
    args.push(Bytes::from_static(b"KEYS"));
    args.extend(keys);
    Some(args)
}

/// True when a read's reply means the key does not exist (for some commands, also that it
/// exists but is empty there or lacks a field: the home shard is then asked for nothing).
pub fn says_absent(reply: &[u8]) -> bool {
    matches!(
        reply,
        b"$-1\r\n"
            | b"*-1\r\n"
            | b"_\r\n"
            | b":0\r\n"
            | b"*0\r\n"
            | b"%0\r\n"
            | b"~0\r\n"
            | b"+none\r\n"
            | b":-2\r\n"
    )
}

/// A request the layer makes itself (`EVAL` of the snapshot, `RESTORE`, `DEL`), pinned to `shard` of `like`'s
/// cluster, with `like`'s database and deadline. It has no key positions: the layers below
/// must not route or split it again.
fn own_request(name: &[u8], args: Vec<Bytes>, like: &Request, shard: usize) -> Request {
    let cmd = crate::command::lookup(name).expect("EVAL, RESTORE and DEL are in the command table");
    let mut r = Request::with_keys(cmd, args, Keys::step(0, 1, 0));
    r.cluster = like.cluster;
    r.flavor = like.flavor;
    r.deadline = like.deadline;
    r.route = like.route;
    r.pin_shard(shard);
    r
}

impl<S> Service<Request> for HotKey<S>
where
    S: Service<Request, Response = Reply, Error = Failure> + Clone,
    S::Future: Unpin,
{
    type Response = Reply;
    type Error = Failure;
    type Future = ResponseFuture<S>;

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
        let c = &self.routing.clusters[cluster];
        let n = c.shards.len();
        let Some(key) = req.first_key().cloned() else {
            return ResponseFuture::Inner(self.inner.call(req));
        };
        let home = c.picker.pick(&key);
        if n <= 1 {
            req.pin_shard(home);
            return ResponseFuture::Inner(self.inner.call(req));
        }
        if req.is_read() {
            let spread = c.hot_keys[rule].copied.load(Acquire) && !self.writing.any();
            let shard = if spread {
                self.read_shard(cluster, rule)
            } else {
                home
            };
            self.stats.read(cluster, rule, shard);
            if shard == home {
                req.pin_shard(home);
                return ResponseFuture::Inner(self.inner.call(req));
            }
            let mut again = req.clone();
            again.pin_shard(home);
            req.pin_shard(shard);
            return ResponseFuture::Read(Box::new(Fallback {
                first: Some(self.inner.call(req)),
                again: Some(again),
                second: None,
                inner: self.inner.clone(),
                stats: self.stats.clone(),
                cluster,
                rule,
            }));
        }
        self.stats.fanned_out(cluster, rule);
        let base = own_request(b"del", vec![Bytes::from_static(b"DEL"), key], &req, home);
        let targets: Vec<usize> = (0..n).filter(|&s| s != home).collect();
        // The write, then the snapshot: one connection per endpoint, so Redis runs the
        // snapshot right after the write.
        let mut join = Join::with_capacity(2);
        req.pin_shard(home);
        join.call(&mut self.inner, req);
        join.call(&mut self.inner, snapshot_request(&base));
        ResponseFuture::Write(Box::new(Write {
            stage: Stage::Written(join),
            reply: None,
            targets,
            failed: Vec::new(),
            rounds: 0,
            dropped: false,
            inner: self.inner.clone(),
            base,
            home,
            routing: self.routing.clone(),
            stats: self.stats.clone(),
            rule,
            writing: self.writing.enter(),
        }))
    }
}

/// `EVAL` of [`SNAPSHOT_SCRIPT`] on `base`'s key, pinned as `base`.
fn snapshot_request(base: &Request) -> Request {
    let args = vec![
        Bytes::from_static(b"EVAL"),
        Bytes::from_static(SNAPSHOT_SCRIPT.as_bytes()),
        Bytes::from_static(b"1"),
        base.args[1].clone(),
    ];
    let mut r = own_request(b"eval", args, base, base.shard_index().unwrap_or(0));
    r.shard = base.shard;
    r
}

/// The snapshot an answer of [`SNAPSHOT_SCRIPT`] gives, or why there is none.
fn parse_snapshot(answer: &Result<Reply, Failure>) -> Result<Snapshot, String> {
    let reply = match answer {
        Ok(r) if !is_error(r) => r,
        r => return Err(error_text(r)),
    };
    match crate::resp::parse_reply(reply) {
        Ok(Frame::Null | Frame::NullArray | Frame::Boolean(false)) => Ok(None),
        Ok(Frame::Array(items)) => match &items[..] {
            [Frame::Bulk(d), Frame::Integer(t)] => Ok(Some((d.clone(), *t))),
            _ => Err("ERR respway: unexpected snapshot of a hot key".into()),
        },
        _ => Err("ERR respway: unexpected snapshot of a hot key".into()),
    }
}

// === impl ResponseFuture ===

impl<S> Future for ResponseFuture<S>
where
    S: Service<Request, Response = Reply, Error = Failure>,
    S::Future: Unpin,
{
    type Output = Result<Reply, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            ResponseFuture::Inner(f) => Pin::new(f).poll(cx),
            ResponseFuture::Write(w) => w.poll_done(cx),
            ResponseFuture::Read(r) => r.poll_read(cx),
            ResponseFuture::Refused(r) => Poll::Ready(Err(r
                .take()
                .map_or_else(|| Failure::new(Kind::PolledTwice), Failure::from))),
        }
    }
}

// === impl Write ===

impl<S> Write<S>
where
    S: Service<Request, Response = Reply, Error = Failure>,
    S::Future: Unpin,
{
    fn poll_done(&mut self, cx: &mut Context<'_>) -> Poll<Result<Reply, Failure>> {
        loop {
            match &mut self.stage {
                Stage::Written(join) => {
                    ready!(join.poll(cx));
                    let reply = join
                        .take(0)
                        .unwrap_or_else(|| Err(Failure::new(Kind::PolledTwice)));
                    let snap = join.take(1);
                    if failed(&reply) {
                        // The write's own error: nothing changed (or, when the home shard
                        // failed, nothing is known); it is the answer.
                        self.finish();
                        return Poll::Ready(reply);
                    }
                    self.reply = Some(reply);
                    match snap.as_ref().map(parse_snapshot) {
                        Some(Ok(snap)) => self.copy(snap),
                        Some(Err(e)) => self.fail_all(e),
                        None => self.fail_all("ERR respway: no snapshot".into()),
                    }
                }
                Stage::Copying(join, snap) => {
                    ready!(join.poll(cx));
                    let snap = snap.take();
                    let answers: Vec<_> = join.replies().map(|r| r.cloned()).collect();
                    for (r, &s) in answers.iter().zip(&self.targets) {
                        match r {
                            Some(Ok(reply)) if !is_error(reply) => {}
                            Some(r) => self.failed.push((s, error_text(r))),
                            None => self.failed.push((s, "ERR respway: no answer".into())),
                        }
                    }
                    let failed: Vec<usize> = self.failed.iter().map(|f| f.0).collect();
                    self.targets.retain(|s| !failed.contains(s));
                    if self.dropped {
                        self.delete_failed();
                        continue;
                    }
                    let mut join = Join::with_capacity(1);
                    join.call_checked(&mut self.inner, snapshot_request(&self.base));
                    self.stage = Stage::Checking(join, snap);
                }
                Stage::Checking(join, snap) => {
                    ready!(join.poll(cx));
                    let snap = snap.take();
                    match join.take(0).as_ref().map(parse_snapshot) {
                        Some(Ok(now)) if now == snap => self.delete_failed(),
                        Some(Ok(now)) if self.rounds < COPY_ROUNDS => {
                            // Written again meanwhile (by another connection or sidecar),
                            // and the copies may have crossed that write's own: copy again.
                            self.stats.copied_again(self.base.cluster, self.rule);
                            self.copy(now)
                        }
                        Some(Ok(_)) => {
                            // Written again and again: the copies are deleted instead (reads
                            // then fall back to the home shard, which is always right; a
                            // deletion cannot leave an old value, and every RESTORE of this
                            // write has answered). The write succeeded: its reply stands.
                            self.stats.copies_dropped(self.base.cluster, self.rule);
                            self.drop_copies()
                        }
                        Some(Err(e)) => self.fail_all(e),
                        None => self.fail_all("ERR respway: no snapshot".into()),
                    }
                }
                Stage::Deleting(join) => {
                    ready!(join.poll(cx));
                    self.finish();
                    let reply = self
                        .reply
                        .take()
                        .unwrap_or_else(|| Err(Failure::new(Kind::PolledTwice)));
                    if self.failed.is_empty() {
                        return Poll::Ready(reply);
                    }
                    return Poll::Ready(Err(self.merge_failures()));
                }
                Stage::Done => return Poll::Ready(Err(Failure::new(Kind::PolledTwice))),
            }
        }
    }

    /// Sends `snap` to every target: `RESTORE key ttl payload REPLACE ABSTTL`, or `DEL key`
    /// when the key is gone.
    fn copy(&mut self, snap: Snapshot) {
        self.rounds += 1;
        let mut join = Join::with_capacity(self.targets.len());
        for &s in &self.targets {
            let mut r = self.base.clone();
            if let Some((payload, expires)) = &snap {
                let mut args = vec![
                    Bytes::from_static(b"RESTORE"),
                    self.base.args[1].clone(),
                    Bytes::from((*expires).max(0).to_string()),
                    payload.clone(),
                    Bytes::from_static(b"REPLACE"),
                ];
                if *expires >= 0 {
                    args.push(Bytes::from_static(b"ABSTTL"));
                }
                r = own_request(b"restore", args, &self.base, s);
            }
            r.pin_shard(s);
            join.call_checked(&mut self.inner, r);
        }
        self.stage = Stage::Copying(join, snap);
    }

    /// Deletes the copies on every remaining target (not a failure: reads there fall back to
    /// the home shard), then the failed shards' ones.
    fn drop_copies(&mut self) {
        self.dropped = true;
        let mut join = Join::with_capacity(self.targets.len());
        for &s in &self.targets {
            let mut del = self.base.clone();
            del.pin_shard(s);
            join.call_checked(&mut self.inner, del);
        }
        self.stage = Stage::Copying(join, None);
    }

    /// Every remaining target failed with `error`.
    fn fail_all(&mut self, error: String) {
        for s in std::mem::take(&mut self.targets) {
            self.failed.push((s, error.clone()));
        }
        self.delete_failed();
    }

    /// Deletes the copies on the shards where copying failed (reads there then fall back to
    /// the home shard), as far as those shards answer.
    fn delete_failed(&mut self) {
        self.failed.sort_by_key(|(s, _)| *s);
        let mut join = Join::with_capacity(self.failed.len());
        for &(s, _) in &self.failed {
            let mut del = self.base.clone();
            del.pin_shard(s);
            join.call_checked(&mut self.inner, del);
        }
        self.stage = Stage::Deleting(join);
    }

    fn finish(&mut self) {
        self.stage = Stage::Done;
        self.writing.release();
    }

    /// The error naming every shard whose copy failed.
    fn merge_failures(&mut self) -> Failure {
        self.failed.sort_by_key(|(s, _)| *s);
        let cluster = self.base.cluster;
        self.stats.partial_failure(cluster, self.rule);
        let c = &self.routing.clusters[cluster];
        let name = |i: usize| c.shards.get(i).map_or("?", |s| s.name.as_str());
        let names: Vec<&str> = self.failed.iter().map(|(s, _)| name(*s)).collect();
        let shards = names.join(", ");
        let first = format!(
            "{} (the write applied on home shard {})",
            self.failed[0].1,
            name(self.home)
        );
        tracing::warn!(
            cluster = %c.name,
            shards = %shards,
            error = %first,
            "hot-key write: copying it from its home shard failed on some shards"
        );
        Failure::new(Kind::HotKeyWrite { shards, first })
    }
}

impl<S: Service<Request>> Drop for Write<S> {
    fn drop(&mut self) {
        self.writing.release();
    }
}

// === impl Fallback ===

impl<S> Fallback<S>
where
    S: Service<Request, Response = Reply, Error = Failure>,
    S::Future: Unpin,
{
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Result<Reply, Failure>> {
        if let Some(f) = self.second.as_mut() {
            return Pin::new(f).poll(cx);
        }
        if let Some(f) = self.first.as_mut() {
            let r = ready!(Pin::new(f).poll(cx));
            self.first = None;
            let absent = match &r {
                Ok(reply) => says_absent(reply),
                Err(_) => true,
            };
            if !absent {
                self.again = None;
                return Poll::Ready(r);
            }
            self.stats.read_fallback(self.cluster, self.rule);
        }
        ready!(self.inner.poll_ready(cx))?;
        let Some(again) = self.again.take() else {
            return Poll::Ready(Err(Failure::new(Kind::PolledTwice)));
        };
        let mut f = self.inner.call(again);
        let r = Pin::new(&mut f).poll(cx);
        self.second = Some(f);
        r
    }
}
