//! What the layer tests share: a mock inner service that records what it got and answers
//! scripted replies, requests as the route layer leaves them, and driving a service by hand
//! (`poll_ready` / `call` / `poll`).

#![allow(dead_code)]

use respway_filters::error::Failure;
use std::future::{ready, Future, Ready};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tower::Service;

use respway_filters::command::lookup;
use respway_filters::model::{
    Cluster, Config, Endpoint, HashPolicy, Listener, ReadPolicy, Role, RouteTable, Shard,
};
use respway_filters::request::{Reply, Request};
use respway_filters::routing::Routing;

/// Shard `name` with one primary, at 127.0.0.1:`port` (also its hash key), in `zone`.
pub fn shard(name: &str, port: u16, zone: Option<&str>) -> Shard {
    let address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    Shard {
        name: name.to_string(),
        hash_key: address.to_string(),
        weight: 1,
        slots: Vec::new(),
        endpoints: vec![Endpoint {
            address,
            role: Role::Primary,
            zone: zone.map(str::to_string),
        }],
        sentinel: None,
    }
}

/// Cluster `name` over `shards`: no hash tag, no hot keys, reads from primaries.
pub fn cluster(name: &str, hash: HashPolicy, shards: Vec<Shard>) -> Cluster {
    Cluster {
        tls: None,
        health_check: None,
        near_cache: None,
        redis_cluster: None,
        name: name.to_string(),
        hash,
        hashtag: None,
        shards,
        connections_per_endpoint: 1,
        databases: respway_filters::model::DEFAULT_DATABASES,
        dedicated_connections: respway_filters::model::DEFAULT_DEDICATED_CONNECTIONS,
        max_queue_per_connection: respway_filters::model::DEFAULT_MAX_QUEUE_PER_CONNECTION,
        connect_timeout: Duration::from_secs(1),
        auth: None,
        endpoint_auth: Vec::new(),
        db: 0,
        hot_keys: Vec::new(),
        read_policy: ReadPolicy::Primary,
    }
}

/// Routing of one listener (`l`, on 127.0.0.1:6380) with these routes over these clusters.
pub fn routing_of(routes: RouteTable, clusters: Vec<Cluster>, zone: Option<&str>) -> Arc<Routing> {
    let listener = Listener {
        observe: Default::default(),
        cluster_emulation: None,
        tls: None,
        name: "l".to_string(),
        address: "127.0.0.1:6380".parse().unwrap(),
        routes,
        downstream_password: None,
        users: Vec::new(),
        op_timeout: Duration::from_secs(1),
        max_pending_per_client: 1024,
        resp: Default::default(),
        client: Default::default(),
        limits: Default::default(),
    };
    let config = Config {
        listeners: vec![listener.clone()],
        clusters,
        zone: zone.map(str::to_string),
    };
    Arc::new(Routing::build(&config, &listener).unwrap())
}

type Answer = dyn Fn(&Request) -> Reply + Send + Sync;

/// Records every request; answers `answer(req)` at once; stops being ready once it has
/// taken `ready_for` calls.
#[derive(Clone)]
pub struct Mock {
    seen: Arc<Mutex<Vec<Request>>>,
    answer: Arc<Answer>,
    pub ready_for: usize,
}

impl Mock {
    pub fn new(answer: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Self {
        Mock {
            seen: Arc::default(),
            answer: Arc::new(answer),
            ready_for: usize::MAX,
        }
    }

    /// The requests taken so far, in call order.
    pub fn seen(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }
}

impl Service<Request> for Mock {
    type Response = Reply;
    type Error = Failure;
    type Future = Ready<Result<Reply, Failure>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        if self.seen.lock().unwrap().len() < self.ready_for {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let reply = (self.answer)(&req);
        self.seen.lock().unwrap().push(req);
        ready(Ok(reply))
    }
}

pub fn ok() -> Reply {
    Bytes::from_static(b"+OK\r\n")
}

/// A request as the route layer leaves it: command resolved, cluster and route set, route
/// prefix removed where the route says so.
pub fn request(routing: &Routing, argv: &[&str]) -> Request {
    let args: Vec<Bytes> = argv
        .iter()
        .map(|a| Bytes::copy_from_slice(a.as_bytes()))
        .collect();
    let cmd = lookup(&args[0]).unwrap().resolve(&args);
    let mut keys = Vec::new();
    cmd.key_indices(&args, &mut keys).unwrap();
    let mut req = Request::new(cmd, args, &keys);
    let m = match req.keys.first() {
        Some(i) => routing.route(&req.args[i]).unwrap(),
        None => routing.catch_all().unwrap(),
    };
    req.cluster = m.cluster;
    req.route = m.route;
    if let (Some(i), true) = (req.keys.first(), m.strip > 0) {
        req.args[i] = req.args[i].slice(m.strip..);
    }
    req
}

pub fn noop_cx() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

/// `poll_ready` (must be ready), `call`, and one poll (must be ready: the mock answers at once).
pub fn send<S>(svc: &mut S, req: Request) -> Reply
where
    S: Service<Request, Response = Reply, Error = Failure>,
    S::Future: Unpin,
{
    let mut cx = noop_cx();
    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut fut = svc.call(req);
    match Pin::new(&mut fut).poll(&mut cx) {
        Poll::Ready(Ok(r)) => r,
        // As the client reads it.
        Poll::Ready(Err(f)) => f.to_reply(),
        Poll::Pending => panic!("the reply should be ready"),
    }
}
