//! One worker's counters and health of one endpoint, and of all its endpoints.

use super::*;

/// One worker's counters and health of one endpoint: written by the endpoint's connection
/// tasks (on the worker's thread, so the atomics are uncontended), read by the worker's zone
/// layer and by the admin endpoint. An endpoint is *out* (respway's passive outlier rule)
/// from a failed connect, or a connection that broke the protocol or was lost right after
/// it opened, until a connect succeeds again; the zone layer sends reads elsewhere meanwhile.
#[derive(Debug)]
pub(crate) struct EndpointStats {
    /// The worker's totals over every endpoint (`INFO proxy`), counted with this endpoint's.
    pub(crate) worker: Arc<UpstreamStats>,
    pub(super) errors: [AtomicU64; 8],
    pub(super) healthy: AtomicBool,
    /// Times it went from healthy to out.
    pub(super) ejections: AtomicU64,
    /// Since when it is out, why, and how many attempts failed since (written on failures
    /// only).
    pub(super) down: Mutex<Option<Down>>,
    /// Connections opened, and connect attempts that failed.
    pub(super) connects: AtomicU64,
    pub(super) connect_failures: AtomicU64,
    /// Connections open now, and the requests written on them not yet answered (see
    /// [`OpenConnection`]).
    pub(super) open: AtomicU64,
    pub(super) inflight: AtomicU64,
    /// Bumped when one of the worker's connections to the endpoint closes (see
    /// `near_cache`: Redis sends no invalidation for what a closed connection read), and by
    /// the endpoint's near-cache tracker.
    pub(crate) cache_epoch: Arc<AtomicU64>,
}

impl EndpointStats {
    pub(super) fn new(worker: Arc<UpstreamStats>) -> EndpointStats {
        EndpointStats {
            worker,
            errors: Default::default(),
            healthy: AtomicBool::new(true),
            ejections: AtomicU64::new(0),
            down: Mutex::new(None),
            connects: AtomicU64::new(0),
            connect_failures: AtomicU64::new(0),
            cache_epoch: Arc::default(),
            open: AtomicU64::new(0),
            inflight: AtomicU64::new(0),
        }
    }

    /// Counts a connection opened, for the endpoint and the worker.
    pub(super) fn count_connect(&self) {
        crate::stats::bump(&self.connects, 1);
        self.worker.connects.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed connect attempt, for the endpoint and the worker.
    pub(super) fn count_connect_failure(&self) {
        crate::stats::bump(&self.connect_failures, 1);
        self.worker.connect_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Connections opened, and connect attempts that failed, so far.
    pub(crate) fn connects(&self) -> (u64, u64) {
        (
            self.connects.load(Ordering::Relaxed),
            self.connect_failures.load(Ordering::Relaxed),
        )
    }

    /// Connections open now, and requests written on them not yet answered.
    pub(crate) fn open(&self) -> (u64, u64) {
        (
            self.open.load(Ordering::Relaxed),
            self.inflight.load(Ordering::Relaxed),
        )
    }

    /// Counts one error of `kind`, for the endpoint and the worker.
    pub(crate) fn count(&self, kind: ErrorKind) {
        crate::stats::bump(&self.errors[kind as usize], 1);
        self.worker.count(kind);
    }

    /// Errors of `kind` so far.
    pub(crate) fn errors(&self, kind: ErrorKind) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
    }

    /// Times the endpoint went out.
    pub(crate) fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// False while the endpoint is out.
    pub(crate) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Since when and why it is out (`None` while healthy).
    pub(crate) fn down(&self) -> Option<Down> {
        self.down.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A connection opened: the endpoint is back (or still) in. The way back is logged once
    /// (whatever put it out: a refused or timed-out connect, a frozen shard, ...).
    pub(super) fn connected(&self, label: &str) {
        if !self.healthy.swap(true, Ordering::Relaxed) {
            let was = self.down.lock().unwrap_or_else(|e| e.into_inner()).take();
            let (out_for, failures) = was.map_or((Duration::ZERO, 0), |d| {
                (d.since.elapsed().unwrap_or_default(), d.failures)
            });
            tracing::info!(
                endpoint = %label,
                out_for_ms = out_for.as_millis() as u64,
                failed_attempts = failures,
                "upstream reachable again"
            );
        }
    }

    /// An attempt failed with `reason`: the endpoint is out (again). Going out is logged
    /// once (warn); the attempts that fail while it stays out only at debug.
    pub(super) fn failed(&self, label: &str, reason: &Arc<str>, backoff: Duration) {
        let was_healthy = self.healthy.swap(false, Ordering::Relaxed);
        if was_healthy {
            crate::stats::bump(&self.ejections, 1);
            tracing::warn!(endpoint = %label, error = %reason, ?backoff, "upstream unavailable");
        } else {
            tracing::debug!(endpoint = %label, error = %reason, ?backoff, "upstream still unavailable");
        }
        let mut d = self.down.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *d {
            Some(d) if !was_healthy => {
                d.reason = reason.clone();
                d.failures += 1;
            }
            _ => {
                *d = Some(Down {
                    since: std::time::SystemTime::now(),
                    reason: reason.clone(),
                    failures: 1,
                })
            }
        }
    }
}

/// One open connection in its endpoint's gauges ([`EndpointStats::open`]): counted open
/// while it lives, with the requests it last reported in flight (its own count, added to and
/// taken from the endpoint's: the connections of one endpoint add up, and a connection that
/// ends takes back exactly what it added).
pub(super) struct OpenConnection<'a> {
    pub(super) stats: &'a EndpointStats,
    pub(super) inflight: u64,
    shared: bool,
}

impl<'a> OpenConnection<'a> {
    /// `shared`: one of the shared connections (those that reads of tracking clients go
    /// on), not a transaction's or a blocking command's.
    pub(super) fn new(stats: &'a EndpointStats, shared: bool) -> Self {
        stats.open.fetch_add(1, Ordering::Relaxed);
        OpenConnection {
            stats,
            inflight: 0,
            shared,
        }
    }

    /// Requests written on this connection and not yet answered: `n` now.
    #[inline]
    pub(super) fn inflight(&mut self, n: usize) {
        let n = n as u64;
        if n > self.inflight {
            self.stats
                .inflight
                .fetch_add(n - self.inflight, Ordering::Relaxed);
        } else if n < self.inflight {
            self.stats
                .inflight
                .fetch_sub(self.inflight - n, Ordering::Relaxed);
        }
        self.inflight = n;
    }
}

/// Called when a shared connection closes, set once by whoever must hear of it (the near
/// cache's client tracking: Redis forgets what was read over a closed connection).
static ON_SHARED_CLOSE: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Sets what a closed shared connection calls (once per process; a second is dropped).
pub(crate) fn on_shared_close(f: fn()) {
    let _ = ON_SHARED_CLOSE.set(f);
}

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.inflight(0);
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
        self.stats.cache_epoch.fetch_add(1, Ordering::AcqRel);
        // What was read over it is no longer followed by Redis (client tracking hears of it).
        if self.shared {
            if let Some(f) = ON_SHARED_CLOSE.get() {
                f();
            }
        }
    }
}
