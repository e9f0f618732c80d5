//! What a session's upstream service keeps across its chains ([`Track`]): its requests
//! waiting behind a held write ([`super::hold`]), and the primaries it wrote to since its last
//! `WAIT`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// One session's; shared by the clones of its upstream service and kept when its chain is
/// rebuilt. Only its session's thread touches it: one relaxed load per request, a load (and
/// a store, the first time) per write.
#[derive(Debug)]
pub(crate) struct Track {
    waiting: AtomicUsize,
    /// The primaries written to since the last `WAIT`, a bit per `(cluster, shard)` (see
    /// [`bit`]); [`ALL`]: not known (a transaction, a blocking command, a fan-out).
    written: AtomicU64,
    /// The set the last `WAIT` asked (all, before the first).
    last: AtomicU64,
}

impl Default for Track {
    fn default() -> Self {
        Track {
            waiting: AtomicUsize::new(0),
            written: AtomicU64::new(0),
            last: AtomicU64::new(ALL),
        }
    }
}

/// Every primary.
pub(crate) const ALL: u64 = u64::MAX;

/// The bit of `(cluster, shard)` in a written set: shards beyond 64 share bits, so a `WAIT`
/// may ask a primary more, never one less.
#[inline]
pub(crate) fn bit(cluster: usize, shard: usize) -> u64 {
    1 << (cluster.wrapping_mul(31).wrapping_add(shard) % 64)
}

impl Track {
    /// True while a request of this session waits (the next ones wait behind it).
    #[inline]
    pub(crate) fn behind(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) != 0
    }

    /// A request that waits: counted until the returned turn is dropped (sent, or given up).
    pub(crate) fn wait(self: &Arc<Self>) -> Turn {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Turn(self.clone())
    }

    /// Notes a write sent to `(cluster, shard)`'s primary.
    #[inline]
    pub(crate) fn wrote(&self, cluster: usize, shard: usize) {
        let b = bit(cluster, shard);
        let w = self.written.load(Ordering::Relaxed);
        if w & b == 0 {
            self.written.store(w | b, Ordering::Relaxed);
        }
    }

    /// Notes writes whose primaries respway does not follow (every primary then).
    pub(crate) fn wrote_anywhere(&self) {
        self.written.store(ALL, Ordering::Relaxed);
    }

    /// For a `WAIT`: the primaries written to since the last one (those the last one asked,
    /// when none), and starts the next set.
    pub(crate) fn take_written(&self) -> u64 {
        let w = self.written.swap(0, Ordering::Relaxed);
        if w == 0 {
            return self.last.load(Ordering::Relaxed);
        }
        self.last.store(w, Ordering::Relaxed);
        w
    }
}

/// A request's place among its session's waiting ones (see [`Track::wait`]).
#[derive(Debug)]
pub(crate) struct Turn(Arc<Track>);

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_counts_while_it_lives() {
        let o = Arc::new(Track::default());
        assert!(!o.behind());
        let t = o.wait();
        let u = o.wait();
        assert!(o.behind());
        drop(t);
        assert!(o.behind());
        drop(u);
        assert!(!o.behind());
    }

    #[test]
    fn wait_asks_the_primaries_written_to_since_the_last() {
        let t = Track::default();
        assert_eq!(t.take_written(), ALL, "nothing known yet: every primary");
        t.wrote(0, 2);
        t.wrote(0, 2);
        t.wrote(1, 0);
        let w = t.take_written();
        assert_eq!(w, bit(0, 2) | bit(1, 0));
        assert_eq!(
            t.take_written(),
            w,
            "no write since: the same primaries again"
        );
        t.wrote(0, 1);
        assert_eq!(t.take_written(), bit(0, 1));
        t.wrote_anywhere();
        assert_eq!(t.take_written(), ALL);
    }
}
