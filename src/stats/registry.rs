//! The registry of every worker's counters, summed when someone reads them (a scrape, `INFO`,
//! `/stats`): the lock is taken when a worker registers and when a reader sums, never per
//! request.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use respway_filters::hot_key::{HotKeyRuleStats, HotKeyStats};
use respway_filters::mirror::{MirrorCounts, MirrorStats};

use super::{CmdTotals, CommandStats, ListenerStats, PIPELINE_BUCKETS};
use super::{ErrorKind, UpstreamStats};

/// One worker's mirror and hot-key counters for one listener.
pub(crate) type FilterStats = (Arc<MirrorStats>, Arc<HotKeyStats>);

/// [`FilterStats`] with the cluster names their mirror counters are indexed by.
type NamedFilters = (FilterStats, Arc<Vec<String>>);

/// Mirror and hot-key counts of configurations no longer served, by name, so that totals do
/// not drop back when a configuration is pushed.
#[derive(Debug, Default)]
struct Retired {
    /// (listener index, receiving cluster) → copies.
    mirror: HashMap<(usize, String), MirrorCounts>,
    /// Replaced mirror counters that something still holds (copies in flight, a session still
    /// on the old configuration): they may still count, so they are read live, and folded
    /// into `mirror` once nothing else holds them.
    mirror_live: Vec<(usize, Arc<MirrorStats>, Arc<Vec<String>>)>,
    /// (listener index, cluster, prefix) → counters.
    hot: HashMap<(usize, String, String), HotKeyRuleStats>,
}

impl Retired {
    /// Folds the replaced mirror counters that nothing else holds any more (they can no
    /// longer count) into `mirror`.
    fn fold_mirror(&mut self) {
        let mut i = 0;
        while i < self.mirror_live.len() {
            if Arc::strong_count(&self.mirror_live[i].1) > 1 {
                i += 1;
                continue;
            }
            let (l, m, names) = self.mirror_live.swap_remove(i);
            for (c, counts) in m.snapshot().into_iter().enumerate() {
                let Some(name) = names.get(c) else { continue };
                self.mirror
                    .entry((l, name.clone()))
                    .or_default()
                    .add(&counts);
            }
        }
    }
}

/// Every worker's counters, for INFO and the admin endpoint. The lock is taken only when a
/// worker starts and when someone reads the totals, never per request.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// Per worker and listener: the listener's name and its counters.
    workers: Mutex<Vec<(String, Arc<ListenerStats>)>>,
    /// Keyed by (worker, listener); replaced on every config change (with the cluster names
    /// the mirror counters are indexed by).
    filters: Mutex<HashMap<(usize, usize), NamedFilters>>,
    /// What replaced counters had counted.
    retired: Mutex<Retired>,
    /// Each worker's upstream counters.
    upstream: Mutex<Vec<Arc<UpstreamStats>>>,
    /// Every worker's `admit: hot` sets, by cluster name.
    hot_sets: Mutex<Vec<(String, std::sync::Weak<dyn super::HotKeysSource>)>>,
    /// Every worker's near-cache counters, by cluster name.
    caches: Mutex<Vec<(String, Arc<super::CacheStats>)>>,
    /// Each worker's current chain parts per listener (for endpoint health).
    slots: Mutex<Vec<Arc<dyn EndpointSource>>>,
    /// The copy passes of hot-key rules (`INFO hotkeys`, metrics).
    copies: std::sync::OnceLock<Arc<dyn super::CopySource>>,
}

/// A worker's endpoints as the registry sums them (a listener's configuration slot): the
/// registry knows no endpoint handle, it asks its sources.
pub(crate) trait EndpointSource: Send + Sync + std::fmt::Debug {
    /// Adds the view of each endpoint `[cluster][shard][endpoint]` into `out` (grown as
    /// needed), unless the set it holds now is in `seen` (sources that share one set of
    /// endpoints are counted once); then adds the set to `seen`.
    fn add_views(&self, seen: &mut Vec<usize>, out: &mut Vec<Vec<Vec<EndpointView>>>);
}

/// One endpoint as the workers see it (see [`Registry::endpoint_health`]).
#[derive(Debug, Default, Clone)]
pub(crate) struct EndpointView {
    /// Workers whose connections to it work.
    pub healthy_workers: usize,
    /// Workers.
    pub workers: usize,
    /// Dedicated connections open to it.
    pub dedicated: usize,
    /// Requests sent to it (since its pools were created).
    pub requests: u64,
    /// How long it took per request, write to reply.
    pub latency: Option<CmdTotals>,
    /// Requests waiting in its connections' queues now.
    pub queued: usize,
    /// Connections open to it now (shared and dedicated).
    pub connections: u64,
    /// Requests sent on its connections and not yet answered, now.
    pub inflight: u64,
    /// Connections opened to it, and connect attempts that failed (since its pools were
    /// created).
    pub connects: u64,
    pub connect_failures: u64,
    /// Failed requests by kind (indexed like [`ErrorKind::ALL`]).
    pub errors: [u64; 8],
    /// Times a worker took it out (the upstream's passive outlier rule).
    pub ejections: u64,
    /// While some worker has it out: the earliest `since`, the latest reason, the most
    /// failed attempts.
    pub down: Option<super::Down>,
    /// What the active health check says (`None`: its cluster has no `health_check`).
    pub check: Option<super::CheckView>,
}

/// Upstream counters summed over workers.
#[derive(Debug, Default, Clone)]
pub(crate) struct UpstreamTotals {
    /// Errors by kind, in [`ErrorKind::ALL`] order.
    pub(crate) errors: Vec<(ErrorKind, u64)>,
    /// Connections opened.
    pub(crate) connects: u64,
    /// Failed connect attempts.
    pub(crate) connect_failures: u64,
    /// Connections replaced because requests on them stopped being answered.
    pub(crate) stuck: u64,
    /// Connections closed because the peer broke the protocol.
    pub(crate) protocol_errors: u64,
}

/// Sums over workers.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Totals {
    /// Commands decoded.
    pub(crate) commands: u64,
    /// Bytes read from clients.
    pub(crate) bytes_in: u64,
    /// Bytes written to clients.
    pub(crate) bytes_out: u64,
    /// Connections accepted.
    pub(crate) connections: u64,
    /// Connections open.
    pub(crate) active: u64,
    /// Protocol errors.
    pub(crate) protocol_errors: u64,
    /// Unsupported commands.
    pub(crate) unsupported: u64,
    /// Upstream timeouts.
    pub(crate) timeouts: u64,
    /// Clients closed for their output buffer.
    pub(crate) output_limit_closes: u64,
    /// Failed AUTH attempts.
    pub(crate) auth_failures: u64,
    /// Failed AUTH attempts answered late.
    pub(crate) auth_tarpitted: u64,
    /// Failed TLS handshakes.
    pub(crate) tls_handshake_failures: u64,
    /// Plaintext clients on a TLS listener.
    pub(crate) tls_plaintext_refused: u64,
    /// Reads per pipeline-depth bucket.
    pub(crate) pipeline: [u64; PIPELINE_BUCKETS],
}

impl Registry {
    /// Registers a worker's counters for the listener `name`.
    pub(crate) fn add(&self, name: &str, s: Arc<ListenerStats>) {
        self.workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name.to_string(), s));
    }

    /// Per-command counters summed over workers (and over listeners, or of one), in command
    /// table order; commands never seen are left out.
    pub(crate) fn command_totals(&self, listener: Option<&str>) -> Vec<CmdTotals> {
        let w = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let mut into = vec![None; CommandStats::slots()];
        for (name, s) in w.iter() {
            if listener.is_none_or(|l| l == name) {
                s.cmds.add_into(&mut into);
            }
        }
        into.into_iter().flatten().collect()
    }

    /// The hottest keys per cluster (of one listener, or all), hottest first, at most `n`
    /// per cluster.
    pub(crate) fn hot_keys(
        &self,
        listener: Option<&str>,
        n: usize,
    ) -> Vec<(String, Vec<(bytes::Bytes, u64)>)> {
        let w = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let mut merged = HashMap::new();
        for (name, s) in w.iter() {
            if listener.is_none_or(|l| l == name) {
                s.hot.add_into(&mut merged);
            }
        }
        crate::stats::hotkeys::top(merged, n)
    }

    /// The slow log of `listener` over every worker, newest first, at most `n` entries.
    pub(crate) fn slowlog(&self, listener: &str, n: usize) -> Vec<crate::stats::slowlog::Entry> {
        let w = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let mut all = Vec::new();
        for (_, s) in w.iter().filter(|(l, _)| l == listener) {
            s.slow.add_into(&mut all);
        }
        all.sort_by_key(|e| std::cmp::Reverse(e.id));
        all.truncate(n);
        all
    }

    /// Entries in the slow log of `listener` over every worker.
    pub(crate) fn slowlog_len(&self, listener: &str) -> usize {
        let w = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        w.iter()
            .filter(|(l, _)| l == listener)
            .map(|(_, s)| s.slow.len())
            .sum()
    }

    /// Empties the slow log of `listener` on every worker.
    pub(crate) fn slowlog_reset(&self, listener: &str) {
        let w = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        for (_, s) in w.iter().filter(|(l, _)| l == listener) {
            s.slow.reset();
        }
    }

    /// The listeners' names, once each, in registration order.
    pub(crate) fn listener_names(&self) -> Vec<String> {
        let w = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<String> = Vec::new();
        for (name, _) in w.iter() {
            if !out.contains(name) {
                out.push(name.clone());
            }
        }
        out
    }

    /// Counters of one listener summed over workers.
    pub(crate) fn listener_totals(&self, listener: &str) -> Totals {
        self.sum(Some(listener))
    }

    /// Registers the mirror and hot-key counters of (worker, listener) for the current
    /// configuration; `clusters` names the mirror counters' indices. What the counters they
    /// replace had counted is kept under the clusters' and rules' names, so totals survive
    /// configuration pushes.
    pub(crate) fn set_filters(
        &self,
        key: (usize, usize),
        mirror: Arc<MirrorStats>,
        hot: Arc<HotKeyStats>,
        clusters: Vec<String>,
    ) {
        let old = self
            .filters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, ((mirror, hot), Arc::new(clusters)));
        let Some(((m, h), names)) = old else { return };
        let mut r = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        r.mirror_live.push((key.1, m, names));
        r.fold_mirror();
        for s in h.snapshot() {
            HotKeyRuleStats::add(
                r.hot
                    .entry((key.1, s.cluster.clone(), s.prefix.clone()))
                    .or_insert_with(|| HotKeyRuleStats {
                        cluster: s.cluster.clone(),
                        prefix: s.prefix.clone(),
                        fanned_out_writes: 0,
                        partial_failures: 0,
                        read_fallbacks: 0,
                        copy_retries: 0,
                        copies_dropped: 0,
                        reads_per_shard: Vec::new(),
                    }),
                &s,
            );
        }
    }

    /// Mirrored copies per receiving cluster of listener `listener` (index), over workers
    /// and configurations, by cluster name.
    pub(crate) fn mirror_totals(&self, listener: usize) -> Vec<(String, MirrorCounts)> {
        let mut r = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        r.fold_mirror();
        let mut out: std::collections::BTreeMap<String, MirrorCounts> = r
            .mirror
            .iter()
            .filter(|((l, _), _)| *l == listener)
            .map(|((_, n), c)| (n.clone(), *c))
            .collect();
        let live = r.mirror_live.iter().map(|(l, m, n)| (*l, m, n));
        let f = self.filters.lock().unwrap_or_else(|e| e.into_inner());
        let current = f.iter().map(|((_, l), ((m, _), n))| (*l, m, n));
        for (l, m, names) in live.chain(current) {
            if l != listener {
                continue;
            }
            for (i, c) in m.snapshot().into_iter().enumerate() {
                let Some(name) = names.get(i) else { continue };
                let t = out.entry(name.clone()).or_default();
                t.add(&c);
            }
        }
        out.into_iter().collect()
    }

    /// Hot-key rule counters of listener `listener` (index), over workers and
    /// configurations.
    pub(crate) fn hot_key_rule_totals(&self, listener: usize) -> Vec<HotKeyRuleStats> {
        let mut out: std::collections::BTreeMap<(String, String), HotKeyRuleStats> = self
            .retired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .hot
            .iter()
            .filter(|((l, _, _), _)| *l == listener)
            .map(|((_, c, p), s)| ((c.clone(), p.clone()), s.clone()))
            .collect();
        let f = self.filters.lock().unwrap_or_else(|e| e.into_inner());
        for ((_, l), ((_, h), _)) in f.iter() {
            if *l != listener {
                continue;
            }
            for s in h.snapshot() {
                let t = out
                    .entry((s.cluster.clone(), s.prefix.clone()))
                    .or_insert_with(|| HotKeyRuleStats {
                        cluster: s.cluster.clone(),
                        prefix: s.prefix.clone(),
                        fanned_out_writes: 0,
                        partial_failures: 0,
                        read_fallbacks: 0,
                        copy_retries: 0,
                        copies_dropped: 0,
                        reads_per_shard: Vec::new(),
                    });
                t.add(&s);
            }
        }
        out.into_values().collect()
    }

    /// Registers a worker's configuration slot of one listener.
    pub(crate) fn add_slot(&self, slot: Arc<dyn EndpointSource>) {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(slot);
    }

    /// Per endpoint `[cluster][shard][endpoint]` of the current configuration, summed over
    /// workers.
    pub(crate) fn endpoint_health(&self) -> Vec<Vec<Vec<EndpointView>>> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<Vec<Vec<EndpointView>>> = Vec::new();
        let mut seen = Vec::new();
        for slot in slots.iter() {
            slot.add_views(&mut seen, &mut out);
        }
        out
    }

    /// Where the copy passes of hot-key rules are read (set once, at start).
    pub(crate) fn set_copies(&self, copies: Arc<dyn super::CopySource>) {
        let _ = self.copies.set(copies);
    }

    /// The copy pass of the rule `prefix` of cluster `cluster`, if it has one.
    pub(crate) fn copy_progress(&self, cluster: &str, prefix: &str) -> Option<super::CopyProgress> {
        self.copies.get()?.progress(cluster, prefix)
    }

    /// Every rule's copy pass: (cluster, prefix, progress).
    pub(crate) fn copies(&self) -> Vec<(String, String, super::CopyProgress)> {
        self.copies.get().map(|c| c.all()).unwrap_or_default()
    }

    /// Registers a worker's upstream counters.
    /// Adds one worker's `admit: hot` set of cluster `name` (held until its configuration is
    /// replaced).
    pub(crate) fn add_hot_set(&self, name: &str, h: &Arc<dyn super::HotKeysSource>) {
        let mut all = self.hot_sets.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|(_, w)| w.strong_count() > 0);
        all.push((name.to_string(), Arc::downgrade(h)));
    }

    /// The keys the near caches admit as hot now, per cluster (every worker's, once each,
    /// sorted).
    pub(crate) fn near_cache_hot_keys(&self) -> Vec<(String, Vec<bytes::Bytes>)> {
        let all = self.hot_sets.lock().unwrap_or_else(|e| e.into_inner());
        let mut by: std::collections::BTreeMap<String, std::collections::BTreeSet<bytes::Bytes>> =
            Default::default();
        for (name, w) in all.iter() {
            if let Some(h) = w.upgrade() {
                by.entry(name.clone()).or_default().extend(h.keys());
            }
        }
        by.into_iter()
            .map(|(n, k)| (n, k.into_iter().collect()))
            .collect()
    }

    /// Adds one worker's near-cache counters of cluster `name`.
    pub(crate) fn add_cache(&self, name: &str, s: Arc<super::CacheStats>) {
        self.caches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name.to_string(), s));
    }

    /// Near-cache counters per cluster in `clusters` (summed over workers), in that order.
    pub(crate) fn cache_totals(&self, clusters: &[&str]) -> Vec<(String, super::CacheTotals)> {
        let all = self.caches.lock().unwrap_or_else(|e| e.into_inner());
        clusters
            .iter()
            .map(|&c| {
                let mut t = super::CacheTotals::default();
                for (_, s) in all.iter().filter(|(n, _)| n == c) {
                    t.add(s);
                }
                (c.to_string(), t)
            })
            .collect()
    }

    pub(crate) fn add_upstream(&self, s: Arc<UpstreamStats>) {
        self.upstream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(s);
    }

    /// Sums every worker's upstream counters.
    pub(crate) fn upstream_totals(&self) -> UpstreamTotals {
        let w = self.upstream.lock().unwrap_or_else(|e| e.into_inner());
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        UpstreamTotals {
            errors: ErrorKind::ALL
                .iter()
                .map(|&k| (k, w.iter().map(|s| s.errors(k)).sum()))
                .collect(),
            connects: w.iter().map(|s| get(&s.connects)).sum(),
            connect_failures: w.iter().map(|s| get(&s.connect_failures)).sum(),
            stuck: w.iter().map(|s| get(&s.stuck)).sum(),
            protocol_errors: w.iter().map(|s| get(&s.protocol_errors)).sum(),
        }
    }

    /// The index of listener `name` (registration order is configuration order).
    pub(crate) fn listener_index(&self, name: &str) -> Option<usize> {
        self.listener_names().iter().position(|n| n == name)
    }

    /// Sums every worker's counters.
    pub(crate) fn totals(&self) -> Totals {
        self.sum(None)
    }

    fn sum(&self, listener: Option<&str>) -> Totals {
        let w = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let mut t = Totals::default();
        for (_, s) in w.iter().filter(|(n, _)| listener.is_none_or(|l| l == n)) {
            t.commands += s.commands.get();
            t.bytes_in += s.bytes_in.load(Ordering::Relaxed);
            t.bytes_out += s.bytes_out.load(Ordering::Relaxed);
            t.connections += s.connections.get();
            t.active += s.active.load(Ordering::Relaxed);
            t.protocol_errors += s.protocol_errors.get();
            t.unsupported += s.unsupported.get();
            t.timeouts += s.timeouts.get();
            t.output_limit_closes += s.output_limit_closes.get();
            t.auth_failures += s.auth_failures.get();
            t.auth_tarpitted += s.auth_tarpitted.get();
            t.tls_handshake_failures += s.tls_handshake_failures.get();
            t.tls_plaintext_refused += s.tls_plaintext_refused.get();
            for (t, s) in t.pipeline.iter_mut().zip(&s.pipeline) {
                *t += s.load(Ordering::Relaxed);
            }
        }
        t
    }
}
