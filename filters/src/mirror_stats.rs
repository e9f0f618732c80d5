//! The counters of request mirroring and move mode, per worker and cluster receiving copies:
//! what the mirror layer ([`crate::mirror`]) and move mode ([`crate::moving`]) both record.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Mirror counters of one worker, per cluster receiving copies (indexed like
/// `Routing::clusters`).
#[derive(Debug)]
pub struct MirrorStats {
    clusters: Vec<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    mirrored: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    applied: AtomicU64,
    moved: AtomicU64,
    absent: AtomicU64,
    move_failed: AtomicU64,
}

/// What one `MIGRATE` of move mode did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveOutcome {
    /// `+OK`: keys moved.
    Moved,
    /// `+NOKEY`: none of its keys was on the old shard.
    Absent,
    /// An error reply or no reply: the command was not run.
    Failed,
}

/// The mirror counters of one cluster, read at one moment (or summed over workers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MirrorCounts {
    /// Copies queued for this cluster.
    pub mirrored: u64,
    /// Copies dropped because the queue was full.
    pub dropped: u64,
    /// Queued copies that failed upstream (error reply or no reply), as the sink's consumer
    /// reported them.
    pub failed: u64,
    /// Queued copies that the other cluster answered without an error: with `failed`, the
    /// copies done; `mirrored - applied - failed` are still queued or in flight.
    pub applied: u64,
    /// Move mode, with this cluster receiving: `MIGRATE`s that moved keys (`+OK`).
    pub moved: u64,
    /// `MIGRATE`s that found none of their keys on the old shard (`+NOKEY`: moved already, or
    /// no such key).
    pub absent: u64,
    /// `MIGRATE`s that failed (an error reply, or no reply): their commands were not run.
    pub move_failed: u64,
}

impl MirrorStats {
    /// Zeroed counters for `n_clusters` clusters.
    pub fn new(n_clusters: usize) -> Self {
        MirrorStats {
            clusters: (0..n_clusters).map(|_| Counters::default()).collect(),
        }
    }

    /// Counts a queued copy for `cluster` that failed; called by the sink's consumer. An
    /// out-of-range `cluster` is ignored.
    pub fn record_failed(&self, cluster: usize) {
        if let Some(c) = self.clusters.get(cluster) {
            c.failed.fetch_add(1, Relaxed);
        }
    }

    /// Counts a queued copy for `cluster` that the other cluster answered without an error;
    /// called by the sink's consumer.
    pub fn record_applied(&self, cluster: usize) {
        if let Some(c) = self.clusters.get(cluster) {
            c.applied.fetch_add(1, Relaxed);
        }
    }

    /// Counts the outcome of one `MIGRATE` of move mode into `cluster`.
    pub fn record_move(&self, cluster: usize, outcome: MoveOutcome) {
        if let Some(c) = self.clusters.get(cluster) {
            match outcome {
                MoveOutcome::Moved => &c.moved,
                MoveOutcome::Absent => &c.absent,
                MoveOutcome::Failed => &c.move_failed,
            }
            .fetch_add(1, Relaxed);
        }
    }

    /// The counters now, indexed by cluster.
    pub fn snapshot(&self) -> Vec<MirrorCounts> {
        self.clusters
            .iter()
            .map(|c| MirrorCounts {
                mirrored: c.mirrored.load(Relaxed),
                dropped: c.dropped.load(Relaxed),
                failed: c.failed.load(Relaxed),
                applied: c.applied.load(Relaxed),
                moved: c.moved.load(Relaxed),
                absent: c.absent.load(Relaxed),
                move_failed: c.move_failed.load(Relaxed),
            })
            .collect()
    }

    pub(crate) fn mirrored(&self, cluster: usize) {
        if let Some(c) = self.clusters.get(cluster) {
            c.mirrored.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn dropped(&self, cluster: usize) {
        if let Some(c) = self.clusters.get(cluster) {
            c.dropped.fetch_add(1, Relaxed);
        }
    }
}

impl MirrorCounts {
    /// Adds up the snapshots of several workers, cluster by cluster (a shorter snapshot
    /// counts as zeros for the clusters it lacks).
    pub fn sum<'a>(snapshots: impl IntoIterator<Item = &'a [MirrorCounts]>) -> Vec<MirrorCounts> {
        let mut out: Vec<MirrorCounts> = Vec::new();
        for snap in snapshots {
            if out.len() < snap.len() {
                out.resize(snap.len(), MirrorCounts::default());
            }
            for (t, s) in out.iter_mut().zip(snap) {
                t.add(s);
            }
        }
        out
    }

    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &MirrorCounts) {
        self.mirrored += o.mirrored;
        self.dropped += o.dropped;
        self.failed += o.failed;
        self.applied += o.applied;
        self.moved += o.moved;
        self.absent += o.absent;
        self.move_failed += o.move_failed;
    }
}
