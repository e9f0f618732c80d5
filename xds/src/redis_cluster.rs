//! A Redis Cluster as Envoy's resources say one (what the YAML reader and `emit` write).

use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, LbPolicy};
use envoy_types::pb::envoy::config::cluster::v3::Cluster as PbCluster;
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint as PbEndpoint, LbEndpoint,
    LocalityLbEndpoints,
};
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;
use respway_filters::model::RedisClusterSource;

use crate::common::{duration, socket};
use crate::names;

/// Makes `out` a Redis Cluster as Envoy says one: `cluster_type: envoy.clusters.redis` with
/// `RedisClusterConfig` (every setting written), `lb_policy: CLUSTER_PROVIDED`, and the seeds
/// as its inline `load_assignment` (no EDS).
pub(crate) fn redis_cluster_type(out: &mut PbCluster, src: &RedisClusterSource) {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::CustomClusterType;
    use envoy_types::pb::envoy::extensions::clusters::redis::v3::RedisClusterConfig;
    out.cluster_discovery_type = Some(ClusterDiscoveryType::ClusterType(CustomClusterType {
        name: names::REDIS_CLUSTER_TYPE.to_string(),
        typed_config: Some(pack_any(RedisClusterConfig {
            cluster_refresh_rate: Some(duration(src.cluster_refresh_rate)),
            cluster_refresh_timeout: Some(duration(src.cluster_refresh_timeout)),
            redirect_refresh_interval: Some(duration(src.redirect_refresh_interval)),
            redirect_refresh_threshold: Some(UInt32Value {
                value: src.redirect_refresh_threshold,
            }),
            failure_refresh_threshold: src.failure_refresh_threshold,
            host_degraded_refresh_threshold: src.host_degraded_refresh_threshold,
            ..Default::default()
        })),
    }));
    out.eds_cluster_config = None;
    out.lb_policy = LbPolicy::ClusterProvided as i32;
    out.lb_config = None;
    out.load_balancing_policy = None;
    out.load_assignment = Some(ClusterLoadAssignment {
        cluster_name: out.name.clone(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: src
                .seeds
                .iter()
                .map(|a| LbEndpoint {
                    host_identifier: Some(HostIdentifier::Endpoint(PbEndpoint {
                        address: Some(socket(*a)),
                        ..Default::default()
                    })),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    });
}
