//! # respway — the sidecar
//!
//! A map of the crate:
//! - [`start`] runs the data plane: `workers` threads, each with its own current-thread tokio
//!   runtime, its own `SO_REUSEPORT` listener socket per listener, its own sessions and its own
//!   upstream connections (Envoy's worker model: nothing on the request path is shared
//!   between workers but read-only config);
//! - `conn`: one client session (decode, dispatch, replies in order, backpressure);
//! - `stack`: the layer order of the chain;
//! - `upstream`: pooled, pipelined connections to the Redis shards;
//! - `local`: commands the proxy answers itself;
//! - `stats`: per-worker counters.

pub mod conn;
pub mod local;
pub mod stack;
pub mod stats;
pub mod upstream;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use respway_filters::hot_key::HotKeyStats;
use respway_filters::mirror::MirrorStats;
use respway_filters::model::{Cluster, Config, Role};
use respway_filters::routing::Routing;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;

use crate::conn::ListenerCtx;
use crate::stats::{ListenerStats, Registry};
use crate::upstream::{EndpointConfig, EndpointHandle, Endpoints};

/// Options of the process, as opposed to the configuration it serves.
#[derive(Debug, Clone)]
pub struct Options {
    /// Worker threads (Envoy's `--concurrency`).
    pub workers: usize,
}

/// A running data plane. Dropping it does not stop it; call [`Server::shutdown`].
#[derive(Debug)]
pub struct Server {
    addrs: Vec<SocketAddr>,
    stop: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
    registry: Arc<Registry>,
}

impl Server {
    /// The bound address of each listener, in configuration order (resolves port 0).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Counters summed over workers.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Stops accepting, closes every connection and joins the workers.
    pub fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.threads {
            let _ = t.join();
        }
    }

    /// Blocks until the workers end (they end on [`Server::shutdown`] from another handle
    /// or when the process is signalled).
    pub fn wait(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Starts the data plane for `config`.
///
/// # Errors
/// When a listener cannot be bound or the routing table cannot be built.
pub fn start(config: Config, opts: Options) -> io::Result<Server> {
    let workers = opts.workers.max(1);
    let config = Arc::new(config);
    let routings = config
        .listeners
        .iter()
        .map(|l| Routing::build(&config, l).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io::Error::other)?;
    let registry = Arc::new(Registry::default());
    let (stop, stop_rx) = watch::channel(false);
    let mut threads = Vec::with_capacity(workers);
    // Worker 0 binds first (resolving port 0); the others bind the same addresses with
    // SO_REUSEPORT so the kernel spreads connections over them.
    let mut addrs: Option<Vec<SocketAddr>> = None;
    for w in 0..workers {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<Vec<SocketAddr>>>();
        let bind_to: Vec<SocketAddr> = match &addrs {
            Some(a) => a.clone(),
            None => config.listeners.iter().map(|l| l.address).collect(),
        };
        let worker = Worker {
            config: config.clone(),
            routings: routings.clone(),
            registry: registry.clone(),
            workers,
            stop: stop_rx.clone(),
        };
        let t = std::thread::Builder::new()
            .name(format!("respway-worker-{w}"))
            .spawn(move || worker.run(bind_to, ready_tx))?;
        match ready_rx.recv() {
            Ok(Ok(bound)) => {
                if addrs.is_none() {
                    addrs = Some(bound);
                }
            }
            Ok(Err(e)) => {
                let _ = stop.send(true);
                for t in threads {
                    let _ = JoinHandle::join(t);
                }
                return Err(e);
            }
            Err(_) => return Err(io::Error::other("worker thread died during start")),
        }
        threads.push(t);
    }
    Ok(Server {
        addrs: addrs.unwrap_or_default(),
        stop,
        threads,
        registry,
    })
}

struct Worker {
    config: Arc<Config>,
    routings: Vec<Arc<Routing>>,
    registry: Arc<Registry>,
    workers: usize,
    stop: watch::Receiver<bool>,
}

impl Worker {
    fn run(
        mut self,
        bind_to: Vec<SocketAddr>,
        ready: std::sync::mpsc::Sender<io::Result<Vec<SocketAddr>>>,
    ) {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        rt.block_on(async move {
            let listeners = match bind_all(&bind_to) {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            };
            let bound = listeners
                .iter()
                .map(|l| l.local_addr())
                .collect::<io::Result<Vec<_>>>();
            let _ = ready.send(bound);
            // This worker's pools: one handle per (cluster, endpoint), shared by every
            // listener and connection of the worker.
            let endpoints = Arc::new(self.spawn_pools());
            let primaries: Arc<Vec<Vec<usize>>> = Arc::new(
                self.config
                    .clusters
                    .iter()
                    .map(|c| {
                        c.shards
                            .iter()
                            .map(|s| {
                                s.endpoints
                                    .iter()
                                    .position(|e| e.role == Role::Primary)
                                    .unwrap_or(0)
                            })
                            .collect()
                    })
                    .collect(),
            );
            for (i, listener) in listeners.into_iter().enumerate() {
                let stats = Arc::new(ListenerStats::default());
                self.registry.add(stats.clone());
                let ctx = Arc::new(ListenerCtx {
                    listener: self.config.listeners[i].clone(),
                    stats,
                    registry: self.registry.clone(),
                    workers: self.workers,
                });
                let routing = self.routings[i].clone();
                let (queue, mirror_rx) = stack::MirrorQueue::new();
                let parts = stack::Parts {
                    mirror_stats: Arc::new(MirrorStats::new(routing.clusters.len())),
                    hot_key_stats: Arc::new(HotKeyStats::new(&routing)),
                    routing,
                    endpoints: endpoints.clone(),
                    primaries: primaries.clone(),
                    mirror: Arc::new(queue),
                };
                self.registry
                    .add_filters(parts.mirror_stats.clone(), parts.hot_key_stats.clone());
                tokio::spawn(stack::run_mirror(
                    mirror_rx,
                    stack::shadow(&parts),
                    parts.mirror_stats.clone(),
                ));
                tokio::spawn(accept_loop(listener, parts, ctx));
            }
            while !*self.stop.borrow() {
                if self.stop.changed().await.is_err() {
                    break;
                }
            }
        });
        // Dropping the runtime cancels every session and connection task of this worker.
        drop(rt);
    }

    fn spawn_pools(&self) -> Endpoints {
        let mut by_addr: HashMap<(String, SocketAddr), EndpointHandle> = HashMap::new();
        let mut handle = |c: &Cluster, shard: &str, addr: SocketAddr| {
            by_addr
                .entry((c.name.clone(), addr))
                .or_insert_with(|| {
                    EndpointHandle::spawn(
                        endpoint_config(c, shard, addr),
                        c.connections_per_endpoint,
                    )
                })
                .clone()
        };
        Endpoints(
            self.config
                .clusters
                .iter()
                .map(|c| {
                    c.shards
                        .iter()
                        .map(|s| {
                            s.endpoints
                                .iter()
                                .map(|e| handle(c, &s.name, e.address))
                                .collect()
                        })
                        .collect()
                })
                .collect(),
        )
    }
}

fn endpoint_config(c: &Cluster, shard: &str, address: SocketAddr) -> EndpointConfig {
    EndpointConfig {
        address,
        label: format!("shard {shard} ({address})").into(),
        connect_timeout: c.connect_timeout,
        auth: c.auth.as_ref().map(|a| {
            let mut v = Vec::new();
            if let Some(u) = &a.username {
                v.push(Bytes::from(u.clone()));
            }
            v.push(Bytes::from(a.password.clone()));
            v
        }),
        db: c.db,
    }
}

fn bind_all(addrs: &[SocketAddr]) -> io::Result<Vec<TcpListener>> {
    addrs
        .iter()
        .map(|&addr| {
            let socket = if addr.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            socket.set_reuseaddr(true)?;
            socket.set_reuseport(true)?;
            socket.bind(addr)?;
            socket.listen(1024)
        })
        .collect()
}

async fn accept_loop(listener: TcpListener, parts: stack::Parts, ctx: Arc<ListenerCtx>) {
    let mut backoff = std::time::Duration::from_millis(5);
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                backoff = std::time::Duration::from_millis(5);
                ctx.stats.connections.inc();
                let chain = stack::build(&parts);
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    ctx.stats
                        .active
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    conn::serve(stream, chain, ctx.clone()).await;
                    ctx.stats
                        .active
                        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(1));
            }
        }
    }
}
