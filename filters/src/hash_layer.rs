//! `HashLayer`: picks the shard for a request's key with its cluster's picker (maglev, ring
//! hash, ketama, modula, crc32/crc16 slots — see [`crate::hash`]), unless an outer layer has
//! already pinned one (split, hot key). Key-less requests go to the cluster's first shard.

use std::sync::Arc;
use std::task::{Context, Poll};

use tower::{Layer, Service};

use crate::error::Failure;
use crate::request::{Reply, Request};
use crate::routing::Routing;

/// Builds [`Hash`] services over one routing table.
#[derive(Debug, Clone)]
pub struct HashLayer {
    routing: Arc<Routing>,
}

impl HashLayer {
    /// A layer hashing with the pickers of `routing`.
    pub fn new(routing: Arc<Routing>) -> Self {
        HashLayer { routing }
    }
}

impl<S> Layer<S> for HashLayer {
    type Service = Hash<S>;
    fn layer(&self, inner: S) -> Hash<S> {
        Hash {
            inner,
            routing: self.routing.clone(),
        }
    }
}

/// Sets [`Request::shard`] when no outer layer pinned it.
#[derive(Debug, Clone)]
pub struct Hash<S> {
    inner: S,
    routing: Arc<Routing>,
}

// === impl Hash ===

impl<S> Hash<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Service<Request> for Hash<S>
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
        if req.shard.is_none() {
            let shard = match req.first_key() {
                Some(key) => self.routing.clusters[req.cluster].picker.pick(key),
                None => 0,
            };
            req.pin_shard(shard);
        }
        self.inner.call(req)
    }
}
