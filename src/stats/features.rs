//! What features count and show, defined here so that the stats floor imports no feature:
//! the near cache's counters, the hot-key copy passes' progress, a Sentinel master's status,
//! an announced sidecar's status (cluster emulation), and the sources the registry asks
//! (hot-key sets, copy passes).

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

/// A worker's counters of one cluster's cache (kept across configuration pushes).
#[derive(Debug, Default)]
pub(crate) struct CacheStats {
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    /// Fills kept.
    pub(crate) fills: AtomicU64,
    /// Fills not kept: an invalidation (or a lost connection or tracker) came first, or the
    /// tracking commands failed.
    pub(crate) fills_dropped: AtomicU64,
    /// Replies too large to keep.
    pub(crate) too_large: AtomicU64,
    /// Keys named by invalidations the trackers received.
    pub(crate) invalidations: AtomicU64,
    /// Times every entry of an endpoint ended at once: its tracker was lost or came back, or
    /// Redis sent a flush.
    pub(crate) flushes: AtomicU64,
    /// Entries evicted to stay within `max_bytes`.
    pub(crate) evictions: AtomicU64,
    /// Entries and bytes held now.
    pub(crate) entries: AtomicU64,
    pub(crate) bytes: AtomicU64,
    /// Trackers connected now, and configured.
    pub(crate) trackers_up: AtomicU64,
    /// Reads not cached: the first of a key in the doorkeeper's window (`admit: all`), or of
    /// a key that is not hot (`admit: hot`).
    pub(crate) not_admitted: AtomicU64,
    /// Keys admitted as hot now (`admit: hot`).
    pub(crate) hot_keys: AtomicU64,
}

/// [`CacheStats`] summed over workers.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CacheTotals {
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) fills: u64,
    pub(crate) fills_dropped: u64,
    pub(crate) too_large: u64,
    pub(crate) invalidations: u64,
    pub(crate) flushes: u64,
    pub(crate) evictions: u64,
    pub(crate) entries: u64,
    pub(crate) bytes: u64,
    pub(crate) trackers_up: u64,
    pub(crate) not_admitted: u64,
    pub(crate) hot_keys: u64,
}

impl CacheTotals {
    pub(crate) fn add(&mut self, s: &CacheStats) {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        self.hits += r(&s.hits);
        self.misses += r(&s.misses);
        self.fills += r(&s.fills);
        self.fills_dropped += r(&s.fills_dropped);
        self.too_large += r(&s.too_large);
        self.invalidations += r(&s.invalidations);
        self.flushes += r(&s.flushes);
        self.evictions += r(&s.evictions);
        self.entries += r(&s.entries);
        self.bytes += r(&s.bytes);
        self.trackers_up += r(&s.trackers_up);
        self.not_admitted += r(&s.not_admitted);
        self.hot_keys += r(&s.hot_keys);
    }

    /// Every counter by the name `INFO nearcache` and the metrics give it (the metric is
    /// `respway_near_cache_<name>`, with `_total` for counters), and whether it is a gauge.
    pub(crate) fn fields(&self) -> [(&'static str, u64, bool); 13] {
        [
            ("hits", self.hits, false),
            ("misses", self.misses, false),
            ("fills", self.fills, false),
            ("fills_dropped", self.fills_dropped, false),
            ("too_large", self.too_large, false),
            ("invalidations", self.invalidations, false),
            ("flushes", self.flushes, false),
            ("evictions", self.evictions, false),
            ("not_admitted", self.not_admitted, false),
            ("entries", self.entries, true),
            ("bytes", self.bytes, true),
            ("trackers_up", self.trackers_up, true),
            ("hot_keys", self.hot_keys, true),
        ]
    }
}

/// Where the copy pass of a hot-key rule is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyState {
    /// Running (reads stay on the home shards).
    Copying,
    /// Finished: reads spread.
    Done,
    /// The last attempt failed; it is retried (reads stay on the home shards).
    Failed,
}

impl CopyState {
    pub(crate) fn name(self) -> &'static str {
        match self {
            CopyState::Copying => "copying",
            CopyState::Done => "done",
            CopyState::Failed => "failed",
        }
    }
}

/// What `INFO hotkeys` and the metrics show of a rule's pass.
#[derive(Debug, Clone)]
pub(crate) struct CopyProgress {
    pub(crate) state: CopyState,
    pub(crate) keys: u64,
    pub(crate) error: String,
}

/// How a master's Sentinels are doing, for `/clusters` and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SentinelStatus {
    /// Sentinels that answered the last round, of how many.
    pub(crate) answering: usize,
    pub(crate) sentinels: usize,
    /// Times the primary changed after the first was found.
    pub(crate) primary_changes: u64,
    /// The `config-epoch` of the last answer that won.
    pub(crate) epoch: u64,
    /// Failovers during which the shard's writes were held, and the writes held.
    pub(crate) holds: u64,
    pub(crate) held_writes: u64,
}

/// An address announced by a listener's cluster emulation, as its checks found it, for
/// `/clusters` and `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PeerStatus {
    /// In the emulated cluster's map (a sidecar not checked stays in).
    pub(crate) up: bool,
    /// Checked by this process (a listener's own address is not).
    pub(crate) checked: bool,
    /// Times it went out of the map or came back.
    pub(crate) changes: u64,
    /// The last failed check's reason (empty: none yet).
    pub(crate) last_error: String,
    /// When it last went out or came back.
    pub(crate) since: Option<std::time::SystemTime>,
}

/// The keys a worker's near cache admits as hot now (`admit: hot`).
pub(crate) trait HotKeysSource: Send + Sync + std::fmt::Debug {
    fn keys(&self) -> Vec<Bytes>;
}

/// The copy passes of hot-key rules, as `INFO hotkeys` and the metrics read them.
pub(crate) trait CopySource: Send + Sync + std::fmt::Debug {
    /// The pass of the rule `prefix` of cluster `cluster`, if it has one.
    fn progress(&self, cluster: &str, prefix: &str) -> Option<CopyProgress>;
    /// Every rule's pass: (cluster, prefix, progress), sorted.
    fn all(&self) -> Vec<(String, String, CopyProgress)>;
}
