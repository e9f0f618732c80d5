//! Model → Envoy v3 resources: what the management server serves for a node, built from the
//! models of its resource files once they are merged. Also the builders of single Envoy
//! values (addresses, durations, data sources, metadata) the YAML reader writes with.
//!
//! Every setting is written out explicitly, so the resources do not depend on translation
//! defaults; [`crate::translate`] of the result gives back the same model (with each shard's
//! endpoints in canonical order: primary first, then replicas by address). For a YAML file,
//! these are the very resources the YAML reader writes (`tests/golden.rs` pins them).

use std::collections::HashMap;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ring_hash_lb_config::HashFunction, ClusterDiscoveryType, DiscoveryType, EdsClusterConfig,
    LbConfig, LbPolicy, MaglevLbConfig, RingHashLbConfig,
};
use envoy_types::pb::envoy::config::cluster::v3::{
    load_balancing_policy, Cluster as PbCluster, LoadBalancingPolicy,
};
use envoy_types::pb::envoy::config::core::v3::health_check::{
    custom_health_check, CustomHealthCheck, HealthChecker,
};
use envoy_types::pb::envoy::config::core::v3::transport_socket;
use envoy_types::pb::envoy::config::core::v3::HealthCheck as PbHealthCheck;
use envoy_types::pb::envoy::config::core::v3::{
    config_source::ConfigSourceSpecifier, data_source, AggregatedConfigSource, ApiVersion,
    ConfigSource, DataSource, Locality, Metadata, RuntimeFractionalPercent, TransportSocket,
    TypedExtensionConfig,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint as PbEndpoint, LbEndpoint,
    LocalityLbEndpoints,
};
use envoy_types::pb::envoy::config::listener::v3::{
    filter::ConfigType, Filter, FilterChain, Listener as PbListener,
};
use envoy_types::pb::envoy::extensions::filters::network::redis_proxy::v3::{
    redis_protocol_options::Credential,
    redis_proxy::{
        prefix_routes::{route::RequestMirrorPolicy, Route},
        ConnPoolSettings, PrefixRoutes, ProtocolVersion,
    },
    RedisProtocolOptions, RedisProxy,
};
use envoy_types::pb::envoy::extensions::health_checkers::redis::v3::Redis as RedisHealthChecker;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    certificate_validation_context::TrustChainVerification,
    common_tls_context::ValidationContextType, CertificateValidationContext, CommonTlsContext,
    DownstreamTlsContext, TlsCertificate, UpstreamTlsContext,
};
use envoy_types::pb::envoy::r#type::v3::{fractional_percent::DenominatorType, FractionalPercent};
use envoy_types::pb::google::protobuf::{
    value::Kind, BoolValue, ListValue, Struct, UInt32Value, UInt64Value, Value,
};
use envoy_types::util::pack_any;
use respway_filters::model::{
    Cluster, Config, HashPolicy, HealthCheck, HotKeyRead, KeyHash, Listener, ListenerTls,
    MirrorMode, MirrorPolicy, NearCache, NearCacheAdmit, NearCacheMode, ProtocolMode, ReadPolicy,
    RingHashFunction, Role, UpstreamTls, ZoneFallback, DEFAULT_FAILOVER_HOLD,
};
use std::net::SocketAddr;

use crate::common;
pub(crate) use crate::common::{duration, socket};
use crate::names;
use crate::pb::respway::v1 as rw;
use crate::Resources;

/// Writes a validated model out as Envoy v3 resources: one `Listener` per listener, and per
/// cluster one EDS `Cluster` and its `ClusterLoadAssignment`. The sidecar's zone, which Envoy
/// takes from its bootstrap rather than from a resource, goes in [`Resources::node_zone`].
///
/// The inverse of [`translate`](crate::translate) for models in canonical order (each
/// shard's primary first, then its replicas by address), which is what both sources produce.
pub fn to_resources(config: &Config) -> Resources {
    Resources {
        listeners: config
            .listeners
            .iter()
            .map(|l| listener(l, config))
            .collect(),
        clusters: config.clusters.iter().map(cluster).collect(),
        // A Redis Cluster's seeds are in its own resource: it has no assignment.
        endpoints: (config.clusters.iter())
            .filter(|c| c.redis_cluster.is_none())
            .map(load_assignment)
            .collect(),
        node_zone: config.zone.clone(),
    }
}

fn listener(l: &Listener, config: &Config) -> PbListener {
    // Hashtags are per cluster in respway (`ClusterOptions.hashtag`, always written), so the
    // listener-wide Envoy flag only summarizes: on when any routed cluster uses a hashtag.
    let routed = l
        .routes
        .routes
        .iter()
        .flat_map(|r| std::iter::once(&r.cluster).chain(r.mirrors.iter().map(|m| &m.cluster)))
        .chain(l.routes.catch_all.iter())
        .chain(l.routes.catch_all_mirrors.iter().map(|m| &m.cluster))
        .map(String::as_str);
    let enable_hashtagging = routed
        .filter_map(|name| config.cluster(name))
        .any(|c| c.hashtag.is_some());
    let redis = RedisProxy {
        stat_prefix: l.name.clone(),
        settings: Some(ConnPoolSettings {
            op_timeout: Some(duration(l.op_timeout)),
            enable_hashtagging,
            ..Default::default()
        }),
        prefix_routes: Some(PrefixRoutes {
            routes: l
                .routes
                .routes
                .iter()
                .map(|r| Route {
                    prefix: r.prefix.clone(),
                    remove_prefix: r.remove_prefix,
                    cluster: r.cluster.clone(),
                    request_mirror_policy: r.mirrors.iter().map(mirror_policy).collect(),
                    ..Default::default()
                })
                .collect(),
            case_insensitive: l.routes.case_insensitive,
            catch_all_route: l.routes.catch_all.as_ref().map(|c| Route {
                cluster: c.clone(),
                request_mirror_policy: l
                    .routes
                    .catch_all_mirrors
                    .iter()
                    .map(mirror_policy)
                    .collect(),
                ..Default::default()
            }),
        }),
        downstream_auth_passwords: l.downstream_password.iter().map(|p| inline(p)).collect(),
        // What Envoy can say of the protocol: RESP3 enforced. Its RESP2 is also proto3's unset,
        // so the mode itself is always written in `ListenerSettings.protocol` as well.
        protocol_version: match l.resp.protocol {
            ProtocolMode::Resp3 => ProtocolVersion::Resp3,
            ProtocolMode::Auto | ProtocolMode::Resp2 => ProtocolVersion::Resp2,
        } as i32,
        ..Default::default()
    };
    let settings = rw::ListenerSettings {
        max_pending_per_client: saturate(l.max_pending_per_client),
        limits: Some(rw::CodecLimits {
            max_bulk_len: l.limits.max_bulk_len as u64,
            max_multibulk_len: l.limits.max_multibulk_len as u64,
            max_inline_len: l.limits.max_inline_len as u64,
        }),
        mirror_modes: l
            .routes
            .routes
            .iter()
            .flat_map(|r| r.mirrors.iter().map(|m| mirror_mode(Some(&r.prefix), m)))
            .chain(
                l.routes
                    .catch_all_mirrors
                    .iter()
                    .filter(|_| l.routes.catch_all.is_some())
                    .map(|m| mirror_mode(None, m)),
            )
            .collect(),
        client_buffer_limit: l.client.buffer_limit as u64,
        client_buffer_hard_limit: l.client.buffer_hard_limit as u64,
        client_stall_timeout: Some(duration(l.client.stall_timeout)),
        max_auth_failures: l.client.max_auth_failures,
        allow_keyless_scripts: l.client.allow_keyless_scripts,
        allow_restricted_scripts: l.client.allow_restricted_scripts,
        admin_commands: l.client.admin_commands,
        keys_max: l.client.keys_max as u64,
        pubsub_buffer_limit: l.client.pubsub_buffer_limit as u64,
        slowlog_threshold: l.observe.slowlog_threshold.map(duration),
        slowlog_max_len: l.observe.slowlog_max_len.map(|n| n as u64),
        hot_key_sample: l.observe.hot_key_sample,
        protocol: match l.resp.protocol {
            ProtocolMode::Auto => rw::Protocol::Auto,
            ProtocolMode::Resp2 => rw::Protocol::Resp2,
            ProtocolMode::Resp3 => rw::Protocol::Resp3,
        } as i32,
        advertised_redis_version: l.resp.advertised_version.clone(),
        cluster_emulation: l.cluster_emulation.as_ref().map(|e| rw::ClusterEmulation {
            announce: e.announce.iter().map(ToString::to_string).collect(),
        }),
        users: l
            .users
            .iter()
            .map(|u| rw::User {
                name: u.name.clone(),
                enabled: Some(u.enabled),
                password_sha256: u
                    .passwords
                    .iter()
                    .map(respway_filters::acl::digest_to_hex)
                    .collect(),
                nopass: u.nopass,
                rules: u.rules.clone(),
                read_only: u.read_only,
            })
            .collect(),
    };
    listener_resource(
        l.name.clone(),
        l.address,
        l.tls.as_ref().map(listener_tls),
        settings,
        redis,
    )
}

/// A listener resource: one filter chain of respway's settings filter and the RedisProxy
/// filter (what both the YAML reader and `emit` write).
pub(crate) fn listener_resource(
    name: String,
    address: SocketAddr,
    tls: Option<TransportSocket>,
    settings: rw::ListenerSettings,
    redis: RedisProxy,
) -> PbListener {
    PbListener {
        name,
        address: Some(socket(address)),
        filter_chains: vec![FilterChain {
            transport_socket: tls,
            filters: vec![
                Filter {
                    name: names::LISTENER_SETTINGS_FILTER.to_string(),
                    config_type: Some(ConfigType::TypedConfig(pack_any(settings))),
                },
                Filter {
                    name: names::REDIS_PROXY_FILTER.to_string(),
                    config_type: Some(ConfigType::TypedConfig(pack_any(redis))),
                },
            ],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn cluster(c: &Cluster) -> PbCluster {
    let mut out = eds_cluster(
        c.name.clone(),
        c.connect_timeout,
        c.tls.as_ref().map(cluster_tls),
    );
    match &c.redis_cluster {
        Some(src) => crate::redis_cluster::redis_cluster_type(&mut out, src),
        None => placement(&mut out, &c.hash),
    }
    if c.auth.is_some() || !c.endpoint_auth.is_empty() {
        out.typed_extension_protocol_options.insert(
            names::REDIS_PROXY_FILTER.to_string(),
            pack_any(RedisProtocolOptions {
                auth_password: c.auth.as_ref().map(|a| inline(&a.password)),
                auth_username: c
                    .auth
                    .as_ref()
                    .and_then(|a| a.username.as_deref().map(inline)),
                credentials: c
                    .endpoint_auth
                    .iter()
                    .map(|e| Credential {
                        address: Some(socket(e.address)),
                        auth_password: Some(inline(&e.auth.password)),
                        auth_username: e.auth.username.as_deref().map(inline),
                    })
                    .collect(),
                ..Default::default()
            }),
        );
    }
    out.typed_extension_protocol_options.insert(
        names::CLUSTER_OPTIONS.to_string(),
        pack_any(rw::ClusterOptions {
            db: c.db,
            connections_per_endpoint: saturate(c.connections_per_endpoint),
            max_queue_per_connection: saturate(c.max_queue_per_connection),
            databases: c.databases,
            dedicated_connections: saturate(c.dedicated_connections),
            hashtag: Some(common::hashtag_string(c.hashtag)),
            read_policy: match c.read_policy {
                ReadPolicy::Primary => rw::ReadPolicy::Primary,
                ReadPolicy::PreferReplica => rw::ReadPolicy::PreferReplica,
                ReadPolicy::ZoneLocal { .. } => rw::ReadPolicy::ZoneLocal,
                ReadPolicy::Any => rw::ReadPolicy::Any,
            } as i32,
            zone_fallback: match c.read_policy {
                ReadPolicy::ZoneLocal {
                    fallback: ZoneFallback::AnyReplica,
                } => rw::ZoneFallback::AnyReplica,
                _ => rw::ZoneFallback::Primary,
            } as i32,
            hot_keys: c
                .hot_keys
                .iter()
                .map(|h| rw::HotKey {
                    prefix: h.prefix.clone(),
                    read: match h.read {
                        HotKeyRead::RoundRobin => rw::HotKeyRead::RoundRobin,
                        HotKeyRead::Random => rw::HotKeyRead::Random,
                        HotKeyRead::SameZone => rw::HotKeyRead::SameZone,
                    } as i32,
                })
                .collect(),
            near_cache: c.near_cache.as_ref().map(near_cache),
        }),
    );
    out.health_checks = c.health_check.iter().map(health_check).collect();
    out
}

/// A cluster's near cache as `respway.v1.NearCache`, every setting written (what both the
/// YAML reader and `emit` write).
pub(crate) fn near_cache(n: &NearCache) -> rw::NearCache {
    rw::NearCache {
        mode: match n.mode {
            NearCacheMode::Tracked => rw::NearCacheMode::Tracked,
            NearCacheMode::Bcast => rw::NearCacheMode::Bcast,
            NearCacheMode::Ttl => rw::NearCacheMode::Ttl,
        } as i32,
        prefixes: n.prefixes.clone(),
        admit: match n.admit {
            NearCacheAdmit::All => rw::NearCacheAdmit::All,
            NearCacheAdmit::Hot => rw::NearCacheAdmit::Hot,
        } as i32,
        max_bytes: n.max_bytes,
        max_entry_bytes: n.max_entry_bytes,
        max_age: Some(duration(n.max_age)),
        hot_reads_per_sec: n.hot_reads_per_sec,
    }
}

/// A cluster's health check as Envoy's Redis health checker, every setting written (what both
/// the YAML reader and `emit` write).
pub(crate) fn health_check(h: &HealthCheck) -> PbHealthCheck {
    PbHealthCheck {
        timeout: Some(duration(h.timeout)),
        interval: Some(duration(h.interval)),
        unhealthy_threshold: Some(UInt32Value {
            value: h.unhealthy_threshold,
        }),
        healthy_threshold: Some(UInt32Value {
            value: h.healthy_threshold,
        }),
        health_checker: Some(HealthChecker::CustomHealthCheck(CustomHealthCheck {
            name: names::REDIS_HEALTH_CHECKER.to_string(),
            config_type: Some(custom_health_check::ConfigType::TypedConfig(pack_any(
                RedisHealthChecker {
                    key: h.drain_key.clone().unwrap_or_default(),
                    aws_iam: None,
                },
            ))),
        })),
        ..Default::default()
    }
}

/// A listener's TLS as Envoy's `DownstreamTlsContext` in a TLS transport socket.
fn listener_tls(t: &ListenerTls) -> TransportSocket {
    let context = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificates: vec![TlsCertificate {
                certificate_chain: Some(file(&t.cert)),
                private_key: Some(file(&t.key)),
                ..Default::default()
            }],
            validation_context_type: t.client_ca.as_ref().map(|ca| {
                ValidationContextType::ValidationContext(CertificateValidationContext {
                    trusted_ca: Some(file(ca)),
                    ..Default::default()
                })
            }),
            ..Default::default()
        }),
        require_client_certificate: Some(BoolValue {
            value: t.require_client_cert,
        }),
        ..Default::default()
    };
    TransportSocket {
        name: names::TLS_TRANSPORT_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    }
}

/// A cluster's TLS as Envoy's `UpstreamTlsContext` in a TLS transport socket;
/// `insecure_skip_verify` is `trust_chain_verification: ACCEPT_UNTRUSTED`.
fn cluster_tls(t: &UpstreamTls) -> TransportSocket {
    let validation = CertificateValidationContext {
        trusted_ca: t.ca.as_deref().map(file),
        trust_chain_verification: if t.insecure_skip_verify {
            TrustChainVerification::AcceptUntrusted
        } else {
            TrustChainVerification::VerifyTrustChain
        } as i32,
        ..Default::default()
    };
    let tls_certificates = match (&t.cert, &t.key) {
        (Some(cert), Some(key)) => vec![TlsCertificate {
            certificate_chain: Some(file(cert)),
            private_key: Some(file(key)),
            ..Default::default()
        }],
        _ => Vec::new(),
    };
    let context = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificates,
            validation_context_type: Some(ValidationContextType::ValidationContext(validation)),
            ..Default::default()
        }),
        sni: t.server_name.clone().unwrap_or_default(),
        ..Default::default()
    };
    TransportSocket {
        name: names::TLS_TRANSPORT_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    }
}

pub(crate) fn file(path: &std::path::Path) -> DataSource {
    DataSource {
        specifier: Some(data_source::Specifier::Filename(
            path.to_string_lossy().into_owned(),
        )),
        ..Default::default()
    }
}

/// What Envoy can say of a mirror: its cluster, the share copied and whether reads are.
fn mirror_policy(m: &MirrorPolicy) -> RequestMirrorPolicy {
    RequestMirrorPolicy {
        cluster: m.cluster.clone(),
        runtime_fraction: Some(RuntimeFractionalPercent {
            default_value: Some(fractional_percent(m.fraction_ppm)),
            runtime_key: String::new(),
        }),
        exclude_read_commands: !m.include_reads,
    }
}

/// What Envoy cannot say of a mirror: its migration mode, keyed by route and mirror cluster.
fn mirror_mode(prefix: Option<&str>, m: &MirrorPolicy) -> rw::RouteMirrorMode {
    let (mode, target_is_primary) = match m.mode {
        MirrorMode::Forward => (rw::MirrorMode::Forward, false),
        MirrorMode::DualWrite { target_is_primary } => {
            (rw::MirrorMode::DualWrite, target_is_primary)
        }
        MirrorMode::ReadOnly => (rw::MirrorMode::ReadOnly, false),
        MirrorMode::Move => (rw::MirrorMode::Move, false),
        MirrorMode::PrepareMove => (rw::MirrorMode::PrepareMove, false),
    };
    rw::RouteMirrorMode {
        prefix: prefix.map(str::to_string),
        cluster: m.cluster.clone(),
        mode: mode as i32,
        target_is_primary,
    }
}

/// Parts per million as the most readable exact `FractionalPercent` (`12` of `HUNDRED` rather
/// than `120000` of `MILLION`).
pub(crate) fn fractional_percent(ppm: u32) -> FractionalPercent {
    let (numerator, denominator) = if ppm.is_multiple_of(10_000) {
        (ppm / 10_000, DenominatorType::Hundred)
    } else if ppm.is_multiple_of(100) {
        (ppm / 100, DenominatorType::TenThousand)
    } else {
        (ppm, DenominatorType::Million)
    };
    FractionalPercent {
        numerator,
        denominator: denominator as i32,
    }
}

fn load_assignment(c: &Cluster) -> ClusterLoadAssignment {
    // One LocalityLbEndpoints per zone, in order of first appearance; shard order travels in
    // `shard_index` because grouping by zone loses it.
    let mut localities: Vec<LocalityLbEndpoints> = Vec::new();
    for (si, shard) in c.shards.iter().enumerate() {
        let primary = shard.primary().address;
        // (address, role, zone, carries the shard's values): a Sentinel-managed shard is
        // written as its Sentinels, the first carrying what the primary carries otherwise.
        let endpoints: Vec<(SocketAddr, &str, Option<&str>, bool)> = match &shard.sentinel {
            Some(s) => (s.sentinels.iter().enumerate())
                .map(|(i, a)| (*a, "sentinel", None, i == 0))
                .collect(),
            None => (shard.endpoints.iter())
                .map(|e| match e.role {
                    Role::Primary => (e.address, "primary", e.zone.as_deref(), true),
                    Role::Replica => (e.address, "replica", e.zone.as_deref(), false),
                })
                .collect(),
        };
        let slots: Vec<Kind> = (shard.slots.iter())
            .map(|r| string(&common::slot_range_string(*r)))
            .collect();
        for (address, role, zone, is_primary) in endpoints {
            let mut respway = vec![
                ("shard", string(&shard.name)),
                ("shard_index", Kind::NumberValue(si as f64)),
                ("role", string(role)),
            ];
            if let Some(s) = &shard.sentinel {
                respway.push(("sentinel_master", string(&s.master)));
                if is_primary && !s.zones.is_empty() {
                    respway.push(("sentinel_zones", zones(&s.zones)));
                }
                if is_primary && s.failover_hold != DEFAULT_FAILOVER_HOLD {
                    respway.push(("sentinel_failover_hold", failover_hold(s.failover_hold)));
                }
                if is_primary && !s.serve_stale_reads {
                    respway.push(("sentinel_serve_stale_reads", Kind::BoolValue(false)));
                }
            }
            let default = match &shard.sentinel {
                Some(_) => shard.name.clone(),
                None => common::default_hash_key(&c.hash, Some(&shard.name), primary),
            };
            let values = is_primary.then(|| ShardValues {
                weight: shard.weight,
                slots: &slots,
                hash_key: (shard.hash_key != default).then_some(shard.hash_key.as_str()),
            });
            let lb_endpoint = shard_endpoint(address, respway, values);
            place_in_zone(&mut localities, zone.unwrap_or_default(), lb_endpoint);
        }
    }
    ClusterLoadAssignment {
        cluster_name: c.name.clone(),
        endpoints: localities,
        ..Default::default()
    }
}

/// The zones of the nodes a shard's Sentinels may name, as `sentinel_zones` metadata.
pub(crate) fn zones(zones: &[(SocketAddr, String)]) -> Kind {
    let kv = zones.iter().map(|(a, z)| (a.to_string(), string(z)));
    Kind::StructValue(Struct {
        fields: kv.map(|(k, v)| (k, Value { kind: Some(v) })).collect(),
    })
}

/// How long a shard's writes are held during a failover, as `sentinel_failover_hold`
/// metadata: a duration string, as the YAML writes one (`250ms`).
pub(crate) fn failover_hold(d: std::time::Duration) -> Kind {
    string(&duration_string(d))
}

/// A duration as [`common::parse_duration`] reads it, in the largest unit that writes it
/// exactly (`2m`, `250ms`, `0us`); one finer than a microsecond is rounded up to the next
/// microsecond, so that it stays above zero.
pub(crate) fn duration_string(d: std::time::Duration) -> String {
    let ns = d.as_nanos();
    for (unit, size) in [
        ("h", 3_600_000_000_000u128),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
    ] {
        if ns != 0 && ns.is_multiple_of(size) {
            return format!("{}{unit}", ns / size);
        }
    }
    format!("{}us", ns.div_ceil(1_000))
}

/// What the endpoint that carries them (a shard's primary, or its first Sentinel) says of its
/// shard: the weight, the slots and the hash key (`None`: the default).
pub(crate) struct ShardValues<'a> {
    pub(crate) weight: u32,
    pub(crate) slots: &'a [Kind],
    pub(crate) hash_key: Option<&'a str>,
}

/// One endpoint of a shard: its address, its `respway` metadata, and the shard's values when
/// it carries them.
pub(crate) fn shard_endpoint(
    address: SocketAddr,
    mut respway: Vec<(&str, Kind)>,
    shard: Option<ShardValues<'_>>,
) -> LbEndpoint {
    let mut metadata = HashMap::new();
    let mut weight = None;
    if let Some(v) = shard {
        if !v.slots.is_empty() {
            let values = v.slots.iter().map(|k| Value {
                kind: Some(k.clone()),
            });
            let list = ListValue {
                values: values.collect(),
            };
            respway.push(("slots", Kind::ListValue(list)));
        }
        if let Some(key) = v.hash_key {
            metadata.insert(
                names::ENVOY_LB_NAMESPACE.to_string(),
                fields(vec![("hash_key", string(key))]),
            );
        }
        weight = Some(UInt32Value { value: v.weight });
    }
    metadata.insert(names::METADATA_NAMESPACE.to_string(), fields(respway));
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(PbEndpoint {
            address: Some(socket(address)),
            ..Default::default()
        })),
        load_balancing_weight: weight,
        metadata: Some(Metadata {
            filter_metadata: metadata,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Puts `e` in the locality of `zone` (one per zone, in order of first appearance) and
/// returns where: the locality's index and the endpoint's within it.
pub(crate) fn place_in_zone(
    localities: &mut Vec<LocalityLbEndpoints>,
    zone: &str,
    e: LbEndpoint,
) -> (usize, usize) {
    let li = match (localities.iter())
        .position(|l| l.locality.as_ref().map_or("", |l| l.zone.as_str()) == zone)
    {
        Some(li) => li,
        None => {
            localities.push(LocalityLbEndpoints {
                locality: (!zone.is_empty()).then(|| Locality {
                    zone: zone.to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            });
            localities.len() - 1
        }
    };
    localities[li].lb_endpoints.push(e);
    (li, localities[li].lb_endpoints.len() - 1)
}

pub(crate) fn key_hash_pb(k: KeyHash) -> rw::KeyHash {
    match k {
        KeyHash::Fnv1a64 => rw::KeyHash::Fnv1a64,
        KeyHash::Fnv1a32 => rw::KeyHash::Fnv1a32,
        KeyHash::Fnv1_64 => rw::KeyHash::Fnv164,
        KeyHash::Fnv1_32 => rw::KeyHash::Fnv132,
        KeyHash::Md5 => rw::KeyHash::Md5,
        KeyHash::Crc32 => rw::KeyHash::Crc32,
        KeyHash::Crc32a => rw::KeyHash::Crc32a,
        KeyHash::OneAtATime => rw::KeyHash::OneAtATime,
        KeyHash::Murmur => rw::KeyHash::Murmur,
    }
}

pub(crate) fn inline(s: &str) -> DataSource {
    DataSource {
        specifier: Some(data_source::Specifier::InlineString(s.to_string())),
        ..Default::default()
    }
}

pub(crate) fn string(s: &str) -> Kind {
    Kind::StringValue(s.to_string())
}

pub(crate) fn fields(kv: Vec<(&str, Kind)>) -> Struct {
    Struct {
        fields: kv
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value { kind: Some(v) }))
            .collect(),
    }
}

pub(crate) fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The placement policy on the cluster: Envoy's own for maglev and ring hash, respway's
/// `ShardHashing` for the others.
pub(crate) fn placement(out: &mut PbCluster, hash: &HashPolicy) {
    let shard_hashing = |policy| {
        Some(LoadBalancingPolicy {
            policies: vec![load_balancing_policy::Policy {
                typed_extension_config: Some(TypedExtensionConfig {
                    name: names::SHARD_HASHING_POLICY.to_string(),
                    typed_config: Some(pack_any(rw::ShardHashing {
                        policy: Some(policy),
                    })),
                }),
            }],
        })
    };
    use rw::shard_hashing::{Crc16Slots, Crc32Slots, Ketama, Modula, Policy};
    match hash {
        HashPolicy::Maglev { table_size } => {
            out.lb_policy = LbPolicy::Maglev as i32;
            out.lb_config = Some(LbConfig::MaglevLbConfig(MaglevLbConfig {
                table_size: Some(UInt64Value { value: *table_size }),
            }));
        }
        HashPolicy::RingHash {
            minimum_ring_size,
            maximum_ring_size,
            function,
        } => {
            out.lb_policy = LbPolicy::RingHash as i32;
            out.lb_config = Some(LbConfig::RingHashLbConfig(RingHashLbConfig {
                minimum_ring_size: Some(UInt64Value {
                    value: *minimum_ring_size,
                }),
                maximum_ring_size: Some(UInt64Value {
                    value: *maximum_ring_size,
                }),
                hash_function: match function {
                    RingHashFunction::XxHash => HashFunction::XxHash,
                    RingHashFunction::MurmurHash2 => HashFunction::MurmurHash2,
                } as i32,
            }));
        }
        HashPolicy::Ketama { key_hash } => {
            out.load_balancing_policy = shard_hashing(Policy::Ketama(Ketama {
                key_hash: key_hash_pb(*key_hash) as i32,
            }));
        }
        HashPolicy::Modula { key_hash } => {
            out.load_balancing_policy = shard_hashing(Policy::Modula(Modula {
                key_hash: key_hash_pb(*key_hash) as i32,
            }));
        }
        HashPolicy::Crc32Slots { slots } => {
            out.load_balancing_policy =
                shard_hashing(Policy::Crc32Slots(Crc32Slots { slots: *slots }));
        }
        HashPolicy::Crc16Slots => {
            out.load_balancing_policy = shard_hashing(Policy::Crc16Slots(Crc16Slots {}));
        }
    }
}

/// An EDS cluster resource whose endpoints come over ADS (what both the YAML reader and
/// `emit` write; placement and options are added by the caller).
pub(crate) fn eds_cluster(
    name: String,
    connect_timeout: std::time::Duration,
    tls: Option<TransportSocket>,
) -> PbCluster {
    PbCluster {
        name,
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(ConfigSource {
                resource_api_version: ApiVersion::V3 as i32,
                config_source_specifier: Some(ConfigSourceSpecifier::Ads(
                    AggregatedConfigSource {},
                )),
                ..Default::default()
            }),
            service_name: String::new(),
        }),
        connect_timeout: Some(duration(connect_timeout)),
        transport_socket: tls,
        ..Default::default()
    }
}
