//! Hot-key detection: the hottest keys per cluster over a sliding window, in bounded memory.
//!
//! One `Tracker` per worker and listener. A session offers every key it dispatches; one in
//! `sample` is taken (a relaxed counter of the worker's own; `sample` 0 turns detection
//! off). A taken key is counted in a count-min sketch of its cluster (4 rows of 4,096
//! counters: an estimate exceeds the true count by at most about 0.07% of the window's
//! samples, with high probability) and enters the cluster's top-`TOP` list when its estimate
//! beats the list's smallest. Windows last `WINDOW`; a report adds the current window to
//! the previous one, so it always covers one to two windows. Memory per cluster and worker:
//! 64 KiB of counters and `TOP` keys; per listener and worker, a queue of `BATCH` samples of
//! 64 bytes.
//!
//! The sampled path takes the worker's own mutex (with `try_lock`: a key offered while a
//! report reads the tracker is skipped), never a lock shared across workers.
//!
//! Sampled keys are queued (a copy of up to `INLINE_KEY` bytes and the hash) and counted
//! `BATCH` at a time: a sample comes one in many commands, so its sketch counters are out of
//! the cache by then, and counting them one by one stalls on each miss in turn, while a batch
//! lets the misses overlap. A report counts what is queued first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Keys kept per cluster and worker.
pub(crate) const TOP: usize = 32;
/// Length of a window.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
const DEPTH: usize = 4;
const WIDTH: usize = 4096;
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;
/// Sampled keys counted together.
const BATCH: usize = 32;
/// Keys up to this long are queued; a longer one is counted at once.
const INLINE_KEY: usize = 46;

/// One worker's hot-key tracker for one listener.
#[derive(Debug)]
pub(crate) struct Tracker {
    /// One key in this many is taken (0: none); a configuration push may change it.
    sample: AtomicU64,
    tick: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Per cluster name (a few: a list searched by name is cheaper than hashing it).
    clusters: Vec<(String, Cluster)>,
    /// Sampled keys not counted yet, oldest first.
    queue: Vec<Sample>,
}

/// A sampled key waiting to be counted: its cluster (index in `clusters`), hash and bytes.
#[derive(Debug, Clone, Copy)]
struct Sample {
    cluster: u16,
    len: u8,
    key: [u8; INLINE_KEY],
    hash: u64,
}

impl Inner {
    /// The index of `cluster`'s counts, added when new.
    fn cluster(&mut self, cluster: &str) -> usize {
        match self.clusters.iter().position(|(n, _)| n == cluster) {
            Some(i) => i,
            None => {
                self.clusters.push((cluster.to_string(), Cluster::new()));
                self.clusters.len() - 1
            }
        }
    }

    /// Counts the queued keys at `now`: first every sketch update (independent loads, whose
    /// cache misses overlap), then the top lists in order (which gives what counting them
    /// one by one gives: a list does not change a sketch).
    fn flush(&mut self, now: Instant) {
        if self.queue.is_empty() {
            return;
        }
        let mut est = [0u32; BATCH];
        for c in &mut self.clusters {
            c.1.roll(now);
        }
        for (e, s) in est.iter_mut().zip(&self.queue) {
            *e = self.clusters[usize::from(s.cluster)].1.add(s.hash);
        }
        for (e, s) in est.iter().zip(&self.queue) {
            let key = &s.key[..usize::from(s.len)];
            self.clusters[usize::from(s.cluster)]
                .1
                .offer(key, s.hash, *e);
        }
        self.queue.clear();
    }
}

#[derive(Debug)]
struct Cluster {
    sketch: Vec<u32>,
    top: Vec<Hot>,
    /// The smallest count in `top` once it is full (0 before).
    min: u32,
    previous: Vec<Hot>,
    started: Instant,
}

/// A key in a top list: its bytes (the buffer is reused when the entry is replaced), its
/// estimate, and a hash to compare with before the bytes.
#[derive(Debug, Clone)]
struct Hot {
    key: Vec<u8>,
    count: u32,
    hash: u64,
}

impl Cluster {
    fn new() -> Cluster {
        Cluster {
            sketch: vec![0; DEPTH * WIDTH],
            top: Vec::with_capacity(TOP),
            min: 0,
            previous: Vec::new(),
            started: Instant::now(),
        }
    }

    /// Counts `key`, whose hash is `hash`, at `now`.
    fn count(&mut self, key: &[u8], hash: u64, now: Instant) {
        self.roll(now);
        let est = self.add(hash);
        self.offer(key, hash, est);
    }

    /// Starts a new window when this one is over at `now`.
    fn roll(&mut self, now: Instant) {
        if now.duration_since(self.started) >= WINDOW {
            self.previous = std::mem::take(&mut self.top);
            self.sketch.iter_mut().for_each(|c| *c = 0);
            self.min = 0;
            self.started = now;
        }
    }

    /// Counts the key whose hash is `first` in the sketch; its estimate.
    #[inline]
    fn add(&mut self, first: u64) -> u32 {
        // One hash per key: its 12-bit slices pick the counter of each row (4 × 12 of its 64
        // bits; xxh64's bits are independent enough for a sketch, and one hash instead of
        // four is most of a sampled key's cost).
        let mut est = u32::MAX;
        for row in 0..DEPTH {
            let col = (first >> (row * 12)) as usize % WIDTH;
            let c = &mut self.sketch[row * WIDTH + col];
            *c = c.saturating_add(1);
            est = est.min(*c);
        }
        est
    }

    /// Offers `key` (hash `first`), whose estimate is now `est`, to the top list.
    fn offer(&mut self, key: &[u8], first: u64, est: u32) {
        // A key in the full list has a count of at least `min`, and every counter of its
        // has grown since it was stored, so its estimate now is above `min`: an estimate at
        // or below `min` is a key outside the list that cannot enter it. That is most sampled
        // keys, and they skip the list's scans.
        if self.top.len() == TOP && est <= self.min {
            return;
        }
        if let Some(e) = self
            .top
            .iter_mut()
            .find(|e| e.hash == first && e.key == key)
        {
            let was_min = e.count == self.min;
            e.count = est;
            if was_min {
                self.reset_min();
            }
            return;
        }
        if self.top.len() < TOP {
            self.top.push(Hot {
                key: key.to_vec(),
                count: est,
                hash: first,
            });
            self.reset_min();
            return;
        }
        if let Some(min) = self.top.iter_mut().min_by_key(|e| e.count) {
            // est > min.count (checked above).
            min.key.clear();
            min.key.extend_from_slice(key);
            min.count = est;
            min.hash = first;
        }
        self.reset_min();
    }

    fn reset_min(&mut self) {
        self.min = if self.top.len() == TOP {
            self.top.iter().map(|e| e.count).min().unwrap_or(0)
        } else {
            0
        };
    }
}

/// Keys taken by default: one in this many.
pub const DEFAULT_SAMPLE: u64 = 16;

impl Default for Tracker {
    fn default() -> Self {
        Tracker::new(DEFAULT_SAMPLE)
    }
}

impl Tracker {
    /// A tracker taking one key in `sample` (0: none).
    pub(crate) fn new(sample: u64) -> Tracker {
        Tracker {
            sample: AtomicU64::new(sample),
            tick: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                clusters: Vec::new(),
                queue: Vec::with_capacity(BATCH),
            }),
        }
    }

    /// True when the next offered key is to be counted (call [`record`](Self::record)).
    #[inline]
    pub(crate) fn take(&self) -> bool {
        // One worker writes the tick (see `stats::bump`): a countdown, so no division per
        // command, and the sampling is read only when it ends.
        let t = self.tick.load(Ordering::Relaxed);
        if t > 1 {
            self.tick.store(t - 1, Ordering::Relaxed);
            return false;
        }
        let sample = self.sample.load(Ordering::Relaxed);
        if sample == 0 {
            return false;
        }
        self.tick.store(sample, Ordering::Relaxed);
        true
    }

    /// Takes one key in `sample` from now on (0: none); what was counted stays. (Offered
    /// while it changes, a key may finish the old countdown first.)
    pub(crate) fn set_sample(&self, sample: u64) {
        self.sample.store(sample, Ordering::Relaxed);
        self.tick.store(0, Ordering::Relaxed);
    }

    /// Counts `key` of `cluster` (a sampled one) at `now`.
    pub(crate) fn record(&self, cluster: &str, key: &[u8], now: Instant) {
        let Ok(mut m) = self.inner.try_lock() else {
            return;
        };
        let hash = xxhash_rust::xxh64::xxh64(key, SEED);
        let i = m.cluster(cluster);
        if key.len() > INLINE_KEY || i > usize::from(u16::MAX) {
            // Counted now, after what was queued before it.
            m.flush(now);
            m.clusters[i].1.count(key, hash, now);
            return;
        }
        let mut s = Sample {
            cluster: i as u16,
            len: key.len() as u8,
            key: [0; INLINE_KEY],
            hash,
        };
        s.key[..key.len()].copy_from_slice(key);
        m.queue.push(s);
        if m.queue.len() == BATCH {
            m.flush(now);
        }
    }

    /// Adds this worker's estimates (current + previous window, scaled by the sampling) into
    /// `into`: cluster → key → requests.
    pub(crate) fn add_into(&self, into: &mut HashMap<String, HashMap<Bytes, u64>>) {
        // Scaled by the sampling now (a push that changed it scales older counts by the new
        // rate until their windows pass).
        let sample = self.sample.load(Ordering::Relaxed);
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        m.flush(Instant::now());
        for (name, c) in m.clusters.iter() {
            let keys = into.entry(name.to_string()).or_default();
            for e in c.top.iter().chain(&c.previous) {
                *keys.entry(Bytes::copy_from_slice(&e.key)).or_default() +=
                    u64::from(e.count) * sample;
            }
        }
    }
}

/// The hottest keys of each cluster, hottest first: `(cluster, [(key, requests)])`, at most
/// `n` per cluster, clusters by name.
pub(crate) fn top(
    merged: HashMap<String, HashMap<Bytes, u64>>,
    n: usize,
) -> Vec<(String, Vec<(Bytes, u64)>)> {
    let mut out: Vec<(String, Vec<(Bytes, u64)>)> = merged
        .into_iter()
        .map(|(c, keys)| {
            let mut v: Vec<(Bytes, u64)> = keys.into_iter().collect();
            v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            v.truncate(n);
            (c, v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A key as redis-cli quotes it: printable ASCII as is, `"` and `\` escaped, other bytes
/// as `\xHH`.
pub(crate) fn quote(key: &[u8]) -> String {
    let mut s = String::with_capacity(key.len() + 2);
    s.push('"');
    for &b in key {
        match b {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    s.push('"');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_one_key_in_sample_and_follows_a_new_sampling() {
        let t = Tracker::new(4);
        let taken: Vec<bool> = (0..9).map(|_| t.take()).collect();
        assert_eq!(
            taken,
            [true, false, false, false, true, false, false, false, true]
        );
        t.set_sample(1);
        assert!((0..5).all(|_| t.take()));
        t.set_sample(0);
        assert!((0..5).all(|_| !t.take()));
        t.set_sample(3);
        let n = (0..30).filter(|_| t.take()).count();
        assert_eq!(n, 10);
    }

    #[test]
    fn finds_the_heaviest_keys_in_bounded_memory() {
        let t = Tracker::new(1);
        let c = "main";
        // 20 heavy keys among 50,000 light ones.
        for round in 0..200 {
            for h in 0..20 {
                for _ in 0..(20 - h) {
                    t.record(c, format!("heavy{h}").as_bytes(), Instant::now());
                }
            }
            for l in 0..250 {
                t.record(
                    c,
                    format!("light{}", round * 250 + l).as_bytes(),
                    Instant::now(),
                );
            }
        }
        let mut m = HashMap::new();
        t.add_into(&mut m);
        let top = top(m, 10);
        let keys: Vec<String> = top[0]
            .1
            .iter()
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .collect();
        let want: Vec<String> = (0..10).map(|h| format!("heavy{h}")).collect();
        assert_eq!(keys, want);
        assert!(t.inner.lock().unwrap().clusters[0].1.top.len() <= TOP);
    }

    /// The list as kept without the `min` shortcut: find the key, else push, else replace
    /// the smallest when the estimate beats it.
    fn plain_top(keys: &[Vec<u8>]) -> Vec<(Vec<u8>, u32)> {
        let mut sketch = vec![0u32; DEPTH * WIDTH];
        let mut top: Vec<(Vec<u8>, u32)> = Vec::new();
        for key in keys {
            let first = xxhash_rust::xxh64::xxh64(key, SEED);
            let mut est = u32::MAX;
            for row in 0..DEPTH {
                let c = &mut sketch[row * WIDTH + (first >> (row * 12)) as usize % WIDTH];
                *c += 1;
                est = est.min(*c);
            }
            if let Some(e) = top.iter_mut().find(|e| &e.0 == key) {
                e.1 = est;
            } else if top.len() < TOP {
                top.push((key.clone(), est));
            } else if let Some(m) = top.iter_mut().min_by_key(|e| e.1) {
                if est > m.1 {
                    *m = (key.clone(), est);
                }
            }
        }
        top
    }

    /// `n` key ids of a skewed stream (an LCG seeded with `seed`): 40% over `hot` ids, the
    /// rest over `cold`, so list members repeat and near-misses come and go.
    fn skewed(seed: u64, n: usize, hot: u64, cold: u64) -> impl Iterator<Item = u64> {
        let mut x = seed;
        (0..n).map(move |_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (x >> 33) % 1000;
            if r < 400 {
                r % hot
            } else {
                (x >> 13) % cold
            }
        })
    }

    #[test]
    fn skipping_keys_at_or_below_the_lists_minimum_keeps_the_same_list() {
        let keys: Vec<Vec<u8>> = skewed(7, 60_000, 50, 20_000)
            .map(|id| format!("k{id}").into_bytes())
            .collect();
        let mut c = Cluster::new();
        let now = c.started;
        for k in &keys {
            c.count(k, xxhash_rust::xxh64::xxh64(k, SEED), now);
        }
        let got: Vec<(Vec<u8>, u32)> = c.top.iter().map(|e| (e.key.clone(), e.count)).collect();
        assert_eq!(got, plain_top(&keys));
        assert_eq!(c.min, c.top.iter().map(|e| e.count).min().unwrap());
    }

    #[test]
    fn counting_queued_keys_in_batches_gives_what_counting_each_at_once_gives() {
        // Two clusters; keys short enough to queue and longer ones counted at once, mixed.
        let keys: Vec<(&str, Vec<u8>)> = skewed(11, 20_000, 40, 5_000)
            .enumerate()
            .map(|(i, id)| {
                let pad = if id % 3 == 0 {
                    "-".repeat(INLINE_KEY)
                } else {
                    String::new()
                };
                let cluster = if i % 5 == 0 { "b" } else { "a" };
                (cluster, format!("k{id}{pad}").into_bytes())
            })
            .collect();
        let t = Tracker::new(1);
        let now = Instant::now();
        let mut one_by_one: Vec<(&str, Cluster)> = Vec::new();
        for (c, k) in &keys {
            t.record(c, k, now);
            let i = match one_by_one.iter().position(|(n, _)| n == c) {
                Some(i) => i,
                None => {
                    one_by_one.push((c, Cluster::new()));
                    one_by_one.len() - 1
                }
            };
            one_by_one[i]
                .1
                .count(k, xxhash_rust::xxh64::xxh64(k, SEED), now);
        }
        let mut m = t.inner.lock().unwrap();
        assert!(!m.queue.is_empty(), "the last keys are still queued");
        m.flush(now);
        for (name, want) in &one_by_one {
            let got = &m.clusters.iter().find(|(n, _)| n == name).unwrap().1;
            let list = |c: &Cluster| -> Vec<(Vec<u8>, u32)> {
                c.top.iter().map(|e| (e.key.clone(), e.count)).collect()
            };
            assert_eq!(list(got), list(want), "cluster {name}");
            assert_eq!(got.sketch, want.sketch, "cluster {name}");
        }
    }

    #[test]
    fn quotes_like_redis_cli() {
        assert_eq!(quote(b"a\"b\\c\x01"), "\"a\\\"b\\\\c\\x01\"");
    }
}
