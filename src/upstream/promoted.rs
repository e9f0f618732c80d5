//! Redis Cluster shards whose primary a `MOVED` showed replaced by a replica, per worker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::EndpointHandle;

/// The replicas this worker saw promoted, by `(cluster, shard)`: the shard's commands go to
/// them at once, not to the old primary for a `MOVED` each until the topology is refreshed
/// (as a cluster client updates its slot map on the first `MOVED`). Set by
/// [`super::redirect::Redirect`] on a `MOVED` from a shard's primary to a node of the same shard;
/// read on every command to a Redis Cluster's primary only while one is set (one atomic load
/// otherwise). Per worker, so its lock is never contended.
#[derive(Debug, Default)]
pub(crate) struct Promoted {
    any: AtomicBool,
    shards: Mutex<Vec<((usize, usize), EndpointHandle)>>,
}

impl Promoted {
    /// `(cluster, shard)`'s promoted replica, when a `MOVED` named one.
    pub(crate) fn get(&self, cluster: usize, shard: usize) -> Option<EndpointHandle> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let s = self.shards.lock().unwrap_or_else(|e| e.into_inner());
        s.iter()
            .find(|(k, _)| *k == (cluster, shard))
            .map(|(_, h)| h.clone())
    }

    /// Notes that `(cluster, shard)`'s primary is now `to`.
    pub(crate) fn set(&self, cluster: usize, shard: usize, to: EndpointHandle) {
        let mut s = self.shards.lock().unwrap_or_else(|e| e.into_inner());
        s.retain(|(k, _)| *k != (cluster, shard));
        s.push(((cluster, shard), to));
        self.any.store(true, Ordering::Relaxed);
    }
}
