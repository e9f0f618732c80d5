//! Move mode ([`MirrorMode::Move`](crate::model::MirrorMode::Move)): a route whose keys are
//! moving from its own cluster (`from`) to the policy's cluster (`to`), online, over plain
//! Redis.
//!
//! A key whose owner is the same Redis under both placements (the same primary address and
//! database: shards kept when a cluster grows) is untouched. For a key whose owner changes,
//! before the command that names it is forwarded to `to`, the key is moved there: `MIGRATE
//! host port "" db timeout [AUTH ...] KEYS k...` on its owner in `from`, which Redis runs
//! atomically (value and TTL move, the source copy is deleted; `NOKEY` when none of the keys
//! is there, as when it moved already). Only then does the command go to `to`. Keys of one
//! command that move between the same two shards share one `MIGRATE`; a command whose keys
//! move from several shards waits for every `MIGRATE`. A `MIGRATE` that fails (the target
//! already holds the key: `BUSYKEY`; the shards cannot reach each other: `IOERR`; a lost
//! connection) fails the command, which is then not forwarded: nothing runs on a key that is
//! not where the command goes.
//!
//! The commands of one connection keep their order: while a command of the connection waits
//! for its keys to move, every later command of the connection on a route in move mode waits
//! too (it is a [`Moving`] with no `MIGRATE`), and each is forwarded only once the commands
//! before it have answered (the session polls the oldest command only). Without this, a
//! pipelined `GET` of a key that does not move ran before an `MSET` sent ahead of it.
//!
//! A worker remembers the keys it has seen leave their old owner ([`Moved`]: `MIGRATE`
//! answered `OK` or `NOKEY`) and sends them no `MIGRATE` again: once every sidecar is in move
//! mode (the `prepare_move` phase sees to it) nothing writes them on their old owner. The
//! memory is per worker and configuration (a push starts it afresh) and bounded
//! ([`MOVED_KEYS_MAX`]; when full it starts over, which costs only `MIGRATE`s that answer
//! `NOKEY`).
//!
//! Nothing is written twice (there is no copy), and a key is never on both sides after a
//! command touched it. Commands that need a connection of their own (transactions, blocking
//! commands) are refused on a route in migration (see [`crate::place`]).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use tower::Service;

use crate::error::{Failure, Kind};
use crate::fanout::Join;
use crate::mirror_stats::{MirrorStats, MoveOutcome};
use crate::request::{is_error, Keys, Reply, Request};
use crate::routing::Routing;

pub use crate::place::ABOUT_TO_MOVE;

/// `MIGRATE`'s timeout (ms) when the request carries no deadline.
const DEFAULT_TIMEOUT_MS: u64 = 1_000;

/// How many keys [`Moved`] remembers before it starts over.
pub const MOVED_KEYS_MAX: usize = 65_536;

/// The keys one worker has seen leave their old owner in move mode, by client database: no
/// `MIGRATE` is sent for them again. The lock is the worker's own (one thread), so it is
/// never contended.
#[derive(Debug, Default)]
pub struct Moved {
    keys: Mutex<SeenKeys>,
}

/// Per client database, its keys seen moved; `len` counts them all.
#[derive(Debug, Default)]
struct SeenKeys {
    by_db: HashMap<u8, HashSet<Box<[u8]>>>,
    len: usize,
}

impl SeenKeys {
    fn contains(&self, db: u8, key: &[u8]) -> bool {
        self.len > 0 && self.by_db.get(&db).is_some_and(|s| s.contains(key))
    }
}

impl Moved {
    fn lock(&self) -> std::sync::MutexGuard<'_, SeenKeys> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers that `keys` (of client database `db`) are no longer on their old owner.
    fn insert(&self, db: u8, keys: &[Bytes]) {
        let mut set = self.lock();
        for k in keys {
            if set.contains(db, k) {
                continue;
            }
            if set.len >= MOVED_KEYS_MAX {
                *set = SeenKeys::default();
            }
            set.by_db.entry(db).or_default().insert(Box::from(&k[..]));
            set.len += 1;
        }
    }
}

/// The `MIGRATE` requests that put `req`'s keys on their owners in `to` (empty when no key's
/// owner changes, or each has been seen moved: `moved`), each pinned to the key's owner in
/// `from`.
pub fn migrations(
    routing: &Routing,
    req: &Request,
    from: usize,
    to: usize,
    moved: &Moved,
) -> Vec<Request> {
    // Read only when a key moves: no clock read for the commands that move nothing.
    let timeout_ms = || {
        req.deadline
            .map(|d| {
                d.saturating_duration_since(std::time::Instant::now())
                    .as_millis()
                    .max(1) as u64
            })
            .unwrap_or(DEFAULT_TIMEOUT_MS)
    };
    let keys = req.keys.iter().filter_map(|i| req.args.get(i));
    let cmds = migrate_commands(routing, keys, req.flavor.db, from, to, moved, timeout_ms);
    if cmds.is_empty() {
        return Vec::new();
    }
    let cmd = crate::command::lookup(b"migrate").expect("MIGRATE is in the command table");
    cmds.into_iter()
        .map(|(s, args)| {
            // No key positions: the layers below must not route or split it again.
            let mut m = Request::with_keys(cmd, args, Keys::step(0, 1, 0));
            m.cluster = from;
            m.flavor = req.flavor;
            m.deadline = req.deadline;
            m.pin_shard(s);
            m
        })
        .collect()
}

/// The `MIGRATE host port "" db timeout_ms [AUTH ...] KEYS k...` commands that put `keys`
/// (of client database `client_db`) on their owners in cluster `to`, each with the shard of
/// cluster `from` to send it to: one per (old shard, new shard) pair, none for keys whose
/// owner is the same Redis or that `moved` has seen moved.
pub fn migrate_commands<'a>(
    routing: &Routing,
    keys: impl Iterator<Item = &'a Bytes>,
    client_db: u8,
    from: usize,
    to: usize,
    moved: &Moved,
    timeout_ms: impl FnOnce() -> u64,
) -> Vec<(usize, Vec<Bytes>)> {
    let (Some(src), Some(dst)) = (routing.clusters.get(from), routing.clusters.get(to)) else {
        return Vec::new();
    };
    let seen = moved.lock();
    // (source shard, target shard, keys), in order of first appearance.
    let mut groups: Vec<(usize, usize, Vec<Bytes>)> = Vec::new();
    for key in keys {
        let (s, t) = (src.picker.pick(key), dst.picker.pick(key));
        if routing.same_primary(from, s, to, t) || seen.contains(client_db, key) {
            continue;
        }
        match groups.iter_mut().find(|g| g.0 == s && g.1 == t) {
            Some(g) => {
                if !g.2.contains(key) {
                    g.2.push(key.clone());
                }
            }
            None => groups.push((s, t, vec![key.clone()])),
        }
    }
    drop(seen);
    if groups.is_empty() {
        return Vec::new();
    }
    let timeout_ms = timeout_ms();
    groups
        .into_iter()
        .filter_map(|(s, t, keys)| {
            let target = dst.shards.get(t)?;
            let addr = target.primary_address?;
            let db = dst.db + u32::from(client_db);
            let mut args = Vec::with_capacity(8 + target.migrate_auth.0.len() + keys.len());
            args.push(Bytes::from_static(b"MIGRATE"));
            args.push(Bytes::from(addr.ip().to_string()));
            args.push(Bytes::from(addr.port().to_string()));
            args.push(Bytes::new());
            args.push(Bytes::from(db.to_string()));
            args.push(Bytes::from(timeout_ms.to_string()));
            args.extend(target.migrate_auth.0.iter().cloned());
            args.push(Bytes::from_static(b"KEYS"));
            args.extend(keys);
            Some((s, args))
        })
        .collect()
}

/// What a `MIGRATE`'s answer means, and (unless it failed) remembers its keys in `moved`.
pub fn outcome(
    answer: &Result<Reply, Failure>,
    migrate: &[Bytes],
    client_db: u8,
    moved: &Moved,
) -> MoveOutcome {
    let outcome = match answer {
        Ok(reply) if reply.starts_with(b"+NOKEY") => MoveOutcome::Absent,
        Ok(reply) if !is_error(reply) => MoveOutcome::Moved,
        _ => MoveOutcome::Failed,
    };
    if outcome != MoveOutcome::Failed {
        moved.insert(client_db, migrated_keys(migrate));
    }
    outcome
}

/// The failure of a command whose keys could not be moved (`answer`: the failed `MIGRATE`'s).
pub fn move_failure(answer: &Result<Reply, Failure>) -> Failure {
    match answer {
        Ok(reply) => {
            let text = String::from_utf8_lossy(reply.get(1..).unwrap_or_default());
            Failure::message(format!(
                "ERR respway: moving the command's keys to their new shard failed, the \
                 command was not run: {}",
                text.trim_end()
            ))
        }
        Err(f) => f.clone(),
    }
}

/// True when a key of `req` has another owner (another primary address or database) in
/// cluster `to` than in `from`.
pub fn owner_changes(routing: &Routing, req: &Request, from: usize, to: usize) -> bool {
    let (Some(src), Some(dst)) = (routing.clusters.get(from), routing.clusters.get(to)) else {
        return false;
    };
    req.keys.iter().any(|i| {
        req.args.get(i).is_some_and(|key| {
            !routing.same_primary(from, src.picker.pick(key), to, dst.picker.pick(key))
        })
    })
}

/// The keys of a `MIGRATE ... KEYS k...` built by [`migrations`].
fn migrated_keys(m: &[Bytes]) -> &[Bytes] {
    m.iter()
        .position(|a| a.eq_ignore_ascii_case(b"KEYS"))
        .and_then(|i| m.get(i + 1..))
        .unwrap_or_default()
}

/// A command waiting for its keys to move before it is forwarded.
#[derive(Debug)]
pub struct Moving<S: Service<Request>> {
    migrations: Join<S::Future>,
    /// The command, taken when it is forwarded.
    req: Option<Request>,
    /// A clone of the inner service, to forward the command once its keys moved.
    inner: S,
    /// Where the `MIGRATE`s' outcomes are counted, and the receiving cluster; `None` once
    /// counted.
    stats: Option<(Arc<MirrorStats>, usize)>,
    /// The connection's count of commands held (see [`Held`]); this one leaves it when it is
    /// forwarded or dropped.
    held: Held,
    /// The worker's memory of moved keys, which the `MIGRATE`s that answer `OK` or `NOKEY`
    /// feed, and the arguments of each `MIGRATE` sent.
    moved: Arc<Moved>,
    sent: Vec<Vec<Bytes>>,
}

/// The count of one connection's commands that wait to be forwarded on a route in move mode:
/// while it is above zero, a later command of the connection waits too, so that none
/// overtakes an earlier one.
#[derive(Debug, Clone, Default)]
pub struct Held(Option<Arc<AtomicUsize>>);

impl Held {
    /// True when a command of the connection waits to be forwarded.
    #[inline]
    pub fn any(&self) -> bool {
        self.0.as_ref().is_some_and(|n| n.load(Relaxed) > 0)
    }

    /// One more command held; the returned handle releases it.
    pub fn enter(&mut self) -> Held {
        let n = self.0.get_or_insert_with(Default::default);
        n.fetch_add(1, Relaxed);
        Held(Some(n.clone()))
    }

    /// Releases this command (once).
    pub fn release(&mut self) {
        if let Some(n) = self.0.take() {
            n.fetch_sub(1, Relaxed);
        }
    }
}

impl<S> Moving<S>
where
    S: Service<Request, Response = Reply, Error = Failure> + Clone,
    S::Future: Unpin,
{
    /// Sends `migrations` (none: `req` only waits for the connection's earlier commands)
    /// through `inner` (made ready by the caller, as tower requires) and holds `req` until they
    /// answer and it is polled; `held` is the connection's count of held commands, which this
    /// one joins until it is forwarded.
    pub fn start(
        inner: &mut S,
        migrations: Vec<Request>,
        req: Request,
        stats: (Arc<MirrorStats>, usize),
        held: &mut Held,
        moved: Arc<Moved>,
    ) -> Self {
        let mut join = Join::with_capacity(migrations.len());
        let mut sent = Vec::with_capacity(migrations.len());
        for m in migrations {
            sent.push(m.args.clone());
            join.call(inner, m);
        }
        Moving {
            migrations: join,
            req: Some(req),
            inner: inner.clone(),
            stats: Some(stats),
            held: held.enter(),
            moved,
            sent,
        }
    }

    /// Ready with the command's future once every key moved, or with the failure that
    /// stops it.
    pub fn poll_moved(&mut self, cx: &mut Context<'_>) -> Poll<Result<S::Future, Failure>> {
        ready!(self.migrations.poll(cx));
        if let Some((stats, cluster)) = self.stats.take() {
            let db = self.req.as_ref().map_or(0, |r| r.flavor.db);
            for (m, r) in self.sent.iter().zip(self.migrations.replies()) {
                let failed = Err(Failure::new(Kind::PolledTwice));
                let r = r.unwrap_or(&failed);
                stats.record_move(cluster, outcome(r, m, db, &self.moved));
            }
        }
        if let Some(r) = self
            .migrations
            .replies()
            .flatten()
            .find(|r| !matches!(r, Ok(reply) if !is_error(reply)))
        {
            self.held.release();
            return Poll::Ready(Err(move_failure(r)));
        }
        ready!(self.inner.poll_ready(cx))?;
        let Some(req) = self.req.take() else {
            return Poll::Ready(Err(Failure::new(Kind::PolledTwice)));
        };
        let forwarded = self.inner.call(req);
        self.held.release();
        Poll::Ready(Ok(forwarded))
    }
}

impl<S: Service<Request>> Drop for Moving<S> {
    fn drop(&mut self) {
        self.held.release();
    }
}

/// The future of a command on a route in move mode.
#[derive(Debug)]
pub enum MoveFuture<S: Service<Request>> {
    /// Its keys are moving.
    Moving(Box<Moving<S>>),
    /// Forwarded.
    Forwarded(S::Future),
}

impl<S> Future for MoveFuture<S>
where
    S: Service<Request, Response = Reply, Error = Failure> + Clone + Unpin,
    S::Future: Unpin,
{
    type Output = Result<Reply, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match this {
                MoveFuture::Moving(m) => match ready!(m.poll_moved(cx)) {
                    Ok(f) => *this = MoveFuture::Forwarded(f),
                    Err(e) => return Poll::Ready(Err(e)),
                },
                MoveFuture::Forwarded(f) => return Pin::new(f).poll(cx),
            }
        }
    }
}
