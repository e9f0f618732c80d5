//! The names under which respway's extensions and metadata travel inside Envoy resources.

/// Envoy's Redis proxy network filter; its `typed_config` is Envoy's `RedisProxy`, and it is
/// also the key of Envoy's `RedisProtocolOptions` in `Cluster.typed_extension_protocol_options`.
pub const REDIS_PROXY_FILTER: &str = "envoy.filters.network.redis_proxy";

/// The network filter carrying `respway.v1.ListenerSettings`, placed before
/// [`REDIS_PROXY_FILTER`] in the listener's filter chain.
pub const LISTENER_SETTINGS_FILTER: &str = "respway.listener";

/// The `Cluster.typed_extension_protocol_options` key of `respway.v1.ClusterOptions`.
pub const CLUSTER_OPTIONS: &str = "respway.cluster";

/// The `Cluster.load_balancing_policy` extension name of `respway.v1.ShardHashing`.
pub const SHARD_HASHING_POLICY: &str = "respway.shard_hashing";

/// The endpoint `filter_metadata` namespace holding `shard`, `shard_index`, `role` and `slots`.
pub const METADATA_NAMESPACE: &str = "respway";

/// The `node.metadata` field in which a sidecar names its admin endpoint (`IP:port`, a
/// string), for tools that ask every sidecar (its mirrored copies and their record of keys:
/// `GET /mirror`); the management server shows it as the node's `admin` in `GET /status`.
pub const NODE_ADMIN_METADATA: &str = "respway_admin";

/// Envoy's load-balancer metadata namespace; respway reads its `hash_key`.
pub const ENVOY_LB_NAMESPACE: &str = "envoy.lb";

/// Envoy's TLS transport socket (`DownstreamTlsContext` on a listener's filter chain,
/// `UpstreamTlsContext` on a cluster).
pub const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";

/// The name of Envoy's Redis health checker (`HealthCheck.custom_health_check.name`), the
/// one health checker respway runs.
pub const REDIS_HEALTH_CHECKER: &str = "envoy.health_checkers.redis";

/// Envoy's custom cluster type of a Redis Cluster (`cluster_type.name`), whose typed config
/// is `envoy.extensions.clusters.redis.v3.RedisClusterConfig`.
pub const REDIS_CLUSTER_TYPE: &str = "envoy.clusters.redis";
