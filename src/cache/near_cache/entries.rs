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
    /// When its key expires (its TTL counted from before the read was sent), if it has one.
    expires: Option<Instant>,
}

impl Entry {
    fn size(&self) -> usize {
        self.args.len() + self.reply.len() + ENTRY_OVERHEAD
    }

    fn same(&self, cmd: &CommandInfo, flavor: Flavor, ep: &EndpointHandle, args: &[Bytes]) -> bool {
        std::ptr::eq(self.cmd, cmd)
            && self.flavor.index() == flavor.index()
            && self.ep.same(ep)
            && same_args(&self.args, args)
    }

    fn serves(&self, max_age: Duration, now: Instant) -> bool {
        STAMPS[self.valid.slot as usize].load(Ordering::Acquire) == self.valid.stamp
            && FLUSHES.load(Ordering::Acquire) == self.valid.flush
            && self.ep.cache_epoch() == self.valid.epoch
            && now.duration_since(self.born) < max_age
            && self.expires.is_none_or(|e| now < e)
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
pub(super) struct Prehashed(u64);

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
    /// `admit: all`'s doorkeeper: two bits per entry hash, set by a read that found no entry;
    /// a read is filled only when its bit was set already (the second read in the window),
    /// so a key read once (a scan, a one-off) costs a bit, not an entry. Cleared when an
    /// eighth of the bits are set (so at most one first read in eight is taken for a second). Allocated on first use.
    seen: Vec<u64>,
    seen_set: usize,
}

/// Bits of the doorkeeper (32 KiB per worker and cluster: it stays in the core's cache).
const SEEN_BITS: usize = 1 << 18;

impl Entries {
    /// True when an entry of `hash` was asked for before in the doorkeeper's window; marks it
    /// asked for.
    fn seen_before(&mut self, hash: u64) -> bool {
        if self.seen.is_empty() {
            self.seen = vec![0; SEEN_BITS / 64];
        }
        // Two bits per read (a Bloom filter with k = 2): with an eighth of the bits set, a
        // read never seen passes for a second read about one time in 64, not one in 8.
        let mut seen = true;
        for shift in [20, 40] {
            let bit = (hash >> shift) as usize & (SEEN_BITS - 1);
            let (word, mask) = (bit / 64, 1u64 << (bit % 64));
            if self.seen[word] & mask == 0 {
                seen = false;
                self.seen[word] |= mask;
                self.seen_set += 1;
            }
        }
        if self.seen_set >= SEEN_BITS / 8 {
            self.seen.fill(0);
            self.seen_set = 0;
        }
        seen
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

/// A read sent to fill entries: one, or one per key of an `MGET` (each kept as its key's
/// `GET` entry: an `MGET` element is encoded as `GET`'s reply is).
#[derive(Debug)]
pub(crate) struct Fill {
    cache: Arc<ClusterCache>,
    /// The entries' command (`GET` for an `MGET`).
    cmd: &'static CommandInfo,
    flavor: Flavor,
    ep: EndpointHandle,
    items: Vec<Item>,
    /// The reply is an `MGET`'s array: item `i` is its element `Item::at`.
    mget: bool,
    /// `tracked` mode: the id of the endpoint's tracker, which the connection the read goes
    /// on must redirect its invalidations to.
    pub(crate) tracker: Option<u64>,
    /// Set by the upstream for `tracked` mode: the tracking state of the connection the read
    /// went on, and the value it must still hold (and the endpoint's connects must still
    /// give) for the reply to be kept (see [`tracking_state`]).
    pub(crate) track: Option<(Arc<AtomicU64>, u64)>,
    /// Set by the upstream when the read went with `CLIENT TRACKING on REDIRECT` itself
    /// (not only `CLIENT CACHING yes`): followed whatever connection wrote it.
    pub(crate) redirected: bool,
    /// The keys of a tracking client's read: announced to the clients that follow them
    /// unless the read was followed by Redis (see [`super::clients`]).
    pub(crate) client: Option<Box<[Bytes]>>,
    /// Each item's key's TTL, learnt with `PTTL` right after the read on its connection
    /// (milliseconds, negative: none), and when the read was sent; `None` until they come
    /// (an entry whose key's TTL is not known is not kept).
    ttls: Option<(Instant, Vec<i64>)>,
}

/// One entry a fill may keep.
#[derive(Debug)]
struct Item {
    hash: u64,
    /// The entry's arguments after the command name, packed.
    args: Box<[u8]>,
    valid: Valid,
    /// For an `MGET`: the element of the reply.
    at: usize,
}

/// What a connection's tracking state holds once `CLIENT TRACKING on REDIRECT tracker` was
/// sent on it after the endpoint's `connects`-th connection opened: a fill goes without it only
/// while the state holds this value, and is kept only if it still does when its reply comes
/// (a tracking command that failed and cleared it drops the fill; so does a reconnect in
/// between, unless the fill carried the redirect itself).
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

    /// The endpoint's tracker id when the mode has one (`Err`: it has none now, so nothing
    /// is served or kept for the endpoint).
    fn tracker(&self, ep: &EndpointHandle) -> Result<Option<u64>, ()> {
        match self.mode {
            NearCacheMode::Ttl => Ok(None),
            _ => tracker_of(ep).and_then(|t| t.id()).map(Some).ok_or(()),
        }
    }

    /// Looks `req` (routed to `ep`) up.
    pub(crate) fn lookup(self: &Arc<Self>, req: &Request, ep: &EndpointHandle) -> Lookup {
        // Writes leave at the first test (a flag).
        if !req.is_read() {
            return Lookup::Pass;
        }
        if req.cmd.name == "mget" {
            return self.lookup_mget(req, ep);
        }
        if !cacheable(req.cmd, &req.args) {
            return Lookup::Pass;
        }
        let Some(key) = req.args.get(1) else {
            return Lookup::Pass;
        };
        if !self.covers(key) {
            return Lookup::Pass;
        }
        let Ok(tracker_id) = self.tracker(ep) else {
            return Lookup::Pass;
        };
        let kh = key_hash(key);
        let slot = slot_of(kh);
        let hash = entry_hash(kh, req.cmd, req.flavor, ep, &req.args[2..]);
        let rest = &req.args[1..];
        // The clock is read only when an entry is found or a key is counted: a miss of
        // `admit: all` reads none.
        {
            let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            // `admit: all`: the doorkeeper first. A read its window has not seen (a scan, a
            // one-off, or a cached key's first read since the bits were cleared, which is
            // then answered by the shard) costs a bit of a small bitmap, not a probe of a map
            // the size of the byte budget.
            if self.cfg.admit == NearCacheAdmit::All && !e.seen_before(hash) {
                bump(&self.stats.misses);
                bump(&self.stats.not_admitted);
                return Lookup::Pass;
            }
            if let Some(entry) = e.map.get(&hash) {
                if entry.same(req.cmd, req.flavor, ep, rest) {
                    if entry.serves(self.cfg.max_age, Instant::now()) {
                        bump(&self.stats.hits);
                        if let Some(hot) = &self.hot {
                            hot.hit(kh);
                        }
                        return Lookup::Hit(entry.reply.clone());
                    }
                    if let Some(old) = e.map.remove(&hash) {
                        self.forget(&mut e, &old);
                    }
                }
            }
            bump(&self.stats.misses);
        }
        if let Some(hot) = &self.hot {
            if self.cfg.admit == NearCacheAdmit::Hot && !hot.admits(key, kh, Instant::now()) {
                bump(&self.stats.not_admitted);
                return Lookup::Pass;
            }
        }
        let item = Item {
            hash,
            args: packed(rest),
            valid: Valid::now(slot, ep),
            at: 0,
        };
        self.fill(req.cmd, req, ep, tracker_id, vec![item], false)
    }

    fn fill(
        self: &Arc<Self>,
        cmd: &'static CommandInfo,
        req: &Request,
        ep: &EndpointHandle,
        tracker_id: Option<u64>,
        items: Vec<Item>,
        mget: bool,
    ) -> Lookup {
        Lookup::Fill(Box::new(Fill {
            cache: self.clone(),
            cmd,
            flavor: req.flavor,
            ep: ep.clone(),
            items,
            mget,
            tracker: match self.mode {
                NearCacheMode::Tracked => tracker_id,
                _ => None,
            },
            track: None,
            redirected: false,
            client: None,
            ttls: None,
        }))
    }

    /// A tracking client's read (`req`, to `ep`) after the cache's own lookup (`fill`, if
    /// it fills): with what has Redis follow its keys (`tracked`: `CLIENT CACHING yes`, in a
    /// fill that keeps nothing when the cache did not want the reply; `bcast`: the tracker's
    /// prefixes cover them), or with its keys announced after the reply when nothing can.
    pub(crate) fn follow_for_client(
        self: &Arc<Self>,
        req: &Request,
        ep: &EndpointHandle,
        fill: Option<Box<Fill>>,
    ) -> Option<Box<Fill>> {
        let keys = || req.keys.iter().filter_map(|i| req.args.get(i)).cloned();
        match (self.mode, self.tracker(ep)) {
            (NearCacheMode::Tracked, Ok(Some(id))) => {
                let mut f = fill.unwrap_or_else(|| {
                    Box::new(Fill {
                        cache: self.clone(),
                        cmd: req.cmd,
                        flavor: req.flavor,
                        ep: ep.clone(),
                        items: Vec::new(),
                        mget: false,
                        tracker: Some(id),
                        track: None,
                        redirected: false,
                        client: None,
                        ttls: None,
                    })
                });
                f.client = Some(keys().collect());
                Some(f)
            }
            (NearCacheMode::Bcast, Ok(_)) if keys().all(|k| self.covers(&k)) => fill,
            _ => {
                super::clients::unfollowed(keys());
                fill
            }
        }
    }

    /// True when a hit is a reply Redis follows (its entry lives only while Redis would
    /// announce a change): not in `ttl` mode.
    pub(crate) fn hits_are_followed(&self) -> bool {
        self.mode != NearCacheMode::Ttl
    }

    /// `MGET`: served when every key's `GET` entry serves; otherwise sent whole, and its
    /// elements kept as the `GET` entries of the keys admitted.
    fn lookup_mget(self: &Arc<Self>, req: &Request, ep: &EndpointHandle) -> Lookup {
        let keys = &req.args[1..];
        if keys.is_empty() || !keys.iter().all(|k| self.covers(k)) {
            return Lookup::Pass;
        }
        let Ok(tracker_id) = self.tracker(ep) else {
            return Lookup::Pass;
        };
        let get = get_command();
        let now = Instant::now();
        let mut replies: Vec<Bytes> = Vec::with_capacity(keys.len());
        let mut items = Vec::new();
        let mut missing = Vec::new();
        {
            let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            for (at, key) in keys.iter().enumerate() {
                let kh = key_hash(key);
                let hash = entry_hash(kh, get, req.flavor, ep, &[]);
                let one = std::slice::from_ref(key);
                // The doorkeeper first (see `lookup`).
                if self.cfg.admit == NearCacheAdmit::All && !e.seen_before(hash) {
                    continue;
                }
                if let Some(entry) = e.map.get(&hash) {
                    if entry.same(get, req.flavor, ep, one) {
                        if entry.serves(self.cfg.max_age, now) {
                            replies.push(entry.reply.clone());
                            continue;
                        }
                        if let Some(old) = e.map.remove(&hash) {
                            self.forget(&mut e, &old);
                        }
                    }
                }
                missing.push((at, kh, hash));
            }
        }
        if replies.len() == keys.len() {
            self.stats
                .hits
                .fetch_add(keys.len() as u64, Ordering::Relaxed);
            let mut out =
                BytesMut::with_capacity(16 + replies.iter().map(Bytes::len).sum::<usize>());
            out.extend_from_slice(format!("*{}\r\n", keys.len()).as_bytes());
            for r in &replies {
                out.extend_from_slice(r);
            }
            return Lookup::Hit(out.freeze());
        }
        self.stats
            .misses
            .fetch_add((keys.len() - replies.len()) as u64, Ordering::Relaxed);
        for (at, kh, hash) in missing {
            let key = &keys[at];
            if let Some(hot) = &self.hot {
                if self.cfg.admit == NearCacheAdmit::Hot && !hot.admits(key, kh, now) {
                    continue;
                }
            }
            items.push(Item {
                hash,
                args: packed(std::slice::from_ref(key)),
                valid: Valid::now(slot_of(kh), ep),
                at,
            });
        }
        if items.is_empty() {
            bump(&self.stats.not_admitted);
            return Lookup::Pass;
        }
        self.fill(get, req, ep, tracker_id, items, true)
    }

    fn insert(&self, fill: Fill, reply: &Bytes) {
        let tracked_ok = match (&fill.tracker, &fill.track) {
            (None, _) => true,
            (Some(id), Some((state, want))) => {
                state.load(Ordering::Acquire) == *want
                    && (fill.redirected || tracking_state(*id, fill.ep.connects()) == *want)
            }
            (Some(_), None) => false,
        };
        if is_error(reply) {
            return;
        }
        if !tracked_ok {
            if let Some(keys) = &fill.client {
                super::clients::unfollowed(keys.iter().cloned());
            }
            if !fill.items.is_empty() {
                bump(&self.stats.fills_dropped);
            }
            return;
        }
        if fill.items.is_empty() {
            return;
        }
        let elements = match fill.mget {
            false => vec![reply.clone()],
            true => match mget_elements(reply, fill.items.len()) {
                Some(el) => el,
                None => return,
            },
        };
        // The keys' TTLs: an entry ends no later than its key (none kept without them).
        let Some((sent, ttls)) = fill.ttls.filter(|t| t.1.len() == fill.items.len()) else {
            bump(&self.stats.fills_dropped);
            return;
        };
        let Fill {
            cmd,
            flavor,
            ep,
            items,
            mget,
            ..
        } = fill;
        let mut e = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        for (item, ttl) in items.into_iter().zip(ttls) {
            let Some(reply) = elements.get(if mget { item.at } else { 0 }) else {
                continue;
            };
            // `-1`: no TTL, and `-2` after a nil read: no key (max_age bounds the entry);
            // `-2` after a value: the key expired between the read and its PTTL, so the value
            // read is already gone: nothing is kept.
            let expires = match u64::try_from(ttl) {
                Ok(ms) => Some(sent + Duration::from_millis(ms)),
                Err(_) if ttl == -1 || is_nil(reply) => None,
                Err(_) => {
                    bump(&self.stats.fills_dropped);
                    continue;
                }
            };
            if reply.len() as u64 > self.cfg.max_entry_bytes {
                bump(&self.stats.too_large);
                continue;
            }
            if Valid::now(item.valid.slot as usize, &ep) != item.valid {
                bump(&self.stats.fills_dropped);
                continue;
            }
            e.seq += 1;
            let entry = Entry {
                seq: e.seq,
                cmd,
                flavor,
                args: item.args,
                // Its own allocation: a slice of the connection's read buffer would keep the
                // whole buffer alive.
                reply: Bytes::copy_from_slice(reply),
                ep: ep.clone(),
                valid: item.valid,
                born: Instant::now(),
                expires,
            };
            let size = entry.size();
            let seq = entry.seq;
            if let Some(old) = e.map.insert(item.hash, entry) {
                self.forget(&mut e, &old);
            }
            e.bytes += size;
            e.order.push_back((item.hash, seq));
            self.stats.entries.fetch_add(1, Ordering::Relaxed);
            self.stats.bytes.fetch_add(size as u64, Ordering::Relaxed);
            bump(&self.stats.fills);
        }
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

/// `GET`'s table entry (an `MGET`'s elements are kept as `GET` entries).
fn get_command() -> &'static CommandInfo {
    static GET: std::sync::OnceLock<&'static CommandInfo> = std::sync::OnceLock::new();
    GET.get_or_init(|| {
        respway_filters::command::lookup(b"get").expect("GET is in the command table")
    })
}

/// The elements of an `MGET` reply (an array of at least `want` bulk strings or nulls), each
/// as its own frame; `None` for any other reply.
fn mget_elements(reply: &Bytes, want: usize) -> Option<Vec<Bytes>> {
    let (n, mut at) = respway_filters::resp::array_header(reply)?;
    if n < want {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len = respway_filters::resp::reply_len(
            &reply[at..],
            &respway_filters::codec_limits::Limits::REPLIES,
        )
        .ok()??;
        let el = reply.slice(at..at + len);
        if !matches!(el.first(), Some(b'$' | b'_')) {
            return None;
        }
        out.push(el);
        at += len;
    }
    Some(out)
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

    /// The read went elsewhere (a replica's read retried on the primary): nothing is kept,
    /// and a tracking client's keys are announced.
    pub(crate) fn abandon(self) {
        if let Some(keys) = self.client {
            super::clients::unfollowed(keys.into_vec().into_iter());
        }
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

/// Whether `reply` is a nil (RESP2 null bulk or array, RESP3 null).
fn is_nil(reply: &[u8]) -> bool {
    matches!(reply, b"$-1\r\n" | b"*-1\r\n" | b"_\r\n")
}

/// The near cache's tracker of `ep` in this worker, when its cluster's cache has one (kept
/// beside the endpoint's pools).
pub(crate) fn tracker_of(ep: &EndpointHandle) -> Option<&super::Tracker> {
    ep.companion()?.downcast_ref::<super::Tracker>()
}

/// A fill rides with its read: in `tracked` mode the connection redirects its invalidations
/// to the tracker (`OPTIN`) from the first fill after it (or the tracker) was opened on,
/// which the connection's slot says; every fill asks for its key to be tracked
/// (`CLIENT CACHING yes`).
impl crate::upstream::Rider for Fill {
    fn wants_slot(&self) -> bool {
        self.tracker.is_some()
    }

    fn before(&mut self, slot: &Arc<AtomicU64>, connects: u64) -> Option<(Bytes, u8)> {
        let id = self.tracker?;
        let want = tracking_state(id, connects);
        self.track = Some((slot.clone(), want));
        Some(if slot.swap(want, Ordering::AcqRel) != want {
            // The redirect goes with the read, in one piece, on whichever connection writes
            // it: the read is followed even if that connection is a new one.
            self.redirected = true;
            (redirect_frame(id), 2)
        } else {
            (Bytes::from_static(CACHING_YES), 1)
        })
    }

    /// `PTTL` of each item's key, right after the read: a key that expires is told apart
    /// from one that does not on the same connection, with no round trip of its own (a
    /// change of its TTL after the read is a write, which ends the entry).
    fn after(&mut self) -> Option<(Bytes, u8)> {
        let n = u8::try_from(self.items.len()).ok().filter(|n| *n > 0)?;
        let mut frame = BytesMut::new();
        for item in &self.items {
            encode_command(&[&b"PTTL"[..], super::first_arg(&item.args)], &mut frame);
        }
        self.ttls = Some((Instant::now(), Vec::with_capacity(n.into())));
        Some((frame.freeze(), n))
    }

    fn after_replies(&mut self, replies: &[u8]) {
        if let Some((_, ttls)) = &mut self.ttls {
            *ttls = super::integers(replies).unwrap_or_default();
        }
    }

    fn done(self: Box<Self>, reply: &Bytes) {
        Fill::done(*self, reply);
    }

    fn abandon(self: Box<Self>) {
        Fill::abandon(*self);
    }
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
