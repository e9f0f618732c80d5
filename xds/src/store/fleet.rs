//! The fleet in the shared store: each replica publishes the nodes connected to it, and reads
//! the others', so that `GET /status` (and `respway-xds status` and `reshard`'s gate) through
//! any replica sees every sidecar.
//!
//! Key `PREFIX/nodes/REPLICA/NODE_ID`, value the node's row of `GET /status` (JSON), put under
//! a lease of the replica ([`LEASE_TTL`], renewed every [`RENEW`]): when the replica dies its
//! rows vanish within the lease's time; when it stops cleanly it revokes the lease. A replica
//! publishes a row when it changes (checked every [`PUBLISH_EVERY`]) and follows the others'
//! with a watch; while etcd is lost it shows only its own nodes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};

use super::{EtcdStore, Link, RETRY};
use crate::server::{Fleet, NodeStatus, Server};

/// How long a replica's rows outlive it.
pub const LEASE_TTL: Duration = Duration::from_secs(5);
/// How often the lease is renewed.
pub const RENEW: Duration = Duration::from_secs(1);
/// How often the connected nodes are compared with what was published.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(100);
/// Operations per etcd transaction (etcd's default limit is 128).
const OPS_PER_TXN: usize = 100;

/// One replica's view of the fleet.
pub struct FleetView {
    store: Arc<EtcdStore>,
    /// A connection of its own: the rows of a large fleet (every node's, rewritten after each
    /// push) must not queue the files' watch and the applies behind them.
    link: Link,
    replica: String,
    /// The other replicas' rows, by their etcd key.
    others: Mutex<BTreeMap<String, NodeStatus>>,
    /// The lease this replica's rows are under (0: none).
    lease: AtomicI64,
    /// [`Server::node_changes`] when the rows were last published (`u64::MAX`: never).
    published_at: AtomicU64,
}

impl std::fmt::Debug for FleetView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetView")
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl Fleet for FleetView {
    fn replica(&self) -> &str {
        &self.replica
    }

    fn others(&self) -> Vec<NodeStatus> {
        let others = self.others.lock().unwrap_or_else(|e| e.into_inner());
        others.values().cloned().collect()
    }
}

/// A lease and its renewal stream.
struct Lease {
    id: i64,
    keeper: etcd_client::LeaseKeeper,
    stream: etcd_client::LeaseKeepAliveStream,
    renewed: Instant,
}

impl FleetView {
    /// The view of replica `replica` (a name without `/`) of `store`'s fleet.
    ///
    /// # Errors
    /// The name is empty or holds a `/`.
    pub fn new(store: Arc<EtcdStore>, replica: &str) -> Result<Arc<FleetView>, String> {
        if replica.is_empty() || replica.contains('/') {
            return Err(format!(
                "{replica:?}: a replica name is not empty and has no '/'"
            ));
        }
        Ok(Arc::new(FleetView {
            link: Link::new(&store.url.endpoints),
            store,
            replica: replica.to_string(),
            others: Mutex::new(BTreeMap::new()),
            lease: AtomicI64::new(0),
            published_at: AtomicU64::new(u64::MAX),
        }))
    }

    fn nodes_prefix(&self) -> String {
        format!("{}/nodes/", self.store.url.prefix)
    }

    /// Publishes `server`'s connected nodes and follows the other replicas', forever.
    pub async fn run(self: Arc<Self>, server: Server) {
        tokio::join!(self.clone().publish(server), self.follow());
    }

    /// Ends this replica's lease, so that its rows leave the store at once (at shutdown).
    pub async fn revoke(&self) {
        let id = self.lease.swap(0, Ordering::Relaxed);
        if id == 0 {
            return;
        }
        if let Ok(mut c) = self.link.get().await {
            let _ = tokio::time::timeout(RETRY, c.lease_revoke(id)).await;
        }
    }

    async fn publish(self: Arc<Self>, server: Server) {
        let mut lease = None;
        let mut published = BTreeMap::new();
        loop {
            tokio::time::sleep(PUBLISH_EVERY).await;
            if let Err(e) = self.publish_once(&server, &mut lease, &mut published).await {
                tracing::debug!(error = %e, "publishing the connected nodes in etcd failed; again from the start");
                lease = None;
                published.clear();
                self.published_at.store(u64::MAX, Ordering::Relaxed);
                self.link.forget();
                tokio::time::sleep(RETRY).await;
            }
        }
    }

    async fn publish_once(
        &self,
        server: &Server,
        lease: &mut Option<Lease>,
        published: &mut BTreeMap<String, String>,
    ) -> Result<(), String> {
        let mut c = self.link.get().await?;
        let l = match lease {
            Some(l) => l,
            None => {
                let ttl = i64::try_from(LEASE_TTL.as_secs()).unwrap_or(5);
                let id = c
                    .lease_grant(ttl, None)
                    .await
                    .map_err(|e| format!("etcd lease grant: {e}"))?
                    .id();
                let (keeper, stream) = c
                    .lease_keep_alive(id)
                    .await
                    .map_err(|e| format!("etcd lease keep-alive: {e}"))?;
                self.lease.store(id, Ordering::Relaxed);
                lease.insert(Lease {
                    id,
                    keeper,
                    stream,
                    renewed: Instant::now(),
                })
            }
        };
        if l.renewed.elapsed() >= RENEW {
            l.keeper
                .keep_alive()
                .await
                .map_err(|e| format!("etcd lease keep-alive: {e}"))?;
            match l.stream.message().await {
                Ok(Some(r)) if r.ttl() > 0 => l.renewed = Instant::now(),
                Ok(_) => return Err("the lease expired".into()),
                Err(e) => return Err(format!("etcd lease keep-alive: {e}")),
            }
        }
        // The rows are read (and written) again only when a node's row may have changed.
        let changes = server.node_changes();
        if self.published_at.load(Ordering::Relaxed) == changes {
            return Ok(());
        }
        let now: BTreeMap<String, String> = server
            .connected_nodes()
            .into_iter()
            .map(|mut n| {
                n.replica = Some(self.replica.clone());
                let json = serde_json::to_string(&n).unwrap_or_default();
                (n.id, json)
            })
            .collect();
        let key = |id: &str| format!("{}{}/{id}", self.nodes_prefix(), self.replica);
        let mut ops = Vec::new();
        for (id, json) in &now {
            if published.get(id) != Some(json) {
                let opts = PutOptions::new().with_lease(l.id);
                ops.push(TxnOp::put(key(id), json.as_str(), Some(opts)));
            }
        }
        for id in published.keys().filter(|id| !now.contains_key(*id)) {
            ops.push(TxnOp::delete(key(id), None));
        }
        for chunk in ops.chunks(OPS_PER_TXN) {
            c.txn(Txn::new().and_then(chunk.to_vec()))
                .await
                .map_err(|e| format!("etcd txn: {e}"))?;
        }
        *published = now;
        self.published_at.store(changes, Ordering::Relaxed);
        Ok(())
    }

    async fn follow(self: Arc<Self>) {
        loop {
            if let Err(e) = self.follow_once().await {
                tracing::debug!(error = %e, "following the other replicas' nodes failed");
            }
            self.others
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
            tokio::time::sleep(RETRY).await;
        }
    }

    /// Reads the other replicas' rows, then follows them until the watch fails.
    async fn follow_once(&self) -> Result<(), String> {
        let mut c = self.link.get().await?;
        let prefix = self.nodes_prefix();
        let mine = format!("{prefix}{}/", self.replica);
        let got = c
            .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| format!("etcd get {prefix}: {e}"))?;
        let revision = got.header().map_or(0, |h| h.revision());
        let mut rows = BTreeMap::new();
        for kv in got.kvs() {
            if let Some((k, n)) = row(kv.key_str().ok(), kv.value(), &mine) {
                rows.insert(k, n);
            }
        }
        *self.others.lock().unwrap_or_else(|e| e.into_inner()) = rows;
        let mut stream = c
            .watch(
                prefix.as_str(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(revision + 1),
                ),
            )
            .await
            .map_err(|e| format!("etcd watch {prefix}: {e}"))?;
        loop {
            let Some(resp) = stream
                .message()
                .await
                .map_err(|e| format!("etcd watch: {e}"))?
            else {
                return Err("etcd closed the watch".into());
            };
            if resp.canceled() {
                return Err(format!(
                    "etcd cancelled the watch: {}",
                    resp.cancel_reason()
                ));
            }
            let mut others = self.others.lock().unwrap_or_else(|e| e.into_inner());
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                match ev.event_type() {
                    EventType::Put => {
                        if let Some((k, n)) = row(kv.key_str().ok(), kv.value(), &mine) {
                            others.insert(k, n);
                        }
                    }
                    EventType::Delete => {
                        if let Ok(k) = kv.key_str() {
                            others.remove(k);
                        }
                    }
                }
            }
        }
    }
}

/// Another replica's row: its key and the node (`None` for this replica's own keys and rows
/// that do not parse).
fn row(key: Option<&str>, value: &[u8], mine: &str) -> Option<(String, NodeStatus)> {
    let key = key?;
    if key.starts_with(mine) {
        return None;
    }
    let node: NodeStatus = serde_json::from_slice(value).ok()?;
    Some((key.to_string(), node))
}
