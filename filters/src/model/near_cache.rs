//! A cluster's near cache settings (the cache itself: the sidecar's `cache::near_cache`).

use std::time::Duration;

/// A per-worker cache of a cluster's read replies (see `src/cache/near_cache/mod.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NearCache {
    /// How entries learn that their key changed.
    pub mode: NearCacheMode,
    /// Keys it applies to, by prefix of the key as forwarded (after a route's
    /// `remove_prefix`), case-sensitive; empty: every key.
    pub prefixes: Vec<String>,
    /// Which keys are cached.
    pub admit: NearCacheAdmit,
    /// Bytes of entries one worker may hold (keys, replies and a fixed overhead per entry;
    /// default 64 MiB).
    pub max_bytes: u64,
    /// Largest reply cached (default 64 KiB); larger ones are served but not kept.
    pub max_entry_bytes: u64,
    /// How long an entry may be served after it was filled, whatever the mode (default
    /// [`NearCacheMode::default_max_age`]: 60 s with a tracker, 10 s in `ttl` mode, where it
    /// is the only way an entry ends besides writes through this sidecar).
    pub max_age: Duration,
    /// `admit: hot`: the estimated reads per second above which a key is admitted (it leaves
    /// below half of it); 0 (the default): automatic, a key's share of the worker's reads
    /// decides whatever the rate (see the sidecar's `HotSet`).
    pub hot_reads_per_sec: u64,
}

impl Default for NearCache {
    fn default() -> Self {
        NearCache {
            mode: NearCacheMode::Tracked,
            prefixes: Vec::new(),
            admit: NearCacheAdmit::All,
            max_bytes: 64 << 20,
            max_entry_bytes: 64 << 10,
            max_age: NearCacheMode::Tracked.default_max_age(),
            hot_reads_per_sec: 0,
        }
    }
}

/// How a near cache's entries are invalidated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NearCacheMode {
    /// Redis's server-assisted tracking (`CLIENT TRACKING ... OPTIN`), per endpoint: a
    /// write by any client invalidates the entries of its keys (default).
    Tracked,
    /// Broadcast tracking of the cache's prefixes (`CLIENT TRACKING ... BCAST PREFIX ...`):
    /// no server memory per key read, an invalidation for every write under the prefixes.
    Bcast,
    /// Time only (`max_age`), for servers without tracking; writes through this sidecar
    /// still invalidate.
    Ttl,
}

impl NearCacheMode {
    /// `max_age` when none is given. With a tracker (`tracked`, `bcast`) Redis ends an
    /// entry whose key changes, and `max_age` is only the backstop: 60 s, so that a key of
    /// the tail a worker reads every 20-30 s is still served from its entry. In `ttl` mode
    /// it is the staleness bound: 10 s.
    pub fn default_max_age(self) -> Duration {
        match self {
            NearCacheMode::Tracked | NearCacheMode::Bcast => Duration::from_secs(60),
            NearCacheMode::Ttl => Duration::from_secs(10),
        }
    }
}

/// Which keys of a near cache's prefixes are cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NearCacheAdmit {
    /// Every key (default).
    All,
    /// Keys the hot-key detector finds hot (see [`NearCache::hot_reads_per_sec`]).
    Hot,
}
