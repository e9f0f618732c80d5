//! The only place the layer order is written. Outermost first:
//!
//! 1. `prefix_route` — picks the cluster from the key prefix. It runs first because every later
//!    layer works within one cluster (its pickers, its shards).
//! 2. `multi_key` — splits MGET/MSET/DEL/... per shard and checks same-shard commands. It
//!    needs the cluster, and must run before hashing so that each sub-request is pinned to
//!    its own shard.
//! 3. `hash` — picks the shard of single-key requests; skips requests already pinned.
//! 4. `upstream` — sends to the shard's primary over this worker's pooled connections.
//!
//! Mirroring, hot keys and zone-local replica choice slot in between as issue 3 lands.

use std::convert::Infallible;
use std::future::Ready;
use std::sync::Arc;

use futures_util::future::Either;
use respway_filters::hash_layer::{Hash, HashLayer};
use respway_filters::multi_key::{self, MultiKey, MultiKeyLayer};
use respway_filters::prefix_route::{PrefixRoute, PrefixRouteLayer};
use respway_filters::request::Reply;
use respway_filters::routing::Routing;
use tower::ServiceBuilder;

use crate::upstream::{EndpointHandle, Upstream, UpstreamFuture};

/// The whole chain for one connection.
pub type Chain = PrefixRoute<MultiKey<Hash<Upstream>>>;

/// What the chain returns for one request.
pub type ChainFuture =
    Either<Ready<Result<Reply, Infallible>>, multi_key::ResponseFuture<UpstreamFuture>>;

/// Builds the chain over `routing` and this worker's endpoint handles.
pub fn build(routing: &Arc<Routing>, endpoints: &Arc<Vec<Vec<EndpointHandle>>>) -> Chain {
    ServiceBuilder::new()
        .layer(PrefixRouteLayer::new(routing.clone()))
        .layer(MultiKeyLayer::new(routing.clone()))
        .layer(HashLayer::new(routing.clone()))
        .service(Upstream::new(endpoints.clone()))
}
