//! Discovery: which endpoints exist and which are usable, decided beside the request path
//! (Envoy's cluster manager: discovery and health apart from the connection pools).
//!
//! - `endpoints`: the connection settings of one configured endpoint;
//! - `sentinel`: the primaries and replicas of Sentinel-managed shards, followed on a thread
//!   of their own and swapped in by compiling the configuration again;
//! - `redis_cluster`: the shards of Redis Clusters (slots, primaries, replicas) discovered
//!   from seed nodes and followed the same way;
//! - `watchers`: the side-thread loop of those two: a task per master or cluster the current
//!   configuration names;
//! - `health`: active health checks of endpoints (`PING` or `EXISTS drain_key`, and `ROLE`),
//!   on a thread of their own, their verdicts shared with the workers through atomics;
//! - `peers`: whether the sidecars a listener's cluster emulation announces answer (a `PING`
//!   every second, on the health-check thread), shared with the workers the same way.

pub(crate) mod commands;
pub(crate) mod endpoints;
pub(crate) mod health;
pub(crate) mod peers;
pub(crate) mod redis_cluster;
pub(crate) mod sentinel;
pub(crate) mod watchers;

use std::sync::Arc;

use respway_filters::routing::Routing;
use tokio::sync::watch;

use crate::net::tls::UpstreamTlsConfig;

/// One configuration now serving, as discovery and the side threads see it: what a scrape
/// sees of it (its model among them), and more (the runtime's compiled snapshot implements
/// it).
pub(crate) trait Serving: crate::stats::Served {
    /// The TLS settings to the shards of cluster `cluster` (`None`: plain TCP).
    fn upstream_tls(&self, cluster: usize) -> Option<UpstreamTlsConfig>;
    /// The routing table of the first listener.
    fn first_routing(&self) -> Option<&Arc<Routing>>;
}

/// What discovery and the side threads may see of the running sidecar and ask of it: the
/// configuration now serving, a signal at each change, the state discovery keeps there, and
/// "compile the configuration again with what was found". The runtime implements it;
/// nothing below the runtime sees the runtime itself.
pub(crate) trait Running: Send + Sync + std::fmt::Debug + 'static {
    /// The configuration now serving.
    fn serving(&self) -> Arc<dyn Serving>;
    /// Hears of each configuration published.
    fn subscribe(&self) -> watch::Receiver<u64>;
    /// Compiles the configuration again with what discovery found and publishes it.
    fn republish(&self) -> Result<u64, String>;
    /// The primaries and replicas of Sentinel-managed shards, as last found.
    fn sentinels(&self) -> &sentinel::Discovery;
    /// The shards of Redis Clusters, as last found.
    fn redis_clusters(&self) -> &redis_cluster::Discovery;
    /// Active health-check state per endpoint.
    fn checks(&self) -> &health::Checks;
    /// Whether each address announced by a listener's cluster emulation answers.
    fn peers(&self) -> &peers::Peers;
    /// The commands learned from the shards.
    fn learned(&self) -> &Arc<respway_filters::command::learned::Learned>;
}

/// How discovery and the side threads hold the running sidecar.
pub(crate) type Handle = Arc<dyn Running>;
