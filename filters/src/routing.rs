//! The compiled routing table: one configuration snapshot turned into what the request path
//! needs — prefix routes as byte strings with their mirror policies, and per cluster a
//! ready-built shard picker, its hot-key rules, its read policy and each shard's endpoints
//! (role, zone, whether the zone is ours).
//!
//! Building happens off the hot path (at start and on every config change); the layers only
//! read it, through an `Arc` shared by every connection of every worker.
//!
//! Where a key lives (`Routing::route_keys`, `place_key`, `place_pinned`, `place_channel`)
//! is answered in [`crate::place`], which extends [`Routing`].

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;

use crate::hash::{cluster_picker, ShardPicker};
use crate::model::{
    Cluster, Config, HotKeyRead, Listener, MirrorMode, MirrorPolicy, ReadPolicy, Role,
};

/// Routing state for one listener.
#[derive(Debug)]
pub struct Routing {
    /// Clusters in configuration order; routes refer to them by index. Compiled once per
    /// configuration and shared by its listeners' routings.
    pub clusters: Arc<Vec<ClusterRoute>>,
    /// The sidecar's own zone.
    pub zone: Option<String>,
    /// Prefix routes, longest prefix first.
    prefixes: Vec<CompiledRoute>,
    case_insensitive: bool,
    catch_all: Option<CompiledRoute>,
}

/// One cluster as the request path sees it.
#[derive(Debug)]
pub struct ClusterRoute {
    /// The cluster's name.
    pub name: String,
    /// Key → shard index.
    pub picker: Arc<dyn ShardPicker>,
    /// Shards in configuration order (the picker's indices).
    pub shards: Vec<ShardRoute>,
    /// Hot-key rules, longest prefix first.
    pub hot_keys: Vec<HotKeyRoute>,
    /// Which endpoint serves reads.
    pub read_policy: ReadPolicy,
    /// Indices of shards with at least one endpoint in the sidecar's zone.
    pub local_shards: Vec<usize>,
    /// The hashtag rule (`None`: whole keys are hashed); the picker applies it itself.
    pub hashtag: Option<crate::model::HashTag>,
    /// The shards' database a client's database 0 maps to.
    pub db: u32,
    /// A Redis Cluster: a multi-key command is split by slot, not only by shard (a node
    /// refuses keys of several slots in one command, `CROSSSLOT`), and its shards are
    /// named for `MOVED`/`ASK` redirections by address.
    pub redis_cluster: bool,
    /// A Redis Cluster's slot map as a hash of every shard's slot ranges (0 for other
    /// clusters): it changes when slots move between shards (a reshard), not when a shard's
    /// primary changes (a failover). A `SCAN` walk carries it (see the session's keyspace).
    pub slot_map: u64,
}

/// One shard as the request path sees it.
#[derive(Debug)]
pub struct ShardRoute {
    /// The shard's name, for errors and stats.
    pub name: String,
    /// Endpoints in model order.
    pub endpoints: Vec<EndpointRoute>,
    /// Index of the primary in `endpoints`.
    pub primary: usize,
    /// The primary's address (`None`: the shard has no endpoint).
    pub primary_address: Option<SocketAddr>,
    /// What `MIGRATE` to this shard's primary sends it as credentials (`AUTH password` or
    /// `AUTH2 user password`; empty without): the cluster's upstream credentials for it.
    pub migrate_auth: MigrateAuth,
}

/// `MIGRATE`'s credential arguments; `Debug` leaves the password out.
#[derive(Clone, Default)]
pub struct MigrateAuth(pub Vec<Bytes>);

impl std::fmt::Debug for MigrateAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "none"
        } else {
            "<redacted>"
        })
    }
}

/// One endpoint as the request path sees it.
#[derive(Debug)]
pub struct EndpointRoute {
    /// Primary or replica.
    pub role: Role,
    /// Its zone.
    pub zone: Option<String>,
    /// Its zone is the sidecar's zone.
    pub local: bool,
}

/// A compiled hot-key rule.
#[derive(Debug)]
pub struct HotKeyRoute {
    /// Key prefix.
    pub prefix: Vec<u8>,
    /// Read shard choice.
    pub read: HotKeyRead,
    /// Set once this sidecar has copied the keys that existed under the prefix to every
    /// shard (the copy pass, run outside the request path): until then reads go to each
    /// key's home shard only. A fresh rule starts unset; the sidecar hands the same flag to
    /// every configuration that keeps the rule over the same shards.
    pub copied: Arc<AtomicBool>,
}

/// A cluster a route sends to, as the keyspace-wide commands see it
/// ([`Routing::keyspace_clusters`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyspaceCluster {
    /// Cluster index.
    pub cluster: usize,
    /// The prefix to put back on the cluster's stored keys (a `remove_prefix` route's).
    pub prefix: Option<Vec<u8>>,
}

/// Identifies the route a request took, for the layers that act per route (mirror).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RouteId {
    /// The catch-all route (also used for key-less commands).
    #[default]
    CatchAll,
    /// A prefix route, by index into the longest-first list (`u16`: with the tag, 4 bytes,
    /// which keeps `Request` within 128 bytes).
    Prefix(u16),
}

#[derive(Debug)]
struct CompiledRoute {
    prefix: Vec<u8>,
    cluster: usize,
    remove_prefix: bool,
    mirrors: Vec<CompiledMirror>,
}

/// A compiled mirror policy.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledMirror {
    /// The mirror cluster's index.
    pub cluster: usize,
    /// Migration mode.
    pub mode: MirrorMode,
    /// Mirror reads too.
    pub include_reads: bool,
    /// Share copied, parts per million.
    pub fraction_ppm: u32,
    /// The route's cluster and this one share a primary (the same address and database):
    /// shards reused when a cluster grows. A copy is then checked with
    /// [`Routing::same_primary`], so that no write runs twice on one Redis.
    pub shares_primaries: bool,
}

/// Where a key goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteMatch {
    /// Cluster index.
    pub cluster: usize,
    /// Bytes to strip from the front of the key before forwarding (0 = none).
    pub strip: usize,
    /// The route taken.
    pub route: RouteId,
}

impl Routing {
    /// Compiles the routes of `listener` over the clusters of `config`.
    ///
    /// # Errors
    /// A message naming the cluster when a shard picker cannot be built, or the route when
    /// it names an unknown cluster (the translator normally catches both first).
    pub fn build(config: &Config, listener: &Listener) -> Result<Routing, String> {
        Routing::with_clusters(Routing::compile_clusters(config)?, config, listener)
    }

    /// Compiles the clusters of `config` (shard pickers, zones), once for all its listeners.
    ///
    /// # Errors
    /// A message naming the cluster when a shard picker cannot be built.
    pub fn compile_clusters(config: &Config) -> Result<Arc<Vec<ClusterRoute>>, String> {
        let zone = config.zone.as_deref();
        config
            .clusters
            .iter()
            .map(|c| compile_cluster(c, zone))
            .collect::<Result<Vec<_>, _>>()
            .map(Arc::new)
    }

    /// Compiles the routes of `listener` over `clusters`, compiled from `config` by
    /// [`Routing::compile_clusters`].
    ///
    /// # Errors
    /// A message naming the route when it names an unknown cluster.
    pub fn with_clusters(
        clusters: Arc<Vec<ClusterRoute>>,
        config: &Config,
        listener: &Listener,
    ) -> Result<Routing, String> {
        let zone = config.zone.clone();
        let index = |name: &str| {
            clusters
                .iter()
                .position(|c| c.name == name)
                .ok_or_else(|| format!("route names unknown cluster \"{name}\""))
        };
        // `forward` policies do nothing: they are left out here so that a route whose
        // mirrors are all `forward` takes the mirror layer's no-policy path.
        let mirrors = |source: usize, m: &[MirrorPolicy]| {
            m.iter()
                .filter(|p| p.mode != MirrorMode::Forward)
                .map(|p| {
                    let cluster = index(&p.cluster)?;
                    Ok(CompiledMirror {
                        cluster,
                        mode: p.mode,
                        include_reads: p.include_reads,
                        fraction_ppm: p.fraction_ppm,
                        shares_primaries: !shared_primaries(&clusters[source], &clusters[cluster])
                            .is_empty(),
                    })
                })
                .collect::<Result<Vec<_>, String>>()
        };
        let ci = listener.routes.case_insensitive;
        let mut prefixes = listener
            .routes
            .routes
            .iter()
            .map(|r| {
                Ok(CompiledRoute {
                    prefix: if ci {
                        r.prefix.to_ascii_lowercase().into_bytes()
                    } else {
                        r.prefix.clone().into_bytes()
                    },
                    cluster: index(&r.cluster)?,
                    remove_prefix: r.remove_prefix,
                    mirrors: mirrors(index(&r.cluster)?, &r.mirrors)?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        if prefixes.len() > usize::from(u16::MAX) {
            return Err(format!(
                "routes: {} prefix routes, at most {} are supported",
                prefixes.len(),
                u16::MAX
            ));
        }
        // Longest first, so the first match is the longest match.
        prefixes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        let catch_all = match listener.routes.catch_all.as_deref() {
            Some(name) => Some(CompiledRoute {
                prefix: Vec::new(),
                cluster: index(name)?,
                remove_prefix: false,
                mirrors: mirrors(index(name)?, &listener.routes.catch_all_mirrors)?,
            }),
            None => None,
        };
        Ok(Routing {
            clusters,
            zone,
            prefixes,
            case_insensitive: ci,
            catch_all,
        })
    }

    /// The cluster for `key`: the longest matching prefix, else the catch-all.
    pub fn route(&self, key: &[u8]) -> Option<RouteMatch> {
        for (i, r) in self.prefixes.iter().enumerate() {
            if self.has_prefix(key, &r.prefix) {
                return Some(RouteMatch {
                    cluster: r.cluster,
                    strip: if r.remove_prefix { r.prefix.len() } else { 0 },
                    route: RouteId::Prefix(i as u16),
                });
            }
        }
        self.catch_all.as_ref().map(|r| RouteMatch {
            cluster: r.cluster,
            strip: 0,
            route: RouteId::CatchAll,
        })
    }

    /// The route of every key that starts with `prefix`, whatever follows: [`route`] of
    /// `prefix`, unless a longer route prefix starts with `prefix` (then some such keys go
    /// elsewhere, and this is `None`).
    ///
    /// [`route`]: Self::route
    pub fn route_of_every(&self, prefix: &[u8]) -> Option<RouteMatch> {
        let longer = self
            .prefixes
            .iter()
            .any(|r| r.prefix.len() > prefix.len() && self.has_prefix(&r.prefix, prefix));
        if longer {
            return None;
        }
        self.route(prefix)
    }

    /// `s` starts with `prefix` (ignoring ASCII case when the routes do).
    #[inline]
    fn has_prefix(&self, s: &[u8], prefix: &[u8]) -> bool {
        let Some(head) = s.get(..prefix.len()) else {
            return false;
        };
        if self.case_insensitive {
            head.eq_ignore_ascii_case(prefix)
        } else if prefix.len() <= 16 {
            // Route prefixes are short: compared in line, not by a call to `memcmp` (which a
            // slice comparison is), on every request with a key.
            head.iter().zip(prefix).all(|(a, b)| a == b)
        } else {
            head == prefix
        }
    }

    /// The route for commands without keys.
    pub fn catch_all(&self) -> Option<RouteMatch> {
        self.catch_all.as_ref().map(|r| RouteMatch {
            cluster: r.cluster,
            strip: 0,
            route: RouteId::CatchAll,
        })
    }

    /// The mirror policies of a route (empty for most routes).
    pub fn mirrors(&self, route: RouteId) -> &[CompiledMirror] {
        let r = match route {
            RouteId::CatchAll => self.catch_all.as_ref(),
            RouteId::Prefix(i) => self.prefixes.get(i as usize),
        };
        r.map(|r| r.mirrors.as_slice()).unwrap_or(&[])
    }

    /// Every route of this listener, catch-all first then prefix routes in their order: its
    /// prefix (empty for the catch-all), the clusters it sends a write to (its own, then its
    /// mirrors') and whether it removes its prefix. For what is decided once per
    /// configuration, not per request.
    pub fn routes(&self) -> Vec<(RouteId, &[u8], Vec<usize>, bool)> {
        let targets = |r: &CompiledRoute| {
            std::iter::once(r.cluster)
                .chain(r.mirrors.iter().map(|m| m.cluster))
                .collect()
        };
        let catch_all = (self.catch_all.iter())
            .map(|r| (RouteId::CatchAll, &[][..], targets(r), r.remove_prefix));
        let prefixes = self.prefixes.iter().enumerate().map(|(i, r)| {
            let id = RouteId::Prefix(i as u16);
            (id, r.prefix.as_slice(), targets(r), r.remove_prefix)
        });
        catch_all.chain(prefixes).collect()
    }

    /// Prefixes are matched ignoring ASCII case.
    pub fn case_insensitive(&self) -> bool {
        self.case_insensitive
    }

    /// Every cluster a route of this listener (or one of its mirrors) sends to: the catch-all
    /// first, then in route order, each once.
    pub fn routed_clusters(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for r in self.catch_all.iter().chain(&self.prefixes) {
            for c in std::iter::once(r.cluster).chain(r.mirrors.iter().map(|m| m.cluster)) {
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
        out
    }

    /// The clusters the routes themselves send to (not their mirror clusters, except the
    /// target of a move, whose keys are on both until it ends), in cluster order, each once,
    /// for the keyspace-wide commands (`SCAN`, `KEYS`, ...). `prefix` is
    /// what to put back in front of the cluster's stored keys: the route's prefix when the
    /// only route to the cluster is one prefix route with `remove_prefix` (lowercased for
    /// case-insensitive routes, as it is matched); `None` when the keys are stored as the
    /// client names them, or when several routes reach the cluster (then a stored key has no
    /// single client name, and it is listed as stored).
    pub fn keyspace_clusters(&self) -> Vec<KeyspaceCluster> {
        let mut out: Vec<(KeyspaceCluster, usize)> = Vec::new();
        let moves = self.catch_all.iter().chain(&self.prefixes).flat_map(|r| {
            r.mirrors
                .iter()
                .filter(|m| matches!(m.mode, MirrorMode::Move | MirrorMode::PrepareMove))
                .map(move |m| (m.cluster, r))
        });
        let targets = self
            .catch_all
            .iter()
            .chain(&self.prefixes)
            .map(|r| (r.cluster, r))
            .chain(moves);
        for (cluster, r) in targets {
            match out.iter_mut().find(|(k, _)| k.cluster == cluster) {
                Some((k, n)) => {
                    k.prefix = None;
                    *n += 1;
                }
                None => out.push((
                    KeyspaceCluster {
                        cluster,
                        prefix: r.remove_prefix.then(|| r.prefix.clone()),
                    },
                    1,
                )),
            }
        }
        let mut out: Vec<KeyspaceCluster> = out.into_iter().map(|(k, _)| k).collect();
        out.sort_by_key(|k| k.cluster);
        out
    }

    /// True when shard `sa` of cluster `a` and shard `sb` of cluster `b` have one primary:
    /// the same address and database, so one Redis.
    pub fn same_primary(&self, a: usize, sa: usize, b: usize, sb: usize) -> bool {
        let at = |c: usize, s: usize| {
            let c = self.clusters.get(c)?;
            Some((c.shards.get(s)?.primary_address?, c.db))
        };
        matches!((at(a, sa), at(b, sb)), (Some(x), Some(y)) if x == y)
    }

    /// The clusters this listener's `dual_write` policies send write copies to, each once, in
    /// route order: an old-first policy's mirror cluster, a new-first policy's route cluster
    /// (the first `target_is_primary` policy of a route; a further one acts as old-first), as
    /// [`crate::mirror`] applies them. A route whose policies include `read_only`, `move` or
    /// `prepare_move` copies no write (they are refused, or moved instead). Each such cluster
    /// has a [`crate::write_record::WriteRecord`].
    pub fn write_copy_targets(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for r in self.catch_all.iter().chain(&self.prefixes) {
            let copies_no_write = r.mirrors.iter().any(|m| {
                matches!(
                    m.mode,
                    MirrorMode::ReadOnly | MirrorMode::Move | MirrorMode::PrepareMove
                )
            });
            if copies_no_write {
                continue;
            }
            let mut retargeted = false;
            for m in &r.mirrors {
                let MirrorMode::DualWrite { target_is_primary } = m.mode else {
                    continue;
                };
                let new_first = target_is_primary && !retargeted;
                retargeted |= new_first;
                let to = if new_first { r.cluster } else { m.cluster };
                if !out.contains(&to) {
                    out.push(to);
                }
            }
        }
        out
    }

    /// The clusters this listener's `read_only` policies name (copy mode's write pause: the
    /// route's writes refused while the copies to that cluster drain): a record of the write
    /// copies they received is kept over such a configuration, though no write is copied.
    pub fn paused_copy_targets(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for r in self.catch_all.iter().chain(&self.prefixes) {
            for m in &r.mirrors {
                if m.mode == MirrorMode::ReadOnly && !out.contains(&m.cluster) {
                    out.push(m.cluster);
                }
            }
        }
        out
    }

    /// True when some route has a mirror policy that is not `Forward`.
    pub fn has_mirrors(&self) -> bool {
        self.prefixes
            .iter()
            .chain(self.catch_all.as_ref())
            .any(|r| r.mirrors.iter().any(|m| m.mode != MirrorMode::Forward))
    }
}

/// Endpoints a shard may have (a request carries the index as a `u16`).
pub const MAX_SHARD_ENDPOINTS: usize = u16::MAX as usize;

/// One line for each mirror policy whose two clusters share primaries (shards reused when a
/// cluster grows), for `respway --check`: those copies are skipped where the write itself
/// went (see [`CompiledMirror::shares_primaries`]).
pub fn shared_primary_notes(config: &Config) -> Vec<String> {
    let Ok(clusters) = Routing::compile_clusters(config) else {
        return Vec::new();
    };
    let find = |name: &str| clusters.iter().find(|c| c.name == name);
    let mut out = Vec::new();
    for l in &config.listeners {
        let routes = l
            .routes
            .routes
            .iter()
            .map(|r| (format!("route \"{}\"", r.prefix), &r.cluster, &r.mirrors))
            .chain(
                l.routes
                    .catch_all
                    .iter()
                    .map(|c| ("catch_all".to_string(), c, &l.routes.catch_all_mirrors)),
            );
        for (route, cluster, mirrors) in routes {
            for m in mirrors.iter().filter(|m| m.mode != MirrorMode::Forward) {
                let (Some(a), Some(b)) = (find(cluster), find(&m.cluster)) else {
                    continue;
                };
                let shared = shared_primaries(a, b);
                if shared.is_empty() {
                    continue;
                }
                let list: Vec<String> = shared.iter().map(ToString::to_string).collect();
                out.push(format!(
                    "listener \"{}\", {route}: clusters \"{}\" and \"{}\" share the primaries {} \
                     (database {}); a write is not copied to the Redis it already reached, so it \
                     runs once there",
                    l.name,
                    a.name,
                    b.name,
                    list.join(", "),
                    a.db
                ));
            }
        }
    }
    out
}

/// The primaries (address and database) two clusters share, in `a`'s shard order.
pub fn shared_primaries(a: &ClusterRoute, b: &ClusterRoute) -> Vec<SocketAddr> {
    if a.db != b.db {
        return Vec::new();
    }
    a.shards
        .iter()
        .filter_map(|s| s.primary_address)
        .filter(|x| b.shards.iter().any(|t| t.primary_address == Some(*x)))
        .collect()
}

fn compile_cluster(c: &Cluster, zone: Option<&str>) -> Result<ClusterRoute, String> {
    let picker = cluster_picker(c).map_err(|e| format!("cluster \"{}\": {e}", c.name))?;
    if let Some(s) = c
        .shards
        .iter()
        .find(|s| s.endpoints.len() > MAX_SHARD_ENDPOINTS)
    {
        return Err(format!(
            "cluster \"{}\": shard \"{}\": endpoints: at most {MAX_SHARD_ENDPOINTS} (got {})",
            c.name,
            s.name,
            s.endpoints.len()
        ));
    }
    let shards: Vec<ShardRoute> = c
        .shards
        .iter()
        .map(|s| ShardRoute {
            name: s.name.clone(),
            primary: s
                .endpoints
                .iter()
                .position(|e| e.role == Role::Primary)
                .unwrap_or(0),
            primary_address: s
                .endpoints
                .iter()
                .find(|e| e.role == Role::Primary)
                .or(s.endpoints.first())
                .map(|e| e.address)
                .filter(|a| *a != crate::model::NO_ENDPOINT),
            migrate_auth: s
                .endpoints
                .iter()
                .find(|e| e.role == Role::Primary)
                .or(s.endpoints.first())
                .and_then(|e| c.auth_for(e.address))
                .map(|a| match &a.username {
                    Some(u) => vec![
                        Bytes::from_static(b"AUTH2"),
                        Bytes::from(u.clone()),
                        Bytes::from(a.password.clone()),
                    ],
                    None => vec![Bytes::from_static(b"AUTH"), Bytes::from(a.password.clone())],
                })
                .map(MigrateAuth)
                .unwrap_or_default(),
            endpoints: s
                .endpoints
                .iter()
                .map(|e| EndpointRoute {
                    role: e.role,
                    zone: e.zone.clone(),
                    local: zone.is_some() && e.zone.as_deref() == zone,
                })
                .collect(),
        })
        .collect();
    let local_shards = shards
        .iter()
        .enumerate()
        .filter(|(_, s)| s.endpoints.iter().any(|e| e.local))
        .map(|(i, _)| i)
        .collect();
    let mut hot_keys: Vec<HotKeyRoute> = c
        .hot_keys
        .iter()
        .map(|h| HotKeyRoute {
            prefix: h.prefix.clone().into_bytes(),
            read: h.read,
            copied: Arc::default(),
        })
        .collect();
    hot_keys.sort_by_key(|h| std::cmp::Reverse(h.prefix.len()));
    Ok(ClusterRoute {
        name: c.name.clone(),
        picker,
        shards,
        hot_keys,
        read_policy: c.read_policy,
        local_shards,
        hashtag: c.hashtag,
        db: c.db,
        redis_cluster: c.redis_cluster.is_some(),
        slot_map: if c.redis_cluster.is_some() {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            for s in &c.shards {
                s.slots.hash(&mut h);
            }
            h.finish()
        } else {
            0
        },
    })
}
