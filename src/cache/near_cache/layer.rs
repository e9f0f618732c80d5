//! The near cache as a service of the chain, between the zone layer and the upstream: a hit
//! is answered without a round trip, a miss rides to the upstream as a fill (told of the
//! reply), and a tracking client's reads are followed or announced. A cluster without a
//! cache, and a session that does not track, pass straight through.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use respway_filters::error::Failure;
use respway_filters::request::{Reply, Request};
use tower::Service;

use super::{clients, ClusterCache, Lookup};
use crate::upstream::{Rider, Upstream, UpstreamFuture};

/// See the module.
#[derive(Debug, Clone)]
pub(crate) struct NearCache {
    upstream: Upstream,
    /// Per cluster, this worker's cache (`None`: no cache).
    caches: Arc<Vec<Option<Arc<ClusterCache>>>>,
}

impl NearCache {
    pub(crate) fn new(upstream: Upstream, caches: Arc<Vec<Option<Arc<ClusterCache>>>>) -> Self {
        NearCache { upstream, caches }
    }
}

/// The keys of `req`.
fn key_args(req: &Request) -> impl Iterator<Item = Bytes> + '_ {
    req.keys.iter().filter_map(|i| req.args.get(i)).cloned()
}

/// A tracking client's keys of a replica read, announced if the primary answers instead.
#[derive(Debug)]
struct ClientKeys(Box<[Bytes]>);

impl Rider for ClientKeys {
    fn done(self: Box<Self>, _: &Bytes) {}

    fn abandon(self: Box<Self>) {
        clients::unfollowed(self.0.into_vec().into_iter());
    }
}

impl Service<Request> for NearCache {
    type Response = Reply;
    type Error = Failure;
    type Future = UpstreamFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        self.upstream.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> UpstreamFuture {
        let cache = self.caches.get(req.cluster).and_then(Option::as_ref);
        let track = req.flavor.track && req.is_read();
        if cache.is_none() && !track {
            return self.upstream.call(req);
        }
        let Some((ep, replica_read)) = self.upstream.endpoint_of(&req) else {
            return self.upstream.call(req);
        };
        let mut fill = None;
        if let Some(cache) = cache {
            match cache.lookup(&req, ep) {
                Lookup::Pass => {}
                Lookup::Hit(reply) => {
                    if req.flavor.track && !cache.hits_are_followed() {
                        clients::unfollowed(key_args(&req));
                    }
                    let deadline = self.upstream.deadline_of(&req);
                    return UpstreamFuture::ready(reply, ep.label().clone(), deadline);
                }
                Lookup::Fill(f) => fill = Some(f),
            }
        }
        // A tracking client's read: Redis follows its keys, or they are announced.
        if track {
            fill = match cache {
                Some(cache) => cache.follow_for_client(&req, ep, fill),
                None => {
                    clients::unfollowed(key_args(&req));
                    None
                }
            };
        }
        let on_fallback = (req.flavor.track && replica_read)
            .then(|| Box::new(ClientKeys(key_args(&req).collect())) as Box<dyn Rider>);
        let fill = fill.map(|f| f as Box<dyn Rider>);
        self.upstream.call_riding(req, fill, on_fallback)
    }
}
