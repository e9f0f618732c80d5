//! `PrefixRouteLayer`: picks the cluster for a request from its key's prefix (Envoy's
//! `prefix_routes`): longest prefix wins, optional case-insensitive match, optional removal of
//! the prefix before forwarding, a catch-all for keys that match nothing and for key-less
//! commands. A multi-key command whose keys route to different clusters is refused.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::Either;
use tower::{Layer, Service};

use crate::request::{error_reply, Reply, Request};
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
    /// on one cluster.
    fn route(&self, req: &mut Request) -> Result<(), Reply> {
        if req.keys.is_empty() {
            return self.catch_all(req);
        }
        let mut cluster = None;
        for i in req.keys.iter() {
            let m = self
                .routing
                .route(&req.args[i])
                .ok_or_else(|| no_route(&req.args[i]))?;
            match cluster {
                None => {
                    cluster = Some(m.cluster);
                    req.route = m.route;
                }
                Some(c) if c != m.cluster => {
                    return Err(error_reply(
                        "ERR respway: keys in request route to different clusters",
                    ))
                }
                Some(_) => {}
            }
            if m.strip > 0 {
                req.args[i] = req.args[i].slice(m.strip..);
                // The client's bytes are no longer the command to send.
                req.raw = None;
            }
        }
        req.cluster = cluster.unwrap_or(0);
        Ok(())
    }

    fn catch_all(&self, req: &mut Request) -> Result<(), Reply> {
        let m = self
            .routing
            .catch_all()
            .ok_or_else(|| error_reply("ERR respway: no catch-all route for a key-less command"))?;
        req.cluster = m.cluster;
        req.route = m.route;
        Ok(())
    }
}

fn no_route(key: &[u8]) -> Reply {
    error_reply(&format!(
        "ERR respway: no route for key '{}'",
        String::from_utf8_lossy(key)
    ))
}

impl<S> Service<Request> for PrefixRoute<S>
where
    S: Service<Request, Response = Reply, Error = Infallible>,
{
    type Response = Reply;
    type Error = Infallible;
    type Future = Either<Ready<Result<Reply, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        match self.route(&mut req) {
            Ok(()) => Either::Right(self.inner.call(req)),
            Err(reply) => Either::Left(ready(Ok(reply))),
        }
    }
}
