//! # respway — the sidecar
//!
//! A map of the crate:
//! - [`start`] runs the data plane: `workers` threads, each with its own current-thread tokio
//!   runtime, its own `SO_REUSEPORT` listener socket per listener, its own sessions and its own
//!   upstream connections (Envoy's worker model: nothing on the request path is shared
//!   between workers but read-only config);
//! - [`Server::apply`] hot-swaps the configuration: it is validated and compiled once, stored
//!   in an `ArcSwap`, and each worker rebuilds its chain parts, reusing the connections to
//!   endpoints that remain; sessions pick the new parts up before their next request, and
//!   requests in flight finish on the chain they started with;
//! - `conn`: one client session (decode, dispatch, replies in order, backpressure);
//! - `stack`: the layer order of the chain;
//! - `upstream`: pooled, pipelined connections to the Redis shards;
//! - `local`: commands the proxy answers itself;
//! - `stats`: per-worker counters.

pub mod admin;
pub mod bootstrap;
pub mod conn;
pub mod fanout;
pub mod hotkeys;
pub mod local;
pub mod metrics;
pub mod slowlog;
pub mod stack;
pub mod stats;
pub mod tx;
pub mod upstream;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use arc_swap::ArcSwap;
use bytes::Bytes;
use respway_filters::hot_key::HotKeyStats;
use respway_filters::mirror::MirrorStats;
use respway_filters::model::{Cluster, Config, Role};
use respway_filters::routing::Routing;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;

use crate::conn::{ListenerCtx, ListenerSlot};
use crate::stats::{ListenerStats, Registry};
use crate::upstream::{EndpointConfig, EndpointHandle, Endpoints, UpstreamStats};

/// Options of the process, as opposed to the configuration it serves.
#[derive(Debug, Clone)]
pub struct Options {
    /// Worker threads (Envoy's `--concurrency`).
    pub workers: usize,
    /// Hot-key detection takes one key in this many (0: off).
    pub hot_key_sample: u64,
    /// Commands at least this slow (µs) go to the slow log.
    pub slowlog_threshold_us: u64,
    /// Slow-log entries kept per worker and listener.
    pub slowlog_max_len: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            workers: 1,
            hot_key_sample: hotkeys::DEFAULT_SAMPLE,
            slowlog_threshold_us: slowlog::DEFAULT_THRESHOLD_US,
            slowlog_max_len: slowlog::DEFAULT_MAX_LEN,
        }
    }
}

/// One validated, compiled configuration.
#[derive(Debug)]
pub struct Snapshot {
    /// Increases by one with every applied configuration (the first is 1).
    pub version: u64,
    /// The model.
    pub config: Arc<Config>,
    /// Compiled routing per listener, in listener order.
    pub routings: Vec<Arc<Routing>>,
}

/// What every worker shares: the current snapshot and a way to hear of the next one.
#[derive(Debug)]
struct Shared {
    current: ArcSwap<Snapshot>,
    changed: watch::Sender<u64>,
    /// Serializes `apply` (config changes are rare; the request path never takes it).
    apply_lock: std::sync::Mutex<()>,
}

/// A running data plane. Dropping it does not stop it; call [`Server::shutdown`].
#[derive(Debug)]
pub struct Server {
    addrs: Vec<SocketAddr>,
    stop: watch::Sender<Stop>,
    threads: Vec<JoinHandle<()>>,
    registry: Arc<Registry>,
    handle: ConfigHandle,
}

/// Applies configuration changes to a running [`Server`]; cheap to clone, usable from any
/// thread (the xDS client and the SIGHUP reload hold one).
#[derive(Debug, Clone)]
pub struct ConfigHandle {
    shared: Arc<Shared>,
}

impl ConfigHandle {
    /// Validates and compiles `config`, then publishes it to every worker.
    ///
    /// # Errors
    /// A message naming what is wrong; the running configuration is left unchanged. The set
    /// of listeners (names and addresses) cannot change without a restart.
    pub fn apply(&self, config: Config) -> Result<u64, String> {
        let _guard = self
            .shared
            .apply_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let old = self.shared.current.load_full();
        let same_listeners = old.config.listeners.len() == config.listeners.len()
            && old
                .config
                .listeners
                .iter()
                .zip(&config.listeners)
                .all(|(a, b)| a.name == b.name && a.address == b.address);
        if !same_listeners {
            return Err(
                "listeners: adding, removing, renaming or moving a listener needs a restart"
                    .to_string(),
            );
        }
        let version = old.version + 1;
        let snapshot = compile(config, version)?;
        self.shared.current.store(Arc::new(snapshot));
        self.shared.changed.send_replace(version);
        Ok(version)
    }

    /// The snapshot being served.
    pub fn current(&self) -> Arc<Snapshot> {
        self.shared.current.load_full()
    }
}

impl Server {
    /// The bound address of each listener, in configuration order (resolves port 0).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Worker threads.
    pub fn workers(&self) -> usize {
        self.threads.len()
    }

    /// Counters summed over workers.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// A handle that applies configuration changes.
    pub fn config_handle(&self) -> ConfigHandle {
        self.handle.clone()
    }

    /// Shorthand for `config_handle().apply(config)`.
    ///
    /// # Errors
    /// As [`ConfigHandle::apply`].
    pub fn apply(&self, config: Config) -> Result<u64, String> {
        self.handle.apply(config)
    }

    /// Stops accepting, closes every connection and joins the workers.
    pub fn shutdown(self) {
        let _ = self.stop.send(Stop::Now);
        for t in self.threads {
            let _ = t.join();
        }
    }

    /// Graceful drain (Envoy's `--drain-time-s`): stops accepting, lets every session answer
    /// the commands it has already read (reading nothing more), closes each session once it
    /// owes nothing, and joins the workers when all are closed or `timeout` has passed
    /// (whatever is still open then is closed). Returns the sessions cut by the timeout.
    pub fn drain(self, timeout: std::time::Duration) -> u64 {
        let _ = self.stop.send(Stop::Drain(timeout));
        for t in self.threads {
            let _ = t.join();
        }
        self.registry.totals().active
    }

    /// Blocks until the workers end (they end on [`Server::shutdown`] from another handle
    /// or when the process is signalled).
    pub fn wait(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn compile(config: Config, version: u64) -> Result<Snapshot, String> {
    let routings = config
        .listeners
        .iter()
        .map(|l| Routing::build(&config, l).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Snapshot {
        version,
        config: Arc::new(config),
        routings,
    })
}

/// Starts the data plane for `config`.
///
/// # Errors
/// When a listener cannot be bound or the routing table cannot be built.
pub fn start(config: Config, opts: Options) -> io::Result<Server> {
    local::mark_start();
    let workers = opts.workers.max(1);
    let snapshot = compile(config, 1).map_err(io::Error::other)?;
    let (changed, _) = watch::channel(1);
    let shared = Arc::new(Shared {
        current: ArcSwap::from_pointee(snapshot),
        changed,
        apply_lock: std::sync::Mutex::new(()),
    });
    let registry = Arc::new(Registry::default());
    let (stop, stop_rx) = watch::channel(Stop::Run);
    let mut threads = Vec::with_capacity(workers);
    // Worker 0 binds first (resolving port 0); the others bind the same addresses with
    // SO_REUSEPORT so the kernel spreads connections over them.
    let mut addrs: Option<Vec<SocketAddr>> = None;
    for w in 0..workers {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<Vec<SocketAddr>>>();
        let bind_to: Vec<SocketAddr> = match &addrs {
            Some(a) => a.clone(),
            None => shared
                .current
                .load()
                .config
                .listeners
                .iter()
                .map(|l| l.address)
                .collect(),
        };
        let names: Vec<String> = shared
            .current
            .load()
            .config
            .listeners
            .iter()
            .map(|l| l.name.clone())
            .collect();
        let bind_to: Vec<(String, SocketAddr)> = names.into_iter().zip(bind_to).collect();
        let worker = Worker {
            id: w,
            shared: shared.clone(),
            registry: registry.clone(),
            workers,
            stop: stop_rx.clone(),
            pools: HashMap::new(),
            upstream_stats: Arc::new(UpstreamStats::default()),
            hot_key_sample: opts.hot_key_sample,
            slowlog: (opts.slowlog_threshold_us, opts.slowlog_max_len),
        };
        registry.add_upstream(worker.upstream_stats.clone());
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
                let _ = stop.send(Stop::Now);
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
        handle: ConfigHandle { shared },
    })
}

/// What the workers are told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Serve.
    Run,
    /// Drain for at most this long, then stop.
    Drain(std::time::Duration),
    /// Stop now.
    Now,
}

/// Identifies a pool: the same endpoint in the same cluster with the same settings.
type PoolKey = (String, EndpointConfig, usize);

struct Worker {
    id: usize,
    shared: Arc<Shared>,
    registry: Arc<Registry>,
    workers: usize,
    stop: watch::Receiver<Stop>,
    /// This worker's upstream pools, kept across config changes for endpoints that remain.
    pools: HashMap<PoolKey, EndpointHandle>,
    /// This worker's upstream counters (kept across config changes).
    upstream_stats: Arc<UpstreamStats>,
    /// Hot-key sampling.
    hot_key_sample: u64,
    /// Slow-log threshold (µs) and length.
    slowlog: (u64, usize),
}

impl Worker {
    fn run(
        mut self,
        bind_to: Vec<(String, SocketAddr)>,
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
            let mut changed = self.shared.changed.subscribe();
            let snapshot = self.shared.current.load_full();
            let mut seen = snapshot.version;
            let all_parts = self.build_parts(&snapshot);
            let mut slots = Vec::new();
            let mut ctxs = Vec::new();
            let mut accepts = Vec::new();
            for (i, (listener, parts)) in listeners.into_iter().zip(all_parts).enumerate() {
                let stats = Arc::new(ListenerStats {
                    hot: hotkeys::Tracker::new(self.hot_key_sample),
                    slow: slowlog::SlowLog::new(self.slowlog.0, self.slowlog.1),
                    ..Default::default()
                });
                self.registry
                    .add(&snapshot.config.listeners[i].name, stats.clone());
                let slot = Arc::new(ListenerSlot::new(parts));
                self.registry.add_slot(slot.clone());
                slots.push(slot.clone());
                let ctx = Arc::new(ListenerCtx {
                    slot,
                    stats,
                    registry: self.registry.clone(),
                    workers: self.workers,
                    draining: std::sync::atomic::AtomicBool::new(false),
                    drain: tokio::sync::Notify::new(),
                });
                let _ = i;
                ctxs.push(ctx.clone());
                accepts.push(tokio::spawn(accept_loop(listener, ctx)));
            }
            loop {
                tokio::select! {
                    r = self.stop.changed() => {
                        let stop = *self.stop.borrow();
                        match stop {
                            _ if r.is_err() => break,
                            Stop::Run => continue,
                            Stop::Now => break,
                            Stop::Drain(timeout) => {
                                drain(&ctxs, accepts, timeout, self.id).await;
                                break;
                            }
                        }
                    }
                    r = changed.changed() => {
                        if r.is_err() {
                            break;
                        }
                        let snapshot = self.shared.current.load_full();
                        if snapshot.version == seen {
                            continue;
                        }
                        seen = snapshot.version;
                        for (slot, parts) in slots.iter().zip(self.build_parts(&snapshot)) {
                            slot.store(parts);
                        }
                        tracing::debug!(worker = self.id, version = seen, "configuration swapped");
                    }
                }
            }
        });
        // Dropping the runtime cancels every session and connection task of this worker.
        drop(rt);
    }

    /// Builds this worker's chain parts for every listener of `snapshot`: endpoint handles
    /// (reusing pools of endpoints that remain, spawning the new ones; pools no longer in the
    /// config are dropped here and close once the last chain using them is gone), and a new
    /// mirror queue with its consumer, whose shadow chain matches the new routing.
    fn build_parts(&mut self, snapshot: &Snapshot) -> Vec<stack::Parts> {
        let config = &snapshot.config;
        let mut old = std::mem::take(&mut self.pools);
        let mut handle = |c: &Cluster, shard: &str, addr: SocketAddr| {
            let key = (
                c.name.clone(),
                endpoint_config(c, shard, addr),
                c.connections_per_endpoint,
            );
            let h = old
                .remove(&key)
                .or_else(|| self.pools.get(&key).cloned())
                .unwrap_or_else(|| {
                    EndpointHandle::spawn(key.1.clone(), key.2, self.upstream_stats.clone())
                });
            self.pools.insert(key, h.clone());
            h
        };
        let endpoints = Arc::new(Endpoints(
            config
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
        ));
        let primaries: Arc<Vec<Vec<usize>>> = Arc::new(
            config
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
        config
            .listeners
            .iter()
            .zip(&snapshot.routings)
            .enumerate()
            .map(|(i, (listener, routing))| {
                let (queue, mirror_rx) = stack::MirrorQueue::new();
                let parts = stack::Parts {
                    listener: Arc::new(listener.clone()),
                    mirror_stats: Arc::new(MirrorStats::new(routing.clusters.len())),
                    hot_key_stats: Arc::new(HotKeyStats::new(routing)),
                    routing: routing.clone(),
                    endpoints: endpoints.clone(),
                    primaries: primaries.clone(),
                    mirror: Arc::new(queue),
                    databases: routing
                        .routed_clusters()
                        .iter()
                        .filter_map(|&c| config.clusters.get(c))
                        .map(|c| c.databases)
                        .min()
                        .unwrap_or(respway_filters::model::DEFAULT_DATABASES),
                };
                self.registry.set_filters(
                    (self.id, i),
                    parts.mirror_stats.clone(),
                    parts.hot_key_stats.clone(),
                    routing.clusters.iter().map(|c| c.name.clone()).collect(),
                );
                tokio::spawn(stack::run_mirror(
                    mirror_rx,
                    stack::shadow(&parts, 0),
                    parts.mirror_stats.clone(),
                ));
                parts
            })
            .collect()
    }
}

/// Stops accepting (the listening sockets close), tells every session to answer what it has
/// read and close, and waits until all have closed or `timeout` has passed.
async fn drain(
    ctxs: &[Arc<ListenerCtx>],
    accepts: Vec<tokio::task::JoinHandle<()>>,
    timeout: std::time::Duration,
    worker: usize,
) {
    use std::sync::atomic::Ordering;
    for a in &accepts {
        a.abort();
    }
    for a in accepts {
        let _ = a.await;
    }
    for c in ctxs {
        c.draining.store(true, Ordering::Relaxed);
        c.drain.notify_waiters();
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let open = || {
        ctxs.iter()
            .map(|c| c.stats.active.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    while open() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let left = open();
    if left > 0 {
        tracing::warn!(
            worker,
            sessions = left,
            ?timeout,
            "drain timeout: closing sessions still open"
        );
    } else {
        tracing::info!(worker, "drained: every session answered and closed");
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
        databases: c.databases,
        dedicated: c.dedicated_connections,
        max_queue: c.max_queue_per_connection,
    }
}

/// Binds every listener; an error names the listener and the address.
fn bind_all(addrs: &[(String, SocketAddr)]) -> io::Result<Vec<TcpListener>> {
    addrs
        .iter()
        .map(|(name, addr)| {
            bind_one(*addr).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("listener {name:?}: cannot listen on {addr}: {e}"),
                )
            })
        })
        .collect()
}

fn bind_one(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn accept_loop(listener: TcpListener, ctx: Arc<ListenerCtx>) {
    let mut backoff = std::time::Duration::from_millis(5);
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                backoff = std::time::Duration::from_millis(5);
                // The accept count, taken here (not when the session first runs, when several
                // sessions accepted in one turn would read the same value), spreads sessions
                // over each endpoint's connections.
                let seq = ctx.stats.connections.get() as usize;
                ctx.stats.connections.inc();
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    ctx.stats
                        .active
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    conn::serve(stream, ctx.clone(), seq).await;
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
