//! The compiled routing table: one configuration snapshot turned into what the request path
//! needs — prefix routes as byte strings, and a ready-built shard picker per cluster.
//!
//! Building happens off the hot path (at start and on every config change); the layers only
//! read it, through an `Arc` shared by every connection of every worker.

use std::sync::Arc;

use crate::hash::{build_picker, ShardInput, ShardPicker};
use crate::model::{Cluster, Config, Listener};

/// Routing state for one listener.
#[derive(Debug)]
pub struct Routing {
    /// Clusters in configuration order; routes refer to them by index.
    pub clusters: Vec<ClusterRoute>,
    /// Prefix routes, longest prefix first.
    prefixes: Vec<CompiledRoute>,
    case_insensitive: bool,
    catch_all: Option<usize>,
}

/// One cluster as the request path sees it.
#[derive(Debug)]
pub struct ClusterRoute {
    /// The cluster's name.
    pub name: String,
    /// Key → shard index.
    pub picker: Arc<dyn ShardPicker>,
    /// Shard names, for error messages and stats.
    pub shard_names: Vec<String>,
}

#[derive(Debug)]
struct CompiledRoute {
    prefix: Vec<u8>,
    cluster: usize,
    remove_prefix: bool,
}

/// Where a key goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteMatch {
    /// Cluster index.
    pub cluster: usize,
    /// Bytes to strip from the front of the key before forwarding (0 = none).
    pub strip: usize,
}

impl Routing {
    /// Compiles the routes of `listener` over the clusters of `config`.
    ///
    /// # Errors
    /// A message naming the cluster when a shard picker cannot be built, or the route when
    /// it names an unknown cluster (the translator normally catches both first).
    pub fn build(config: &Config, listener: &Listener) -> Result<Routing, String> {
        let clusters = config
            .clusters
            .iter()
            .map(compile_cluster)
            .collect::<Result<Vec<_>, _>>()?;
        let index = |name: &str| {
            clusters
                .iter()
                .position(|c| c.name == name)
                .ok_or_else(|| format!("route names unknown cluster \"{name}\""))
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
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        // Longest first, so the first match is the longest match.
        prefixes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        let catch_all = listener
            .routes
            .catch_all
            .as_deref()
            .map(index)
            .transpose()?;
        Ok(Routing {
            clusters,
            prefixes,
            case_insensitive: ci,
            catch_all,
        })
    }

    /// The cluster for `key`: the longest matching prefix, else the catch-all.
    pub fn route(&self, key: &[u8]) -> Option<RouteMatch> {
        for r in &self.prefixes {
            let hit = key.len() >= r.prefix.len()
                && if self.case_insensitive {
                    key[..r.prefix.len()].eq_ignore_ascii_case(&r.prefix)
                } else {
                    key.starts_with(&r.prefix)
                };
            if hit {
                return Some(RouteMatch {
                    cluster: r.cluster,
                    strip: if r.remove_prefix { r.prefix.len() } else { 0 },
                });
            }
        }
        self.catch_all
            .map(|cluster| RouteMatch { cluster, strip: 0 })
    }

    /// The cluster for commands without keys.
    pub fn catch_all(&self) -> Option<usize> {
        self.catch_all
    }
}

fn compile_cluster(c: &Cluster) -> Result<ClusterRoute, String> {
    let inputs: Vec<ShardInput<'_>> = c
        .shards
        .iter()
        .map(|s| ShardInput {
            hash_key: &s.hash_key,
            weight: s.weight,
            slots: &s.slots,
        })
        .collect();
    let picker = build_picker(&c.hash, c.hashtag, &inputs)
        .map_err(|e| format!("cluster \"{}\": {e}", c.name))?;
    Ok(ClusterRoute {
        name: c.name.clone(),
        picker,
        shard_names: c.shards.iter().map(|s| s.name.clone()).collect(),
    })
}
