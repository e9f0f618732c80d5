//! The management server: state-of-the-world ADS
//! (`envoy.service.discovery.v3.AggregatedDiscoveryService.StreamAggregatedResources`) over the
//! [`Cache`], plus per-node ACK/NACK status for the admin endpoint.
//!
//! # Protocol
//! One task per ADS stream follows the cache's snapshots and the stream's requests:
//! - The first request must carry `node`; its `id` and `locality.zone` pick the node's snapshot
//!   (see [`crate::cache`] for the merge rules). Later `node`s are ignored.
//! - LDS and CDS subscriptions are wildcard (an empty `resource_names`, or `"*"`); EDS names its
//!   cluster load assignments (a first EDS request with no names, or `"*"`, is wildcard too).
//!   Other type URLs are not served (no response).
//! - A request with an empty `response_nonce` opens (or reopens) a subscription and is answered
//!   at once with the current resources, whatever `version_info` it carries (the client
//!   compares content). A request whose nonce is not the latest sent for its type is stale and
//!   ignored. A current ACK or NACK (`error_detail` set) is answered only when its
//!   `resource_names` changed the subscription.
//! - When a new snapshot is committed, every stream pushes the types whose content for its
//!   subscription changed, in make-before-break order: CDS, EDS, then LDS. A push does not
//!   wait for the previous response's ACK: the client answers the latest nonce.
//! - Every response carries a new nonce (unique per stream: the stream's number and a
//!   counter) and the resources' `version_info` (see [`crate::cache`]: a hash of that type's
//!   content for the node, the same from every server serving the same files).
//! - A node no file is for gets no response; it keeps what it has.
//! - Delta xDS is answered with `UNIMPLEMENTED`.
//!
//! Per node id, the server records the last version sent, the last version ACKed and the last
//! NACK (version, nonce and error), apart: which response a request answers is known by its
//! nonce, and a request with `error_detail` is a NACK whatever its `version_info`.
//! [`Server::status`] and the admin `GET /status` show it. Nodes stay listed after they disconnect (as not connected),
//! until the server restarts.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::ControlPlane;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use respway_tls::rustls::pki_types::CertificateDer;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status as GrpcStatus, Streaming};

use crate::secure::{PeerInfo, Security};
use admin_state::{AdminLimits, AdminState, AdminStats};

use crate::cache::{Cache, FileState, NodeSnapshot, ResourceType, Snapshot, TypeResources};

/// How often [`Server::serve`] scans the resource directory by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// The `control_plane.identifier` of every response.
const CONTROL_PLANE: &str = concat!("respway-xds/", env!("CARGO_PKG_VERSION"));

// === Server ===

/// The management server: a [`Cache`] over a resource directory, served over ADS, with an
/// optional admin HTTP endpoint ([`crate::admin`]). Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct Server {
    pub(crate) cache: Arc<Cache>,
    registry: Arc<Registry>,
    pub(crate) poll_interval: Duration,
    pub(crate) security: Arc<Security>,
    admin: Arc<AdminState>,
    /// Failed accepts on the ADS port.
    pub(crate) ads_accept_errors: Arc<AtomicU64>,
    /// The other replicas' nodes, with a shared store.
    fleet: Arc<FleetSlot>,
}

impl Server {
    /// A server over the resource files in `resources_dir`, loaded now (blocking file I/O);
    /// invalid files are logged and reported in [`Server::status`].
    pub fn new(resources_dir: impl Into<PathBuf>) -> Server {
        let cache = Arc::new(Cache::new(resources_dir));
        cache.reload();
        Server::from_cache(cache)
    }

    /// A server over an existing cache (loaded or not).
    pub fn from_cache(cache: Arc<Cache>) -> Server {
        Server {
            cache,
            registry: Arc::new(Registry::default()),
            poll_interval: DEFAULT_POLL_INTERVAL,
            security: Arc::new(Security::default()),
            admin: Arc::new(AdminState::new(AdminLimits::default())),
            ads_accept_errors: Arc::new(AtomicU64::new(0)),
            fleet: Arc::new(FleetSlot::default()),
        }
    }

    /// Shows the nodes of the other replicas of a shared store in [`Server::status`] (once;
    /// later calls change nothing).
    pub fn set_fleet(&self, fleet: Arc<dyn Fleet>) {
        let _ = self.fleet.0.set(fleet);
    }

    /// A count that moves whenever a node's row of [`Server::status`] may have changed (a
    /// stream opened or closed, a response sent, an ACK or NACK): compare two readings.
    pub fn node_changes(&self) -> u64 {
        self.registry.changes.load(Ordering::Relaxed)
    }

    /// The nodes whose streams are open on this replica, as [`Server::status`] lists them
    /// (what a shared store publishes for the other replicas).
    pub fn connected_nodes(&self) -> Vec<NodeStatus> {
        let mut nodes = self.registry.status(&self.cache.snapshot());
        nodes.retain(|n| n.connected);
        nodes
    }

    /// Sets the admin port's connection cap and idle timeout (default [`AdminLimits::default`]).
    pub fn with_admin_limits(mut self, limits: AdminLimits) -> Server {
        self.admin = Arc::new(AdminState::new(limits));
        self
    }

    pub(crate) fn admin_state(&self) -> &Arc<AdminState> {
        &self.admin
    }

    /// Sets who may connect and what they get ([`crate::secure`]); default: plaintext, no
    /// admin credentials (so `POST /apply` answers 401), secrets only to authenticated nodes.
    pub fn with_security(mut self, security: Security) -> Server {
        self.security = Arc::new(security);
        self
    }

    /// The security settings.
    pub fn security(&self) -> &Security {
        &self.security
    }

    /// Sets how often [`Server::serve`] scans the directory (default
    /// [`DEFAULT_POLL_INTERVAL`]).
    pub fn with_poll_interval(mut self, interval: Duration) -> Server {
        self.poll_interval = interval;
        self
    }

    /// The snapshot cache.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// The served version, the resource files' state and every node's ACK/NACK state.
    pub fn status(&self) -> ServerStatus {
        let report = self.cache.report();
        ServerStatus {
            version: report.version,
            files: report
                .files
                .into_iter()
                .map(|f| match f.state {
                    FileState::Ok => FileStatus {
                        name: f.name,
                        ok: true,
                        error: None,
                        serving_previous: false,
                    },
                    FileState::Invalid {
                        error,
                        serving_previous,
                    } => FileStatus {
                        name: f.name,
                        ok: false,
                        error: Some(error),
                        serving_previous,
                    },
                })
                .collect(),
            errors: report.errors,
            unserved: report.unserved,
            nodes: match self.fleet.0.get() {
                None => self.registry.status(&self.cache.snapshot()),
                Some(f) => fleet::merge(
                    self.registry.status(&self.cache.snapshot()),
                    f.replica(),
                    f.others(),
                ),
            },
            refusals: self.registry.refusals(),
            admin: self.admin.stats(),
            ads_accept_errors: self.ads_accept_errors.load(Ordering::Relaxed),
            store: self.cache.store_status(),
        }
    }

    /// The ADS service alone, for embedding in another tonic server; its streams end when
    /// `stop` changes or its sender is dropped.
    pub fn ads_service(
        &self,
        stop: watch::Receiver<bool>,
    ) -> AggregatedDiscoveryServiceServer<Ads> {
        AggregatedDiscoveryServiceServer::new(Ads {
            cache: self.cache.clone(),
            registry: self.registry.clone(),
            security: self.security.clone(),
            stop,
            next_stream: Arc::new(AtomicU64::new(1)),
        })
        .max_decoding_message_size(64 << 20)
    }
}

/// Aborts the task when dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) mod admin_state;
mod ads;
mod fleet;
mod status;

pub use ads::Ads;
pub use fleet::Fleet;
use fleet::FleetSlot;
pub use status::*;
