//! The near cache: read replies kept in each worker, served without a round trip, and
//! dropped when their key may have changed.
//!
//! # What is cached
//!
//! Replies of deterministic single-key reads ([`cacheable`]: `GET`, `HGET`, `HGETALL`,
//! `LRANGE`, ...) of a cluster with a `near_cache`, for keys under its prefixes, as Redis sent
//! them (so in the protocol the client asked in: the client's protocol and database pick the
//! connection, and are part of the entry's key). Never replies of writes, of reads inside
//! `MULTI` (the transaction lane does not come here), errors, or replies larger than
//! `max_entry_bytes`.
//!
//! # When an entry stops being served
//!
//! An entry records, when its fill was sent, three counters; it is served only while all
//! three still hold those values, and for at most `max_age`:
//!
//! - the **stamp of its key** ([`STAMPS`], one of 65,536 per process, by the hash of the key
//!   as its cluster stores it): bumped by every command that may write the key through this
//!   sidecar, when it is dispatched and again when its reply reaches the client (so a fill
//!   that read the old value before the write ran is not served after the write's reply:
//!   read-your-writes within the sidecar), and by every invalidation Redis sends to a
//!   tracker. Only writes routed to a cluster with a cache, or sharing a Redis with one, are
//!   looked at ([`Marks`]): the others pay nothing;
//! - the **flush generation** ([`FLUSHES`]): bumped by key-less writes through this sidecar
//!   (`FLUSHDB`, `FLUSHALL`, a script without keys);
//! - the **epoch of the endpoint** it was filled from, in this worker: bumped when any of the
//!   worker's connections to the endpoint closes (Redis forgets what a closed connection read
//!   and would send no invalidation for it: redis #11767), when the endpoint's tracker is lost
//!   or reconnects, and when Redis sends a flush (a null invalidation).
//!
//! A fill that raced an invalidation is therefore never served: it carries the counters of
//! before the race.
//!
//! # Modes
//!
//! - `tracked`: the worker's shared connections to the endpoint redirect their tracking to
//!   the tracker, in `OPTIN` mode: every fill is preceded, in one piece, by `CLIENT CACHING
//!   yes` (and the first on a connection after it or the tracker was opened by `CLIENT
//!   TRACKING on REDIRECT <tracker> OPTIN`), so only the keys of fills are tracked, not every
//!   read. Fills go on the session's own connection, so they keep their place among the
//!   session's commands. Redis then sends the tracker an invalidation when anyone changes a
//!   key filled. A fill is kept only while its connection's tracking state still says so
//!   ([`tracking_state`]): a tracking command that failed drops it, and so does a reconnect
//!   unless the fill carried the redirect itself.
//! - `bcast`: the tracker asks for every change under the prefixes (`BCAST PREFIX ...`); fills
//!   are plain reads.
//! - `ttl`: no tracker; entries end at `max_age` or on writes through this sidecar.
//!
//! A tracker is one RESP2 connection per worker and endpoint, subscribed to
//! `__redis__:invalidate` and sent `PING` every [`TRACKER_PING`]; one that misses
//! [`TRACKER_MISSES`] answers is dropped. While an endpoint has no tracker, its entries are not
//! served and nothing is filled from it.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use respway_filters::command::{CommandInfo, READONLY, WRITE};
use respway_filters::model::{Cluster, Config};
use respway_filters::routing::{RouteId, Routing};

pub(crate) mod clients;
mod entries;
mod hot;
mod layer;
mod tracker;

pub(crate) use entries::*;
pub(crate) use hot::*;
pub(crate) use layer::NearCache;
pub(crate) use tracker::*;

/// Key stamps per process.
const SLOTS: usize = 1 << 16;

/// One counter per key hash, bumped whenever a key of that hash may have changed.
pub(super) static STAMPS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// Bumped by key-less writes (every entry of every cluster ends).
pub(super) static FLUSHES: AtomicU64 = AtomicU64::new(0);

/// How often a tracker sends `PING`.
pub(crate) const TRACKER_PING: Duration = Duration::from_secs(2);
/// Unanswered pings after which a tracker is dropped.
pub(crate) const TRACKER_MISSES: u32 = 3;
/// The fixed cost counted per entry besides its key and reply (map slot, order queue,
/// entry fields).
pub(crate) const ENTRY_OVERHEAD: usize = 160;

/// Which writes of one listener mark key stamps: those whose route sends them to a cluster
/// that has a near cache, or that shares a Redis with one, in this configuration or any
/// applied before in this process (see [`marking_clusters`]). Built once per configuration
/// and worker; a listener none of whose routes reach such a cluster has none, and its
/// sessions pay nothing for the caches of others.
#[derive(Debug)]
pub(crate) struct Marks {
    /// Per route ([`RouteId`]: the catch-all, then the prefix routes): its writes mark.
    catch_all: bool,
    prefixes: Box<[bool]>,
    /// Every route marks and none removes its prefix: a key's stamp is its own, found
    /// without looking its route up.
    every_key: bool,
    /// When the catch-all does not mark: the first bytes of the prefixes of the routes that
    /// do (a key starting with none of them is not looked up: most writes, when the cache is
    /// on another cluster behind a prefix).
    first_bytes: Option<Box<[bool; 256]>>,
}

impl Marks {
    /// The marks of `routing`'s routes, given which clusters mark (`None`: no route marks).
    pub(crate) fn new(routing: &Routing, marking: &[bool]) -> Option<Arc<Marks>> {
        let routes = routing.routes();
        let marks = |targets: &[usize]| targets.iter().any(|&c| marking.get(c) == Some(&true));
        if !routes.iter().any(|(_, _, t, _)| marks(t)) {
            return None;
        }
        let mut m = Marks {
            catch_all: false,
            prefixes: vec![false; routes.len()].into_boxed_slice(),
            every_key: routes.iter().all(|(_, _, t, strip)| marks(t) && !strip),
            first_bytes: None,
        };
        for (id, _, targets, _) in &routes {
            match id {
                RouteId::CatchAll => m.catch_all = marks(targets),
                RouteId::Prefix(i) => m.prefixes[usize::from(*i)] = marks(targets),
            }
        }
        let marking_prefixes = || {
            (routes.iter())
                .filter(|(id, _, t, _)| *id != RouteId::CatchAll && marks(t))
                .map(|(_, p, _, _)| *p)
        };
        if !m.catch_all && marking_prefixes().all(|p| !p.is_empty()) {
            let mut first = Box::new([false; 256]);
            for p in marking_prefixes() {
                first[usize::from(p[0])] = true;
                if routing.case_insensitive() {
                    first[usize::from(p[0].to_ascii_lowercase())] = true;
                    first[usize::from(p[0].to_ascii_uppercase())] = true;
                }
            }
            m.first_bytes = Some(first);
        }
        Some(Arc::new(m))
    }

    fn of(&self, route: RouteId) -> bool {
        match route {
            RouteId::CatchAll => self.catch_all,
            RouteId::Prefix(i) => self.prefixes.get(usize::from(i)) == Some(&true),
        }
    }

    /// The stamp slot of `key`, as its cluster and its near cache name it (without the
    /// prefix its route removes), when a write of it marks.
    #[inline]
    fn slot(&self, routing: &Routing, key: &[u8]) -> Option<u32> {
        if self.every_key {
            return Some(slot_of(key_hash(key)) as u32);
        }
        if let Some(first) = &self.first_bytes {
            if !first[usize::from(*key.first()?)] {
                return None;
            }
        }
        let m = routing.route(key)?;
        self.of(m.route)
            .then(|| slot_of(key_hash(&key[m.strip.min(key.len())..])) as u32)
    }
}

/// Clusters (and Redis addresses) that have had a near cache in this process.
static EVER_CACHED: Mutex<(BTreeSet<String>, BTreeSet<SocketAddr>)> =
    Mutex::new((BTreeSet::new(), BTreeSet::new()));

/// Per cluster of `config`, whether writes sent to it mark key stamps: it has a near cache,
/// or it had one in a configuration applied before in this process (an entry of the old
/// configuration may still be served by a session that has not picked the new one up), or it
/// shares a Redis with a cluster that has or had one (a write through it changes that
/// cluster's keys). Called once per configuration and worker.
pub(crate) fn marking_clusters(config: &Config) -> Vec<bool> {
    let addresses = |c: &Cluster| {
        c.shards
            .iter()
            .flat_map(|s| s.endpoints.iter().map(|e| e.address))
            .collect::<Vec<_>>()
    };
    let mut ever = EVER_CACHED.lock().unwrap_or_else(|e| e.into_inner());
    for c in config.clusters.iter().filter(|c| c.near_cache.is_some()) {
        ever.0.insert(c.name.clone());
        ever.1.extend(addresses(c));
    }
    config
        .clusters
        .iter()
        .map(|c| ever.0.contains(&c.name) || addresses(c).iter().any(|a| ever.1.contains(a)))
        .collect()
}

#[inline]
pub(super) fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

pub(super) fn slot_of(hash: u64) -> usize {
    (hash as usize) & (SLOTS - 1)
}

/// Marks `key` as possibly changed.
pub(crate) fn invalidate(key: &[u8]) {
    STAMPS[slot_of(key_hash(key))].fetch_add(1, Ordering::AcqRel);
}

/// Ends every entry.
pub(crate) fn flush_all() {
    FLUSHES.fetch_add(1, Ordering::AcqRel);
}

/// What a dispatched write touches, to be marked again when its reply reaches the client.
#[derive(Debug, Default, Clone)]
pub(crate) enum Touch {
    /// Nothing (a read, or no cache).
    #[default]
    None,
    /// One stamp slot (a single-key write: no allocation).
    One(u32),
    /// These stamp slots.
    Slots(Box<[u32]>),
    /// Everything.
    All,
}

impl Touch {
    /// Marks again what was touched.
    pub(crate) fn again(&self) {
        match self {
            Touch::None => {}
            Touch::One(i) => {
                STAMPS[*i as usize].fetch_add(1, Ordering::AcqRel);
            }
            Touch::Slots(s) => {
                for &i in s.iter() {
                    STAMPS[i as usize].fetch_add(1, Ordering::AcqRel);
                }
            }
            Touch::All => flush_all(),
        }
    }

    /// Adds what `other` touched (a transaction's commands, gathered for its `EXEC`).
    pub(crate) fn merge(&mut self, other: Touch) {
        *self = match (std::mem::take(self), other) {
            (Touch::All, _) | (_, Touch::All) => Touch::All,
            (Touch::None, o) | (o, Touch::None) => o,
            (a, b) => Touch::Slots(a.slots().iter().chain(b.slots()).copied().collect()),
        };
    }

    fn slots(&self) -> &[u32] {
        match self {
            Touch::One(i) => std::slice::from_ref(i),
            Touch::Slots(s) => s,
            Touch::None | Touch::All => &[],
        }
    }
}

/// Called for every command a session dispatches on a listener with [`Marks`]: a command
/// that may write marks the stamps of its keys that go to a cache (or, without keys, every
/// entry) now, and returns them to be marked again when its reply goes out.
pub(crate) fn dispatched(
    marks: &Marks,
    routing: &Routing,
    cmd: &CommandInfo,
    args: &[Bytes],
    keys: Option<&[usize]>,
) -> Touch {
    if cmd.flags & READONLY != 0 {
        return Touch::None;
    }
    match keys.filter(|k| !k.is_empty()) {
        Some(&[i]) => {
            let Some(slot) = args.get(i).and_then(|k| marks.slot(routing, k)) else {
                return Touch::None;
            };
            STAMPS[slot as usize].fetch_add(1, Ordering::AcqRel);
            Touch::One(slot)
        }
        Some(keys) => {
            let slots: Box<[u32]> = keys
                .iter()
                .filter_map(|&i| args.get(i))
                .filter_map(|k| marks.slot(routing, k))
                .collect();
            if slots.is_empty() {
                return Touch::None;
            }
            for &i in slots.iter() {
                STAMPS[i as usize].fetch_add(1, Ordering::AcqRel);
            }
            Touch::Slots(slots)
        }
        None if flushes_all(cmd) => {
            flush_all();
            Touch::All
        }
        None => Touch::None,
    }
}

/// A command that, given no keys, may write any key (`FLUSHDB`, a script without keys, ...).
pub(crate) fn flushes_all(cmd: &CommandInfo) -> bool {
    cmd.flags & WRITE != 0
        || matches!(
            cmd.name,
            "eval" | "evalsha" | "fcall" | "script|flush" | "function|flush" | "function|restore"
        )
}

/// The reads whose replies may be cached (deterministic, one key, first argument).
pub(crate) fn cacheable(cmd: &CommandInfo, args: &[Bytes]) -> bool {
    match cmd.name {
        "get" | "hget" | "hmget" | "hgetall" | "hexists" | "hlen" | "hstrlen" | "smembers"
        | "sismember" | "smismember" | "scard" | "zscore" | "zmscore" | "zrange" | "zcard"
        | "zrank" | "zrevrank" | "zrangebyscore" | "zrevrange" | "zrevrangebyscore" | "lrange"
        | "llen" | "lindex" | "strlen" | "type" | "getrange" | "substr" | "hkeys" | "hvals"
        | "getbit" | "bitcount" => true,
        "exists" => args.len() == 2,
        _ => false,
    }
}

pub(crate) use crate::stats::CacheStats;

/// The first argument of packed arguments (see [`entries::packed`]): an entry's key.
pub(super) fn first_arg(packed: &[u8]) -> &[u8] {
    let len = packed
        .get(..4)
        .map_or(0, |l| u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize);
    packed.get(4..4 + len).unwrap_or_default()
}

/// Integer replies one after another (`:N` and CRLF each), as `PTTL`s answer; `None` for
/// anything else (an error: a server without the command, a user without it).
pub(super) fn integers(mut replies: &[u8]) -> Option<Vec<i64>> {
    let mut out = Vec::new();
    while !replies.is_empty() {
        let rest = replies.strip_prefix(b":")?;
        let end = rest.windows(2).position(|w| w == b"\r\n")?;
        out.push(std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?);
        replies = &rest[end + 2..];
    }
    Some(out)
}

pub(super) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use respway_filters::resp::Frame;
    use std::sync::Arc;
    use std::time::Instant;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn ttls_read_back_from_their_replies() {
        assert_eq!(integers(b":120\r\n:-1\r\n:-2\r\n"), Some(vec![120, -1, -2]));
        assert_eq!(integers(b""), Some(vec![]));
        assert_eq!(integers(b"-ERR unknown command 'PTTL'\r\n"), None);
        assert_eq!(integers(b":12"), None);
        assert_eq!(first_arg(&entries::packed(&[b("k"), b("f")])), b"k");
    }

    #[test]
    fn overlapping_bcast_prefixes_keep_the_shortest() {
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            shortest(&p(&["user:1", "user:", "item:", "item:9:"])),
            p(&["user:", "item:"])
        );
    }

    #[test]
    fn packed_arguments_compare_exactly() {
        let args = [b("k"), b("f1")];
        let p = packed(&args);
        assert!(same_args(&p, &args));
        assert!(!same_args(&p, &[b("k")]));
        assert!(!same_args(&p, &[b("k"), b("f2")]));
        assert!(!same_args(&p, &[b("kf"), b("1")]));
        assert!(!same_args(&p, &[b("k"), b("f1"), b("")]));
    }

    #[test]
    fn invalidation_messages_name_their_keys_or_a_flush() {
        let msg = Frame::Array(vec![
            Frame::Bulk(b("message")),
            Frame::Bulk(b("__redis__:invalidate")),
            Frame::Array(vec![Frame::Bulk(b("a")), Frame::Bulk(b("b"))]),
        ]);
        let keys = invalidated(&msg).expect("an invalidation").expect("keys");
        assert_eq!(keys, [&b("a"), &b("b")]);
        let flush = Frame::Array(vec![
            Frame::Bulk(b("message")),
            Frame::Bulk(b("__redis__:invalidate")),
            Frame::NullArray,
        ]);
        assert_eq!(invalidated(&flush), Some(None));
        let other = Frame::Array(vec![
            Frame::Bulk(b("message")),
            Frame::Bulk(b("news")),
            Frame::Bulk(b("x")),
        ]);
        assert_eq!(invalidated(&other), None);
        assert!(is_pong(&Frame::Array(vec![
            Frame::Bulk(b("pong")),
            Frame::Bulk(b(""))
        ])));
    }

    /// Two clusters: `plain` (the catch-all) and `cached` (a near cache, behind a prefix
    /// route that removes its prefix `c:`), each on its own address.
    fn two_clusters() -> (Config, Routing) {
        let yaml = "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes:\n      \
            catch_all: plain\n      prefixes:\n        - { prefix: \"c:\", cluster: cached, \
            remove_prefix: true }\nclusters:\n  - name: plain\n    shards:\n      - name: s\n\
            \x20       endpoints: [{ address: \"127.0.0.1:7901\" }]\n  - name: cached\n    \
            near_cache: { mode: ttl }\n    shards:\n      - name: s\n        endpoints: \
            [{ address: \"127.0.0.1:7902\" }]\n";
        let config =
            respway_xds::translate(&respway_xds::parse_yaml(yaml).expect("yaml")).expect("config");
        let routing = Routing::build(&config, &config.listeners[0]).expect("routing");
        (config, routing)
    }

    #[test]
    fn a_write_marks_its_cached_keys_and_a_keyless_write_everything() {
        let (config, routing) = two_clusters();
        let marking = marking_clusters(&config);
        assert_eq!(marking, [false, true]);
        let marks = Marks::new(&routing, &marking).expect("a route marks");
        let table = respway_filters::command::lookup(b"set").expect("set");
        // The cache knows the key as its cluster stores it: without the prefix.
        let args = [b("set"), b("c:stamp-test-key"), b("v")];
        let slot = slot_of(key_hash(b"stamp-test-key"));
        let before = STAMPS[slot].load(Ordering::Acquire);
        let touch = dispatched(&marks, &routing, table, &args, Some(&[1]));
        assert_eq!(STAMPS[slot].load(Ordering::Acquire), before + 1);
        touch.again();
        assert_eq!(STAMPS[slot].load(Ordering::Acquire), before + 2);
        // A write to the cluster without a cache marks nothing (whatever its first byte).
        for key in ["stamp-test-key", "c-not-the-prefix", ""] {
            let plain = [b("set"), b(key), b("v")];
            assert!(matches!(
                dispatched(&marks, &routing, table, &plain, Some(&[1])),
                Touch::None
            ));
        }
        let mset = respway_filters::command::lookup(b"mset").expect("mset");
        let both = [b("mset"), b("stamp-test-key"), b("v"), b("c:k2"), b("v")];
        match dispatched(&marks, &routing, mset, &both, Some(&[1, 3])) {
            Touch::Slots(s) => assert_eq!(&*s, [slot_of(key_hash(b"k2")) as u32]),
            t => panic!("{t:?}"),
        }
        let get = respway_filters::command::lookup(b"get").expect("get");
        assert!(matches!(
            dispatched(
                &marks,
                &routing,
                get,
                &[b("get"), b("c:stamp-test-key")],
                Some(&[1])
            ),
            Touch::None
        ));
        let flushdb = respway_filters::command::lookup(b"flushdb").expect("flushdb");
        let flushes = FLUSHES.load(Ordering::Acquire);
        assert!(matches!(
            dispatched(&marks, &routing, flushdb, &[b("flushdb")], Some(&[])),
            Touch::All
        ));
        assert!(FLUSHES.load(Ordering::Acquire) > flushes);
    }

    #[test]
    fn a_cluster_sharing_a_redis_with_a_cache_marks_and_a_removed_cache_still_does() {
        let (config, _) = two_clusters();
        let mut shared = config.clone();
        shared.clusters[0].shards[0].endpoints[0].address =
            shared.clusters[1].shards[0].endpoints[0].address;
        assert_eq!(marking_clusters(&shared), [true, true]);
        let mut removed = config.clone();
        removed.clusters[1].near_cache = None;
        assert_eq!(marking_clusters(&removed), [false, true]);
    }

    #[test]
    fn hot_keys_enter_above_the_rate_and_leave_below_half_of_it() {
        let stats = Arc::new(CacheStats::default());
        let hot = HotSet::new(100, 1, stats.clone());
        let t0 = Instant::now();
        for i in 0..99 {
            assert!(!hot.admits(b"k", key_hash(b"k"), t0), "read {i}");
        }
        assert!(
            hot.admits(b"k", key_hash(b"k"), t0),
            "the 100th read in the window admits it"
        );
        assert!(!hot.admits(b"cold", key_hash(b"cold"), t0));
        // Next window: 50 reads (half) keep it, fewer drop it.
        let t1 = t0 + HOT_WINDOW;
        assert!(hot.admits(b"k", key_hash(b"k"), t1));
        for _ in 0..49 {
            hot.admits(b"k", key_hash(b"k"), t1);
        }
        let t2 = t1 + HOT_WINDOW;
        assert!(hot.admits(b"k", key_hash(b"k"), t2), "50 reads kept it");
        let t3 = t2 + HOT_WINDOW;
        assert!(
            !hot.admits(b"k", key_hash(b"k"), t3),
            "1 read in a window: it left"
        );
        assert_eq!(stats.hot_keys.load(Ordering::Relaxed), 0);
    }
}
