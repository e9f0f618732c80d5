//! Clusters, read into Envoy's EDS `Cluster`: connect timeout, TLS, the placement policy
//! (Envoy's maglev and ring hash, or respway's `ShardHashing`), upstream auth (Envoy's
//! `RedisProtocolOptions`) and respway's `ClusterOptions`. The shards are [`super::shards`].
//!
//! Only what is about the YAML's shape is checked here; the translation checks the rest.

use envoy_types::pb::envoy::config::cluster::v3::Cluster as PbCluster;
use envoy_types::pb::envoy::config::core::v3::{transport_socket, TransportSocket};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::extensions::filters::network::redis_proxy::v3::{
    redis_protocol_options::Credential, RedisProtocolOptions,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    certificate_validation_context::TrustChainVerification,
    common_tls_context::ValidationContextType, CertificateValidationContext, CommonTlsContext,
    TlsCertificate, UpstreamTlsContext,
};
use envoy_types::util::pack_any;
use respway_filters::model::{
    HashPolicy, HealthCheck, KeyHash, NearCache, RingHashFunction, DEFAULT_DATABASES,
    DEFAULT_DEDICATED_CONNECTIONS, DEFAULT_MAX_QUEUE_PER_CONNECTION,
};
use serde_yaml_ng::Value;

use super::auth::upstream_auth;
use super::listener::resource_name;
use super::origin::Origins;
use super::reference::{
    CLUSTER_KEYS, CLUSTER_TLS_KEYS, HEALTH_CHECK_KEYS, HOT_KEY_KEYS, NEAR_CACHE_KEYS, POLICIES,
};
use super::shards::shards;
use super::value::{kind, Map};
use crate::common;
use crate::emit::{
    eds_cluster, file, health_check as health_check_pb, inline, near_cache as near_cache_pb,
    placement, saturate, socket,
};
use crate::error::{join, Cx};
use crate::names;
use crate::pb::respway::v1 as rw;

/// Where the translation finds the options.
fn options_at(name: &str) -> String {
    format!("typed_extension_protocol_options[{name:?}]")
}

/// One cluster and its endpoints (none for a Redis Cluster: its seeds are in the cluster);
/// `None` when the value is not a mapping.
pub(super) fn cluster(
    cx: &mut Cx,
    o: &mut Origins,
    v: &Value,
    i: usize,
) -> Option<(PbCluster, Option<ClusterLoadAssignment>)> {
    cx.resource = resource_name(v, "cluster", "clusters", i);
    let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
    let envoy = if name.is_empty() {
        format!("clusters[{i}]")
    } else {
        format!("cluster {name:?}")
    };
    o.enter(&envoy, &cx.resource);
    let m = Map::new(cx, v, "", CLUSTER_KEYS)?;
    o.note("name", "name");
    let name = m.required_name(cx).unwrap_or_default();
    for (envoy, yaml) in [
        ("lb_policy", "hash"),
        ("lb_config", "hash"),
        ("load_balancing_policy", "hash"),
        ("maglev_lb_config", "hash"),
        ("maglev_lb_config.table_size", "hash.table_size"),
        ("ring_hash_lb_config", "hash"),
        ("ring_hash_lb_config.hash_function", "hash.function"),
        (
            "ring_hash_lb_config.minimum_ring_size",
            "hash.minimum_ring_size",
        ),
        (
            "ring_hash_lb_config.maximum_ring_size",
            "hash.maximum_ring_size",
        ),
    ] {
        o.note(envoy, yaml);
    }
    let hash = match m.get("hash") {
        Some(v) => hash_policy(cx, v, "hash"),
        None => None,
    }
    .unwrap_or(HashPolicy::Maglev {
        table_size: common::DEFAULT_TABLE_SIZE,
    });
    let opts = options_at(names::CLUSTER_OPTIONS);
    for key in [
        "hashtag",
        "connections_per_endpoint",
        "max_queue_per_connection",
        "dedicated_connections",
    ] {
        o.note(format!("{opts}.{key}"), key);
    }
    // The hashtag as written when it reads, else as given (the translation says why not).
    let hashtag = match m.raw("hashtag") {
        None => common::hashtag_string(Some(Default::default())),
        Some(Value::Null) => String::new(),
        Some(Value::String(s)) => common::parse_hashtag(s)
            .map(common::hashtag_string)
            .unwrap_or_else(|_| s.clone()),
        Some(other) => {
            cx.err(
                "hashtag",
                format!("expected a string or null, got {}", kind(other)),
            );
            String::new()
        }
    };
    let connections_per_endpoint = m
        .positive(cx, "connections_per_endpoint", u32::MAX.into())
        .map_or(common::DEFAULT_CONNECTIONS_PER_ENDPOINT, |n| n as usize);
    let max_queue_per_connection = m
        .positive(cx, "max_queue_per_connection", u32::MAX.into())
        .map_or(DEFAULT_MAX_QUEUE_PER_CONNECTION, |n| n as usize);
    let dedicated_connections = m
        .positive(cx, "dedicated_connections", u32::MAX.into())
        .map_or(DEFAULT_DEDICATED_CONNECTIONS, |n| n as usize);
    o.note("connect_timeout", "connect_timeout");
    let connect_timeout = m
        .duration_or_zero(cx, "connect_timeout")
        .unwrap_or(common::DEFAULT_CONNECT_TIMEOUT);
    let auth_at = options_at(names::REDIS_PROXY_FILTER);
    o.note(&auth_at, "auth");
    o.note(format!("{auth_at}.auth_username"), "auth.username");
    let auth = m.get("auth").and_then(|v| {
        let (auth, key) = upstream_auth(cx, v, "auth")?;
        o.note(format!("{auth_at}.auth_password"), join("auth", key));
        Some(auth)
    });
    for key in ["db", "databases"] {
        o.note(format!("{opts}.{key}"), key);
    }
    let db = m.uint(cx, "db", u32::MAX.into()).unwrap_or(0) as u32;
    let databases = m
        .positive(cx, "databases", u32::MAX.into())
        .map_or(DEFAULT_DATABASES, |n| n as u32);
    let (read_policy, zone_fallback) = read_policy(cx, o, &m, &opts);
    let hot_keys = hot_keys(cx, o, &m, &opts);
    let near_cache = m
        .get("near_cache")
        .and_then(|v| near_cache(cx, o, v, &opts));
    let redis = m
        .get("redis_cluster")
        .and_then(|v| super::redis_cluster::redis_cluster(cx, o, v));
    let (cla, credentials) = match m.get("redis_cluster") {
        // The shards of a Redis Cluster are discovered; its hash is Redis Cluster's own.
        Some(_) => {
            if m.get("shards").is_some() {
                cx.err(
                    "shards",
                    "a redis_cluster's shards are discovered from its seeds: give no shards",
                );
            }
            if m.get("hash")
                .is_some_and(|_| hash != HashPolicy::Crc16Slots)
            {
                cx.err(
                    "hash",
                    "a redis_cluster places keys by Redis Cluster's slots (crc16_slots)",
                );
            }
            if m.get("db").is_some_and(|_| db != 0) {
                cx.err("db", "a redis_cluster has database 0 only");
            }
            if m.get("databases").is_some_and(|_| databases != 1) {
                cx.err(
                    "databases",
                    "a redis_cluster has database 0 only (databases: 1)",
                );
            }
            (None, Vec::new())
        }
        None => {
            let (cla, credentials) = shards(cx, o, &m, &name, &hash, &auth_at);
            (Some(cla), credentials)
        }
    };
    o.note("transport_socket", "tls");
    let tls = m.get("tls").and_then(|v| cluster_tls(cx, o, v, "tls"));

    let health_check = m.get("health_check").and_then(|v| health_check(cx, o, v));

    let mut out = eds_cluster(name.clone(), connect_timeout, tls);
    match &redis {
        Some(src) => crate::redis_cluster::redis_cluster_type(&mut out, src),
        None => placement(&mut out, &hash),
    }
    out.health_checks = health_check.iter().map(health_check_pb).collect();
    if auth.is_some() || !credentials.is_empty() {
        out.typed_extension_protocol_options.insert(
            names::REDIS_PROXY_FILTER.to_string(),
            pack_any(RedisProtocolOptions {
                auth_password: auth.as_ref().map(|a| inline(&a.password)),
                auth_username: auth
                    .as_ref()
                    .and_then(|a| a.username.as_deref().map(inline)),
                credentials: credentials
                    .iter()
                    .map(|(address, a)| Credential {
                        address: Some(socket(*address)),
                        auth_password: Some(inline(&a.password)),
                        auth_username: a.username.as_deref().map(inline),
                    })
                    .collect(),
                ..Default::default()
            }),
        );
    }
    out.typed_extension_protocol_options.insert(
        names::CLUSTER_OPTIONS.to_string(),
        pack_any(rw::ClusterOptions {
            db,
            connections_per_endpoint: saturate(connections_per_endpoint),
            max_queue_per_connection: saturate(max_queue_per_connection),
            databases: if redis.is_some() { 1 } else { databases },
            dedicated_connections: saturate(dedicated_connections),
            hashtag: Some(hashtag),
            read_policy: read_policy as i32,
            zone_fallback: zone_fallback as i32,
            hot_keys,
            near_cache: near_cache.as_ref().map(near_cache_pb),
        }),
    );
    Some((out, cla))
}

/// `read_policy` and, for `zone_local`, its `zone_fallback`, as `ClusterOptions` says them.
fn read_policy(
    cx: &mut Cx,
    o: &mut Origins,
    m: &Map<'_>,
    opts: &str,
) -> (rw::ReadPolicy, rw::ZoneFallback) {
    o.note(format!("{opts}.zone_fallback"), "zone_fallback");
    o.note(format!("{opts}.read_policy"), "read_policy");
    let fallback = m.string(cx, "zone_fallback").and_then(|s| {
        match common::ZONE_FALLBACKS.iter().find(|(n, _)| *n == s) {
            Some((_, f)) => Some(*f),
            None => {
                cx.err(
                    m.at("zone_fallback"),
                    format!(
                        "unknown zone fallback {s:?} (expected one of: {})",
                        common::one_of(common::ZONE_FALLBACKS.iter().map(|(n, _)| *n))
                    ),
                );
                None
            }
        }
    });
    use respway_filters::model::{ReadPolicy, ZoneFallback};
    let policy = match m.string(cx, "read_policy") {
        None => Some(ReadPolicy::Primary),
        Some(s) => {
            let p = common::read_policy(&s, fallback.unwrap_or(ZoneFallback::Primary));
            if p.is_none() {
                cx.err(
                    m.at("read_policy"),
                    format!(
                        "unknown read policy {s:?} (expected one of: {})",
                        common::one_of(common::READ_POLICIES.iter().copied())
                    ),
                );
            }
            p
        }
    };
    // A fallback is written only for zone_local: with another policy it cannot be said.
    if m.get("zone_fallback").is_some()
        && policy.is_some_and(|p| !matches!(p, ReadPolicy::ZoneLocal { .. }))
    {
        cx.err(
            m.at("zone_fallback"),
            "only used with read_policy zone_local",
        );
    }
    let policy = policy.unwrap_or(ReadPolicy::Primary);
    (
        match policy {
            ReadPolicy::Primary => rw::ReadPolicy::Primary,
            ReadPolicy::PreferReplica => rw::ReadPolicy::PreferReplica,
            ReadPolicy::ZoneLocal { .. } => rw::ReadPolicy::ZoneLocal,
            ReadPolicy::Any => rw::ReadPolicy::Any,
        },
        match policy {
            ReadPolicy::ZoneLocal {
                fallback: ZoneFallback::AnyReplica,
            } => rw::ZoneFallback::AnyReplica,
            _ => rw::ZoneFallback::Primary,
        },
    )
}

/// `health_check`: its numbers as written (the translation checks them), the rest at the
/// defaults; `None` when it is not a mapping.
fn health_check(cx: &mut Cx, o: &mut Origins, v: &Value) -> Option<HealthCheck> {
    let path = "health_check";
    o.note("health_checks", path);
    let envoy = "health_checks[0]";
    for (field, key) in [
        ("interval", "interval"),
        ("timeout", "timeout"),
        ("unhealthy_threshold", "unhealthy_threshold"),
        ("healthy_threshold", "healthy_threshold"),
        ("custom_health_check", "drain_key"),
    ] {
        o.note(format!("{envoy}.{field}"), join(path, key));
    }
    let h = Map::new(cx, v, path, HEALTH_CHECK_KEYS)?;
    let d = HealthCheck::default();
    let threshold = |cx: &mut Cx, key: &str, default: u32| {
        h.uint(cx, key, u32::MAX.into())
            .map_or(default, |n| n as u32)
    };
    Some(HealthCheck {
        interval: h.duration_or_zero(cx, "interval").unwrap_or(d.interval),
        timeout: h.duration_or_zero(cx, "timeout").unwrap_or(d.timeout),
        unhealthy_threshold: threshold(cx, "unhealthy_threshold", d.unhealthy_threshold),
        healthy_threshold: threshold(cx, "healthy_threshold", d.healthy_threshold),
        drain_key: h.non_empty_string(cx, "drain_key"),
    })
}

/// `near_cache`: its settings as written, the rest at the defaults (the translation checks
/// the prefixes, the entry cap against the budget and the age); `None` when it is not a
/// mapping. A zero count or size is refused here: in `respway.v1.NearCache` it would mean the
/// default.
fn near_cache(cx: &mut Cx, o: &mut Origins, v: &Value, opts: &str) -> Option<NearCache> {
    let path = "near_cache";
    let at = format!("{opts}.near_cache");
    o.note(&at, path);
    // In the keys' order, each prefix after `prefixes`, so that errors come in that order.
    let listed = v
        .get("prefixes")
        .and_then(Value::as_sequence)
        .map_or(0, Vec::len);
    for key in NEAR_CACHE_KEYS {
        o.note(format!("{at}.{key}"), join(path, key));
        if *key == "prefixes" {
            for i in 0..listed {
                o.note(format!("{at}.{key}[{i}]"), format!("{path}.{key}[{i}]"));
            }
        }
    }
    let n = Map::new(cx, v, path, NEAR_CACHE_KEYS)?;
    let d = NearCache::default();
    let mode = n.string(cx, "mode").map_or(d.mode, |s| {
        named(cx, &n, "mode", "mode", common::NEAR_CACHE_MODES, &s).unwrap_or(d.mode)
    });
    let admit = n.string(cx, "admit").map_or(d.admit, |s| {
        named(cx, &n, "admit", "admission", common::NEAR_CACHE_ADMITS, &s).unwrap_or(d.admit)
    });
    let mut prefixes = Vec::new();
    for (i, p) in n.seq(cx, "prefixes").unwrap_or_default().iter().enumerate() {
        let item = format!("prefixes[{i}]");
        match p.as_str() {
            Some(s) => prefixes.push(s.to_string()),
            None => {
                // `- user:` reads as the mapping `{user: null}`: say how to write it.
                let hint = match p.as_mapping().map(|m| m.iter().collect::<Vec<_>>()) {
                    Some(kv) if kv.len() == 1 && kv[0].1.is_null() => kv[0]
                        .0
                        .as_str()
                        .map(|k| format!(" (quote a prefix that ends in a colon: \"{k}:\")")),
                    _ => None,
                };
                cx.err(
                    join(path, &item),
                    format!(
                        "expected a string, got {}{}",
                        kind(p),
                        hint.unwrap_or_default()
                    ),
                );
            }
        }
    }
    Some(NearCache {
        mode,
        prefixes,
        admit,
        max_bytes: n.size(cx, "max_bytes").unwrap_or(d.max_bytes),
        max_entry_bytes: n.size(cx, "max_entry_bytes").unwrap_or(d.max_entry_bytes),
        max_age: n
            .duration_or_zero(cx, "max_age")
            .unwrap_or(mode.default_max_age()),
        hot_reads_per_sec: n
            .uint(cx, "hot_reads_per_sec", u64::MAX)
            .unwrap_or(d.hot_reads_per_sec),
    })
}

/// The value a table (`NEAR_CACHE_MODES`, ...) names `s`, or an error at `key` listing the
/// names (`what` says what they are).
fn named<T: Copy>(
    cx: &mut Cx,
    m: &Map<'_>,
    key: &str,
    what: &str,
    table: &[(&str, T)],
    s: &str,
) -> Option<T> {
    match table.iter().find(|(n, _)| *n == s) {
        Some((_, v)) => Some(*v),
        None => {
            cx.err(
                m.at(key),
                format!(
                    "unknown {what} {s:?} (expected one of: {})",
                    common::one_of(table.iter().map(|(n, _)| *n))
                ),
            );
            None
        }
    }
}

/// The cluster's `hot_keys` rules.
fn hot_keys(cx: &mut Cx, o: &mut Origins, m: &Map<'_>, opts: &str) -> Vec<rw::HotKey> {
    let list = m.seq(cx, "hot_keys").unwrap_or_default();
    let mut out = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let path = format!("hot_keys[{i}]");
        let at = format!("{opts}.hot_keys[{i}]");
        o.note(&at, &path);
        o.note(format!("{at}.prefix"), join(&path, "prefix"));
        o.note(format!("{at}.read"), join(&path, "read"));
        let Some(h) = Map::new(cx, v, &path, HOT_KEY_KEYS) else {
            out.push(rw::HotKey::default());
            continue;
        };
        let prefix = h.required_string(cx, "prefix").unwrap_or_default();
        let read = match h.string(cx, "read") {
            None => rw::HotKeyRead::RoundRobin,
            Some(s) => match common::HOT_KEY_READS.iter().find(|(n, _)| *n == s) {
                Some((_, r)) => match r {
                    respway_filters::model::HotKeyRead::RoundRobin => rw::HotKeyRead::RoundRobin,
                    respway_filters::model::HotKeyRead::Random => rw::HotKeyRead::Random,
                    respway_filters::model::HotKeyRead::SameZone => rw::HotKeyRead::SameZone,
                },
                None => {
                    cx.err(
                        h.at("read"),
                        format!(
                            "unknown read {s:?} (expected one of: {})",
                            common::one_of(common::HOT_KEY_READS.iter().map(|(n, _)| *n))
                        ),
                    );
                    rw::HotKeyRead::RoundRobin
                }
            },
        };
        out.push(rw::HotKey {
            prefix,
            read: read as i32,
        });
    }
    out
}

/// `hash`: the policy and its numbers as written (the translation checks them); `None` when
/// the policy cannot be read.
fn hash_policy(cx: &mut Cx, v: &Value, path: &str) -> Option<HashPolicy> {
    let Value::Mapping(_) = v else {
        cx.err(path, format!("expected a mapping, got {}", kind(v)));
        return None;
    };
    let at = |k: &str| join(path, k);
    let policy = match v.get("policy") {
        None | Some(Value::Null) => {
            cx.err(at("policy"), "required");
            return None;
        }
        Some(Value::String(s)) => s.as_str(),
        Some(other) => {
            cx.err(
                at("policy"),
                format!("expected a string, got {}", kind(other)),
            );
            return None;
        }
    };
    let Some(keys) = POLICIES.iter().find(|p| p.name == policy).map(|p| p.known) else {
        cx.err(
            at("policy"),
            format!(
                "unknown policy {policy:?} (expected one of: {})",
                common::one_of(POLICIES.iter().map(|p| p.name))
            ),
        );
        return None;
    };
    let m = Map::new(cx, v, path, keys)?;
    let key_hash = |cx: &mut Cx| match m.string(cx, "key_hash") {
        None => KeyHash::Fnv1a64,
        Some(s) => match common::KEY_HASHES.iter().find(|(n, _)| *n == s) {
            Some((_, k)) => *k,
            None => {
                cx.err(
                    m.at("key_hash"),
                    format!(
                        "unknown key hash {s:?} (expected one of: {})",
                        common::one_of(common::KEY_HASHES.iter().map(|(n, _)| *n))
                    ),
                );
                KeyHash::Fnv1a64
            }
        },
    };
    Some(match policy {
        "maglev" => HashPolicy::Maglev {
            table_size: m
                .uint(cx, "table_size", u64::MAX)
                .unwrap_or(common::DEFAULT_TABLE_SIZE),
        },
        "ring_hash" => {
            let function = match m.string(cx, "function").as_deref() {
                None | Some("xx_hash") => RingHashFunction::XxHash,
                Some("murmur_hash_2") => RingHashFunction::MurmurHash2,
                Some(other) => {
                    cx.err(
                        m.at("function"),
                        format!(
                            "unknown function {other:?} (expected one of: xx_hash, murmur_hash_2)"
                        ),
                    );
                    RingHashFunction::XxHash
                }
            };
            HashPolicy::RingHash {
                minimum_ring_size: m
                    .uint(cx, "minimum_ring_size", u64::MAX)
                    .unwrap_or(common::DEFAULT_MIN_RING),
                maximum_ring_size: m
                    .uint(cx, "maximum_ring_size", u64::MAX)
                    .unwrap_or(common::MAX_RING),
                function,
            }
        }
        "ketama" => HashPolicy::Ketama {
            key_hash: key_hash(cx),
        },
        "modula" => HashPolicy::Modula {
            key_hash: key_hash(cx),
        },
        "crc32_slots" => HashPolicy::Crc32Slots {
            slots: m
                .uint(cx, "slots", u32::MAX.into())
                .map_or(common::DEFAULT_CRC32_SLOTS, |n| n as u32),
        },
        _ => HashPolicy::Crc16Slots,
    })
}

/// `tls: { ca, cert, key, server_name, insecure_skip_verify }` of a cluster, as Envoy's
/// `UpstreamTlsContext` in a TLS transport socket; `insecure_skip_verify` is
/// `trust_chain_verification: ACCEPT_UNTRUSTED`.
fn cluster_tls(cx: &mut Cx, o: &mut Origins, v: &Value, path: &str) -> Option<TransportSocket> {
    let typed = "transport_socket.typed_config";
    let common = format!("{typed}.common_tls_context");
    let validation = format!("{common}.validation_context");
    for (envoy, key) in [
        (format!("{validation}.trusted_ca"), "ca"),
        (
            format!("{validation}.trust_chain_verification"),
            "insecure_skip_verify",
        ),
        (
            format!("{common}.tls_certificates[0].certificate_chain"),
            "cert",
        ),
        (format!("{common}.tls_certificates[0].private_key"), "key"),
        (format!("{common}.tls_certificates"), "cert"),
        (format!("{typed}.sni"), "server_name"),
    ] {
        o.note(envoy, join(path, key));
    }
    let t = Map::new(cx, v, path, CLUSTER_TLS_KEYS)?;
    let ca = t.path(cx, "ca");
    let cert = t.path(cx, "cert");
    let key = t.path(cx, "key");
    let server_name = t.non_empty_string(cx, "server_name");
    let insecure_skip_verify = t.boolean(cx, "insecure_skip_verify").unwrap_or(false);
    let validation = CertificateValidationContext {
        trusted_ca: ca.as_deref().map(file),
        trust_chain_verification: if insecure_skip_verify {
            TrustChainVerification::AcceptUntrusted
        } else {
            TrustChainVerification::VerifyTrustChain
        } as i32,
        ..Default::default()
    };
    let tls_certificates = if cert.is_none() && key.is_none() {
        Vec::new()
    } else {
        vec![TlsCertificate {
            certificate_chain: cert.as_deref().map(file),
            private_key: key.as_deref().map(file),
            ..Default::default()
        }]
    };
    let context = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificates,
            validation_context_type: Some(ValidationContextType::ValidationContext(validation)),
            ..Default::default()
        }),
        sni: server_name.unwrap_or_default(),
        ..Default::default()
    };
    Some(TransportSocket {
        name: names::TLS_TRANSPORT_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    })
}
