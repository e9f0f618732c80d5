//! `PrefixRouteLayer`: picks the cluster for a request from its key's prefix (Envoy's
//! `prefix_routes`): longest prefix wins, optional case-insensitive match, optional removal of
//! the prefix before forwarding, a catch-all for keys that match nothing and for key-less
//! commands. A multi-key command whose keys route to different clusters is refused.

use std::future::{ready, Ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::Either;
use tower::{Layer, Service};

use crate::error::Failure;
use crate::place::Refusal;
use crate::request::{Reply, Request};
use crate::routing::Routing;

/// Builds [`PrefixRoute`] services over one routing table.
#[derive(Debug, Clone)]
pub struct PrefixRouteLayer {
    routing: Arc<Routing>,
}

impl PrefixRouteLayer {
    /// A layer routing by `routing`.
    pub fn new(routing: Arc<Routing>) -> Self {
        PrefixRouteLayer { routing }
    }
}

impl<S> Layer<S> for PrefixRouteLayer {
    type Service = PrefixRoute<S>;
    fn layer(&self, inner: S) -> PrefixRoute<S> {
        PrefixRoute {
            inner,
            routing: self.routing.clone(),
        }
    }
}

/// Sets [`Request::cluster`] (and strips route prefixes) before calling the inner service.
#[derive(Debug, Clone)]
pub struct PrefixRoute<S> {
    inner: S,
    routing: Arc<Routing>,
}

// === impl PrefixRoute ===

impl<S> PrefixRoute<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Routes by every key of `req`, at the positions the session computed
    /// ([`Request::keys`]): a single-key command has one, a multi-key one needs all its keys
    /// on one cluster; a key-less one takes the catch-all ([`Routing::route_keys`]).
    #[inline]
    fn route(&self, req: &mut Request) -> Result<(), Refusal> {
        let (cluster, route, rewritten) =
            self.routing.route_keys(&mut req.args, req.keys.iter())?;
        req.cluster = cluster;
        req.route = route;
        if rewritten {
            // The client's bytes are no longer the command to send.
            req.raw = None;
        }
        Ok(())
    }
}

impl<S> Service<Request> for PrefixRoute<S>
where
    S: Service<Request, Response = Reply, Error = Failure>,
{
    type Response = Reply;
    type Error = Failure;
    type Future = Either<Ready<Result<Reply, Failure>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        match self.route(&mut req) {
            Ok(()) => Either::Right(self.inner.call(req)),
            Err(r) => Either::Left(ready(Err(r.into()))),
        }
    }
}
