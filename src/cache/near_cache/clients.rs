//! Client-side caching through the sidecar: `CLIENT TRACKING on` is answered by respway, and
//! the keys a tracking session read are announced to it (`>2 invalidate [keys]`, RESP3
//! pushes on its own connection) when they may have changed.
//!
//! What announces a key:
//! - a write through any session of this sidecar ([`changed`] at its dispatch; the writer
//!   itself gets its announcement right after the write's reply, [`ClientTracking::dispatched`]);
//! - Redis, for writes by anyone: a tracking session's reads go upstream as near-cache fills
//!   do (`CLIENT CACHING yes` on a connection whose tracking redirects to the endpoint's
//!   tracker, `tracked` mode; or under the tracker's `BCAST` prefixes), and the tracker's
//!   invalidations are announced;
//! - a read the sidecar could not have Redis follow (no `tracked` near cache on the cluster,
//!   its tracker down, a reconnect while the read was in flight, a read inside `MULTI`): its
//!   keys are announced right after its reply, so the client keeps nothing nobody would
//!   announce a change of.
//!
//! Every key at once (a null `invalidate`): a key-less write (`FLUSHDB`, ...), a tracker
//! lost or back, a shared upstream connection closed (Redis forgets what was read over it:
//! redis #11767), a session's announcements piling up past [`MAX_QUEUED`], or its followed
//! keys past [`MAX_KEYS`].
//!
//! Publishers find the sessions through one list swapped on change ([`SESSIONS`]: read
//! without a lock); each session's inbox counts its followed keys per hash bucket, and
//! [`FOLLOWED`] counts them for all sessions together, so a write of a key nobody follows
//! looks at no session and wakes nobody.

use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use respway_filters::command::{CommandInfo, READONLY};
use tokio::sync::mpsc;

use super::{key_hash, Prehashed};

/// Hash buckets of a session's followed keys (what publishers look at).
const BUCKETS: usize = 4096;
/// Keys one session follows at most: past it, it is sent a flush and starts over (Redis's
/// `tracking-table-max-keys` is the same idea, for the whole server).
pub(crate) const MAX_KEYS: usize = 100_000;
/// Announcements queued for one session at most: past it, one flush replaces them.
pub(crate) const MAX_QUEUED: usize = 10_000;

/// What a session is told.
#[derive(Debug)]
enum Msg {
    Key(Bytes),
    Flush,
}

/// What publishers see of a tracking session.
#[derive(Debug)]
struct Inbox {
    /// The session's client id (its own writes are announced by the session itself).
    id: u64,
    /// Keys followed per hash bucket (default, `OPTIN` and `OPTOUT` modes).
    interest: Box<[AtomicU32]>,
    /// `BCAST`: every key under `prefixes` (none: every key).
    bcast: bool,
    prefixes: ArcSwap<Vec<Bytes>>,
    tx: mpsc::UnboundedSender<Msg>,
    queued: AtomicUsize,
    /// A flush was queued instead of keys: the next keys are dropped until it is taken.
    overflow: AtomicBool,
}

impl Inbox {
    fn wants(&self, key: &[u8], hash: u64) -> bool {
        if self.bcast {
            let p = self.prefixes.load();
            p.is_empty() || p.iter().any(|p| key.starts_with(p))
        } else {
            self.interest[bucket(hash)].load(Ordering::Acquire) > 0
        }
    }

    fn send(&self, m: Msg) {
        if self.overflow.load(Ordering::Acquire) {
            return;
        }
        if self.queued.fetch_add(1, Ordering::AcqRel) >= MAX_QUEUED {
            if !self.overflow.swap(true, Ordering::AcqRel) {
                let _ = self.tx.send(Msg::Flush);
            }
            return;
        }
        let _ = self.tx.send(m);
    }
}

fn bucket(hash: u64) -> usize {
    (hash >> 32) as usize & (BUCKETS - 1)
}

/// Every tracking session of the process.
static SESSIONS: LazyLock<ArcSwap<Vec<Arc<Inbox>>>> = LazyLock::new(ArcSwap::default);
/// How many there are (publishers look at nothing else while there are none).
use crate::stats::process::TRACKING_SESSIONS as COUNT;

/// Keys announced, flushes announced, and reads announced at once because nothing upstream
/// follows them (process-wide, for `INFO` and the metrics).
use crate::stats::process::{
    TRACKING_ANNOUNCED_FLUSHES as ANNOUNCED_FLUSHES, TRACKING_ANNOUNCED_KEYS as ANNOUNCED_KEYS,
    TRACKING_UNFOLLOWED_READS as UNFOLLOWED_READS,
};

/// Per hash bucket, how many keys of it the tracking sessions follow (all of them: the sum
/// of their interests): a write of a key in a bucket no one follows stops here, without
/// looking at the sessions.
static FOLLOWED: [AtomicU32; BUCKETS] = [const { AtomicU32::new(0) }; BUCKETS];
/// Tracking sessions in `BCAST` mode (they follow prefixes, not keys: every write looks).
static BCASTS: AtomicUsize = AtomicUsize::new(0);

/// True while some session tracks.
#[inline(always)]
pub(crate) fn any() -> bool {
    COUNT.load(Ordering::Relaxed) > 0
}

/// `key` may have changed: every tracking session that follows it but `origin` (the
/// session that wrote it, which announces it itself; 0 for none) is told.
#[inline]
pub(crate) fn changed(key: &Bytes, origin: u64) {
    if !any() {
        return;
    }
    let hash = key_hash(key);
    if FOLLOWED[bucket(hash)].load(Ordering::Acquire) == 0 && BCASTS.load(Ordering::Acquire) == 0 {
        return;
    }
    tell(key, hash, origin);
}

/// `key` (of `hash`) may have changed and some session may follow it.
#[cold]
fn tell(key: &Bytes, hash: u64, origin: u64) {
    for s in SESSIONS.load().iter() {
        if s.id != origin && s.wants(key, hash) {
            s.send(Msg::Key(key.clone()));
        }
    }
}

/// Every key may have changed: every tracking session but `origin` is told.
pub(crate) fn flush(origin: u64) {
    if !any() {
        return;
    }
    for s in SESSIONS.load().iter() {
        if s.id != origin {
            s.send(Msg::Flush);
        }
    }
}

/// A write dispatched by session `origin` (its key positions in `args`; `None` when they
/// could not be found): the other tracking sessions are told of its keys, or of every key.
#[inline]
pub(crate) fn written(cmd: &CommandInfo, args: &[Bytes], keys: Option<&[usize]>, origin: u64) {
    match keys.filter(|k| !k.is_empty()) {
        Some(keys) => {
            for &i in keys {
                if let Some(k) = args.get(i) {
                    changed(k, origin);
                }
            }
        }
        None if super::flushes_all(cmd) => flush(origin),
        None => {}
    }
}

/// Reads of a tracking session that nothing upstream follows: announced after their reply.
pub(crate) fn unfollowed(keys: impl Iterator<Item = Bytes>) {
    UNFOLLOWED_READS.fetch_add(1, Ordering::Relaxed);
    for k in keys {
        changed(&k, 0);
    }
}

/// How a session tracks (`CLIENT TRACKING on [BCAST [PREFIX p ...]] [OPTIN|OPTOUT]
/// [NOLOOP]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Options {
    pub(crate) bcast: bool,
    pub(crate) prefixes: Vec<Bytes>,
    pub(crate) optin: bool,
    pub(crate) optout: bool,
    pub(crate) noloop: bool,
}

/// A session's tracking: what it follows, and its inbox.
#[derive(Debug)]
pub(crate) struct ClientTracking {
    pub(crate) opts: Options,
    inbox: Arc<Inbox>,
    rx: mpsc::UnboundedReceiver<Msg>,
    /// Hashes of the keys followed (not `BCAST`).
    keys: HashSet<u64, BuildHasherDefault<Prehashed>>,
    /// `CLIENT CACHING yes|no`, for the next command.
    pub(crate) caching: Option<bool>,
    /// Keys read or written inside `MULTI`, announced after `EXEC`'s reply.
    tx_keys: Vec<Bytes>,
    /// A key was followed since the last flush announced (another flush before one would
    /// tell the client nothing: it holds nothing it may keep).
    followed: bool,
}

impl ClientTracking {
    /// Starts tracking for session `id` with `opts`.
    pub(crate) fn start(id: u64, opts: Options) -> Box<ClientTracking> {
        let (tx, rx) = mpsc::unbounded_channel();
        let inbox = Arc::new(Inbox {
            id,
            interest: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            bcast: opts.bcast,
            prefixes: ArcSwap::from_pointee(opts.prefixes.clone()),
            tx,
            queued: AtomicUsize::new(0),
            overflow: AtomicBool::new(false),
        });
        SESSIONS.rcu(|v| {
            let mut v = Vec::clone(v);
            v.push(inbox.clone());
            v
        });
        if opts.bcast {
            BCASTS.fetch_add(1, Ordering::AcqRel);
        }
        COUNT.fetch_add(1, Ordering::AcqRel);
        Box::new(ClientTracking {
            opts,
            inbox,
            rx,
            keys: HashSet::default(),
            caching: None,
            tx_keys: Vec::new(),
            followed: true,
        })
    }

    /// `CLIENT TRACKING on` again: the new options (prefixes are added to those held).
    pub(crate) fn update(&mut self, opts: Options) {
        let mut prefixes = std::mem::take(&mut self.opts.prefixes);
        prefixes.extend(opts.prefixes);
        self.opts = Options { prefixes, ..opts };
        self.inbox
            .prefixes
            .store(Arc::new(self.opts.prefixes.clone()));
    }

    fn follow(&mut self, key: &[u8]) {
        self.followed = true;
        let h = key_hash(key);
        if self.keys.insert(h) {
            self.inbox.interest[bucket(h)].fetch_add(1, Ordering::AcqRel);
            FOLLOWED[bucket(h)].fetch_add(1, Ordering::AcqRel);
        }
    }

    /// True when `key` was followed (it is not anymore).
    fn unfollow(&mut self, key: &[u8]) -> bool {
        let h = key_hash(key);
        let had = self.keys.remove(&h);
        if had {
            self.inbox.interest[bucket(h)].fetch_sub(1, Ordering::AcqRel);
            FOLLOWED[bucket(h)].fetch_sub(1, Ordering::AcqRel);
        }
        had
    }

    /// The flush announcement, unless nothing was followed since the last one.
    fn flush_once(&mut self) -> Option<Bytes> {
        self.unfollow_all();
        if !std::mem::take(&mut self.followed) && !self.opts.bcast {
            return None;
        }
        ANNOUNCED_FLUSHES.fetch_add(1, Ordering::Relaxed);
        Some(flush_push())
    }

    fn unfollow_all(&mut self) {
        for &h in &self.keys {
            FOLLOWED[bucket(h)].fetch_sub(1, Ordering::AcqRel);
        }
        self.keys.clear();
        for b in self.inbox.interest.iter() {
            b.store(0, Ordering::Release);
        }
    }

    fn under_prefixes(&self, key: &[u8]) -> bool {
        self.opts.prefixes.is_empty() || self.opts.prefixes.iter().any(|p| key.starts_with(p))
    }

    /// Called for every command the session dispatches while tracking is on, with its keys
    /// (`keys`: positions in `args`); `upstream` when the command goes to the chain outside
    /// a transaction (where the upstream can have Redis follow its keys). Returns whether the
    /// request is to be followed upstream, and what to write right after its reply.
    pub(crate) fn dispatched(
        &mut self,
        cmd: &CommandInfo,
        args: &[Bytes],
        keys: &[usize],
        upstream: bool,
        in_multi: bool,
    ) -> (bool, Option<Bytes>) {
        let caching = if cmd.name == "client|caching" {
            return (false, None);
        } else {
            self.caching.take()
        };
        let key_args = || keys.iter().filter_map(|&i| args.get(i));
        if cmd.name == "exec" {
            let ks = std::mem::take(&mut self.tx_keys);
            return (false, self.announce(ks));
        }
        if cmd.name == "discard" {
            self.tx_keys.clear();
            return (false, None);
        }
        if cmd.flags & READONLY != 0 {
            if keys.is_empty() {
                return (false, None);
            }
            let follow = if self.opts.bcast {
                key_args().all(|k| self.under_prefixes(k))
            } else if self.opts.optin {
                caching == Some(true)
            } else if self.opts.optout {
                caching != Some(false)
            } else {
                true
            };
            if !follow {
                return (false, None);
            }
            if !self.opts.bcast {
                for k in key_args() {
                    self.follow(k);
                }
                if self.keys.len() > MAX_KEYS {
                    return (false, self.flush_once());
                }
            }
            if upstream && !in_multi {
                return (true, None);
            }
            UNFOLLOWED_READS.fetch_add(1, Ordering::Relaxed);
            let ks: Vec<Bytes> = key_args().cloned().collect();
            if in_multi {
                self.tx_keys.extend(ks);
                return (false, None);
            }
            return (false, self.announce(ks));
        }
        // A write: what this session follows of it is announced after its reply (unless
        // NOLOOP); the others are told by `changed` at dispatch.
        if self.opts.noloop {
            return (false, None);
        }
        if keys.is_empty() {
            if super::flushes_all(cmd) && !in_multi {
                return (false, self.flush_once());
            }
            return (false, None);
        }
        let ks: Vec<Bytes> = key_args().cloned().collect();
        if in_multi {
            self.tx_keys.extend(ks);
            return (false, None);
        }
        (false, self.announce(ks))
    }

    /// The announcement of those of `keys` this session follows (and follows no more).
    fn announce(&mut self, keys: Vec<Bytes>) -> Option<Bytes> {
        let keys: Vec<Bytes> = keys
            .into_iter()
            .filter(|k| {
                if self.opts.bcast {
                    self.under_prefixes(k)
                } else {
                    self.unfollow(k)
                }
            })
            .collect();
        if keys.is_empty() {
            return None;
        }
        ANNOUNCED_KEYS.fetch_add(keys.len() as u64, Ordering::Relaxed);
        Some(keys_push(&keys))
    }

    /// The announcements waiting in the inbox, as one push (a flush when any says so).
    pub(crate) fn poll_announcements(&mut self, cx: &mut Context<'_>) -> Option<Bytes> {
        let mut keys = Vec::new();
        let mut flush = false;
        while let Poll::Ready(Some(m)) = self.rx.poll_recv(cx) {
            self.inbox.queued.fetch_sub(1, Ordering::AcqRel);
            match m {
                Msg::Key(k) => keys.push(k),
                Msg::Flush => flush = true,
            }
            if keys.len() >= 1024 {
                break;
            }
        }
        if flush {
            self.inbox.overflow.store(false, Ordering::Release);
            return self.flush_once();
        }
        if keys.is_empty() {
            return None;
        }
        keys.sort_unstable();
        keys.dedup();
        self.announce(keys)
    }
}

impl Drop for ClientTracking {
    fn drop(&mut self) {
        let me = self.inbox.clone();
        SESSIONS.rcu(|v| {
            v.iter()
                .filter(|s| !Arc::ptr_eq(s, &me))
                .cloned()
                .collect::<Vec<_>>()
        });
        for &h in &self.keys {
            FOLLOWED[bucket(h)].fetch_sub(1, Ordering::AcqRel);
        }
        if self.inbox.bcast {
            BCASTS.fetch_sub(1, Ordering::AcqRel);
        }
        COUNT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `>2 invalidate [keys]`.
fn keys_push(keys: &[Bytes]) -> Bytes {
    let mut out = BytesMut::with_capacity(32 + keys.iter().map(|k| k.len() + 16).sum::<usize>());
    out.extend_from_slice(b">2\r\n$10\r\ninvalidate\r\n");
    out.extend_from_slice(format!("*{}\r\n", keys.len()).as_bytes());
    for k in keys {
        out.extend_from_slice(format!("${}\r\n", k.len()).as_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(b"\r\n");
    }
    out.freeze()
}

/// `>2 invalidate _`: every key.
fn flush_push() -> Bytes {
    Bytes::from_static(b">2\r\n$10\r\ninvalidate\r\n_\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn pushes_are_resp3_invalidations() {
        assert_eq!(
            &keys_push(&[b("a"), b("bc")])[..],
            b">2\r\n$10\r\ninvalidate\r\n*2\r\n$1\r\na\r\n$2\r\nbc\r\n"
        );
        assert_eq!(&flush_push()[..], b">2\r\n$10\r\ninvalidate\r\n_\r\n");
    }

    /// The count of all sessions' followed keys per bucket follows a session's keys in and
    /// out (followed, unfollowed, flushed, session gone), so that a write looks at the
    /// sessions exactly when one may follow its key.
    #[test]
    fn followed_buckets_count_every_sessions_keys() {
        let at = |k: &str| FOLLOWED[bucket(key_hash(k.as_bytes()))].load(Ordering::Acquire);
        let keys = ["fbcesk:a", "fbcesk:b", "fbcesk:c"];
        let before: Vec<u32> = keys.iter().map(|k| at(k)).collect();
        let now = || keys.iter().map(|k| at(k)).collect::<Vec<u32>>();
        let plus = |d: [u32; 3]| before.iter().zip(d).map(|(b, d)| b + d).collect::<Vec<_>>();
        let mut t = ClientTracking::start(u64::MAX - 7, Options::default());
        t.follow(keys[0].as_bytes());
        t.follow(keys[0].as_bytes());
        t.follow(keys[1].as_bytes());
        assert_eq!(now(), plus([1, 1, 0]));
        assert!(t.unfollow(keys[0].as_bytes()));
        assert_eq!(now(), plus([0, 1, 0]));
        t.follow(keys[2].as_bytes());
        t.unfollow_all();
        assert_eq!(now(), plus([0, 0, 0]));
        t.follow(keys[1].as_bytes());
        drop(t);
        assert_eq!(now(), plus([0, 0, 0]));
    }
}
