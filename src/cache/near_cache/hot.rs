//! `admit: hot`: the keys a worker reads often enough (see the module above).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{CacheStats, Prehashed};

/// `admit: hot`: the keys one worker reads often enough, with hysteresis. Reads of the
/// cache's keys are counted per window in a count-min sketch; a key whose count in the
/// current window reaches `enter` is admitted, and one admitted key whose count in a finished
/// window stays below half of it leaves.
///
/// - A rate (`hot_reads_per_sec`): one-second windows, 4 rows of 4,096 counters, `enter` the
///   rate's share of this worker.
/// - Automatic (the default, no rate): the window is a number of reads, not a time
///   ([`AUTO_READS`], or [`AUTO_MAX`] at most), so it adapts to the read rate: a key read twice
///   among this worker's last ~65,000 reads is admitted (its share of reads, not its rate,
///   decides: at 1,000 or 50,000 reads a second alike), and one not read in a whole window
///   leaves; 4 rows of 65,536 counters (1 MiB per worker). The byte budget bounds the entries.
#[derive(Debug)]
pub(crate) struct HotSet {
    /// 0: automatic.
    enter: u32,
    width: usize,
    inner: Mutex<HotInner>,
    stats: Arc<CacheStats>,
}

#[derive(Debug)]
struct HotInner {
    sketch: Box<[u32]>,
    window: Instant,
    /// Reads counted in the current window.
    reads: u32,
    /// Admitted keys and their reads in the current window.
    /// By the key's hash (computed once per read by the cache): the key, and its reads in
    /// the current window.
    admitted: HashMap<u64, (Bytes, u32), BuildHasherDefault<Prehashed>>,
}

const HOT_WIDTH: usize = 4096;
pub(super) const HOT_WINDOW: Duration = Duration::from_secs(1);
/// Automatic admission: a window's reads, its longest time, and the sketch's width.
pub(super) const AUTO_READS: u32 = 65_536;
pub(super) const AUTO_MAX: Duration = Duration::from_secs(60);
const AUTO_WIDTH: usize = 65_536;

impl HotSet {
    /// Admits keys read `reads_per_sec` times a second by the whole sidecar, of which this
    /// worker sees one in `workers`; 0: automatic (see above).
    pub(crate) fn new(reads_per_sec: u64, workers: usize, stats: Arc<CacheStats>) -> HotSet {
        let (enter, width) = match reads_per_sec {
            0 => (0, AUTO_WIDTH),
            r => (
                (r / workers.max(1) as u64).clamp(1, u64::from(u32::MAX)) as u32,
                HOT_WIDTH,
            ),
        };
        HotSet {
            enter,
            width,
            stats,
            inner: Mutex::new(HotInner {
                sketch: vec![0; 4 * width].into_boxed_slice(),
                window: Instant::now(),
                reads: 0,
                admitted: HashMap::default(),
            }),
        }
    }

    /// Whether the current window ended by `now`, and the counts to enter and to stay.
    fn window(&self, h: &HotInner, now: Instant) -> (bool, u32, u32) {
        match self.enter {
            0 => (
                h.reads >= AUTO_READS || now.duration_since(h.window) >= AUTO_MAX,
                2,
                1,
            ),
            e => (now.duration_since(h.window) >= HOT_WINDOW, e, e.div_ceil(2)),
        }
    }

    /// Counts one read of `key` (whose `key_hash` is `kh`); true when the key is admitted.
    pub(crate) fn admits(&self, key: &[u8], kh: u64, now: Instant) -> bool {
        let mut h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (ended, enter, leave) = self.window(&h, now);
        h.reads = h.reads.saturating_add(1);
        if ended {
            h.reads = 0;
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
            let i = row * self.width + ((kh >> (row * 16)) as usize & (self.width - 1));
            h.sketch[i] = h.sketch[i].saturating_add(1);
            est = est.min(h.sketch[i]);
        }
        if est >= enter && h.admitted.len() < 65_536 {
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
        h.reads = h.reads.saturating_add(1);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_admission_counts_reads_not_seconds() {
        let h = HotSet::new(0, 2, Arc::default());
        let now = Instant::now();
        assert!(!h.admits(b"a", 1, now), "a first read");
        assert!(h.admits(b"a", 1, now), "a second read in the window admits");
        // A window ends after AUTO_READS reads, whatever the time: a key not read in it
        // leaves; one read stays.
        let mut t = now;
        for i in 0..u64::from(AUTO_READS) {
            t += Duration::from_micros(1);
            h.admits(b"x", (i + 2).wrapping_mul(0x9e37_79b9_7f4a_7c15), t);
            if i == 10 {
                h.hit(1);
            }
        }
        assert!(
            h.keys().contains(&Bytes::from_static(b"a")),
            "read in the window"
        );
        for i in 0..u64::from(AUTO_READS) + 1 {
            h.admits(b"y", (i + 2).wrapping_mul(0xc2b2_ae3d_27d4_eb4f), t);
        }
        assert!(
            !h.keys().contains(&Bytes::from_static(b"a")),
            "not read in a window"
        );
        // A rate: one-second windows, its share of each worker.
        let r = HotSet::new(1000, 2, Arc::default());
        for _ in 0..499 {
            assert!(!r.admits(b"k", 7, now));
        }
        assert!(
            r.admits(b"k", 7, now),
            "500 reads in a second on one of 2 workers"
        );
    }
}
