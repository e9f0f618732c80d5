//! Clusters: connection settings, upstream auth and TLS, read policy, hot keys, hashing,
//! shards and endpoints.

use std::collections::HashMap;
use std::net::SocketAddr;

use respway_filters::model::{
    Cluster, Endpoint, EndpointAuth, HashPolicy, HashTag, HotKeyRead, HotKeyRule, ReadPolicy,
    RingHashFunction, Role, Shard, UpstreamAuth, UpstreamTls, ZoneFallback, DEFAULT_DATABASES,
    DEFAULT_DEDICATED_CONNECTIONS, DEFAULT_MAX_QUEUE_PER_CONNECTION,
};
use serde_yaml_ng::Value;

use crate::common::{self, SlotProblem};
use crate::error::{index, join, Cx};

use super::*;

pub(super) const CLUSTER_KEYS: &[&str] = &[
    "name",
    "hash",
    "hashtag",
    "connections_per_endpoint",
    "max_queue_per_connection",
    "dedicated_connections",
    "connect_timeout",
    "auth",
    "db",
    "databases",
    "read_policy",
    "zone_fallback",
    "hot_keys",
    "shards",
    "tls",
];
pub(super) const HOT_KEY_KEYS: &[&str] = &["prefix", "read"];
pub(super) const AUTH_KEYS: &[&str] = &["username", "password", "password_file", "password_env"];
pub(super) const SHARD_KEYS: &[&str] = &["name", "hash_key", "weight", "slots", "endpoints"];
pub(super) const ENDPOINT_KEYS: &[&str] = &["address", "role", "zone", "auth"];
pub(super) const POLICIES: &[(&str, &[&str])] = &[
    ("maglev", &["policy", "table_size"]),
    (
        "ring_hash",
        &[
            "policy",
            "minimum_ring_size",
            "maximum_ring_size",
            "function",
        ],
    ),
    ("ketama", &["policy", "key_hash"]),
    ("modula", &["policy", "key_hash"]),
    ("crc32_slots", &["policy", "slots"]),
    ("crc16_slots", &["policy"]),
];

/// Reads a YAML document into the validated model, reporting every error.
pub(super) const CLUSTER_TLS_KEYS: &[&str] =
    &["ca", "cert", "key", "server_name", "insecure_skip_verify"];

// === clusters ===

pub(super) fn cluster(cx: &mut Cx, v: &Value, i: usize) -> Option<Cluster> {
    cx.resource = resource_name(v, "cluster", "clusters", i);
    let before = cx.count();
    let m = Map::new(cx, v, "", CLUSTER_KEYS)?;
    let name = m.required_name(cx);
    let hash_before = cx.count();
    let hash = match m.get("hash") {
        Some(v) => hash_policy(cx, v, "hash"),
        None => Some(HashPolicy::Maglev {
            table_size: common::DEFAULT_TABLE_SIZE,
        }),
    };
    let hash_valid = cx.count() == hash_before;
    let hashtag = match m.raw("hashtag") {
        None => Some(HashTag::default()),
        Some(Value::Null) => None,
        Some(Value::String(s)) => common::parse_hashtag(s).unwrap_or_else(|e| {
            cx.err("hashtag", e);
            None
        }),
        Some(other) => {
            cx.err(
                "hashtag",
                format!("expected a string or null, got {}", kind(other)),
            );
            None
        }
    };
    let connections_per_endpoint = m
        .positive(cx, "connections_per_endpoint", u32::MAX.into())
        .map_or(common::DEFAULT_CONNECTIONS_PER_ENDPOINT, |n| n as usize);
    let max_queue_per_connection = m
        .positive(cx, "max_queue_per_connection", u32::MAX.into())
        .map_or(DEFAULT_MAX_QUEUE_PER_CONNECTION, |n| n as usize);
    let dedicated_connections = m
        .positive(
            cx,
            "dedicated_connections",
            common::MAX_DEDICATED_CONNECTIONS.into(),
        )
        .map_or(DEFAULT_DEDICATED_CONNECTIONS, |n| n as usize);
    let connect_timeout = m
        .duration(cx, "connect_timeout")
        .unwrap_or(common::DEFAULT_CONNECT_TIMEOUT);
    let auth = m.get("auth").and_then(|v| upstream_auth(cx, v, "auth"));
    let endpoint_auth = endpoint_auth(cx, &m);
    let db = m.uint(cx, "db", u32::MAX.into()).unwrap_or(0) as u32;
    let databases = m
        .positive(cx, "databases", common::MAX_DATABASES.into())
        .map_or(DEFAULT_DATABASES, |n| n as u32);
    let read_policy = read_policy(cx, &m);
    let hot_keys = hot_keys(cx, &m);
    let shards = shards(cx, &m, hash.as_ref(), hash_valid);
    let tls = m.get("tls").and_then(|v| cluster_tls(cx, v, &m.at("tls")));
    if cx.count() > before {
        return None;
    }
    let cluster = Cluster {
        tls,
        hot_keys,
        read_policy,
        name: name.unwrap_or_default(),
        hash: hash.expect("a policy without errors"),
        hashtag,
        shards,
        connections_per_endpoint,
        databases,
        dedicated_connections,
        max_queue_per_connection,
        connect_timeout,
        auth,
        endpoint_auth,
        db,
    };
    if let Some(reason) = common::picker_error(&cluster) {
        cx.err("", reason);
        return None;
    }
    Some(cluster)
}

/// An `auth` block at `path`: `username`, and the password from exactly one of `password`,
/// `password_file` (read now, trailing newline trimmed) and `password_env`.
pub(super) fn upstream_auth(cx: &mut Cx, v: &Value, path: &str) -> Option<UpstreamAuth> {
    let before = cx.count();
    let a = Map::new(cx, v, path, AUTH_KEYS)?;
    let username = a.non_empty_string(cx, "username");
    let sources = ["password", "password_file", "password_env"];
    let given: Vec<&str> = sources
        .iter()
        .copied()
        .filter(|k| a.get(k).is_some())
        .collect();
    let password = match given.as_slice() {
        [] => {
            cx.err(
                a.at("password"),
                "required: one of password, password_file, password_env",
            );
            None
        }
        [key] => {
            let value = a.string(cx, key);
            match (*key, value) {
                (_, None) => None,
                (_, Some(v)) if v.is_empty() => {
                    cx.err(a.at(key), "must not be empty");
                    None
                }
                ("password", Some(v)) => Some(v),
                ("password_file", Some(f)) => common::read_password_file(&f)
                    .map_err(|e| cx.err(a.at(key), e))
                    .ok(),
                (_, Some(name)) => common::read_password_env(&name)
                    .map_err(|e| cx.err(a.at(key), e))
                    .ok(),
            }
        }
        more => {
            cx.err(
                a.at(more[1]),
                format!("conflicts with {}: give the password one way", more[0]),
            );
            None
        }
    };
    (cx.count() == before).then_some(UpstreamAuth {
        username,
        password: password?,
    })
}

/// The `auth` of single endpoints (`shards[i].endpoints[j].auth`). Addresses that do not
/// read are reported by [`shard`].
pub(super) fn endpoint_auth(cx: &mut Cx, m: &Map<'_>) -> Vec<EndpointAuth> {
    let mut out = Vec::new();
    let Some(Value::Sequence(shards)) = m.get("shards") else {
        return out;
    };
    for (si, s) in shards.iter().enumerate() {
        let Some(Value::Sequence(eps)) = s.get("endpoints") else {
            continue;
        };
        for (ei, e) in eps.iter().enumerate() {
            let Some(v) = e.get("auth").filter(|v| !v.is_null()) else {
                continue;
            };
            let path = format!("shards[{si}].endpoints[{ei}].auth");
            let auth = upstream_auth(cx, v, &path);
            let address = e
                .get("address")
                .and_then(Value::as_str)
                .and_then(|a| common::parse_socket_addr(a).ok());
            if let (Some(address), Some(auth)) = (address, auth) {
                out.push(EndpointAuth { address, auth });
            }
        }
    }
    common::normalize_endpoint_auth(&mut out);
    out
}

/// `read_policy` and, for `zone_local`, its `zone_fallback`.
pub(super) fn read_policy(cx: &mut Cx, m: &Map<'_>) -> ReadPolicy {
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
    if m.get("zone_fallback").is_some()
        && policy.is_some_and(|p| !matches!(p, ReadPolicy::ZoneLocal { .. }))
    {
        cx.err(
            m.at("zone_fallback"),
            "only used with read_policy zone_local",
        );
    }
    policy.unwrap_or(ReadPolicy::Primary)
}

/// The cluster's `hot_keys` rules.
pub(super) fn hot_keys(cx: &mut Cx, m: &Map<'_>) -> Vec<HotKeyRule> {
    let list = m.seq(cx, "hot_keys").unwrap_or_default();
    let mut out = Vec::new();
    let mut positions = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let path = index(&m.at("hot_keys"), i);
        let before = cx.count();
        let Some(h) = Map::new(cx, v, &path, HOT_KEY_KEYS) else {
            continue;
        };
        let prefix = h.required_string(cx, "prefix");
        let read = match h.string(cx, "read") {
            None => Some(HotKeyRead::RoundRobin),
            Some(s) => match common::HOT_KEY_READS.iter().find(|(n, _)| *n == s) {
                Some((_, r)) => Some(*r),
                None => {
                    cx.err(
                        h.at("read"),
                        format!(
                            "unknown read {s:?} (expected one of: {})",
                            common::one_of(common::HOT_KEY_READS.iter().map(|(n, _)| *n))
                        ),
                    );
                    None
                }
            },
        };
        if let (Some(prefix), Some(read), true) = (prefix, read, cx.count() == before) {
            out.push(HotKeyRule { prefix, read });
            positions.push(i);
        }
    }
    for p in common::check_hot_keys(&out) {
        let (i, reason) = common::hot_key_problem(&p, &out, |i| positions[i]);
        cx.err(format!("hot_keys[{i}].prefix"), reason);
    }
    out
}

pub(super) fn hash_policy(cx: &mut Cx, v: &Value, path: &str) -> Option<HashPolicy> {
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
    let Some((_, keys)) = POLICIES.iter().find(|(n, _)| *n == policy) else {
        cx.err(
            at("policy"),
            format!(
                "unknown policy {policy:?} (expected one of: {})",
                common::one_of(POLICIES.iter().map(|(n, _)| *n))
            ),
        );
        return None;
    };
    let m = Map::new(cx, v, path, keys)?;
    let key_hash = |cx: &mut Cx| match m.string(cx, "key_hash") {
        None => Some(respway_filters::model::KeyHash::Fnv1a64),
        Some(s) => match common::KEY_HASHES.iter().find(|(n, _)| *n == s) {
            Some((_, k)) => Some(*k),
            None => {
                cx.err(
                    m.at("key_hash"),
                    format!(
                        "unknown key hash {s:?} (expected one of: {})",
                        common::one_of(common::KEY_HASHES.iter().map(|(n, _)| *n))
                    ),
                );
                None
            }
        },
    };
    let policy = match policy {
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
            key_hash: key_hash(cx)?,
        },
        "modula" => HashPolicy::Modula {
            key_hash: key_hash(cx)?,
        },
        "crc32_slots" => HashPolicy::Crc32Slots {
            slots: m
                .uint(cx, "slots", u32::MAX.into())
                .map_or(common::DEFAULT_CRC32_SLOTS, |n| n as u32),
        },
        _ => HashPolicy::Crc16Slots,
    };
    for (field, reason) in common::check_hash_policy(&policy) {
        cx.err(m.at(field), reason);
    }
    // The policy is returned even when a number in it is wrong: its kind is still known, and
    // the shards are checked against it (the caller knows the cluster failed).
    Some(policy)
}

/// A shard as read, before its hash key can be worked out.
pub(super) struct RawShard {
    name: Option<String>,
    hash_key: Option<String>,
    weight: u32,
    slots: Vec<(u32, u32)>,
    endpoints: Vec<Endpoint>,
}

/// The shards; `policy` is the cluster's policy if its kind is known, `policy_valid` says
/// whether its numbers are right too (the slot table checks need the slot count).
pub(super) fn shards(
    cx: &mut Cx,
    m: &Map<'_>,
    policy: Option<&HashPolicy>,
    policy_valid: bool,
) -> Vec<Shard> {
    let before = cx.count();
    let list = m.non_empty_seq(cx, "shards");
    let mut raw = Vec::new();
    for (si, v) in list.iter().enumerate() {
        if let Some(s) = shard(cx, v, &index("shards", si), policy) {
            raw.push(s);
        }
    }
    if cx.count() > before {
        return Vec::new();
    }
    let Some(policy) = policy else {
        return Vec::new();
    };

    // Names, addresses and hash keys must tell shards and endpoints apart.
    let mut names: HashMap<String, usize> = HashMap::new();
    let mut addrs: HashMap<SocketAddr, String> = HashMap::new();
    for (si, s) in raw.iter().enumerate() {
        let name = s.name.clone().unwrap_or_else(|| format!("shard-{si}"));
        if let Some(first) = names.insert(name.clone(), si) {
            cx.err(
                format!("shards[{si}].name"),
                format!("duplicate shard name {name:?} (also shards[{first}])"),
            );
        }
        for (ei, e) in s.endpoints.iter().enumerate() {
            let here = format!("shards[{si}].endpoints[{ei}]");
            if let Some(first) = addrs.insert(e.address, here.clone()) {
                cx.err(
                    format!("{here}.address"),
                    format!("{} is already used by {first}", e.address),
                );
            }
        }
    }
    let addresses_ok = cx.count() == before;

    let mut out = Vec::new();
    let mut keys: HashMap<String, usize> = HashMap::new();
    for (si, s) in raw.into_iter().enumerate() {
        let primary = s
            .endpoints
            .iter()
            .find(|e| e.role == Role::Primary)
            .expect("checked")
            .address;
        let hash_key = s
            .hash_key
            .unwrap_or_else(|| common::default_hash_key(policy, s.name.as_deref(), primary));
        if common::unique_hash_keys(policy) && addresses_ok {
            if let Some(first) = keys.insert(hash_key.clone(), si) {
                cx.err(
                    format!("shards[{si}]"),
                    format!(
                        "hash key {hash_key:?} is also the hash key of shards[{first}]; set hash_key or name to tell them apart"
                    ),
                );
            }
        }
        let mut endpoints = s.endpoints;
        common::normalize_endpoints(&mut endpoints);
        out.push(Shard {
            name: s.name.unwrap_or_else(|| format!("shard-{si}")),
            hash_key,
            weight: s.weight,
            slots: s.slots,
            endpoints,
        });
    }

    if let Some(total) = common::slot_count(policy).filter(|_| policy_valid) {
        let tables: Vec<&[(u32, u32)]> = out.iter().map(|s| s.slots.as_slice()).collect();
        for p in common::check_slots(total, &tables) {
            match p {
                SlotProblem::OutOfBounds {
                    shard,
                    range,
                    reason,
                } => cx.err(format!("shards[{shard}].slots[{range}]"), reason),
                SlotProblem::Overlap {
                    shard,
                    range,
                    other,
                    slot,
                } => cx.err(
                    format!("shards[{shard}].slots[{range}]"),
                    format!("slot {slot} is already assigned to shards[{other}]"),
                ),
                SlotProblem::Missing { shard } => cx.err(
                    format!("shards[{shard}].slots"),
                    "required: the other shards list their slots",
                ),
                SlotProblem::Uncovered { reason } => cx.err("shards", reason),
            }
        }
    }
    out
}

pub(super) fn shard(
    cx: &mut Cx,
    v: &Value,
    path: &str,
    policy: Option<&HashPolicy>,
) -> Option<RawShard> {
    let before = cx.count();
    let m = Map::new(cx, v, path, SHARD_KEYS)?;
    let name = m.non_empty_string(cx, "name");
    let hash_key = m.non_empty_string(cx, "hash_key");
    let weight = m.positive(cx, "weight", u32::MAX.into()).unwrap_or(1) as u32;
    let mut slots = Vec::new();
    if let Some(list) = m.seq(cx, "slots") {
        if policy.is_some_and(|p| common::slot_count(p).is_none()) {
            cx.err(
                m.at("slots"),
                "only the crc32_slots and crc16_slots policies use slots",
            );
        }
        for (i, s) in list.iter().enumerate() {
            let at = index(&m.at("slots"), i);
            let range = match s {
                Value::String(s) => common::parse_slot_range(s),
                Value::Number(n) => n
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .map(|n| (n, n))
                    .ok_or_else(|| format!("invalid slot {n}")),
                other => Err(format!(
                    "expected a slot or a range such as \"0-511\", got {}",
                    kind(other)
                )),
            };
            match range {
                Ok(r) => slots.push(r),
                Err(e) => cx.err(at, e),
            }
        }
    }
    let list = m.non_empty_seq(cx, "endpoints");
    let single = list.len() == 1;
    let mut endpoints = Vec::new();
    for (ei, v) in list.iter().enumerate() {
        let at = index(&m.at("endpoints"), ei);
        let Some(e) = Map::new(cx, v, &at, ENDPOINT_KEYS) else {
            continue;
        };
        let address = e.required(cx, "address", common::parse_socket_addr);
        let role = match e.string(cx, "role").as_deref() {
            Some("primary") => Some(Role::Primary),
            Some("replica") => Some(Role::Replica),
            None if single => Some(Role::Primary),
            None => {
                cx.err(
                    e.at("role"),
                    "required when a shard has more than one endpoint",
                );
                None
            }
            Some(other) => {
                cx.err(
                    e.at("role"),
                    format!("unknown role {other:?} (expected one of: primary, replica)"),
                );
                None
            }
        };
        let zone = e.non_empty_string(cx, "zone");
        if let (Some(address), Some(role)) = (address, role) {
            endpoints.push(Endpoint {
                address,
                role,
                zone,
            });
        }
    }
    if cx.count() > before {
        return None;
    }
    let primaries: Vec<String> = endpoints
        .iter()
        .enumerate()
        .filter(|(_, e)| e.role == Role::Primary)
        .map(|(i, _)| format!("endpoints[{i}]"))
        .collect();
    match primaries.len() {
        1 => {}
        0 => cx.err(
            m.at("endpoints"),
            "no primary: exactly one endpoint must have role primary",
        ),
        n => cx.err(
            m.at("endpoints"),
            format!(
                "{n} primaries ({}): exactly one endpoint must have role primary",
                primaries.join(", ")
            ),
        ),
    }
    (cx.count() == before).then_some(RawShard {
        name,
        hash_key,
        weight,
        slots,
        endpoints,
    })
}

/// `tls: { ca, cert, key, server_name, insecure_skip_verify }` of a cluster.
pub(super) fn cluster_tls(cx: &mut Cx, v: &Value, path: &str) -> Option<UpstreamTls> {
    let before = cx.count();
    let t = Map::new(cx, v, path, CLUSTER_TLS_KEYS)?;
    let ca = t.path(cx, "ca");
    let cert = t.path(cx, "cert");
    let key = t.path(cx, "key");
    let server_name = t.non_empty_string(cx, "server_name");
    let insecure_skip_verify = t.boolean(cx, "insecure_skip_verify").unwrap_or(false);
    match (&ca, insecure_skip_verify) {
        (None, false) => cx.err(
            t.at("ca"),
            "required: respway has no built-in CA roots (insecure_skip_verify: true accepts \
             any certificate)",
        ),
        (Some(_), true) => cx.err(
            t.at("insecure_skip_verify"),
            "contradicts ca (no certificate is verified with insecure_skip_verify)",
        ),
        _ => {}
    }
    match (&cert, &key) {
        (Some(_), None) => cx.err(t.at("key"), "required with cert"),
        (None, Some(_)) => cx.err(t.at("cert"), "required with key"),
        _ => {}
    }
    (cx.count() == before).then_some(UpstreamTls {
        ca,
        cert,
        key,
        server_name,
        insecure_skip_verify,
    })
}
