//! Process-wide counters that features report into and the metric families read: each is
//! one atomic a feature bumps, kept here so that the stats floor imports no feature.

use std::sync::atomic::{AtomicU64, AtomicUsize};

/// Client-side caching through the sidecar: sessions tracking now (publishers look at
/// nothing else while there are none).
pub(crate) static TRACKING_SESSIONS: AtomicUsize = AtomicUsize::new(0);
/// Keys announced, flushes announced, and reads announced at once because nothing upstream
/// follows them.
pub(crate) static TRACKING_ANNOUNCED_KEYS: AtomicU64 = AtomicU64::new(0);
pub(crate) static TRACKING_ANNOUNCED_FLUSHES: AtomicU64 = AtomicU64::new(0);
pub(crate) static TRACKING_UNFOLLOWED_READS: AtomicU64 = AtomicU64::new(0);

/// Redis Cluster topology refreshes answered, and those that changed a topology.
pub(crate) static REDIS_CLUSTER_REFRESHES: AtomicU64 = AtomicU64::new(0);
pub(crate) static REDIS_CLUSTER_CHANGES: AtomicU64 = AtomicU64::new(0);
/// Redis Cluster redirections followed, by kind (`MOVED`, `ASK`, `TRYAGAIN`).
pub(crate) static REDIS_CLUSTER_REDIRECTS: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];
