//! A Redis Cluster (`cluster_type: envoy.clusters.redis` with Envoy's `RedisClusterConfig`):
//! its seed nodes from the cluster's inline `load_assignment`, its refresh settings, and the
//! one placeholder shard the sidecar replaces with the discovered ones.

use envoy_types::pb::envoy::config::cluster::v3::cluster::{CustomClusterType, LbPolicy};
use envoy_types::pb::envoy::config::cluster::v3::Cluster as PbCluster;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::extensions::clusters::redis::v3::RedisClusterConfig;
use prost::Name;
use respway_filters::model::{Endpoint, HashPolicy, RedisClusterSource, Role, Shard, NO_ENDPOINT};

use super::{positive_duration, socket_address, type_name, unpack};
use crate::error::{join, Cx};

/// True when `c` is a Redis Cluster.
pub(super) fn is_redis_cluster(c: &PbCluster) -> bool {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType;
    matches!(&c.cluster_discovery_type, Some(ClusterDiscoveryType::ClusterType(ct))
        if ct.name == crate::names::REDIS_CLUSTER_TYPE)
}

/// A Redis Cluster's placement: Redis Cluster's own slots. Its `lb_policy` is Envoy's
/// `CLUSTER_PROVIDED` (or unset); a load-balancing policy of respway's or Envoy's is refused.
#[allow(deprecated)]
pub(super) fn placement(cx: &mut Cx, c: &PbCluster) -> Option<HashPolicy> {
    let lb = c.lb_policy;
    if lb != LbPolicy::ClusterProvided as i32 && lb != LbPolicy::RoundRobin as i32 {
        cx.err(
            "lb_policy",
            "a Redis Cluster places keys by its own slots: CLUSTER_PROVIDED (or unset)",
        );
    }
    if c.load_balancing_policy.is_some() || c.lb_config.is_some() {
        cx.err(
            "load_balancing_policy",
            "a Redis Cluster places keys by its own slots: no load-balancing policy",
        );
    }
    Some(HashPolicy::Crc16Slots)
}

/// The source of a Redis Cluster: `RedisClusterConfig` (defaults for what it leaves unset) and
/// the seeds.
pub(super) fn source(
    cx: &mut Cx,
    c: &PbCluster,
    ct: &CustomClusterType,
) -> Option<RedisClusterSource> {
    let before = cx.count();
    let mut src = RedisClusterSource::default();
    let at = "cluster_type.typed_config";
    match &ct.typed_config {
        None => {}
        Some(any) if type_name(any) == RedisClusterConfig::full_name() => {
            match unpack::<RedisClusterConfig>(any) {
                Ok(r) => {
                    let d = |cx: &mut Cx, f: &str, v: &Option<_>, default| match v {
                        Some(d) => positive_duration(cx, &join(at, f), d).unwrap_or(default),
                        None => default,
                    };
                    src.cluster_refresh_rate = d(
                        cx,
                        "cluster_refresh_rate",
                        &r.cluster_refresh_rate,
                        src.cluster_refresh_rate,
                    );
                    src.cluster_refresh_timeout = d(
                        cx,
                        "cluster_refresh_timeout",
                        &r.cluster_refresh_timeout,
                        src.cluster_refresh_timeout,
                    );
                    src.redirect_refresh_interval = d(
                        cx,
                        "redirect_refresh_interval",
                        &r.redirect_refresh_interval,
                        src.redirect_refresh_interval,
                    );
                    if let Some(t) = r.redirect_refresh_threshold {
                        src.redirect_refresh_threshold = t.value;
                    }
                    src.failure_refresh_threshold = r.failure_refresh_threshold;
                    src.host_degraded_refresh_threshold = r.host_degraded_refresh_threshold;
                    if r.enable_zone_discovery.is_some_and(|b| b.value) {
                        cx.err(
                            join(at, "enable_zone_discovery"),
                            "not supported by respway (Valkey's availability_zone)",
                        );
                    }
                }
                Err(e) => cx.err(at, e),
            }
        }
        Some(any) => cx.err(
            at,
            format!(
                "expected {}, got {:?}",
                RedisClusterConfig::full_name(),
                any.type_url
            ),
        ),
    }
    match &c.load_assignment {
        None => cx.err(
            "load_assignment",
            "required for a Redis Cluster: its seed nodes",
        ),
        Some(cla) => {
            for (l, locality) in cla.endpoints.iter().enumerate() {
                for (e, lb) in locality.lb_endpoints.iter().enumerate() {
                    let path = format!("load_assignment.endpoints[{l}].lb_endpoints[{e}]");
                    match &lb.host_identifier {
                        Some(HostIdentifier::Endpoint(ep)) => {
                            let field = join(&path, "endpoint.address");
                            if let Some(a) = socket_address(cx, &field, ep.address.as_ref()) {
                                if src.seeds.contains(&a) {
                                    cx.err(field, format!("{a} is given twice"));
                                } else {
                                    src.seeds.push(a);
                                }
                            }
                        }
                        _ => cx.err(join(&path, "endpoint"), "required"),
                    }
                }
            }
            if src.seeds.is_empty() && cx.count() == before {
                cx.err(
                    "load_assignment",
                    "a Redis Cluster needs at least one seed node",
                );
            }
        }
    }
    if c.eds_cluster_config.is_some() {
        cx.err("eds_cluster_config", "only used by EDS clusters");
    }
    (cx.count() == before).then_some(src)
}

/// The shard a Redis Cluster has until its topology is known: every slot, no primary.
pub(super) fn placeholder() -> Vec<Shard> {
    vec![Shard {
        name: "unknown".to_string(),
        hash_key: "unknown".to_string(),
        weight: 1,
        slots: vec![(0, 16383)],
        endpoints: vec![Endpoint {
            address: NO_ENDPOINT,
            role: Role::Primary,
            zone: None,
        }],
        sentinel: None,
    }]
}
