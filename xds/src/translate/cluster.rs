//! `Cluster` → [`respway_filters::model::Cluster`]: placement policy (Envoy's maglev and ring
//! hash, or respway's `ShardHashing`), upstream auth (Envoy's `RedisProtocolOptions`),
//! respway's `ClusterOptions`, and the shards from the cluster's endpoints.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ring_hash_lb_config::HashFunction, ClusterDiscoveryType, DiscoveryType, LbConfig, LbPolicy,
};
use envoy_types::pb::envoy::config::cluster::v3::Cluster as PbCluster;
use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use envoy_types::pb::envoy::config::core::v3::DataSource;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::extensions::filters::network::redis_proxy::v3::RedisProtocolOptions;
use envoy_types::pb::envoy::extensions::load_balancing_policies::{
    maglev::v3::Maglev, ring_hash::v3::ring_hash, ring_hash::v3::RingHash,
};
use prost::Name;
use respway_filters::model::{
    Cluster, EndpointAuth, HashPolicy, HashTag, HotKeyRead, HotKeyRule, KeyHash, ReadPolicy,
    RingHashFunction, UpstreamAuth, ZoneFallback, DEFAULT_DATABASES, DEFAULT_DEDICATED_CONNECTIONS,
};

use super::{
    endpoint, inline_secret, positive_duration, secret, socket_address, type_name, unpack,
    unsupported,
};
use crate::common;
use crate::error::{index, join, Cx};
use crate::pb::respway::v1 as rw;

/// How a cluster is named in errors.
pub(super) fn resource(c: &PbCluster, i: usize) -> String {
    if c.name.is_empty() {
        format!("clusters[{i}]")
    } else {
        format!("cluster {:?}", c.name)
    }
}

/// A translated cluster and what it leaves to the listeners routing to it.
pub(super) struct Translated {
    /// The model cluster; its `hashtag` and `read_policy` are placeholders until the caller
    /// settles them.
    pub(super) cluster: Cluster,
    /// The hashtag from `respway.v1.ClusterOptions` when that says one; `None` leaves it to
    /// the listeners' `enable_hashtagging`.
    pub(super) hashtag: Option<Option<HashTag>>,
    /// The read policy from `respway.v1.ClusterOptions` when that says one; `None` leaves it
    /// to the listeners' `RedisProxy.settings.read_policy`.
    pub(super) read_policy: Option<ReadPolicy>,
}

/// Translates one cluster; `None` when it (or its endpoints) had errors.
#[allow(deprecated)] // deprecated Envoy fields are read to refuse them
pub(super) fn translate(
    cx: &mut Cx,
    c: &PbCluster,
    i: usize,
    assignments: &HashMap<&str, &ClusterLoadAssignment>,
) -> Option<Translated> {
    cx.resource = resource(c, i);
    let before = cx.count();
    if c.name.is_empty() {
        cx.err("name", "must not be empty");
    }
    let connect_timeout = match &c.connect_timeout {
        Some(d) => positive_duration(cx, "connect_timeout", d),
        None => Some(common::DEFAULT_CONNECT_TIMEOUT),
    };
    let redis = super::redis_cluster::is_redis_cluster(c);
    let hash = if redis {
        super::redis_cluster::placement(cx, c)
    } else {
        hash_policy(cx, c)
    };

    let mut auth = None;
    let mut endpoint_auth = Vec::new();
    let mut options = rw::ClusterOptions::default();
    let mut options_at = format!(
        "typed_extension_protocol_options[{:?}]",
        crate::names::CLUSTER_OPTIONS
    );
    let mut keys: Vec<&String> = c.typed_extension_protocol_options.keys().collect();
    keys.sort();
    for key in keys {
        let any = &c.typed_extension_protocol_options[key];
        let at = format!("typed_extension_protocol_options[{key:?}]");
        let name = type_name(any);
        if name == RedisProtocolOptions::full_name() {
            match unpack::<RedisProtocolOptions>(any) {
                Ok(o) => {
                    auth = upstream_auth(cx, &at, &o);
                    endpoint_auth = credentials(cx, &at, &o);
                }
                Err(e) => cx.err(at, e),
            }
        } else if name == rw::ClusterOptions::full_name() {
            match unpack::<rw::ClusterOptions>(any) {
                Ok(o) => {
                    options = o;
                    options_at = at;
                }
                Err(e) => cx.err(at, e),
            }
        } else {
            cx.err(
                at,
                format!("unsupported protocol options {:?}", any.type_url),
            );
        }
    }
    let hashtag = options.hashtag.as_deref().map(|s| {
        common::parse_hashtag(s).unwrap_or_else(|e| {
            cx.err(join(&options_at, "hashtag"), e);
            None
        })
    });
    let read_policy = read_policy(cx, &options_at, &options);
    let hot_keys = hot_keys(cx, &options_at, &options.hot_keys);
    let near_cache = super::near_cache::near_cache(cx, &options_at, options.near_cache.as_ref());
    let databases = match options.databases {
        // A Redis Cluster has database 0 only (a client's SELECT n is refused by respway).
        0 | 1 if redis => 1,
        _ if redis => {
            cx.err(
                join(&options_at, "databases"),
                "a Redis Cluster has database 0 only (databases: 1)",
            );
            1
        }
        0 => DEFAULT_DATABASES,
        n => at_most(cx, &options_at, "databases", n, common::MAX_DATABASES),
    };
    let dedicated_connections = match options.dedicated_connections {
        0 => DEFAULT_DEDICATED_CONNECTIONS,
        n => at_most(
            cx,
            &options_at,
            "dedicated_connections",
            n,
            common::MAX_DEDICATED_CONNECTIONS,
        ) as usize,
    };

    unsupported(
        cx,
        "",
        &[
            (
                "transport_socket_matches",
                !c.transport_socket_matches.is_empty(),
            ),
            (
                "transport_socket_matcher",
                c.transport_socket_matcher.is_some(),
            ),
            ("stats_matcher", c.stats_matcher.is_some()),
            (
                "per_connection_buffer_limit_bytes",
                c.per_connection_buffer_limit_bytes.is_some(),
            ),
            (
                "per_connection_buffer_high_watermark_timeout",
                c.per_connection_buffer_high_watermark_timeout.is_some(),
            ),
            (
                "max_requests_per_connection",
                c.max_requests_per_connection.is_some(),
            ),
            ("circuit_breakers", c.circuit_breakers.is_some()),
            (
                "upstream_http_protocol_options",
                c.upstream_http_protocol_options.is_some(),
            ),
            (
                "common_http_protocol_options",
                c.common_http_protocol_options.is_some(),
            ),
            ("http_protocol_options", c.http_protocol_options.is_some()),
            ("http2_protocol_options", c.http2_protocol_options.is_some()),
            ("dns_refresh_rate", c.dns_refresh_rate.is_some()),
            ("dns_jitter", c.dns_jitter.is_some()),
            (
                "dns_failure_refresh_rate",
                c.dns_failure_refresh_rate.is_some(),
            ),
            ("respect_dns_ttl", c.respect_dns_ttl),
            ("dns_lookup_family", c.dns_lookup_family != 0),
            ("dns_resolvers", !c.dns_resolvers.is_empty()),
            ("use_tcp_for_dns_lookups", c.use_tcp_for_dns_lookups),
            ("dns_resolution_config", c.dns_resolution_config.is_some()),
            (
                "typed_dns_resolver_config",
                c.typed_dns_resolver_config.is_some(),
            ),
            ("wait_for_warm_on_init", c.wait_for_warm_on_init.is_some()),
            ("outlier_detection", c.outlier_detection.is_some()),
            ("cleanup_interval", c.cleanup_interval.is_some()),
            ("upstream_bind_config", c.upstream_bind_config.is_some()),
            ("lb_subset_config", c.lb_subset_config.is_some()),
            ("common_lb_config", c.common_lb_config.is_some()),
            ("protocol_selection", c.protocol_selection != 0),
            (
                "upstream_connection_options",
                c.upstream_connection_options.is_some(),
            ),
            (
                "close_connections_on_host_health_failure",
                c.close_connections_on_host_health_failure,
            ),
            (
                "ignore_health_on_host_removal",
                c.ignore_health_on_host_removal,
            ),
            ("filters", !c.filters.is_empty()),
            ("lrs_server", c.lrs_server.is_some()),
            (
                "lrs_report_endpoint_metrics",
                !c.lrs_report_endpoint_metrics.is_empty(),
            ),
            ("track_timeout_budgets", c.track_timeout_budgets),
            ("upstream_config", c.upstream_config.is_some()),
            ("track_cluster_stats", c.track_cluster_stats.is_some()),
            ("preconnect_policy", c.preconnect_policy.is_some()),
            (
                "connection_pool_per_downstream_connection",
                c.connection_pool_per_downstream_connection,
            ),
            ("queuing_policies", c.queuing_policies.is_some()),
        ],
    );

    let health_check = super::health::health_check(cx, &c.health_checks);
    let tls = c
        .transport_socket
        .as_ref()
        .and_then(|ts| super::tls::cluster(cx, "transport_socket", ts));

    // Where the endpoints come from (a Redis Cluster: its seeds, the shards found later).
    let mut redis_cluster = None;
    let assignment = match &c.cluster_discovery_type {
        None | Some(ClusterDiscoveryType::Type(0)) => {
            if c.eds_cluster_config.is_some() {
                cx.err("eds_cluster_config", "only used by EDS clusters");
            }
            match &c.load_assignment {
                Some(cla) => Some((cx.resource.clone(), "load_assignment".to_string(), cla)),
                None => {
                    cx.err("load_assignment", "required for a STATIC cluster");
                    None
                }
            }
        }
        Some(ClusterDiscoveryType::Type(t)) if *t == DiscoveryType::Eds as i32 => {
            eds_source(cx, c);
            if c.load_assignment.is_some() {
                cx.err(
                    "load_assignment",
                    "not used by EDS clusters (send a ClusterLoadAssignment)",
                );
            }
            let service = c
                .eds_cluster_config
                .as_ref()
                .map(|e| e.service_name.as_str())
                .filter(|s| !s.is_empty())
                .unwrap_or(c.name.as_str());
            match assignments.get(service) {
                Some(cla) => Some((
                    format!("cluster_load_assignment {service:?}"),
                    String::new(),
                    *cla,
                )),
                None => {
                    cx.err("", missing_assignment(service));
                    None
                }
            }
        }
        Some(ClusterDiscoveryType::Type(t)) => {
            let name = DiscoveryType::try_from(*t)
                .map(|t| t.as_str_name().to_string())
                .unwrap_or_else(|_| t.to_string());
            cx.err(
                "type",
                format!("{name} is not supported by respway (use EDS or STATIC)"),
            );
            None
        }
        Some(ClusterDiscoveryType::ClusterType(ct)) if redis => {
            redis_cluster = super::redis_cluster::source(cx, c, ct);
            None
        }
        Some(ClusterDiscoveryType::ClusterType(ct)) => {
            cx.err(
                "cluster_type",
                format!(
                    "custom cluster type {:?} is not supported by respway",
                    ct.name
                ),
            );
            None
        }
    };
    let shards = match assignment {
        Some((resource, prefix, cla)) => {
            let own = std::mem::replace(&mut cx.resource, resource);
            let shards = endpoint::shards(cx, &prefix, cla, hash.as_ref());
            cx.resource = own;
            Some(shards)
        }
        None if redis_cluster.is_some() => Some(super::redis_cluster::placeholder()),
        None => None,
    };
    // A Redis Cluster's keys are placed as Redis Cluster places them: `{}` hashtags.
    let hashtag = if redis {
        if hashtag.is_some_and(|h| h != Some(HashTag::default())) {
            cx.err(
                join(&options_at, "hashtag"),
                "a Redis Cluster hashes keys with {} hashtags, as Redis does",
            );
        }
        Some(Some(HashTag::default()))
    } else {
        hashtag
    };
    if redis && options.db != 0 {
        cx.err(
            join(&options_at, "db"),
            "a Redis Cluster has database 0 only",
        );
    }

    if cx.count() > before {
        return None;
    }
    Some(Translated {
        cluster: Cluster {
            tls,
            health_check,
            near_cache,
            redis_cluster,
            hot_keys,
            read_policy: ReadPolicy::Primary,
            name: c.name.clone(),
            hash: hash?,
            hashtag: None,
            shards: shards?,
            connections_per_endpoint: match options.connections_per_endpoint {
                0 => common::DEFAULT_CONNECTIONS_PER_ENDPOINT,
                n => n as usize,
            },
            databases,
            dedicated_connections,
            max_queue_per_connection: match options.max_queue_per_connection {
                0 => respway_filters::model::DEFAULT_MAX_QUEUE_PER_CONNECTION,
                n => n as usize,
            },
            connect_timeout: connect_timeout?,
            auth,
            endpoint_auth,
            db: options.db,
        },
        hashtag,
        read_policy,
    })
}

/// An EDS cluster's endpoints come over the ADS stream (or, from a file, beside it):
/// `eds_cluster_config.eds_config` unset or `ads`. Any other source (a file, a separate gRPC
/// or REST API, `self`) is refused by name rather than read from the ADS stream anyway.
#[allow(deprecated)] // `path` is read to refuse it
fn eds_source(cx: &mut Cx, c: &PbCluster) {
    let Some(source) = c
        .eds_cluster_config
        .as_ref()
        .and_then(|e| e.eds_config.as_ref())
    else {
        return;
    };
    let field = match &source.config_source_specifier {
        None | Some(ConfigSourceSpecifier::Ads(_)) => return,
        Some(ConfigSourceSpecifier::Path(_)) => "path",
        Some(ConfigSourceSpecifier::PathConfigSource(_)) => "path_config_source",
        Some(ConfigSourceSpecifier::ApiConfigSource(_)) => "api_config_source",
        Some(ConfigSourceSpecifier::Self_(_)) => "self",
    };
    cx.err(
        format!("eds_cluster_config.eds_config.{field}"),
        "not supported by respway: endpoints come over the ADS stream (use ads: {})",
    );
}

/// `ClusterOptions` (at `at`) count `field`, `n`, when it is at most `max` (else an error, and
/// `max` to carry on).
fn at_most(cx: &mut Cx, at: &str, field: &str, n: u32, max: u32) -> u32 {
    if n > max {
        cx.err(join(at, field), format!("must be at most {max}"));
        return max;
    }
    n
}

/// `ClusterOptions.read_policy` with its `zone_fallback`; `None` when unspecified.
fn read_policy(cx: &mut Cx, at: &str, o: &rw::ClusterOptions) -> Option<ReadPolicy> {
    let fallback = match rw::ZoneFallback::try_from(o.zone_fallback) {
        Ok(rw::ZoneFallback::Primary) => ZoneFallback::Primary,
        Ok(rw::ZoneFallback::AnyReplica) => ZoneFallback::AnyReplica,
        Err(_) => {
            cx.err(
                join(at, "zone_fallback"),
                format!("unknown value {}", o.zone_fallback),
            );
            ZoneFallback::Primary
        }
    };
    let policy = match rw::ReadPolicy::try_from(o.read_policy) {
        Ok(rw::ReadPolicy::Unspecified) => None,
        Ok(rw::ReadPolicy::Primary) => Some(ReadPolicy::Primary),
        Ok(rw::ReadPolicy::PreferReplica) => Some(ReadPolicy::PreferReplica),
        Ok(rw::ReadPolicy::ZoneLocal) => Some(ReadPolicy::ZoneLocal { fallback }),
        Ok(rw::ReadPolicy::Any) => Some(ReadPolicy::Any),
        Err(_) => {
            cx.err(
                join(at, "read_policy"),
                format!("unknown value {}", o.read_policy),
            );
            return None;
        }
    };
    if fallback != ZoneFallback::Primary && !matches!(policy, Some(ReadPolicy::ZoneLocal { .. })) {
        cx.err(
            join(at, "zone_fallback"),
            "only used with READ_POLICY_ZONE_LOCAL",
        );
    }
    policy
}

/// `ClusterOptions.hot_keys`, checked like the YAML's.
fn hot_keys(cx: &mut Cx, at: &str, list: &[rw::HotKey]) -> Vec<HotKeyRule> {
    let mut out = Vec::new();
    for (i, h) in list.iter().enumerate() {
        let read = match rw::HotKeyRead::try_from(h.read) {
            Ok(rw::HotKeyRead::RoundRobin) => HotKeyRead::RoundRobin,
            Ok(rw::HotKeyRead::Random) => HotKeyRead::Random,
            Ok(rw::HotKeyRead::SameZone) => HotKeyRead::SameZone,
            Err(_) => {
                cx.err(
                    format!("{at}.hot_keys[{i}].read"),
                    format!("unknown value {}", h.read),
                );
                HotKeyRead::RoundRobin
            }
        };
        out.push(HotKeyRule {
            prefix: h.prefix.clone(),
            read,
        });
    }
    for p in common::check_hot_keys(&out) {
        let (i, reason) = common::hot_key_problem(&p, &out, |i| i);
        cx.err(format!("{at}.hot_keys[{i}].prefix"), reason);
    }
    out
}

fn upstream_auth(cx: &mut Cx, at: &str, o: &RedisProtocolOptions) -> Option<UpstreamAuth> {
    unsupported(cx, at, &[("aws_iam", o.aws_iam.is_some())]);
    auth_pair(cx, at, o.auth_username.as_ref(), o.auth_password.as_ref())
}

/// A username and password (`auth_username`, `auth_password` under `at`); the password
/// inline, from a file or from an environment variable.
fn auth_pair(
    cx: &mut Cx,
    at: &str,
    user: Option<&DataSource>,
    password: Option<&DataSource>,
) -> Option<UpstreamAuth> {
    let username = user.and_then(|ds| inline_secret(cx, &join(at, "auth_username"), ds));
    match password {
        Some(ds) => Some(UpstreamAuth {
            username,
            password: secret(cx, &join(at, "auth_password"), ds, true)?,
        }),
        None if user.is_some() => {
            cx.err(join(at, "auth_password"), "required with auth_username");
            None
        }
        None => None,
    }
}

/// `RedisProtocolOptions.credentials`: per-endpoint credentials, by address (at most one
/// entry per address).
fn credentials(cx: &mut Cx, at: &str, o: &RedisProtocolOptions) -> Vec<EndpointAuth> {
    let mut out: Vec<EndpointAuth> = Vec::new();
    for (i, c) in o.credentials.iter().enumerate() {
        let item = index(&join(at, "credentials"), i);
        let address = socket_address(cx, &join(&item, "address"), c.address.as_ref());
        let auth = match &c.auth_password {
            None => {
                cx.err(join(&item, "auth_password"), "required");
                None
            }
            p => auth_pair(cx, &item, c.auth_username.as_ref(), p.as_ref()),
        };
        let (Some(address), Some(auth)) = (address, auth) else {
            continue;
        };
        if let Some(first) = out.iter().position(|e| e.address == address) {
            cx.err(
                join(&item, "address"),
                format!("{address} already has credentials (credentials[{first}])"),
            );
            continue;
        }
        out.push(EndpointAuth { address, auth });
    }
    common::normalize_endpoint_auth(&mut out);
    out
}

/// The placement policy, from `load_balancing_policy` when set (Envoy's newer way, and the
/// only way to carry respway's `ShardHashing`), else from `lb_policy` and its `lb_config`.
fn hash_policy(cx: &mut Cx, c: &PbCluster) -> Option<HashPolicy> {
    let lb_config_name = |l: &LbConfig| match l {
        LbConfig::RingHashLbConfig(_) => "ring_hash_lb_config",
        LbConfig::MaglevLbConfig(_) => "maglev_lb_config",
        LbConfig::OriginalDstLbConfig(_) => "original_dst_lb_config",
        LbConfig::LeastRequestLbConfig(_) => "least_request_lb_config",
        LbConfig::RoundRobinLbConfig(_) => "round_robin_lb_config",
    };
    let before = cx.count();
    let lb_policy = LbPolicy::try_from(c.lb_policy);
    if let Some(lbp) = &c.load_balancing_policy {
        match lb_policy {
            Ok(LbPolicy::RoundRobin | LbPolicy::ClusterProvided)
            | Ok(LbPolicy::LoadBalancingPolicyConfig) => {}
            Ok(p) => cx.err(
                "lb_policy",
                format!("{} conflicts with load_balancing_policy", p.as_str_name()),
            ),
            Err(_) => cx.err("lb_policy", format!("unknown value {}", c.lb_policy)),
        }
        if let Some(l) = &c.lb_config {
            cx.err(lb_config_name(l), "conflicts with load_balancing_policy");
        }
        // Like Envoy, use the first policy in the list that is supported.
        let mut seen = Vec::new();
        for (i, p) in lbp.policies.iter().enumerate() {
            let at = format!("load_balancing_policy.policies[{i}].typed_extension_config");
            let Some(any) = p
                .typed_extension_config
                .as_ref()
                .and_then(|t| t.typed_config.as_ref())
            else {
                cx.err(join(&at, "typed_config"), "required");
                continue;
            };
            let at = join(&at, "typed_config");
            let name = type_name(any);
            let policy = if name == rw::ShardHashing::full_name() {
                unpack::<rw::ShardHashing>(any)
                    .map_err(|e| cx.err(&at, e))
                    .ok()
                    .and_then(|s| shard_hashing(cx, &at, &s))
            } else if name == Maglev::full_name() {
                unpack::<Maglev>(any)
                    .map_err(|e| cx.err(&at, e))
                    .ok()
                    .map(|m| {
                        unsupported(
                            cx,
                            &at,
                            &[
                                (
                                    "consistent_hashing_lb_config",
                                    m.consistent_hashing_lb_config.is_some(),
                                ),
                                (
                                    "locality_weighted_lb_config",
                                    m.locality_weighted_lb_config.is_some(),
                                ),
                            ],
                        );
                        HashPolicy::Maglev {
                            table_size: m
                                .table_size
                                .map_or(common::DEFAULT_TABLE_SIZE, |v| v.value),
                        }
                    })
            } else if name == RingHash::full_name() {
                unpack::<RingHash>(any)
                    .map_err(|e| cx.err(&at, e))
                    .ok()
                    .and_then(|r| ring_hash_extension(cx, &at, &r))
            } else {
                seen.push(any.type_url.clone());
                continue;
            };
            if let Some(policy) = &policy {
                check(cx, &at, policy);
            }
            return policy.filter(|_| cx.count() == before);
        }
        cx.err(
            "load_balancing_policy.policies",
            format!(
                "no supported policy (respway supports {}, {} and {}; got {})",
                rw::ShardHashing::type_url(),
                Maglev::type_url(),
                RingHash::type_url(),
                if seen.is_empty() {
                    "none".to_string()
                } else {
                    seen.join(", ")
                }
            ),
        );
        return None;
    }

    let policy = match lb_policy {
        Ok(LbPolicy::Maglev) => {
            let table_size = match &c.lb_config {
                None => common::DEFAULT_TABLE_SIZE,
                Some(LbConfig::MaglevLbConfig(m)) => {
                    m.table_size.map_or(common::DEFAULT_TABLE_SIZE, |v| v.value)
                }
                Some(other) => {
                    cx.err(lb_config_name(other), "does not go with lb_policy MAGLEV");
                    return None;
                }
            };
            let p = HashPolicy::Maglev { table_size };
            check(cx, "maglev_lb_config", &p);
            p
        }
        Ok(LbPolicy::RingHash) => {
            let p = match &c.lb_config {
                None => HashPolicy::RingHash {
                    minimum_ring_size: common::DEFAULT_MIN_RING,
                    maximum_ring_size: common::MAX_RING,
                    function: RingHashFunction::XxHash,
                },
                Some(LbConfig::RingHashLbConfig(r)) => HashPolicy::RingHash {
                    minimum_ring_size: r
                        .minimum_ring_size
                        .map_or(common::DEFAULT_MIN_RING, |v| v.value),
                    maximum_ring_size: r.maximum_ring_size.map_or(common::MAX_RING, |v| v.value),
                    function: match HashFunction::try_from(r.hash_function) {
                        Ok(HashFunction::XxHash) => RingHashFunction::XxHash,
                        Ok(HashFunction::MurmurHash2) => RingHashFunction::MurmurHash2,
                        Err(_) => {
                            cx.err(
                                "ring_hash_lb_config.hash_function",
                                format!("unknown value {}", r.hash_function),
                            );
                            return None;
                        }
                    },
                },
                Some(other) => {
                    cx.err(
                        lb_config_name(other),
                        "does not go with lb_policy RING_HASH",
                    );
                    return None;
                }
            };
            check(cx, "ring_hash_lb_config", &p);
            p
        }
        Ok(other) => {
            cx.err(
                "lb_policy",
                format!(
                    "{} is not supported: respway places keys on shards by hash (use MAGLEV, RING_HASH, or a load_balancing_policy with {})",
                    other.as_str_name(),
                    rw::ShardHashing::full_name()
                ),
            );
            return None;
        }
        Err(_) => {
            cx.err("lb_policy", format!("unknown value {}", c.lb_policy));
            return None;
        }
    };
    (cx.count() == before).then_some(policy)
}

/// Range checks shared with the YAML reader, reported under `prefix`.
fn check(cx: &mut Cx, prefix: &str, policy: &HashPolicy) {
    for (field, reason) in common::check_hash_policy(policy) {
        // ShardHashing nests its numbers one level down (crc32_slots.slots).
        let field = match policy {
            HashPolicy::Crc32Slots { .. } => join("crc32_slots", field),
            _ => field.to_string(),
        };
        cx.err(join(prefix, &field), reason);
    }
}

fn ring_hash_extension(cx: &mut Cx, at: &str, r: &RingHash) -> Option<HashPolicy> {
    #[allow(deprecated)]
    unsupported(
        cx,
        at,
        &[
            ("use_hostname_for_hashing", r.use_hostname_for_hashing),
            ("hash_balance_factor", r.hash_balance_factor.is_some()),
            (
                "consistent_hashing_lb_config",
                r.consistent_hashing_lb_config.is_some(),
            ),
            (
                "locality_weighted_lb_config",
                r.locality_weighted_lb_config.is_some(),
            ),
        ],
    );
    let function = match ring_hash::HashFunction::try_from(r.hash_function) {
        Ok(ring_hash::HashFunction::DefaultHash | ring_hash::HashFunction::XxHash) => {
            RingHashFunction::XxHash
        }
        Ok(ring_hash::HashFunction::MurmurHash2) => RingHashFunction::MurmurHash2,
        Err(_) => {
            cx.err(
                join(at, "hash_function"),
                format!("unknown value {}", r.hash_function),
            );
            return None;
        }
    };
    Some(HashPolicy::RingHash {
        minimum_ring_size: r
            .minimum_ring_size
            .map_or(common::DEFAULT_MIN_RING, |v| v.value),
        maximum_ring_size: r.maximum_ring_size.map_or(common::MAX_RING, |v| v.value),
        function,
    })
}

fn shard_hashing(cx: &mut Cx, at: &str, s: &rw::ShardHashing) -> Option<HashPolicy> {
    use rw::shard_hashing::Policy;
    let mut key_hash = |field: &str, k: i32| match rw::KeyHash::try_from(k) {
        Ok(k) => Some(key_hash_model(k)),
        Err(_) => {
            cx.err(join(at, field), format!("unknown key hash {k}"));
            None
        }
    };
    match &s.policy {
        Some(Policy::Ketama(k)) => Some(HashPolicy::Ketama {
            key_hash: key_hash("ketama.key_hash", k.key_hash)?,
        }),
        Some(Policy::Modula(m)) => Some(HashPolicy::Modula {
            key_hash: key_hash("modula.key_hash", m.key_hash)?,
        }),
        Some(Policy::Crc32Slots(c)) => Some(HashPolicy::Crc32Slots {
            slots: match c.slots {
                0 => common::DEFAULT_CRC32_SLOTS,
                n => n,
            },
        }),
        Some(Policy::Crc16Slots(_)) => Some(HashPolicy::Crc16Slots),
        None => {
            cx.err(
                join(at, "policy"),
                "required: one of ketama, modula, crc32_slots, crc16_slots",
            );
            None
        }
    }
}

fn key_hash_model(k: rw::KeyHash) -> KeyHash {
    match k {
        rw::KeyHash::Fnv1a64 => KeyHash::Fnv1a64,
        rw::KeyHash::Fnv1a32 => KeyHash::Fnv1a32,
        rw::KeyHash::Fnv164 => KeyHash::Fnv1_64,
        rw::KeyHash::Fnv132 => KeyHash::Fnv1_32,
        rw::KeyHash::Md5 => KeyHash::Md5,
        rw::KeyHash::Crc32 => KeyHash::Crc32,
        rw::KeyHash::Crc32a => KeyHash::Crc32a,
        rw::KeyHash::OneAtATime => KeyHash::OneAtATime,
        rw::KeyHash::Murmur => KeyHash::Murmur,
    }
}

/// The reason reported against an EDS cluster whose `ClusterLoadAssignment` is missing; the
/// ADS client recognizes it as "not warm yet" rather than invalid.
pub(crate) fn missing_assignment(service: &str) -> String {
    format!("no ClusterLoadAssignment for {service:?}")
}
