//! A worker's entries of one cluster: lookups, fills and the budget (see the module above).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use respway_filters::command::CommandInfo;
use respway_filters::model::{NearCache, NearCacheAdmit, NearCacheMode};
use respway_filters::request::{is_error, Flavor, Request};
use respway_filters::resp::encode_command;

use super::{
    bump, cacheable, key_hash, slot_of, CacheStats, HotSet, ENTRY_OVERHEAD, FLUSHES, STAMPS,
};
use crate::upstream::EndpointHandle;

/// The counters an entry must still find to be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Valid {
    slot: u32,
    stamp: u64,
    flush: u64,
    epoch: u64,
}

impl Valid {
    fn now(slot: usize, ep: &EndpointHandle) -> Valid {
        Valid {
            slot: slot as u32,
            stamp: STAMPS[slot].load(Ordering::Acquire),
            flush: FLUSHES.load(Ordering::Acquire),
            epoch: ep.cache_epoch(),
        }
    }
}

#[derive(Debug)]
struct Entry {
    /// Its order number (an eviction finds the entry it queued by it).
    seq: u64,
    cmd: &'static CommandInfo,
    flavor: Flavor,
    /// The arguments after the command name, length-prefixed.
    args: Box<[u8]>,
    reply: Bytes,
    ep: EndpointHandle,
    valid: Valid,
    born: Instant,
}

impl Entry {
    fn size(&self) -> usize {
        self.args.len() + self.reply.len() + ENTRY_OVERHEAD
    }

    fn same(&self, cmd: &CommandInfo, flavor: Flavor, ep: &EndpointHandle, args: &[Bytes]) -> bool {
        std::ptr::eq(self.cmd, cmd)
            && self.flavor == flavor
            && self.ep.same(ep)
            && same_args(&self.args, args)
    }

    fn serves(&self, max_age: Duration, now: Instant) -> bool {
        STAMPS[self.valid.slot as usize].load(Ordering::Acquire) == self.valid.stamp
            && FLUSHES.load(Ordering::Acquire) == self.valid.flush
            && self.ep.cache_epoch() == self.valid.epoch
            && now.duration_since(self.born) < max_age
    }
}

pub(super) fn packed(args: &[Bytes]) -> Box<[u8]> {
    let mut out = Vec::with_capacity(args.iter().map(|a| a.len() + 4).sum());
    for a in args {
        out.extend_from_slice(&(a.len() as u32).to_le_bytes());
        out.extend_from_slice(a);
    }
    out.into_boxed_slice()
}

pub(super) fn same_args(mut packed: &[u8], args: &[Bytes]) -> bool {
    for a in args {
        let Some((len, rest)) = packed.split_first_chunk::<4>() else {
            return false;
        };
        let len = u32::from_le_bytes(*len) as usize;
        if len != a.len() || rest.get(..len) != Some(&a[..]) {
            return false;
        }
        packed = &rest[len..];
    }
    packed.is_empty()
}

/// A map keyed by hashes already computed.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<u64, Entry, BuildHasherDefault<Prehashed>>,
    /// Entries in fill order, for eviction (hash, seq).
    order: VecDeque<(u64, u64)>,
    seq: u64,
    bytes: usize,
    /// `admit: all`'s doorkeeper: one bit per entry hash, set by a read that found no entry;
    /// a read is filled only when its bit was set already (the second read in the window),
    /// so a key read once (a scan, a one-off) costs a bit, not an entry. Cleared when an
    /// eighth of the bits are set (so at most one first read in eight is taken for a second). Allocated on first use.
    seen: Vec<u64>,
    seen_set: usize,
}

/// Bits of the doorkeeper (128 KiB per worker and cluster).
const SEEN_BITS: usize = 1 << 20;

impl Entries {
    /// True when an entry of `hash` was asked for before in the doorkeeper's window; marks it
    /// asked for.
    fn seen_before(&mut self, hash: u64) -> bool {
        if self.seen.is_empty() {
            self.seen = vec![0; SEEN_BITS / 64];
        }
        let bit = (hash >> 20) as usize & (SEEN_BITS - 1);
        let (word, mask) = (bit / 64, 1u64 << (bit % 64));
        if self.seen[word] & mask != 0 {
            return true;
        }
        self.seen[word] |= mask;
        self.seen_set += 1;
        if self.seen_set >= SEEN_BITS / 8 {
            self.seen.fill(0);
            self.seen_set = 0;
        }
        false
    }
}

/// One worker's cache of one cluster, for one configuration (a push starts a new, empty one).
#[derive(Debug)]
pub(crate) struct ClusterCache {
    cfg: NearCache,
    mode: NearCacheMode,
    entries: Mutex<Entries>,
    stats: Arc<CacheStats>,
    hot: Option<Arc<HotSet>>,
}

/// What the cache says of a read.
pub(crate) enum Lookup {
    /// Not for the cache: send it as it is.
    Pass,
    /// Served from the cache.
    Hit(Bytes),
    /// Send it, with the tracking commands before it when `pre` is set, and keep the reply.
    Fill(Box<Fill>),
}

/// A read sent to fill an entry.
#[derive(Debug)]
pub(crate) struct Fill {
    cache: Arc<ClusterCache>,
    hash: u64,
    cmd: &'static CommandInfo,
    flavor: Flavor,
    args: Box<[u8]>,
    ep: EndpointHandle,
    valid: Valid,
    /// `tracked` mode: the id of the endpoint's tracker, which the connection the read goes
    /// on must redirect its invalidations to.
    pub(crate) tracker: Option<u64>,
    /// Set by the upstream for `tracked` mode: the tracking state of the connection the read
    /// went on, and the value it must still hold for the reply to be kept (see
    /// [`tracking_state`]).
    pub(crate) track: Option<(Arc<AtomicU64>, u64, Arc<AtomicU64>)>,
}

/// What a connection's tracking state holds once `CLIENT TRACKING on REDIRECT tracker` was
/// sent on it after the endpoint's `connects`-th connection opened: a fill goes without it only
/// while the state holds this value, and is kept only if it still does when its reply comes
/// (a reconnect in between, or a tracking command that failed and cleared it, drops the fill).
pub(crate) fn tracking_state(tracker: u64, connects: u64) -> u64 {
    match tracker.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ connects {
        0 => 1,
        v => v,
    }
}

/// `CLIENT TRACKING on REDIRECT id OPTIN` and `CLIENT CACHING yes`, encoded: what the first
/// fill on a connection is preceded by.
pub(crate) fn redirect_frame(id: u64) -> Bytes {
    let mut b = BytesMut::with_capacity(96);
    encode_command(
        &[
            &b"CLIENT"[..],
            b"TRACKING",
            b"on",
            b"REDIRECT",
            id.to_string().as_bytes(),
            b"OPTIN",
        ],
        &mut b,
    );
    b.extend_from_slice(CACHING_YES);
    b.freeze()
}

/// `CLIENT CACHING yes`, encoded: what every other fill is preceded by.
pub(crate) const CACHING_YES: &[u8] = b"*3\r\n$6\r\nCLIENT\r\n$7\r\nCACHING\r\n$3\r\nyes\r\n";

impl ClusterCache {
    pub(crate) fn new(
        cfg: &NearCache,
        stats: Arc<CacheStats>,
        hot: Option<Arc<HotSet>>,
    ) -> ClusterCache {
        ClusterCache {
            mode: cfg.mode,
            cfg: cfg.clone(),
            entries: Mutex::default(),
            stats,
            hot,
        }
    }

    /// Counts `old`, taken out of `e`, out of the bytes and the gauges.
    fn forget(&self, e: &mut Entries, old: &Entry) {
        e.bytes -= old.size();
        self.stats.entries.fetch_sub(1, Ordering::Relaxed);
        self.stats
            .bytes
            .fetch_sub(old.size() as u64, Ordering::Relaxed);
    }

    fn covers(&self, key: &[u8]) -> bool {
        self.cfg.prefixes.is_empty()
            || self
                .cfg
                .prefixes
                .iter()
                .any(|p| key.starts_with(p.as_bytes()))
    }

    /// Looks `req` (routed to `ep`) up.
    pub(crate) fn lookup(self: &Arc<Self>, req: &Request, ep: &EndpointHandle) -> Lookup {
        if !req.is_read() || !cacheable(req.cmd, &req.args) {
            return Lookup::Pass;
        }
        let Some(key) = req.args.get(1) else {
            return Lookup::Pass;
        };
        if !self.covers(key) {
            return Lookup::Pass;
        }
        let tracker_id = match self.mode {
            NearCacheMode::Ttl => None,
            _ => match ep.tracker().and_then(|t| t.id()) {
                Some(id) => Some(id),
                // No tracker: nothing is served or kept for this endpoint.
                None => return Lookup::Pass,
            },
        };
        let kh = key_hash(key);
        let slot = slot_of(kh);
        let hash = entry_hash(kh, req.cmd, req.flavor, ep, &req.args[2..]);
        let rest = &req.args[1..];
        let now = Instant::now();
        let mut was_cached = false;
        {
            let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = e.map.get(&hash) {
                if entry.same(req.cmd, req.flavor, ep, rest) {
                    if entry.serves(self.cfg.max_age, now) {
                        bump(&self.stats.hits);
                        if let Some(hot) = &self.hot {
                            hot.hit(key);
                        }
                        return Lookup::Hit(entry.reply.clone());
                    }
                    if let Some(old) = e.map.remove(&hash) {
                        self.forget(&mut e, &old);
                    }
                    was_cached = true;
                }
            }
            bump(&self.stats.misses);
            if self.cfg.admit == NearCacheAdmit::All && !was_cached && !e.seen_before(hash) {
                bump(&self.stats.not_admitted);
                return Lookup::Pass;
            }
        }
        if let Some(hot) = &self.hot {
            if self.cfg.admit == NearCacheAdmit::Hot && !hot.admits(key, now) {
                bump(&self.stats.not_admitted);
                return Lookup::Pass;
            }
        }
        Lookup::Fill(Box::new(Fill {
            cache: self.clone(),
            hash,
            cmd: req.cmd,
            flavor: req.flavor,
            args: packed(rest),
            ep: ep.clone(),
            valid: Valid::now(slot, ep),
            tracker: match self.mode {
                NearCacheMode::Tracked => tracker_id,
                _ => None,
            },
            track: None,
        }))
    }

    fn insert(&self, fill: Fill, reply: &Bytes) {
        let tracked_ok = match (&fill.tracker, &fill.track) {
            (None, _) => true,
            (Some(id), Some((state, want, connects))) => {
                state.load(Ordering::Acquire) == *want
                    && tracking_state(*id, connects.load(Ordering::Acquire)) == *want
            }
            (Some(_), None) => false,
        };
        if is_error(reply) {
            return;
        }
        if reply.len() as u64 > self.cfg.max_entry_bytes {
            bump(&self.stats.too_large);
            return;
        }
        if !tracked_ok || Valid::now(fill.valid.slot as usize, &fill.ep) != fill.valid {
            bump(&self.stats.fills_dropped);
            return;
        }
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        e.seq += 1;
        let entry = Entry {
            seq: e.seq,
            cmd: fill.cmd,
            flavor: fill.flavor,
            args: fill.args,
            // Its own allocation: a slice of the connection's read buffer would keep the
            // whole buffer alive.
            reply: Bytes::copy_from_slice(reply),
            ep: fill.ep.clone(),
            valid: fill.valid,
            born: Instant::now(),
        };
        let size = entry.size();
        let seq = entry.seq;
        if let Some(old) = e.map.insert(fill.hash, entry) {
            self.forget(&mut e, &old);
        }
        e.bytes += size;
        e.order.push_back((fill.hash, seq));
        self.stats.entries.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes.fetch_add(size as u64, Ordering::Relaxed);
        bump(&self.stats.fills);
        while e.bytes as u64 > self.cfg.max_bytes {
            let Some((h, seq)) = e.order.pop_front() else {
                break;
            };
            if e.map.get(&h).is_some_and(|x| x.seq == seq) {
                if let Some(old) = e.map.remove(&h) {
                    self.forget(&mut e, &old);
                    bump(&self.stats.evictions);
                }
            }
        }
        // The order queue keeps one item per fill; entries replaced or removed leave stale
        // items, dropped here when they outnumber the entries.
        if e.order.len() > 2 * e.map.len() + 64 {
            let Entries { map, order, .. } = &mut *e;
            order.retain(|(h, s)| map.get(h).is_some_and(|x| x.seq == *s));
        }
    }
}

impl Drop for ClusterCache {
    fn drop(&mut self) {
        let e = self.entries.get_mut().unwrap_or_else(|e| e.into_inner());
        self.stats
            .entries
            .fetch_sub(e.map.len() as u64, Ordering::Relaxed);
        self.stats
            .bytes
            .fetch_sub(e.bytes as u64, Ordering::Relaxed);
    }
}

impl Fill {
    /// Keeps `reply` when nothing ended the entry since the fill was sent.
    pub(crate) fn done(self, reply: &Bytes) {
        let cache = self.cache.clone();
        cache.insert(self, reply);
    }
}

/// An entry's hash: the key's, the command, the protocol and database, the endpoint (a read
/// sent elsewhere, as a hot key's read that falls back to the key's home shard, is another
/// entry), and the other arguments.
fn entry_hash(
    key_hash: u64,
    cmd: &CommandInfo,
    flavor: Flavor,
    ep: &EndpointHandle,
    rest: &[Bytes],
) -> u64 {
    let mut h = key_hash
        ^ (cmd as *const CommandInfo as u64).rotate_left(17)
        ^ (flavor.index() as u64).rotate_left(41)
        ^ ep.id().rotate_left(29);
    for a in rest {
        h = xxhash_rust::xxh3::xxh3_64_with_seed(a, h);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_doorkeeper_admits_a_second_read_and_forgets_at_half_full() {
        let mut e = Entries::default();
        let h = 0x1234_5678_9abc_def0;
        assert!(!e.seen_before(h), "first read");
        assert!(e.seen_before(h), "second read");
        // Set an eighth of the bits with other reads: the window starts over.
        let mut other = 0u64;
        while e.seen_set != 0 {
            other += 1;
            e.seen_before(other << 20);
        }
        assert!(!e.seen_before(h), "forgotten with the window");
    }
}
