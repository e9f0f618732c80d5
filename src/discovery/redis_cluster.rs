//! Redis Cluster upstreams: clusters whose shards (slot ranges, primaries, replicas) are
//! discovered from seed nodes and followed, instead of configured.
//!
//! One thread of its own (a current-thread runtime, off the workers) keeps, per Redis
//! Cluster a configuration names, one watcher. It asks `CLUSTER SHARDS` (`CLUSTER SLOTS` on a
//! server without it) of the seeds and of every node it learned, first one that answers,
//! every `cluster_refresh_rate` and when the workers report redirections or failures past
//! the thresholds ([`redirected`], at most once per `redirect_refresh_interval`). When the
//! answer changes, it records it and has the configuration compiled again
//! ([`crate::discovery::Running::republish`]): the cluster's shards become the topology's (one per
//! primary, named by its address, with its slot ranges and its replicas not marked failed;
//! slots no node
//! serves go to a shard `unassigned` whose keys get an error), and the workers swap them in
//! as for any configuration change, without dropping a request: pools of nodes that remain
//! are kept, a promoted replica gets a primary's pools, a node that left is drained.
//!
//! Placement is Redis Cluster's own (`crc16_slots`, `{}` hashtags), so a key goes to the
//! node the cluster says owns its slot; between a change in the cluster and the refresh that
//! learns it, the node answers `MOVED` or `ASK`, which the upstream follows (see
//! `upstream::redirect`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Instant;

use bytes::Bytes;
use respway_filters::model::{Config, Endpoint, RedisClusterSource, Role, Shard, NO_ENDPOINT};
use respway_filters::resp::Frame;
use tokio::sync::Notify;

use crate::discovery::Handle;
use crate::upstream::{Control, EndpointConfig, RedisCluster, TopologyHints};

/// Slots of a Redis Cluster.
const SLOTS: u32 = 16384;

/// A Redis Cluster as the configuration names it: the cluster's name and its seeds.
pub(crate) type Key = (String, Vec<SocketAddr>);

/// One shard of a discovered topology.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Part {
    /// Inclusive slot ranges, sorted.
    pub(crate) slots: Vec<(u32, u32)>,
    pub(crate) primary: SocketAddr,
    /// Replicas not marked failed, sorted.
    pub(crate) replicas: Vec<SocketAddr>,
}

/// What the nodes say of one Redis Cluster: its shards, sorted by first slot.
pub(crate) type Topology = Vec<Part>;

/// Topology refreshes answered, and those that changed a topology, over the process (for
/// `INFO` and the metrics).
use crate::stats::process::{
    REDIS_CLUSTER_CHANGES as CHANGES, REDIS_CLUSTER_REFRESHES as REFRESHES,
};

/// What is known of every watched Redis Cluster; read when a configuration is compiled.
#[derive(Debug, Default)]
pub(crate) struct Discovery {
    found: Mutex<HashMap<Key, Topology>>,
}

fn key_of(name: &str, src: &RedisClusterSource) -> Key {
    (name.to_string(), src.seeds.clone())
}

impl Discovery {
    /// `config` with the shards of each Redis Cluster as last found (the placeholder stays
    /// until the first answer).
    pub(crate) fn resolve(&self, mut config: Config) -> Config {
        let found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        for c in &mut config.clusters {
            let Some(src) = &c.redis_cluster else {
                continue;
            };
            if let Some(t) = found.get(&key_of(&c.name, src)) {
                c.shards = shards(t);
            }
        }
        config
    }

    /// Records `t` for `key`; true when it changed.
    fn set(&self, key: &Key, t: Topology) -> bool {
        let mut found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        REFRESHES.fetch_add(1, Ordering::Relaxed);
        if found.get(key) == Some(&t) {
            return false;
        }
        CHANGES.fetch_add(1, Ordering::Relaxed);
        found.insert(key.clone(), t);
        true
    }

    fn forget(&self, key: &Key) {
        let mut found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        found.remove(key);
    }
}

/// The shards of a topology: one per primary (named by its address), and `unassigned` for
/// the slots no node serves.
fn shards(t: &[Part]) -> Vec<Shard> {
    let mut out: Vec<Shard> = t
        .iter()
        .map(|p| Shard {
            name: p.primary.to_string(),
            hash_key: p.primary.to_string(),
            weight: 1,
            slots: p.slots.clone(),
            endpoints: std::iter::once(Endpoint {
                address: p.primary,
                role: Role::Primary,
                zone: None,
            })
            .chain(p.replicas.iter().map(|&address| Endpoint {
                address,
                role: Role::Replica,
                zone: None,
            }))
            .collect(),
            sentinel: None,
        })
        .collect();
    let gaps = gaps(t);
    if !gaps.is_empty() {
        out.push(Shard {
            name: "unassigned".to_string(),
            hash_key: "unassigned".to_string(),
            weight: 1,
            slots: gaps,
            endpoints: vec![Endpoint {
                address: NO_ENDPOINT,
                role: Role::Primary,
                zone: None,
            }],
            sentinel: None,
        });
    }
    out
}

/// The slot ranges no shard of `t` serves.
fn gaps(t: &[Part]) -> Vec<(u32, u32)> {
    let mut ranges: Vec<(u32, u32)> = t.iter().flat_map(|p| p.slots.iter().copied()).collect();
    ranges.sort_unstable();
    let mut out = Vec::new();
    let mut next = 0u32;
    for (a, b) in ranges {
        if a > next {
            out.push((next, a - 1));
        }
        next = next.max(b + 1);
    }
    if next < SLOTS {
        out.push((next, SLOTS - 1));
    }
    out
}

/// Why the placeholder shard of a Redis Cluster (`unknown`: no answer yet; `unassigned`: no
/// node serves the slot) has no node.
pub(crate) fn missing(shard: &str, src: &RedisClusterSource) -> String {
    if shard == "unassigned" {
        "no node of the Redis Cluster serves this key's slot".to_string()
    } else {
        let seeds: Vec<String> = src.seeds.iter().map(|s| s.to_string()).collect();
        format!(
            "the Redis Cluster's topology is not known yet: no node answered CLUSTER SHARDS (seeds {})",
            seeds.join(", ")
        )
    }
}

// === redirections reported by the workers ===

/// Per cluster name: redirections seen, and the watcher's wake-up.
#[derive(Debug)]
struct Kick {
    redirects: AtomicU64,
    failures: AtomicU64,
    /// A `MOVED` named a node the sidecar does not know: refresh now, whatever the interval.
    urgent: std::sync::atomic::AtomicBool,
    /// A `MOVED` was followed: the slot map is stale; refresh at once (see [`SOON`]).
    stale: std::sync::atomic::AtomicBool,
    /// When a request to a node last failed (ms on [`clock_ms`]; 0: not since the topology
    /// last changed): the watcher polls every [`POLL`] until the map changes (the cluster
    /// promotes a replica) or [`POLL_FOR`] passes without a failure.
    failed_at: AtomicU64,
    notify: Notify,
}

/// The least time between two refreshes that a `MOVED` or a failed node asks for: the map is
/// stale, or a primary may be gone, so the watcher does not wait for the
/// `redirect_refresh_threshold`/`redirect_refresh_interval` of Envoy (5 redirections, 5 s),
/// whose defaults leave commands redirected, or a dead primary's slots failing, for up to 5 s
/// after the cluster changed.
const SOON: std::time::Duration = std::time::Duration::from_millis(100);

/// While requests to a node fail: the topology is asked this often until it changes.
const POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// How long after the last failed request the watcher keeps polling.
const POLL_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// Milliseconds since the first call (never 0).
fn clock_ms() -> u64 {
    static START: LazyLock<Instant> = LazyLock::new(Instant::now);
    u64::try_from(START.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
}

static KICKS: LazyLock<Mutex<HashMap<String, Arc<Kick>>>> = LazyLock::new(Mutex::default);

fn kick_of(cluster: &str) -> Arc<Kick> {
    let mut k = KICKS.lock().unwrap_or_else(|e| e.into_inner());
    // Looked up first: a failure or redirection of a known cluster allocates nothing.
    if let Some(kick) = k.get(cluster) {
        return kick.clone();
    }
    k.entry(cluster.to_string())
        .or_insert_with(|| {
            Arc::new(Kick {
                redirects: AtomicU64::new(0),
                failures: AtomicU64::new(0),
                urgent: std::sync::atomic::AtomicBool::new(false),
                stale: std::sync::atomic::AtomicBool::new(false),
                failed_at: AtomicU64::new(0),
                notify: Notify::new(),
            })
        })
        .clone()
}

/// The handle a worker's upstream gets for Redis Cluster `cluster`: its name and the kick
/// of its watcher, found once per configuration (not per redirection).
pub(crate) fn handle(cluster: &str) -> RedisCluster {
    RedisCluster {
        name: Arc::from(cluster),
        topology: kick_of(cluster),
    }
}

/// The watcher refreshes the topology once the redirections pass the threshold, at once for
/// an unknown node.
impl TopologyHints for Kick {
    fn redirected(&self, moved: bool) {
        if moved {
            self.redirects.fetch_add(1, Ordering::Relaxed);
            self.stale.store(true, Ordering::Release);
        }
        self.notify.notify_one();
    }

    fn unknown_node(&self) {
        self.urgent.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.failed_at.store(clock_ms(), Ordering::Relaxed);
        self.notify.notify_one();
    }
}

// === the watchers ===

/// Whether `config` has a Redis Cluster.
pub(crate) fn any(config: &Config) -> bool {
    config.clusters.iter().any(|c| c.redis_cluster.is_some())
}

/// How one Redis Cluster's nodes are reached.
#[derive(Clone)]
struct Reach {
    src: RedisClusterSource,
    /// An endpoint configuration for any node (its address is set per node).
    cfg: EndpointConfig,
}

fn wanted(handle: &Handle) -> HashMap<Key, Reach> {
    let snapshot = handle.serving();
    let mut out = HashMap::new();
    for (ci, c) in snapshot.config().clusters.iter().enumerate() {
        let Some(src) = &c.redis_cluster else {
            continue;
        };
        let auth = c.auth.as_ref().map(|a| {
            let mut v = Vec::new();
            if let Some(u) = &a.username {
                v.push(Bytes::from(u.clone()));
            }
            v.push(Bytes::from(a.password.clone()));
            v
        });
        let cfg = EndpointConfig {
            address: src.seeds[0],
            label: format!("Redis Cluster {}", c.name).into(),
            connect_timeout: c.connect_timeout,
            auth,
            db: 0,
            databases: 1,
            dedicated: 0,
            max_queue: 1,
            tls: snapshot.upstream_tls(ci),
            missing: None,
            readonly: false,
            replica: false,
        };
        out.insert(
            key_of(&c.name, src),
            Reach {
                src: src.clone(),
                cfg,
            },
        );
    }
    out
}

/// The Redis Cluster watchers: one per cluster a configuration names (see the module above).
pub(crate) struct Clusters;

impl crate::discovery::watchers::Watch for Clusters {
    /// The cluster and its settings: a change of either starts a new watcher.
    type Key = (Key, RedisClusterSource);
    type Value = EndpointConfig;
    fn wanted(handle: &Handle) -> HashMap<Self::Key, EndpointConfig> {
        wanted(handle)
            .into_iter()
            .map(|(k, r)| ((k, r.src), r.cfg))
            .collect()
    }
    fn watch(
        handle: Handle,
        key: Self::Key,
        cfg: EndpointConfig,
        first: tokio::sync::oneshot::Sender<()>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (key, src) = key;
        watch_cluster(handle, key, Reach { src, cfg }, first)
    }
    fn forget(handle: &Handle, key: &Self::Key) {
        handle.redis_clusters().forget(&key.0);
    }
}

/// One Redis Cluster: refreshes its topology at once, every `cluster_refresh_rate`, and when
/// redirections or failures pass their thresholds.
async fn watch_cluster(
    handle: Handle,
    key: Key,
    reach: Reach,
    first: tokio::sync::oneshot::Sender<()>,
) {
    let src = &reach.src;
    let kick = kick_of(&key.0);
    let mut known: Vec<SocketAddr> = src.seeds.clone();
    let mut link: Option<(SocketAddr, Control)> = None;
    let mut first = Some(first);
    let mut quiet = false;
    loop {
        let last = Instant::now();
        kick.redirects.store(0, Ordering::Relaxed);
        kick.failures.store(0, Ordering::Relaxed);
        match ask_any(&reach, &known, &mut link).await {
            Ok(t) => {
                quiet = false;
                // Every node is a node to ask next time (the seeds stay first).
                let mut nodes = src.seeds.clone();
                for p in &t {
                    for a in std::iter::once(&p.primary).chain(&p.replicas) {
                        if !nodes.contains(a) {
                            nodes.push(*a);
                        }
                    }
                }
                known = nodes;
                if handle.redis_clusters().set(&key, t.clone()) {
                    // The cluster changed: a failed node is behind us.
                    kick.failed_at.store(0, Ordering::Relaxed);
                    tracing::info!(cluster = %key.0, shards = t.len(), "Redis Cluster: topology changed");
                    if let Err(e) = handle.republish() {
                        tracing::error!(error = %e, "Redis Cluster: the configuration with the new topology was refused");
                    }
                }
            }
            Err(e) if !quiet => {
                quiet = true;
                tracing::warn!(cluster = %key.0, error = %e, "Redis Cluster: no node answered the topology refresh; the last topology stays");
            }
            Err(_) => {}
        }
        if let Some(f) = first.take() {
            let _ = f.send(());
        }
        // Until the next periodic refresh, or a kick past a threshold (not sooner than
        // redirect_refresh_interval after the last refresh), or sooner: a MOVED (SOON after
        // the last refresh), requests to a node failing (every POLL).
        let next = last + src.cluster_refresh_rate;
        loop {
            let failing = match kick.failed_at.load(Ordering::Relaxed) {
                0 => None,
                at => (clock_ms().saturating_sub(at) < POLL_FOR.as_millis() as u64)
                    .then_some(last + POLL),
            };
            let wake = failing.map_or(next, |p| p.min(next));
            tokio::select! {
                _ = tokio::time::sleep_until(wake.into()) => break,
                _ = kick.notify.notified() => {}
            }
            if kick.urgent.swap(false, Ordering::AcqRel) {
                break;
            }
            if kick.stale.swap(false, Ordering::AcqRel) {
                let at = last + SOON;
                if at > Instant::now() {
                    tokio::time::sleep_until(at.into()).await;
                }
                break;
            }
            let redirects = kick.redirects.load(Ordering::Relaxed);
            let failures = kick.failures.load(Ordering::Relaxed);
            let due = (src.redirect_refresh_threshold > 0
                && redirects >= u64::from(src.redirect_refresh_threshold))
                || (src.failure_refresh_threshold > 0
                    && failures >= u64::from(src.failure_refresh_threshold));
            if due {
                let at = last + src.redirect_refresh_interval;
                if at > Instant::now() {
                    tokio::time::sleep_until(at.min(next).into()).await;
                }
                break;
            }
        }
    }
}

/// Asks the nodes, the one of the open link first, until one answers the topology.
async fn ask_any(
    reach: &Reach,
    nodes: &[SocketAddr],
    link: &mut Option<(SocketAddr, Control)>,
) -> Result<Topology, String> {
    let mut order: Vec<SocketAddr> = Vec::with_capacity(nodes.len());
    if let Some((a, _)) = link {
        order.push(*a);
    }
    order.extend(
        nodes
            .iter()
            .filter(|a| link.as_ref().is_none_or(|(l, _)| l != *a)),
    );
    let mut last = String::from("no node to ask");
    for addr in order {
        let round = async {
            let l = match link {
                Some((a, l)) if *a == addr => l,
                _ => {
                    let mut cfg = reach.cfg.clone();
                    cfg.address = addr;
                    &mut link.insert((addr, Control::open(&cfg).await?)).1
                }
            };
            topology(l).await
        };
        match tokio::time::timeout(reach.src.cluster_refresh_timeout, round).await {
            Ok(Ok(t)) => return Ok(t),
            Ok(Err(e)) => last = format!("{addr}: {e}"),
            Err(_) => {
                last = format!(
                    "{addr}: no answer within {:?}",
                    reach.src.cluster_refresh_timeout
                )
            }
        }
        *link = None;
    }
    Err(last)
}

/// `CLUSTER SHARDS`, else (`-ERR unknown subcommand`) `CLUSTER SLOTS`, on one node.
async fn topology(l: &mut Control) -> Result<Topology, String> {
    l.send(&[&[b"CLUSTER", b"SHARDS"]]).await?;
    match l.next().await? {
        Frame::Error(e) if e.starts_with(b"ERR unknown subcommand") => {
            l.send(&[&[b"CLUSTER", b"SLOTS"]]).await?;
            match l.next().await? {
                Frame::Error(e) => Err(String::from_utf8_lossy(&e).into_owned()),
                f => from_slots(&f),
            }
        }
        Frame::Error(e) => Err(String::from_utf8_lossy(&e).into_owned()),
        f => from_shards(&f),
    }
}

fn text(f: &Frame) -> Option<&[u8]> {
    match f {
        Frame::Bulk(b) | Frame::Simple(b) => Some(b.as_ref()),
        _ => None,
    }
}

/// The name/value pairs of a flat array (RESP2) or a map (RESP3).
fn pairs(f: &Frame) -> Vec<(&[u8], &Frame)> {
    match f {
        Frame::Array(items) => items
            .chunks(2)
            .filter_map(|kv| Some((text(kv.first()?)?, kv.get(1)?)))
            .collect(),
        Frame::Map(items) => items
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, v)))
            .collect(),
        _ => Vec::new(),
    }
}

fn int(f: &Frame) -> Option<i64> {
    match f {
        Frame::Integer(n) => Some(*n),
        other => std::str::from_utf8(text(other)?).ok()?.parse().ok(),
    }
}

/// A `CLUSTER SHARDS` reply.
fn from_shards(f: &Frame) -> Result<Topology, String> {
    let Frame::Array(shards) = f else {
        return Err(format!("CLUSTER SHARDS answered {f:?}"));
    };
    let mut out = Vec::new();
    for s in shards {
        let fields = pairs(s);
        let get = |name: &[u8]| fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        let slots: Vec<i64> = match get(b"slots") {
            Some(Frame::Array(v)) => v.iter().filter_map(int).collect(),
            _ => Vec::new(),
        };
        let mut ranges: Vec<(u32, u32)> = slots
            .chunks(2)
            .filter_map(|r| {
                Some((
                    u32::try_from(*r.first()?).ok()?,
                    u32::try_from(*r.get(1)?).ok()?,
                ))
            })
            .filter(|(a, b)| a <= b && *b < SLOTS)
            .collect();
        if ranges.is_empty() {
            continue;
        }
        ranges.sort_unstable();
        let mut primary = None;
        let mut replicas = Vec::new();
        if let Some(Frame::Array(nodes)) = get(b"nodes") {
            for n in nodes {
                let nf = pairs(n);
                let nget = |name: &[u8]| nf.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
                let ip = nget(b"ip").and_then(text).map(String::from_utf8_lossy);
                let port = nget(b"port").and_then(int);
                let (Some(ip), Some(port)) = (ip, port) else {
                    continue;
                };
                let Ok(addr) = format!("{ip}:{port}").parse::<SocketAddr>() else {
                    continue;
                };
                let role = nget(b"role").and_then(text).unwrap_or_default();
                let health = nget(b"health").and_then(text).unwrap_or(b"online");
                // A replica that has received nothing yet says `loading`: it is a node of the
                // shard all the same (a read it cannot serve goes to the primary).
                if role == b"master" {
                    primary = Some(addr);
                } else if health != b"failed" {
                    replicas.push(addr);
                }
            }
        }
        let Some(primary) = primary else { continue };
        replicas.sort_unstable();
        out.push(Part {
            slots: ranges,
            primary,
            replicas,
        });
    }
    out.sort();
    Ok(out)
}

/// A `CLUSTER SLOTS` reply: `[start, end, [ip, port, id], replicas...]` per range.
fn from_slots(f: &Frame) -> Result<Topology, String> {
    let Frame::Array(ranges) = f else {
        return Err(format!("CLUSTER SLOTS answered {f:?}"));
    };
    let mut by_primary: HashMap<SocketAddr, Part> = HashMap::new();
    let addr = |n: &Frame| -> Option<SocketAddr> {
        let Frame::Array(p) = n else { return None };
        let ip = String::from_utf8_lossy(text(p.first()?)?).into_owned();
        let port = int(p.get(1)?)?;
        format!("{ip}:{port}").parse().ok()
    };
    for r in ranges {
        let Frame::Array(parts) = r else { continue };
        let (Some(a), Some(b)) = (parts.first().and_then(int), parts.get(1).and_then(int)) else {
            continue;
        };
        let Some(primary) = parts.get(2).and_then(addr) else {
            continue;
        };
        let e = by_primary.entry(primary).or_insert_with(|| Part {
            slots: Vec::new(),
            primary,
            replicas: Vec::new(),
        });
        e.slots.push((a as u32, b as u32));
        for rep in parts.iter().skip(3).filter_map(addr) {
            if !e.replicas.contains(&rep) {
                e.replicas.push(rep);
            }
        }
    }
    let mut out: Topology = by_primary.into_values().collect();
    for p in &mut out {
        p.slots.sort_unstable();
        p.replicas.sort_unstable();
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(slots: &[(u32, u32)], primary: &str) -> Part {
        Part {
            slots: slots.to_vec(),
            primary: primary.parse().unwrap(),
            replicas: Vec::new(),
        }
    }

    #[test]
    fn slots_no_node_serves_go_to_the_unassigned_shard() {
        let t = vec![
            part(&[(0, 99)], "127.0.0.1:1"),
            part(&[(200, 16383)], "127.0.0.1:2"),
        ];
        assert_eq!(gaps(&t), vec![(100, 199)]);
        let s = shards(&t);
        assert_eq!(s.len(), 3);
        assert_eq!(s[2].name, "unassigned");
        assert_eq!(gaps(&[part(&[(0, 16383)], "127.0.0.1:1")]), vec![]);
        assert_eq!(gaps(&[]), vec![(0, 16383)]);
    }

    #[test]
    fn cluster_shards_and_cluster_slots_give_the_same_topology() {
        let b = |s: &str| Frame::Bulk(Bytes::copy_from_slice(s.as_bytes()));
        let node = |port: i64, role: &str, health: &str| {
            Frame::Array(vec![
                b("id"),
                b("x"),
                b("port"),
                Frame::Integer(port),
                b("ip"),
                b("127.0.0.1"),
                b("role"),
                b(role),
                b("health"),
                b(health),
            ])
        };
        let shards = Frame::Array(vec![Frame::Array(vec![
            b("slots"),
            Frame::Array(vec![
                Frame::Integer(0),
                Frame::Integer(5),
                Frame::Integer(10),
                Frame::Integer(16383),
            ]),
            b("nodes"),
            Frame::Array(vec![
                node(7000, "master", "online"),
                node(7001, "replica", "loading"),
                node(7002, "replica", "failed"),
            ]),
        ])]);
        let t = from_shards(&shards).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].slots, vec![(0, 5), (10, 16383)]);
        assert_eq!(t[0].primary, "127.0.0.1:7000".parse().unwrap());
        assert_eq!(t[0].replicas, vec!["127.0.0.1:7001".parse().unwrap()]);
        let n = |port: i64| Frame::Array(vec![b("127.0.0.1"), Frame::Integer(port), b("id")]);
        let slots = Frame::Array(vec![
            Frame::Array(vec![
                Frame::Integer(10),
                Frame::Integer(16383),
                n(7000),
                n(7001),
            ]),
            Frame::Array(vec![Frame::Integer(0), Frame::Integer(5), n(7000), n(7001)]),
        ]);
        assert_eq!(from_slots(&slots).unwrap(), t);
    }
}
