//! `ClusterLoadAssignment` → shards.
//!
//! Envoy has no notion of a shard: it groups endpoints by locality. respway groups them by the
//! endpoint metadata `filter_metadata["respway"].shard`; an endpoint without it is a shard of
//! its own (its primary, named by its address), which is how Envoy's Redis proxy treats every
//! host. Shard-level values (`slots`, `load_balancing_weight`, `filter_metadata["envoy.lb"]
//! .hash_key`) are taken from the shard's primary; a replica may repeat them but not differ.
//! Shards are ordered by `shard_index` when the shards carry one, else by first appearance.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, LbEndpoint,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct};
use respway_filters::model::{
    Endpoint, HashPolicy, Role, SentinelSource, Shard, DEFAULT_FAILOVER_HOLD, MAX_FAILOVER_HOLD,
};

use super::{socket_address, unsupported};
use crate::common::{self, SlotProblem};
use crate::error::{index, join, Cx};
use crate::names;

const RESPWAY_KEYS: &[&str] = &[
    "shard",
    "shard_index",
    "role",
    "slots",
    "sentinel_master",
    "sentinel_zones",
    "sentinel_failover_hold",
    "sentinel_serve_stale_reads",
];

/// One endpoint as read, before grouping into shards.
struct RawEndpoint {
    /// Envoy path of the `LbEndpoint`.
    path: String,
    address: SocketAddr,
    zone: Option<String>,
    role: Option<Role>,
    shard: Option<String>,
    shard_index: Option<u32>,
    slots: Option<Vec<(u32, u32)>>,
    weight: Option<u32>,
    hash_key: Option<String>,
    /// Role `sentinel`: the address is a Sentinel's, not a data node's.
    sentinel: bool,
    /// The Sentinel master name of a `sentinel` endpoint's shard.
    sentinel_master: Option<String>,
    /// The zones of the shard's data nodes, by address (on a `sentinel` endpoint).
    sentinel_zones: Option<Vec<(SocketAddr, String)>>,
    /// How long the shard's writes are held during a failover (on a `sentinel` endpoint).
    sentinel_failover_hold: Option<Duration>,
    /// Whether the shard's replicas keep serving reads while its primary is down (on a
    /// `sentinel` endpoint).
    sentinel_serve_stale_reads: Option<bool>,
}

impl RawEndpoint {
    fn meta(&self, key: &str) -> String {
        format!("{}.metadata.filter_metadata.respway.{key}", self.path)
    }
}

/// The shards of one assignment; empty when there were errors (all recorded in `cx`).
pub(super) fn shards(
    cx: &mut Cx,
    prefix: &str,
    cla: &ClusterLoadAssignment,
    policy: Option<&HashPolicy>,
) -> Vec<Shard> {
    let before = cx.count();
    unsupported(
        cx,
        prefix,
        &[
            ("policy", cla.policy.is_some()),
            ("named_endpoints", !cla.named_endpoints.is_empty()),
        ],
    );
    let list = join(prefix, "endpoints");
    let mut raw = Vec::new();
    for (li, loc) in cla.endpoints.iter().enumerate() {
        let lp = index(&list, li);
        unsupported(
            cx,
            &lp,
            &[
                ("load_balancing_weight", loc.load_balancing_weight.is_some()),
                ("priority", loc.priority != 0),
                ("proximity", loc.proximity.is_some()),
                ("leds_cluster_locality_config", loc.lb_config.is_some()),
            ],
        );
        let mut zone = None;
        if let Some(l) = &loc.locality {
            unsupported(
                cx,
                &join(&lp, "locality"),
                &[
                    ("region", !l.region.is_empty()),
                    ("sub_zone", !l.sub_zone.is_empty()),
                ],
            );
            zone = (!l.zone.is_empty()).then(|| l.zone.clone());
        }
        for (ei, e) in loc.lb_endpoints.iter().enumerate() {
            let path = index(&join(&lp, "lb_endpoints"), ei);
            if let Some(r) = lb_endpoint(cx, path, zone.clone(), e, policy) {
                raw.push(r);
            }
        }
    }
    if cx.count() > before {
        return Vec::new();
    }
    if raw.is_empty() {
        cx.err(list, "no endpoints: a cluster needs at least one shard");
        return Vec::new();
    }

    // Addresses must tell endpoints apart.
    // Sentinels are not data nodes: one set of Sentinels usually names the primaries of
    // several shards.
    let mut addrs: HashMap<SocketAddr, &str> = HashMap::new();
    for r in raw.iter().filter(|r| !r.sentinel) {
        if let Some(first) = addrs.insert(r.address, &r.path) {
            cx.err(
                join(&r.path, "endpoint.address"),
                format!("{} is already used by {first}", r.address),
            );
        }
    }
    if cx.count() > before {
        return Vec::new();
    }

    // Group into shards by name, in order of first appearance.
    let mut groups: Vec<(String, bool, Vec<RawEndpoint>)> = Vec::new();
    for r in raw {
        match &r.shard {
            Some(name) => match groups.iter_mut().find(|(n, named, _)| *named && n == name) {
                Some(g) => g.2.push(r),
                None => groups.push((name.clone(), true, vec![r])),
            },
            None => groups.push((r.address.to_string(), false, vec![r])),
        }
    }

    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut shards: Vec<(Option<u32>, Shard, String)> = Vec::new();
    for (name, named, eps) in &groups {
        if let Some(first) = names.insert(name.as_str(), eps[0].path.as_str()) {
            cx.err(
                &eps[0].path,
                format!("shard name {name:?} is also used by the shard of {first}"),
            );
            continue;
        }
        if let Some(s) = shard(cx, name, *named, eps, policy) {
            shards.push(s);
        }
    }
    if cx.count() > before {
        return Vec::new();
    }

    // Order: by shard_index when every shard has one, else as they came.
    let indexed = shards.iter().filter(|s| s.0.is_some()).count();
    if indexed != 0 && indexed != shards.len() {
        for (i, s, path) in &shards {
            if i.is_none() {
                cx.err(
                    format!("{path}.metadata.filter_metadata.respway.shard_index"),
                    format!(
                        "required: other shards have a shard_index, shard {:?} has none",
                        s.name
                    ),
                );
            }
        }
    }
    let mut seen: HashMap<u32, &str> = HashMap::new();
    for (i, s, path) in &shards {
        if let Some(i) = i {
            if let Some(other) = seen.insert(*i, &s.name) {
                cx.err(
                    format!("{path}.metadata.filter_metadata.respway.shard_index"),
                    format!("shard_index {i} is also the index of shard {other:?}"),
                );
            }
        }
    }
    if cx.count() > before {
        return Vec::new();
    }
    shards.sort_by_key(|(i, _, _)| *i);

    if let Some(policy) = policy {
        let mut keys: HashMap<&str, &str> = HashMap::new();
        if common::unique_hash_keys(policy) {
            for (_, s, path) in &shards {
                if let Some(other) = keys.insert(&s.hash_key, &s.name) {
                    cx.err(
                        path,
                        format!(
                            "hash key {:?} of shard {:?} is also the hash key of shard {other:?}",
                            s.hash_key, s.name
                        ),
                    );
                }
            }
        }
        if let Some(total) = common::slot_count(policy) {
            let tables: Vec<&[(u32, u32)]> =
                shards.iter().map(|(_, s, _)| s.slots.as_slice()).collect();
            let slots = |si: usize| -> String {
                format!("{}.metadata.filter_metadata.respway.slots", shards[si].2)
            };
            for p in common::check_slots(total, &tables) {
                match p {
                    SlotProblem::OutOfBounds {
                        shard,
                        range,
                        reason,
                    } => cx.err(index(&slots(shard), range), reason),
                    SlotProblem::Overlap {
                        shard,
                        range,
                        other,
                        slot,
                    } => cx.err(
                        index(&slots(shard), range),
                        format!(
                            "slot {slot} is already assigned to shard {:?}",
                            shards[other].1.name
                        ),
                    ),
                    SlotProblem::Missing { shard } => cx.err(
                        slots(shard),
                        format!(
                            "required: the other shards list their slots, shard {:?} does not",
                            shards[shard].1.name
                        ),
                    ),
                    SlotProblem::Uncovered { reason } => cx.err(&list, reason),
                }
            }
        }
    }
    if cx.count() > before {
        return Vec::new();
    }
    shards.into_iter().map(|(_, s, _)| s).collect()
}

/// One shard from its endpoints: `(shard_index, shard, path of its primary)`.
fn shard(
    cx: &mut Cx,
    name: &str,
    named: bool,
    eps: &[RawEndpoint],
    policy: Option<&HashPolicy>,
) -> Option<(Option<u32>, Shard, String)> {
    let before = cx.count();
    if eps.iter().any(|e| e.sentinel) {
        return sentinel_shard(cx, name, eps);
    }
    for e in eps.iter().filter(|e| e.sentinel_master.is_some()) {
        cx.err(
            e.meta("sentinel_master"),
            "only endpoints with role sentinel name a Sentinel master",
        );
    }
    for e in eps.iter().filter(|e| e.sentinel_zones.is_some()) {
        cx.err(
            e.meta("sentinel_zones"),
            "only endpoints with role sentinel give the zones of the nodes Sentinels name",
        );
    }
    for e in eps.iter().filter(|e| e.sentinel_failover_hold.is_some()) {
        cx.err(
            e.meta("sentinel_failover_hold"),
            "only endpoints with role sentinel say how long a failover holds the shard's writes",
        );
    }
    for e in eps
        .iter()
        .filter(|e| e.sentinel_serve_stale_reads.is_some())
    {
        cx.err(
            e.meta("sentinel_serve_stale_reads"),
            "only endpoints with role sentinel say whether replicas serve reads while the primary is down",
        );
    }
    let single = eps.len() == 1;
    let mut endpoints = Vec::new();
    for e in eps {
        let role = match e.role {
            Some(r) => r,
            None if single => Role::Primary,
            None => {
                cx.err(
                    e.meta("role"),
                    format!("required: shard {name:?} has more than one endpoint"),
                );
                continue;
            }
        };
        endpoints.push(Endpoint {
            address: e.address,
            role,
            zone: e.zone.clone(),
        });
    }
    if cx.count() > before {
        return None;
    }
    let primaries: Vec<usize> = (0..eps.len())
        .filter(|i| endpoints[*i].role == Role::Primary)
        .collect();
    let p = match primaries.as_slice() {
        [p] => &eps[*p],
        [] => {
            cx.err(
                eps[0].meta("role"),
                format!(
                    "shard {name:?} has no primary: exactly one endpoint must have role primary"
                ),
            );
            return None;
        }
        [first, rest @ ..] => {
            for r in rest {
                cx.err(
                    eps[*r].meta("role"),
                    format!(
                        "shard {name:?} already has a primary ({}): exactly one endpoint must have role primary",
                        eps[*first].path
                    ),
                );
            }
            return None;
        }
    };

    // Shard-level values come from the primary; replicas may repeat but not contradict them.
    let mut shard_index = p.shard_index;
    for e in eps {
        if std::ptr::eq(e, p) {
            continue;
        }
        if let (Some(a), Some(b)) = (shard_index, e.shard_index) {
            if a != b {
                cx.err(
                    e.meta("shard_index"),
                    format!("{b} differs from the primary's shard_index {a}"),
                );
            }
        }
        shard_index = shard_index.or(e.shard_index);
        if e.weight.is_some_and(|w| Some(w) != p.weight) {
            cx.err(
                format!("{}.load_balancing_weight", e.path),
                "differs from the shard's primary (the primary's weight is the shard's)",
            );
        }
        if e.slots
            .as_ref()
            .is_some_and(|s| Some(s) != p.slots.as_ref())
        {
            cx.err(
                e.meta("slots"),
                "differ from the shard's primary (the primary's slots are the shard's)",
            );
        }
        if e.hash_key
            .as_ref()
            .is_some_and(|h| Some(h) != p.hash_key.as_ref())
        {
            cx.err(
                format!("{}.metadata.filter_metadata.envoy.lb.hash_key", e.path),
                "differs from the shard's primary (the primary's hash key is the shard's)",
            );
        }
    }
    if cx.count() > before {
        return None;
    }
    let hash_key = match (&p.hash_key, policy) {
        (Some(k), _) => k.clone(),
        (None, Some(policy)) => common::default_hash_key(policy, named.then_some(name), p.address),
        (None, None) => p.address.to_string(),
    };
    common::normalize_endpoints(&mut endpoints);
    Some((
        shard_index,
        Shard {
            name: name.to_string(),
            hash_key,
            weight: p.weight.unwrap_or(1),
            slots: p.slots.clone().unwrap_or_default(),
            endpoints,
            sentinel: None,
        },
        p.path.clone(),
    ))
}

/// A shard whose endpoints are Sentinels: its primary and replicas are found by the sidecar;
/// the model holds the placeholder primary until then. Shard-level values come from the first
/// Sentinel; the others may repeat but not contradict them. The hash key defaults to the
/// shard's name, never an address: the primary's changes with each failover, and the keys
/// must stay where they are.
fn sentinel_shard(
    cx: &mut Cx,
    name: &str,
    eps: &[RawEndpoint],
) -> Option<(Option<u32>, Shard, String)> {
    let before = cx.count();
    let p = &eps[0];
    let master = eps.iter().find_map(|e| e.sentinel_master.clone());
    let mut sentinels: Vec<SocketAddr> = Vec::new();
    for e in eps {
        if !e.sentinel {
            cx.err(
                e.meta("role"),
                format!(
                    "shard {name:?} is Sentinel-managed: every endpoint of it has role sentinel"
                ),
            );
            continue;
        }
        if sentinels.contains(&e.address) {
            cx.err(
                join(&e.path, "endpoint.address"),
                format!("Sentinel {} is listed twice in shard {name:?}", e.address),
            );
        }
        sentinels.push(e.address);
        match (&e.sentinel_master, &master) {
            (None, _) => cx.err(
                e.meta("sentinel_master"),
                "required for an endpoint with role sentinel",
            ),
            (Some(a), Some(b)) if a != b => cx.err(
                e.meta("sentinel_master"),
                format!("{a:?} differs from the shard's Sentinel master {b:?}"),
            ),
            _ => {}
        }
        if std::ptr::eq(e, p) {
            continue;
        }
        if e.shard_index.is_some_and(|i| Some(i) != p.shard_index)
            || e.weight.is_some_and(|w| Some(w) != p.weight)
            || e.slots
                .as_ref()
                .is_some_and(|s| Some(s) != p.slots.as_ref())
            || e.hash_key
                .as_ref()
                .is_some_and(|h| Some(h) != p.hash_key.as_ref())
            || (e.sentinel_zones.as_ref()).is_some_and(|z| Some(z) != p.sentinel_zones.as_ref())
            || e.sentinel_failover_hold
                .is_some_and(|h| Some(h) != p.sentinel_failover_hold)
            || e.sentinel_serve_stale_reads
                .is_some_and(|b| Some(b) != p.sentinel_serve_stale_reads)
        {
            cx.err(
                &e.path,
                "shard_index, weight, slots, hash_key, sentinel_zones, sentinel_failover_hold and sentinel_serve_stale_reads differ from the shard's first Sentinel's",
            );
        }
    }
    if cx.count() > before {
        return None;
    }
    Some((
        p.shard_index,
        Shard {
            name: name.to_string(),
            hash_key: p.hash_key.clone().unwrap_or_else(|| name.to_string()),
            weight: p.weight.unwrap_or(1),
            slots: p.slots.clone().unwrap_or_default(),
            endpoints: vec![Endpoint {
                address: respway_filters::model::NO_ENDPOINT,
                role: Role::Primary,
                zone: None,
            }],
            sentinel: Some(SentinelSource {
                master: master?,
                sentinels,
                zones: p.sentinel_zones.clone().unwrap_or_default(),
                failover_hold: p.sentinel_failover_hold.unwrap_or(DEFAULT_FAILOVER_HOLD),
                serve_stale_reads: p.sentinel_serve_stale_reads.unwrap_or(true),
            }),
        },
        p.path.clone(),
    ))
}

fn lb_endpoint(
    cx: &mut Cx,
    path: String,
    zone: Option<String>,
    e: &LbEndpoint,
    policy: Option<&HashPolicy>,
) -> Option<RawEndpoint> {
    let before = cx.count();
    match HealthStatus::try_from(e.health_status) {
        Ok(HealthStatus::Unknown | HealthStatus::Healthy) => {}
        Ok(s) => cx.err(
            join(&path, "health_status"),
            format!("{} is not supported yet", s.as_str_name()),
        ),
        Err(_) => cx.err(
            join(&path, "health_status"),
            format!("unknown value {}", e.health_status),
        ),
    }
    let address = match &e.host_identifier {
        Some(HostIdentifier::Endpoint(ep)) => {
            let ep_path = join(&path, "endpoint");
            unsupported(
                cx,
                &ep_path,
                &[
                    ("health_check_config", ep.health_check_config.is_some()),
                    ("hostname", !ep.hostname.is_empty()),
                    ("additional_addresses", !ep.additional_addresses.is_empty()),
                ],
            );
            socket_address(cx, &join(&ep_path, "address"), ep.address.as_ref())
        }
        Some(HostIdentifier::EndpointName(_)) => {
            cx.err(join(&path, "endpoint_name"), "not supported by respway");
            None
        }
        None => {
            cx.err(join(&path, "endpoint"), "required");
            None
        }
    };
    let weight = e.load_balancing_weight.map(|w| w.value);
    if weight == Some(0) {
        cx.err(
            join(&path, "load_balancing_weight"),
            "must be greater than 0",
        );
    }
    let mut raw = RawEndpoint {
        path,
        address: address.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
        zone,
        role: None,
        shard: None,
        shard_index: None,
        slots: None,
        weight,
        hash_key: None,
        sentinel: false,
        sentinel_master: None,
        sentinel_zones: None,
        sentinel_failover_hold: None,
        sentinel_serve_stale_reads: None,
    };
    if let Some(md) = &e.metadata {
        if let Some(s) = md.filter_metadata.get(names::METADATA_NAMESPACE) {
            respway_metadata(cx, &mut raw, s, policy);
        }
        // Other keys of envoy.lb (subset selectors) only matter to lb_subset_config, which is
        // refused on the cluster; other namespaces belong to other consumers.
        if let Some(s) = md.filter_metadata.get(names::ENVOY_LB_NAMESPACE) {
            if let Some(v) = s.fields.get("hash_key") {
                let at = format!("{}.metadata.filter_metadata.envoy.lb.hash_key", raw.path);
                match &v.kind {
                    Some(Kind::StringValue(k)) if !k.is_empty() => raw.hash_key = Some(k.clone()),
                    _ => cx.err(at, "expected a non-empty string"),
                }
            }
        }
    }
    (cx.count() == before).then_some(raw)
}

fn respway_metadata(cx: &mut Cx, raw: &mut RawEndpoint, s: &Struct, policy: Option<&HashPolicy>) {
    let mut keys: Vec<&String> = s.fields.keys().collect();
    keys.sort();
    for key in keys {
        let at = raw.meta(key);
        let kind = s.fields[key].kind.as_ref();
        match key.as_str() {
            "shard" => match kind {
                Some(Kind::StringValue(v)) if !v.is_empty() => raw.shard = Some(v.clone()),
                _ => cx.err(at, "expected a non-empty string"),
            },
            "shard_index" => match kind {
                Some(Kind::NumberValue(n))
                    if n.fract() == 0.0 && *n >= 0.0 && *n <= u32::MAX as f64 =>
                {
                    raw.shard_index = Some(*n as u32)
                }
                _ => cx.err(at, "expected a whole number from 0"),
            },
            "role" => match kind {
                Some(Kind::StringValue(v)) if v == "primary" => raw.role = Some(Role::Primary),
                Some(Kind::StringValue(v)) if v == "replica" => raw.role = Some(Role::Replica),
                Some(Kind::StringValue(v)) if v == "sentinel" => raw.sentinel = true,
                _ => cx.err(at, "expected \"primary\", \"replica\" or \"sentinel\""),
            },
            "sentinel_zones" => {
                let Some(Kind::StructValue(z)) = kind else {
                    cx.err(at, "expected a map of IP:port to zone");
                    continue;
                };
                let mut zones = Vec::new();
                for (addr, zone) in &z.fields {
                    let zat = format!("{at}.{addr}");
                    match (common::parse_socket_addr(addr), &zone.kind) {
                        (Ok(a), Some(Kind::StringValue(zone))) if !zone.is_empty() => {
                            zones.push((a, zone.clone()))
                        }
                        (Err(e), _) => cx.err(zat, e),
                        _ => cx.err(zat, "expected a non-empty zone"),
                    }
                }
                zones.sort();
                raw.sentinel_zones = Some(zones);
            }
            "sentinel_failover_hold" => {
                let Some(Kind::StringValue(text)) = kind else {
                    cx.err(at, "expected a duration such as \"250ms\"");
                    continue;
                };
                match common::parse_duration(text) {
                    Ok(d) if d > MAX_FAILOVER_HOLD => cx.err(
                        at,
                        format!(
                            "{text} is more than {MAX_FAILOVER_HOLD:?}, the longest a failover \
                             may hold writes"
                        ),
                    ),
                    Ok(d) => raw.sentinel_failover_hold = Some(d),
                    Err(e) => cx.err(at, e),
                }
            }
            "sentinel_serve_stale_reads" => match kind {
                Some(Kind::BoolValue(b)) => raw.sentinel_serve_stale_reads = Some(*b),
                _ => cx.err(at, "expected true or false"),
            },
            "sentinel_master" => match kind {
                Some(Kind::StringValue(v)) if !v.is_empty() => {
                    raw.sentinel_master = Some(v.clone())
                }
                _ => cx.err(at, "expected a non-empty string"),
            },
            "slots" => {
                if policy.is_some_and(|p| common::slot_count(p).is_none()) {
                    cx.err(
                        &at,
                        "only the crc32_slots and crc16_slots policies use slots",
                    );
                }
                let Some(Kind::ListValue(list)) = kind else {
                    cx.err(at, "expected a list of slots or ranges such as \"0-511\"");
                    continue;
                };
                let mut slots = Vec::new();
                for (i, v) in list.values.iter().enumerate() {
                    let range = match &v.kind {
                        Some(Kind::StringValue(s)) => common::parse_slot_range(s),
                        Some(Kind::NumberValue(n))
                            if n.fract() == 0.0 && *n >= 0.0 && *n <= u32::MAX as f64 =>
                        {
                            Ok((*n as u32, *n as u32))
                        }
                        _ => Err("expected a slot or a range such as \"0-511\"".to_string()),
                    };
                    match range {
                        Ok(r) => slots.push(r),
                        Err(e) => cx.err(index(&at, i), e),
                    }
                }
                raw.slots = Some(slots);
            }
            _ => cx.err(
                at,
                format!(
                    "unknown field (expected one of: {})",
                    RESPWAY_KEYS.join(", ")
                ),
            ),
        }
    }
}
