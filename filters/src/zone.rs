//! `ZoneLayer`: picks the endpoint of the request's shard — the innermost choice before the
//! upstream pool. It sits after `hash` because it needs the shard, and right before the
//! upstream because the endpoint is the upstream's address.
//!
//! - Writes (and every command without Redis's `readonly` flag, see [`Request::is_read`]) go
//!   to the shard's primary, healthy or not: a replica cannot take them, and the upstream
//!   turns a dead primary into an error reply.
//! - Reads follow the cluster's [`ReadPolicy`]:
//!
//! | policy | endpoint |
//! |---|---|
//! | `Primary` | the primary |
//! | `PreferReplica` | a healthy replica, round-robin; else the primary |
//! | `ZoneLocal { fallback: Primary }` | a healthy replica in our zone, round-robin; else the primary |
//! | `ZoneLocal { fallback: AnyReplica }` | a healthy replica in our zone; else a healthy replica in another zone; else the primary |
//! | `Any` | any healthy endpoint, primary included, round-robin; else the primary |
//!
//! Health comes from a [`HealthView`] (the upstream pools know which endpoints refuse
//! connections or are in backoff). An unhealthy endpoint is skipped until it recovers; the
//! primary is the last resort whatever its health, so every request still gets a reply.
//!
//! The round-robin cursor is per connection (each connection has its own stack), so the hot
//! path shares no atomic with other connections. The cursor moves to just past the endpoint
//! it chose, so the rotation stays even when unhealthy or non-matching endpoints sit between
//! the candidates. Nothing here allocates, and a shard with one endpoint or a `Primary` policy
//! costs no health lookup at all.
//!
//! The zone layer is the only one that sets [`Request::endpoint`]; it always sets it (to
//! `Some`), replacing whatever an outer layer left there, and [`Request::primary`] with it
//! (the upstream's replica-read fallback target). A shard index outside the cluster
//! (which the outer layers never produce) leaves the request untouched for the upstream to
//! reject.

use std::sync::Arc;
use std::task::{Context, Poll};

use tower::{Layer, Service};

use crate::error::Failure;
use crate::model::{ReadPolicy, Role, ZoneFallback};
use crate::request::{Reply, Request};
use crate::routing::{EndpointRoute, Routing};

/// Which endpoints are usable right now, as the upstream pools see them.
///
/// Implementations are read on the request path for every read that may go to a replica, so
/// `healthy` must be cheap (an atomic load, no lock held across awaits, no allocation).
pub trait HealthView: Send + Sync + std::fmt::Debug {
    /// False while this endpoint is failing (connect refused, in backoff); such endpoints are
    /// skipped until they recover. Indices are those of [`Routing::clusters`],
    /// [`ClusterRoute::shards`](crate::routing::ClusterRoute::shards) and
    /// [`ShardRoute::endpoints`](crate::routing::ShardRoute::endpoints).
    fn healthy(&self, cluster: usize, shard: usize, endpoint: usize) -> bool;
}

/// A [`HealthView`] that calls every endpoint healthy (for tests, tools and before the pools
/// report anything).
#[derive(Debug, Clone, Copy, Default)]
pub struct AllHealthy;

impl HealthView for AllHealthy {
    fn healthy(&self, _cluster: usize, _shard: usize, _endpoint: usize) -> bool {
        true
    }
}

// === impl ZoneLayer ===

/// Builds [`Zone`] services over one routing table and one health view.
#[derive(Debug, Clone)]
pub struct ZoneLayer {
    routing: Arc<Routing>,
    health: Arc<dyn HealthView>,
    rr_start: usize,
}

impl ZoneLayer {
    /// A layer choosing endpoints by the read policies of `routing`, skipping endpoints that
    /// `health` reports as failing.
    pub fn new(routing: Arc<Routing>, health: Arc<dyn HealthView>) -> Self {
        ZoneLayer {
            routing,
            health,
            rr_start: 0,
        }
    }

    /// Where the round-robin cursor of the services built from here starts (default 0).
    ///
    /// Every connection starting at 0 sends the first read of each connection to the same
    /// replica; a session that opens many short connections can pass a per-connection number
    /// (a connection counter) to spread them.
    pub fn with_rr_start(mut self, start: usize) -> Self {
        self.rr_start = start;
        self
    }
}

impl<S> Layer<S> for ZoneLayer {
    type Service = Zone<S>;

    fn layer(&self, inner: S) -> Zone<S> {
        Zone {
            inner,
            routing: self.routing.clone(),
            health: self.health.clone(),
            rr: self.rr_start,
        }
    }
}

// === impl Zone ===

/// Sets [`Request::endpoint`] to the index, within the request's shard, of the endpoint that
/// serves it.
#[derive(Debug, Clone)]
pub struct Zone<S> {
    inner: S,
    routing: Arc<Routing>,
    health: Arc<dyn HealthView>,
    /// Per-connection round-robin cursor: the next search starts at `rr % endpoints`.
    rr: usize,
}

impl<S> Zone<S> {
    /// Wraps `inner` directly (what [`ZoneLayer::layer`] does), with the cursor at 0.
    pub fn new(inner: S, routing: Arc<Routing>, health: Arc<dyn HealthView>) -> Self {
        Zone {
            inner,
            routing,
            health,
            rr: 0,
        }
    }

    /// A layer building this service; see [`ZoneLayer::new`].
    pub fn layer(routing: Arc<Routing>, health: Arc<dyn HealthView>) -> ZoneLayer {
        ZoneLayer::new(routing, health)
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The endpoint for `req` within shard `shard` of cluster `cluster` and the shard's
    /// primary, or `None` when the routing table has no such shard.
    fn choose(&mut self, req: &Request, cluster: usize, shard: usize) -> Option<(usize, usize)> {
        let c = self.routing.clusters.get(cluster)?;
        let s = c.shards.get(shard)?;
        let primary = s.primary;
        if !req.is_read() || s.endpoints.len() <= 1 {
            return Some((primary, primary));
        }
        let mut pick = |want: fn(&EndpointRoute) -> bool| {
            round_robin(&mut self.rr, &s.endpoints, want, |e| {
                self.health.healthy(cluster, shard, e)
            })
        };
        let chosen = match c.read_policy {
            ReadPolicy::Primary => None,
            ReadPolicy::PreferReplica => pick(is_replica),
            ReadPolicy::ZoneLocal { fallback } => {
                pick(is_local_replica).or_else(|| match fallback {
                    ZoneFallback::Primary => None,
                    ZoneFallback::AnyReplica => pick(is_remote_replica),
                })
            }
            ReadPolicy::Any => pick(|_| true),
        };
        Some((chosen.unwrap_or(primary), primary))
    }
}

impl<S> Service<Request> for Zone<S>
where
    S: Service<Request, Response = Reply, Error = Failure>,
{
    type Response = Reply;
    type Error = Failure;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> S::Future {
        let shard = req.shard_index().unwrap_or(0);
        if let Some((endpoint, primary)) = self.choose(&req, req.cluster, shard) {
            // (A shard has at most `u16::MAX` endpoints: the routing table refuses more.)
            req.endpoint = Some(endpoint as u16);
            req.primary = primary as u16;
        }
        self.inner.call(req)
    }
}

fn is_replica(e: &EndpointRoute) -> bool {
    e.role == Role::Replica
}

fn is_local_replica(e: &EndpointRoute) -> bool {
    e.role == Role::Replica && e.local
}

fn is_remote_replica(e: &EndpointRoute) -> bool {
    e.role == Role::Replica && !e.local
}

/// The first endpoint at or after `*rr` (cyclically) that `want`s and is `healthy`; moves
/// `*rr` just past it. Health is asked only of endpoints `want` accepts, in cursor order, and
/// only until one is found. `None` (cursor unchanged) when no endpoint qualifies.
fn round_robin(
    rr: &mut usize,
    endpoints: &[EndpointRoute],
    want: fn(&EndpointRoute) -> bool,
    healthy: impl Fn(usize) -> bool,
) -> Option<usize> {
    let n = endpoints.len();
    if n == 0 {
        return None;
    }
    let start = *rr % n;
    let found = (start..n)
        .chain(0..start)
        .find(|&i| want(&endpoints[i]) && healthy(i))?;
    *rr = found + 1;
    Some(found)
}
