//! Hot-key counters, per worker, cluster and rule (see [`HotKeyStats`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::routing::Routing;

/// Hot-key counters of one worker, per cluster and rule.
///
/// Built from the same [`Routing`] as the layer that counts into it; the layer only writes
/// them (relaxed atomics, one writer per worker), scrapes read them with
/// [`snapshot`](Self::snapshot) and add the workers up with [`HotKeyRuleStats::sum`].
#[derive(Debug)]
pub struct HotKeyStats {
    /// `[cluster][rule]`, rules in the routing table's (longest-first) order.
    clusters: Vec<Vec<RuleCounters>>,
    names: Vec<String>,
}

#[derive(Debug)]
struct RuleCounters {
    prefix: String,
    fanned_out_writes: AtomicU64,
    partial_failures: AtomicU64,
    read_fallbacks: AtomicU64,
    copy_retries: AtomicU64,
    copies_dropped: AtomicU64,
    reads_per_shard: Vec<AtomicU64>,
}

/// The counters of one hot-key rule, read at one moment (or summed over workers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotKeyRuleStats {
    /// The cluster's name.
    pub cluster: String,
    /// The rule's prefix (lossy UTF-8).
    pub prefix: String,
    /// Writes run on the home shard and copied to every other shard.
    pub fanned_out_writes: u64,
    /// Those writes whose copy failed on at least one shard.
    pub partial_failures: u64,
    /// Reads of a copy that said "no such key" (or failed), sent again to the home shard.
    pub read_fallbacks: u64,
    /// Copy rounds made again because the home value changed while copying (concurrent
    /// writes of the key).
    pub copy_retries: u64,
    /// Writes whose copies were deleted instead, the key changing during every round.
    pub copies_dropped: u64,
    /// Reads, by the shard they were pinned to (shard index order).
    pub reads_per_shard: Vec<u64>,
}

impl HotKeyStats {
    /// Zeroed counters for every hot-key rule of every cluster of `routing`.
    pub fn new(routing: &Routing) -> Self {
        HotKeyStats {
            clusters: routing
                .clusters
                .iter()
                .map(|c| {
                    c.hot_keys
                        .iter()
                        .map(|r| RuleCounters {
                            prefix: String::from_utf8_lossy(&r.prefix).into_owned(),
                            fanned_out_writes: AtomicU64::new(0),
                            partial_failures: AtomicU64::new(0),
                            read_fallbacks: AtomicU64::new(0),
                            copy_retries: AtomicU64::new(0),
                            copies_dropped: AtomicU64::new(0),
                            reads_per_shard: c.shards.iter().map(|_| AtomicU64::new(0)).collect(),
                        })
                        .collect()
                })
                .collect(),
            names: routing.clusters.iter().map(|c| c.name.clone()).collect(),
        }
    }

    /// The counters now, one entry per rule, clusters in routing order.
    pub fn snapshot(&self) -> Vec<HotKeyRuleStats> {
        self.clusters
            .iter()
            .zip(&self.names)
            .flat_map(|(rules, name)| {
                rules.iter().map(move |r| HotKeyRuleStats {
                    cluster: name.clone(),
                    prefix: r.prefix.clone(),
                    fanned_out_writes: r.fanned_out_writes.load(Relaxed),
                    partial_failures: r.partial_failures.load(Relaxed),
                    read_fallbacks: r.read_fallbacks.load(Relaxed),
                    copy_retries: r.copy_retries.load(Relaxed),
                    copies_dropped: r.copies_dropped.load(Relaxed),
                    reads_per_shard: r.reads_per_shard.iter().map(|c| c.load(Relaxed)).collect(),
                })
            })
            .collect()
    }

    // Lookups use `get`: stats built from another routing table count nothing instead of
    // panicking.
    fn counters(&self, cluster: usize, rule: usize) -> Option<&RuleCounters> {
        self.clusters.get(cluster)?.get(rule)
    }

    pub(super) fn read(&self, cluster: usize, rule: usize, shard: usize) {
        if let Some(c) = self
            .counters(cluster, rule)
            .and_then(|r| r.reads_per_shard.get(shard))
        {
            c.fetch_add(1, Relaxed);
        }
    }

    pub(super) fn fanned_out(&self, cluster: usize, rule: usize) {
        if let Some(r) = self.counters(cluster, rule) {
            r.fanned_out_writes.fetch_add(1, Relaxed);
        }
    }

    pub(super) fn copied_again(&self, cluster: usize, rule: usize) {
        if let Some(r) = self.counters(cluster, rule) {
            r.copy_retries.fetch_add(1, Relaxed);
        }
    }

    pub(super) fn copies_dropped(&self, cluster: usize, rule: usize) {
        if let Some(r) = self.counters(cluster, rule) {
            r.copies_dropped.fetch_add(1, Relaxed);
        }
    }

    pub(super) fn read_fallback(&self, cluster: usize, rule: usize) {
        if let Some(r) = self.counters(cluster, rule) {
            r.read_fallbacks.fetch_add(1, Relaxed);
        }
    }

    pub(super) fn partial_failure(&self, cluster: usize, rule: usize) {
        if let Some(r) = self.counters(cluster, rule) {
            r.partial_failures.fetch_add(1, Relaxed);
        }
    }
}

impl HotKeyRuleStats {
    /// Adds up the snapshots of several workers, matching rules by cluster name and prefix
    /// (so snapshots of slightly different configurations still add up). The result keeps
    /// the order in which rules first appear; shorter `reads_per_shard` lists count as zeros.
    pub fn sum<'a>(
        snapshots: impl IntoIterator<Item = &'a [HotKeyRuleStats]>,
    ) -> Vec<HotKeyRuleStats> {
        let mut out: Vec<HotKeyRuleStats> = Vec::new();
        for snap in snapshots {
            for s in snap {
                let Some(t) = out
                    .iter_mut()
                    .find(|t| t.cluster == s.cluster && t.prefix == s.prefix)
                else {
                    out.push(s.clone());
                    continue;
                };
                t.add(s);
            }
        }
        out
    }

    /// Adds the counters of `s` (reads per shard by index; a shard count that changed keeps
    /// the longer list).
    pub fn add(&mut self, s: &HotKeyRuleStats) {
        self.fanned_out_writes += s.fanned_out_writes;
        self.partial_failures += s.partial_failures;
        self.read_fallbacks += s.read_fallbacks;
        self.copy_retries += s.copy_retries;
        self.copies_dropped += s.copies_dropped;
        if self.reads_per_shard.len() < s.reads_per_shard.len() {
            self.reads_per_shard.resize(s.reads_per_shard.len(), 0);
        }
        for (a, b) in self.reads_per_shard.iter_mut().zip(&s.reads_per_shard) {
            *a += b;
        }
    }
}
