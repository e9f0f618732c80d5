//! A cluster's `shards`, read into its `ClusterLoadAssignment`: one `LbEndpoint` per
//! endpoint, grouped by zone into localities, each carrying its shard's name, position and
//! role (and, on the primary, the shard's slots, weight and hash key) in its metadata.
//!
//! Each shard's endpoints are written in canonical order (the primary first, then replicas
//! by address), as the translation gives them back. Only what is about the YAML's shape is
//! checked here; the translation checks the shards (one primary each, names, addresses, hash
//! keys and slots).

use std::collections::HashMap;
use std::net::SocketAddr;

use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, LocalityLbEndpoints};
use envoy_types::pb::google::protobuf::value::Kind;
use respway_filters::model::{HashPolicy, Role, UpstreamAuth, DEFAULT_FAILOVER_HOLD};
use serde_yaml_ng::Value;

use super::auth::upstream_auth;
use super::origin::Origins;
use super::reference::{ENDPOINT_KEYS, SENTINEL_KEYS, SHARD_KEYS};
use super::value::{kind, Map};
use crate::common;
use crate::emit::{failover_hold, place_in_zone, shard_endpoint, string, ShardValues};
use crate::error::{index, join, Cx};
use crate::names;

/// One endpoint as read.
struct Raw {
    /// Its position in the shard's `endpoints`.
    at: usize,
    address: SocketAddr,
    role: Option<Role>,
    zone: Option<String>,
}

/// The cluster's shards as its `ClusterLoadAssignment`, and the endpoints' own credentials
/// by address (for `RedisProtocolOptions.credentials`, at Envoy path `auth_at`).
pub(super) fn shards(
    cx: &mut Cx,
    o: &mut Origins,
    m: &Map<'_>,
    cluster: &str,
    policy: &HashPolicy,
    auth_at: &str,
) -> (ClusterLoadAssignment, Vec<(SocketAddr, UpstreamAuth)>) {
    let own = (
        if cluster.is_empty() {
            String::new()
        } else {
            format!("cluster {cluster:?}")
        },
        cx.resource.clone(),
    );
    o.enter(
        &format!("cluster_load_assignment {cluster:?}"),
        &cx.resource,
    );
    o.note("endpoints", "shards");
    o.note("", "shards");
    let list = m.non_empty_seq(cx, "shards");
    let mut localities: Vec<LocalityLbEndpoints> = Vec::new();
    // (address, credentials, YAML path of the `auth`)
    let mut credentials: Vec<(SocketAddr, UpstreamAuth, String)> = Vec::new();
    let mut names: HashMap<String, usize> = HashMap::new();
    for (si, v) in list.iter().enumerate() {
        let sp = index("shards", si);
        o.mark(&sp);
        o.mark(join(&sp, "name"));
        let Some(s) = Map::new(cx, v, &sp, SHARD_KEYS) else {
            continue;
        };
        let name = s.non_empty_string(cx, "name");
        let hash_key = s.non_empty_string(cx, "hash_key");
        let weight = s.uint(cx, "weight", u32::MAX.into()).unwrap_or(1) as u32;
        let slots = slots(cx, &s);
        if let Some(v) = s.get("sentinel") {
            if s.get("endpoints").is_some() {
                cx.err(
                    s.at("endpoints"),
                    "a shard has either endpoints or sentinel, not both",
                );
            }
            let shard_name = name.clone().unwrap_or_else(|| format!("shard-{si}"));
            if let Some(first) = names.insert(shard_name.clone(), si) {
                cx.err(
                    s.at("name"),
                    format!("duplicate shard name {shard_name:?} (also shards[{first}])"),
                );
            }
            let shard = SentinelShard {
                at: &sp,
                index: si,
                name: &shard_name,
                hash_key: hash_key.filter(|k| *k != shard_name),
                weight,
                slots: &slots,
            };
            sentinel_shard(cx, o, v, &shard, &mut localities, &mut credentials);
            continue;
        }
        let list = s.non_empty_seq(cx, "endpoints");
        let single = list.len() == 1;
        let mut raw = Vec::new();
        for (ei, v) in list.iter().enumerate() {
            let at = index(&s.at("endpoints"), ei);
            o.mark(&at);
            let Some(e) = Map::new(cx, v, &at, ENDPOINT_KEYS) else {
                continue;
            };
            let address = e.required(cx, "address", common::parse_socket_addr);
            let role = match e.string(cx, "role").as_deref() {
                Some("primary") => Some(Role::Primary),
                Some("replica") => Some(Role::Replica),
                None if single => Some(Role::Primary),
                None => {
                    // With more than one endpoint, there is no role to write without one.
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
            let auth = e
                .get("auth")
                .and_then(|v| upstream_auth(cx, v, &e.at("auth")));
            if let Some(address) = address {
                if let Some((auth, _)) = auth {
                    credentials.push((address, auth, e.at("auth")));
                }
                raw.push(Raw {
                    at: ei,
                    address,
                    role,
                    zone,
                });
            }
        }
        raw.sort_by_key(|e| (e.role != Some(Role::Primary), e.address));
        let shard_name = name.clone().unwrap_or_else(|| format!("shard-{si}"));
        // Endpoints are grouped into shards by name: two shards of one name cannot be
        // written apart.
        if let Some(first) = names.insert(shard_name.clone(), si) {
            cx.err(
                s.at("name"),
                format!("duplicate shard name {shard_name:?} (also shards[{first}])"),
            );
        }
        let primary = raw
            .iter()
            .find(|e| e.role == Some(Role::Primary))
            .map(|e| e.address);
        // The hash key is written only when it is not what the translation would take
        // anyway.
        let hash_key = primary.and_then(|p| {
            let key =
                hash_key.unwrap_or_else(|| common::default_hash_key(policy, name.as_deref(), p));
            (key != common::default_hash_key(policy, Some(&shard_name), p)).then_some(key)
        });
        for e in raw {
            // Shard-level values travel on the primary; on every endpoint when there is
            // none, so that the translation still checks them (it refuses the shard anyway).
            let is_primary = e.role == Some(Role::Primary) || primary.is_none();
            let mut respway = vec![
                ("shard", string(&shard_name)),
                ("shard_index", Kind::NumberValue(si as f64)),
            ];
            if let Some(role) = e.role {
                let role = match role {
                    Role::Primary => "primary",
                    Role::Replica => "replica",
                };
                respway.push(("role", string(role)));
            }
            let values = is_primary.then(|| ShardValues {
                weight,
                slots: &slots,
                hash_key: hash_key.as_deref(),
            });
            let lb_endpoint = shard_endpoint(e.address, respway, values);
            let zone = e.zone.clone().unwrap_or_default();
            let (li, k) = place_in_zone(&mut localities, &zone, lb_endpoint);
            let ep = format!("endpoints[{li}].lb_endpoints[{k}]");
            note_endpoint(o, &ep, &sp, e.at, is_primary.then_some(slots.len()));
        }
    }
    o.enter(&own_envoy(&own.0, &own.1), &own.1);
    credentials.sort_by_key(|c| c.0);
    // One set of Sentinels usually serves several shards: its credentials are written once.
    credentials.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    for (k, (_, _, path)) in credentials.iter().enumerate() {
        let at = format!("{auth_at}.credentials[{k}]");
        o.note(&at, path);
        o.note(format!("{at}.auth_username"), join(path, "username"));
        o.note(format!("{at}.auth_password"), join(path, "password"));
    }
    let cla = ClusterLoadAssignment {
        cluster_name: cluster.to_string(),
        endpoints: localities,
        ..Default::default()
    };
    let credentials = credentials.into_iter().map(|(a, c, _)| (a, c)).collect();
    (cla, credentials)
}

/// What a Sentinel-managed shard carries besides its Sentinels.
struct SentinelShard<'a> {
    /// Its YAML path.
    at: &'a str,
    /// Its position in `shards`.
    index: usize,
    name: &'a str,
    /// Written only when it is not the shard's name (the translation's default).
    hash_key: Option<String>,
    weight: u32,
    slots: &'a [Kind],
}

/// A shard's `sentinel` (`master`, `sentinels`, `auth`, `zones`, `failover_hold`,
/// `serve_stale_reads`): one `LbEndpoint` of role `sentinel` per Sentinel, naming the master,
/// the first carrying the shard's slots, weight and hash key, its zones, its failover hold
/// (when not the default) and `serve_stale_reads` (when false); the Sentinels' credentials
/// (their own, never the cluster's) go to `credentials`.
fn sentinel_shard(
    cx: &mut Cx,
    o: &mut Origins,
    v: &Value,
    shard: &SentinelShard<'_>,
    localities: &mut Vec<LocalityLbEndpoints>,
    credentials: &mut Vec<(SocketAddr, UpstreamAuth, String)>,
) {
    let at = join(shard.at, "sentinel");
    let Some(m) = Map::new(cx, v, &at, SENTINEL_KEYS) else {
        return;
    };
    let master = m.required_string(cx, "master");
    if master.as_deref() == Some("") {
        cx.err(m.at("master"), "must not be empty");
    }
    let auth = m
        .get("auth")
        .and_then(|v| upstream_auth(cx, v, &m.at("auth")));
    let mut zones: Vec<(SocketAddr, String)> = Vec::new();
    if let Some(z) = m.get("zones") {
        let zat = m.at("zones");
        match z {
            Value::Mapping(map) => {
                for (k, v) in map {
                    let at = format!("{zat}.{}", k.as_str().unwrap_or("?"));
                    let addr = k.as_str().map(common::parse_socket_addr);
                    match (addr, v.as_str()) {
                        (Some(Ok(a)), Some(zone)) if !zone.is_empty() => {
                            zones.push((a, zone.to_string()))
                        }
                        (Some(Err(e)), _) => cx.err(at, e),
                        (None, _) => cx.err(at, "expected an address such as \"10.0.0.1:6379\""),
                        _ => cx.err(at, "expected a non-empty zone"),
                    }
                }
            }
            Value::Null => {}
            other => cx.err(
                zat,
                format!("expected a map of IP:port to zone, got {}", kind(other)),
            ),
        }
    }
    zones.sort();
    // Its range is the translation's to check, as for every value.
    let hold = m
        .duration_or_zero(cx, "failover_hold")
        .filter(|d| *d != DEFAULT_FAILOVER_HOLD);
    // Absent is true: only `false` travels.
    let stale = m.boolean(cx, "serve_stale_reads").filter(|b| !b);
    let list = m.non_empty_seq(cx, "sentinels");
    let mut seen: Vec<SocketAddr> = Vec::new();
    for (k, v) in list.iter().enumerate() {
        let sat = index(&m.at("sentinels"), k);
        let address = match v {
            Value::String(text) => match common::parse_socket_addr(text) {
                Ok(a) => a,
                Err(e) => {
                    cx.err(sat, e);
                    continue;
                }
            },
            other => {
                cx.err(
                    sat,
                    format!(
                        "expected an address such as \"127.0.0.1:26379\", got {}",
                        kind(other)
                    ),
                );
                continue;
            }
        };
        if seen.contains(&address) {
            cx.err(sat, format!("{address} is listed twice"));
            continue;
        }
        seen.push(address);
        if let Some((auth, _)) = &auth {
            credentials.push((address, auth.clone(), m.at("auth")));
        }
        let first = k == 0;
        let mut respway = vec![
            ("shard", string(shard.name)),
            ("shard_index", Kind::NumberValue(shard.index as f64)),
            ("role", string("sentinel")),
        ];
        if let Some(master) = &master {
            respway.push(("sentinel_master", string(master)));
        }
        if first && !zones.is_empty() {
            respway.push(("sentinel_zones", crate::emit::zones(&zones)));
        }
        if let Some(hold) = hold.filter(|_| first) {
            respway.push(("sentinel_failover_hold", failover_hold(hold)));
        }
        if let Some(stale) = stale.filter(|_| first) {
            respway.push(("sentinel_serve_stale_reads", Kind::BoolValue(stale)));
        }
        let values = first.then_some(ShardValues {
            weight: shard.weight,
            slots: shard.slots,
            hash_key: shard.hash_key.as_deref(),
        });
        let lb_endpoint = shard_endpoint(address, respway, values);
        let (li, k) = place_in_zone(localities, "", lb_endpoint);
        let ep = format!("endpoints[{li}].lb_endpoints[{k}]");
        let meta = format!(
            "{ep}.metadata.filter_metadata.{}",
            names::METADATA_NAMESPACE
        );
        o.note(&ep, &sat);
        o.note(format!("{ep}.endpoint"), &sat);
        o.note(format!("{ep}.endpoint.address"), &sat);
        o.note(format!("{meta}.role"), &at);
        o.note(format!("{meta}.sentinel_master"), m.at("master"));
        o.note(format!("{meta}.sentinel_zones"), m.at("zones"));
        o.note(
            format!("{meta}.sentinel_failover_hold"),
            m.at("failover_hold"),
        );
        o.note(
            format!("{meta}.sentinel_serve_stale_reads"),
            m.at("serve_stale_reads"),
        );
        o.note(format!("{meta}.shard"), join(shard.at, "name"));
        o.note(format!("{meta}.shard_index"), shard.at);
        if first {
            o.note(
                format!("{ep}.load_balancing_weight"),
                join(shard.at, "weight"),
            );
            o.note(format!("{meta}.slots"), join(shard.at, "slots"));
        }
    }
}

/// How the translation names the cluster being read (`own`, empty for an unnamed one, whose
/// name is then its YAML one, `clusters[i]`).
fn own_envoy(own: &str, yaml: &str) -> String {
    if own.is_empty() {
        yaml.to_string()
    } else {
        own.to_string()
    }
}

/// Notes where the fields of the `LbEndpoint` at Envoy path `ep` came from: endpoint `ei` of
/// the shard at YAML path `shard`; `primary`: the number of slots the primary carries.
fn note_endpoint(o: &mut Origins, ep: &str, shard: &str, ei: usize, primary: Option<usize>) {
    let at = index(&join(shard, "endpoints"), ei);
    let meta = format!(
        "{ep}.metadata.filter_metadata.{}",
        names::METADATA_NAMESPACE
    );
    o.note(ep, &at);
    o.note(format!("{ep}.endpoint"), &at);
    o.note(format!("{ep}.endpoint.address"), join(&at, "address"));
    o.note(format!("{meta}.role"), join(&at, "role"));
    o.note(format!("{meta}.shard"), join(shard, "name"));
    o.note(format!("{meta}.shard_index"), shard);
    if let Some(slots) = primary {
        o.note(format!("{ep}.load_balancing_weight"), join(shard, "weight"));
        o.note(format!("{meta}.slots"), join(shard, "slots"));
        for k in 0..slots {
            o.note(
                format!("{meta}.slots[{k}]"),
                index(&join(shard, "slots"), k),
            );
        }
        o.note(
            format!(
                "{ep}.metadata.filter_metadata.{}.hash_key",
                names::ENVOY_LB_NAMESPACE
            ),
            join(shard, "hash_key"),
        );
    }
}

/// A shard's `slots`, each a slot range as written when it reads (`"0-511"`, `7`), else as
/// given (the translation says why not).
fn slots(cx: &mut Cx, s: &Map<'_>) -> Vec<Kind> {
    let mut out = Vec::new();
    for (i, v) in s.seq(cx, "slots").unwrap_or_default().iter().enumerate() {
        let at = index(&s.at("slots"), i);
        match v {
            Value::String(text) => out.push(string(
                &common::parse_slot_range(text)
                    .map(common::slot_range_string)
                    .unwrap_or_else(|_| text.clone()),
            )),
            Value::Number(n) => match n.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) => out.push(string(&common::slot_range_string((n, n)))),
                None => cx.err(at, format!("invalid slot {n}")),
            },
            other => cx.err(
                at,
                format!(
                    "expected a slot or a range such as \"0-511\", got {}",
                    kind(other)
                ),
            ),
        }
    }
    out
}
