//! `admit: hot`: the keys a worker reads often enough (see the module above).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{CacheStats, Prehashed};

/// `admit: hot`: the keys one worker reads often enough, with hysteresis. Reads of the
/// cache's keys are counted per one-second window in a count-min sketch (4 rows of 4,096); a
/// key whose count in the current window reaches `enter` is admitted, and one admitted key
/// whose count in a finished window stays below half of it leaves.
#[derive(Debug)]
pub(crate) struct HotSet {
    enter: u32,
    inner: Mutex<HotInner>,
    stats: Arc<CacheStats>,
}

#[derive(Debug)]
struct HotInner {
    sketch: Box<[u32]>,
    window: Instant,
    /// Admitted keys and their reads in the current window.
    /// By the key's hash (computed once per read by the cache): the key, and its reads in
    /// the current window.
    admitted: HashMap<u64, (Bytes, u32), BuildHasherDefault<Prehashed>>,
}

const HOT_WIDTH: usize = 4096;
pub(super) const HOT_WINDOW: Duration = Duration::from_secs(1);

impl HotSet {
    /// Admits keys read `reads_per_sec` times a second by the whole sidecar, of which this
    /// worker sees one in `workers`.
    pub(crate) fn new(reads_per_sec: u64, workers: usize, stats: Arc<CacheStats>) -> HotSet {
        let enter = (reads_per_sec / workers.max(1) as u64).clamp(1, u64::from(u32::MAX)) as u32;
        HotSet {
            enter,
            stats,
            inner: Mutex::new(HotInner {
                sketch: vec![0; 4 * HOT_WIDTH].into_boxed_slice(),
                window: Instant::now(),
                admitted: HashMap::default(),
            }),
        }
    }

    /// Counts one read of `key` (whose `key_hash` is `kh`); true when the key is admitted.
    pub(crate) fn admits(&self, key: &[u8], kh: u64, now: Instant) -> bool {
        let mut h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if now.duration_since(h.window) >= HOT_WINDOW {
            let leave = self.enter.div_ceil(2);
            h.admitted.retain(|_, (_, n)| {
                let keep = *n >= leave;
                *n = 0;
                keep
            });
            h.sketch.fill(0);
            h.window = now;
            self.stats
                .hot_keys
                .store(h.admitted.len() as u64, Ordering::Relaxed);
        }
        if let Some((k, n)) = h.admitted.get_mut(&kh) {
            if k.as_ref() == key {
                *n = n.saturating_add(1);
                return true;
            }
        }
        let mut est = u32::MAX;
        for row in 0..4 {
            let i = row * HOT_WIDTH + ((kh >> (row * 16)) as usize & (HOT_WIDTH - 1));
            h.sketch[i] = h.sketch[i].saturating_add(1);
            est = est.min(h.sketch[i]);
        }
        if est >= self.enter && h.admitted.len() < 65_536 {
            h.admitted.insert(kh, (Bytes::copy_from_slice(key), est));
            self.stats
                .hot_keys
                .store(h.admitted.len() as u64, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Counts a read of an admitted key (hash `kh`) served from the cache.
    pub(crate) fn hit(&self, kh: u64) {
        let mut h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, n)) = h.admitted.get_mut(&kh) {
            *n = n.saturating_add(1);
        }
    }

    /// The admitted keys.
    pub(crate) fn keys(&self) -> Vec<Bytes> {
        let h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        h.admitted.values().map(|(k, _)| k.clone()).collect()
    }
}

/// What the registry reads of a worker's hot set.
impl crate::stats::HotKeysSource for HotSet {
    fn keys(&self) -> Vec<Bytes> {
        HotSet::keys(self)
    }
}
