//! One worker thread: its current-thread tokio runtime, its listeners' accept loops, the
//! chain parts it builds for every configuration (reusing the pools of endpoints that remain),
//! and its graceful drain.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use respway_filters::hot_key::HotKeyStats;
use respway_filters::mirror::MirrorStats;
use respway_filters::model::{Cluster, Endpoint, Role, Shard};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::discovery::endpoints::endpoint_config;
pub(crate) use crate::lifecycle::Stop;
use crate::runtime::{Shared, Snapshot};
use crate::session::conn;
use crate::session::listener::{bind_all, AcceptBackoff, ListenerCtx};
use crate::stack;
use crate::stack::ListenerSlot;
use crate::stats::AcceptSocket;
use crate::stats::{hotkeys, slowlog};
use crate::stats::{ListenerStats, Registry};
use crate::upstream::{EndpointConfig, EndpointHandle, Endpoints, UpstreamStats};

/// Identifies a pool: the same endpoint in the same cluster with the same settings and role
/// (a primary demoted to replica, as in a Sentinel failover, gets new connections: those that
/// carried its writes close), and actively checked or not.
/// What a near-cache tracker of the endpoint follows is part of it: a pool whose cluster's
/// cache changes mode or prefixes starts afresh.
type PoolKey = (
    String,
    EndpointConfig,
    usize,
    bool,
    bool,
    Option<crate::cache::near_cache::Follow>,
);

pub(crate) struct Worker {
    pub(crate) id: usize,
    pub(crate) shared: Arc<Shared>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) workers: usize,
    pub(crate) stop: watch::Receiver<Stop>,
    /// This worker's upstream pools, kept across config changes for endpoints that remain.
    pub(crate) pools: HashMap<PoolKey, EndpointHandle>,
    /// This worker's upstream counters (kept across config changes).
    pub(crate) upstream_stats: Arc<UpstreamStats>,
    /// Hot-key sampling.
    pub(crate) hot_key_sample: u64,
    /// Slow-log threshold (µs) and length.
    pub(crate) slowlog: (u64, usize),
    /// Near-cache counters per cluster name (kept across config changes).
    pub(crate) cache_stats: HashMap<String, Arc<crate::cache::near_cache::CacheStats>>,
}

impl Worker {
    pub(crate) fn run(
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
            self.observe_upstream(&snapshot);
            let all_parts = self.build_parts(&snapshot);
            let mut slots = Vec::new();
            let mut ctxs = Vec::new();
            let mut accepts = Vec::new();
            for (i, (listener, parts)) in listeners.into_iter().zip(all_parts).enumerate() {
                let (sample, threshold, max_len) = self.observe(&snapshot.config.listeners[i]);
                let stats = Arc::new(ListenerStats {
                    hot: hotkeys::Tracker::new(sample),
                    slow: slowlog::SlowLog::new(threshold, max_len),
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
                    auth_limiter: self.shared.auth_limiter.clone(),
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
                        self.observe_upstream(&snapshot);
                        for (ctx, l) in ctxs.iter().zip(&snapshot.config.listeners) {
                            let (sample, threshold, max_len) = self.observe(l);
                            ctx.stats.hot.set_sample(sample);
                            ctx.stats.slow.set(threshold, max_len);
                        }
                        tracing::debug!(worker = self.id, version = seen, "configuration swapped");
                    }
                }
            }
        });
        // Dropping the runtime cancels every session and connection task of this worker.
        drop(rt);
    }

    /// The listener's hot-key sampling, slow-log threshold (µs) and slow-log length: its
    /// configuration's, else the process's.
    fn observe(&self, l: &respway_filters::model::Listener) -> (u64, u64, usize) {
        let o = &l.observe;
        (
            o.hot_key_sample.unwrap_or(self.hot_key_sample),
            o.slowlog_threshold.map_or(self.slowlog.0, |d| {
                u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
            }),
            o.slowlog_max_len.unwrap_or(self.slowlog.1),
        )
    }

    /// Sets how slow upstream a reply must be for the slow log's upstream split on this
    /// worker's thread: from the lowest threshold of the listeners that keep a slow log.
    fn observe_upstream(&self, snapshot: &Snapshot) {
        let min = snapshot
            .config
            .listeners
            .iter()
            .map(|l| self.observe(l))
            .filter(|&(_, _, len)| len > 0)
            .map(|(_, t, _)| t)
            .min();
        crate::stats::slowlog::set_upstream_min(min);
    }

    /// Builds this worker's chain parts for every listener of `snapshot`: endpoint handles
    /// (reusing pools of endpoints that remain, spawning the new ones; pools no longer in the
    /// config are dropped here and close once the last chain using them is gone), and a new
    /// mirror queue with its consumer, whose shadow chain matches the new routing.
    // A pool key's TLS part hashes and compares its settings only, never the configuration
    // that the file watcher swaps inside it.
    #[allow(clippy::mutable_key_type)]
    fn build_parts(&mut self, snapshot: &Snapshot) -> Vec<stack::Parts> {
        let config = &snapshot.config;
        let mut old = std::mem::take(&mut self.pools);
        let certs = &snapshot.certs;
        let marking = crate::cache::near_cache::marking_clusters(config);
        let cache_stats: Vec<Option<Arc<crate::cache::near_cache::CacheStats>>> = config
            .clusters
            .iter()
            .map(|c| {
                c.near_cache.as_ref().map(|_| {
                    let registry = &self.registry;
                    self.cache_stats
                        .entry(c.name.clone())
                        .or_insert_with(|| {
                            let s = Arc::<crate::cache::near_cache::CacheStats>::default();
                            registry.add_cache(&c.name, s.clone());
                            s
                        })
                        .clone()
                })
            })
            .collect();
        let mut handle = |ci: usize, c: &Cluster, s: &Shard, e: &Endpoint| {
            let tls = certs.upstream(ci);
            let key = (
                c.name.clone(),
                endpoint_config(c, s, e.address, tls),
                c.connections_per_endpoint,
                e.role == Role::Primary,
                c.health_check.is_some(),
                crate::cache::near_cache::Follow::of(c.near_cache.as_ref()),
            );
            let shared = &self.shared;
            let h = old
                .remove(&key)
                .or_else(|| self.pools.get(&key).cloned())
                .unwrap_or_else(|| {
                    let check = key.4.then(|| shared.checks.get(&c.name, e.address));
                    let follow = key.5.clone().zip(cache_stats[ci].clone());
                    let h = EndpointHandle::spawn(
                        key.1.clone(),
                        key.2,
                        self.upstream_stats.clone(),
                        check,
                    );
                    // The near cache's tracker of the endpoint, kept beside its pools.
                    if let Some((follow, cache_stats)) = follow {
                        let t = Arc::new(crate::cache::near_cache::Tracker::default());
                        tokio::spawn(crate::cache::near_cache::run_tracker(
                            key.1.clone(),
                            follow,
                            t.clone(),
                            h.cache_epoch_counter().clone(),
                            cache_stats,
                        ));
                        h.set_companion(t);
                    }
                    h
                });
            // A Sentinel-managed shard's primary: its writes are held during a failover.
            if let Some(src) = s.sentinel.as_ref().filter(|_| e.role == Role::Primary) {
                let master = (src.master.clone(), src.sentinels.clone());
                h.set_hold(shared.discovery.hold(&master));
            }
            self.pools.insert(key, h.clone());
            h
        };
        let caches: Arc<Vec<_>> = Arc::new(
            config
                .clusters
                .iter()
                .zip(&cache_stats)
                .map(|(c, stats)| {
                    let (nc, stats) = (c.near_cache.as_ref()?, stats.clone()?);
                    let hot =
                        (nc.admit == respway_filters::model::NearCacheAdmit::Hot).then(|| {
                            let h = Arc::new(crate::cache::near_cache::HotSet::new(
                                nc.hot_reads_per_sec,
                                self.workers,
                                stats.clone(),
                            ));
                            let source: Arc<dyn crate::stats::HotKeysSource> = h.clone();
                            self.registry.add_hot_set(&c.name, &source);
                            h
                        });
                    Some(Arc::new(crate::cache::near_cache::ClusterCache::new(
                        nc, stats, hot,
                    )))
                })
                .collect(),
        );
        let endpoints = Arc::new(Endpoints(
            config
                .clusters
                .iter()
                .enumerate()
                .map(|(ci, c)| {
                    c.shards
                        .iter()
                        .map(|s| s.endpoints.iter().map(|e| handle(ci, c, s, e)).collect())
                        .collect()
                })
                .collect(),
            (config.clusters.iter())
                .map(|c| {
                    c.redis_cluster
                        .as_ref()
                        .map(|_| crate::discovery::redis_cluster::handle(&c.name))
                })
                .collect(),
            Default::default(),
        ));
        crate::upstream::set_latest(&endpoints);
        // This worker's part of each record of write copies (the same records as the last
        // configuration's while their clusters still receive copies, see
        // `runtime::write_records`), shared by its listeners.
        let records: respway_filters::write_record::RecordParts = snapshot
            .records
            .iter()
            .map(|r| r.as_ref().and_then(|r| r.part(self.id)))
            .collect();
        config
            .listeners
            .iter()
            .zip(&snapshot.routings)
            .enumerate()
            .map(|(i, (listener, routing))| {
                let (queue, mirror_rx) = stack::MirrorQueue::new();
                let parts = stack::Parts {
                    tls: snapshot
                        .certs
                        .listeners
                        .get(i)
                        .cloned()
                        .flatten()
                        .map(|(_, tls)| tls),
                    config_version: snapshot.version,
                    learned: self.shared.learned.clone(),
                    announced: self.shared.peers.announced(listener),
                    acl: snapshot.acls.get(i).cloned().flatten(),
                    listener: Arc::new(listener.clone()),
                    mirror_stats: Arc::new(MirrorStats::new(routing.clusters.len())),
                    hot_key_stats: Arc::new(HotKeyStats::new(routing)),
                    moved: Arc::default(),
                    records: records.clone(),
                    routing: routing.clone(),
                    endpoints: endpoints.clone(),
                    caches: caches.clone(),
                    marks: crate::cache::near_cache::Marks::new(routing, &marking),
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
                    stack::shadow(&parts, 0, Default::default()),
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

async fn accept_loop(listener: TcpListener, ctx: Arc<ListenerCtx>) {
    let mut backoff = AcceptBackoff::new(AcceptSocket::Listeners);
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                backoff.accepted();
                // The accept count, taken here (not when the session first runs, when several
                // sessions accepted in one turn would read the same value), spreads sessions
                // over each endpoint's connections.
                let seq = ctx.stats.connections.get() as usize;
                ctx.stats.connections.inc();
                let ctx = ctx.clone();
                // The listener's TLS as configured now (a config change applies to the
                // connections accepted after it).
                let tls = ctx.slot.parts.load().tls.clone();
                tokio::spawn(async move {
                    ctx.stats
                        .active
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    match tls {
                        None => conn::serve(stream, ctx.clone(), seq).await,
                        Some(tls) => {
                            // The handshake is bounded by the listener's client_stall_timeout.
                            let limit = ctx.slot.parts.load().listener.client.stall_timeout;
                            let shake = tls_handshake(stream, peer, &tls, &ctx);
                            match tokio::time::timeout(limit, shake).await {
                                Ok(Shake::Tls(s)) => conn::serve(s, ctx.clone(), seq).await,
                                Ok(Shake::Plaintext(s)) => refuse_plaintext(s).await,
                                Ok(Shake::Failed) => {}
                                Err(_) => {
                                    ctx.stats.tls_handshake_failures.inc();
                                    tracing::debug!(
                                        %peer,
                                        timeout = ?limit,
                                        "TLS handshake not done within client_stall_timeout: closed"
                                    );
                                }
                            }
                        }
                    }
                    ctx.stats
                        .active
                        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                });
            }
            // Out of file descriptors and the like: counted, and backed off instead of spinning.
            Err(e) => backoff.failed(&e).await,
        }
    }
}

/// What a plaintext client on a TLS listener is told before the connection closes (when its
/// first byte looks like RESP: `*` or an inline command's letter).
const PLAINTEXT_REFUSED: &[u8] = b"-ERR this port speaks TLS\r\n";

/// How a TLS listener's handshake ended. (Once per connection, moved straight into the
/// session: the size difference between variants costs nothing worth a box.)
#[allow(clippy::large_enum_variant)]
enum Shake {
    Tls(crate::net::tls::TlsStream),
    /// The client's first byte looks like RESP (`*` or an inline command's letter): it is
    /// told, after the bounded handshake, that the port speaks TLS.
    Plaintext(tokio::net::TcpStream),
    /// Failed (logged and counted), closed, or plaintext that is not RESP (counted).
    Failed,
}

/// The server side of a TLS handshake on an accepted connection. The caller bounds it in
/// time; a plaintext client's refusal is not part of it, so a client that stays connected
/// after reading it is not also counted as a handshake that timed out.
async fn tls_handshake(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    tls: &respway_tls::ServerTls,
    ctx: &ListenerCtx,
) -> Shake {
    // A TLS connection starts with a handshake record (content type 22).
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(0) | Err(_) => return Shake::Failed,
        Ok(_) => {}
    }
    if first[0] != 0x16 {
        ctx.stats.tls_plaintext_refused.inc();
        tracing::debug!(%peer, "plaintext client on a TLS listener: closed");
        if first[0] == b'*' || first[0].is_ascii_alphabetic() {
            return Shake::Plaintext(stream);
        }
        return Shake::Failed;
    }
    match tls.acceptor().accept(stream).await {
        Ok(s) => {
            let (tcp, conn) = s.into_inner();
            Shake::Tls(crate::net::tls::TlsStream::new(tcp, conn))
        }
        Err(e) => {
            ctx.stats.tls_handshake_failures.inc();
            tracing::info!(%peer, reason = %crate::net::tls::reason(&e), "TLS handshake failed");
            Shake::Failed
        }
    }
}

/// Tells a plaintext client on a TLS listener why it is closed. What it sent is read first
/// (and dropped, never executed): closing a socket with unread bytes resets it, and the client
/// might not see the error. Then it waits for the client to close, for a second at most.
async fn refuse_plaintext(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sink = [0u8; 4096];
    while let Ok(n) = stream.try_read(&mut sink) {
        if n == 0 {
            break;
        }
    }
    let _ = stream.write_all(PLAINTEXT_REFUSED).await;
    let _ = stream.shutdown().await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}
