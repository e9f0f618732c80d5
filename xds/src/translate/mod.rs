//! Envoy v3 resources → the validated model: the one place a configuration's meaning is
//! checked. Used for the static YAML file (read into resources by `yaml/`, which checks only
//! its shape), the xDS stream and the management server's snapshots, so all obey the same
//! rules.
//!
//! Errors name the resource (`listener "main"`, `cluster "cache"`,
//! `cluster_load_assignment "cache"`), the Envoy field path, and the reason; all are reported
//! at once. Envoy fields that respway does not implement are errors naming the field when they
//! are set: a config that asks for something respway would not do is refused, never half
//! applied.

mod cluster;
mod endpoint;
mod health;
mod listener;
mod near_cache;
mod redis_cluster;
mod routes;
mod tls;

pub(crate) use cluster::missing_assignment;
pub(crate) use listener::referenced_clusters;

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{
    address, data_source, socket_address, Address, DataSource,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use prost::{Message, Name};
use respway_filters::model::{Config, HashTag, ReadPolicy};

use crate::common;
use crate::error::{join, ConfigErrors, Cx};
use crate::Resources;

/// Translates Envoy resources into the validated model, reporting every error at once.
///
/// Clusters of type EDS take their endpoints from the `ClusterLoadAssignment` in
/// `resources.endpoints` whose `cluster_name` is the cluster's `eds_cluster_config.service_name`
/// or, when that is empty, the cluster's name; STATIC clusters use their `load_assignment`.
/// Assignments that no cluster uses are ignored (an xDS server may send them before the
/// cluster, or after it is gone). No Envoy resource names the sidecar's zone: [`Config::zone`]
/// is `resources.node_zone` (the bootstrap's `node.locality.zone`, or a file's `node.zone`).
pub fn translate(resources: &Resources) -> Result<Config, ConfigErrors> {
    // Routes are checked against every cluster present, so that a cluster with errors of its
    // own does not also make each route to it an error.
    let cluster_names: HashSet<&str> = resources.clusters.iter().map(|c| c.name.as_str()).collect();
    translate_with(resources, &cluster_names)
}

/// [`translate`] for a part of a snapshot (a management-server resource file): routes may
/// name clusters it does not hold, which are checked once the parts are merged.
pub(crate) fn translate_open(resources: &Resources) -> Result<Config, ConfigErrors> {
    let referenced: Vec<String> = resources
        .listeners
        .iter()
        .flat_map(referenced_clusters)
        .collect();
    let cluster_names: HashSet<&str> = resources
        .clusters
        .iter()
        .map(|c| c.name.as_str())
        .chain(referenced.iter().map(String::as_str))
        .collect();
    translate_with(resources, &cluster_names)
}

/// [`translate`], with routes checked against `cluster_names`.
fn translate_with(
    resources: &Resources,
    cluster_names: &HashSet<&str>,
) -> Result<Config, ConfigErrors> {
    let mut cx = Cx::default();

    let mut listeners = Vec::new();
    let mut names = HashMap::new();
    let mut addresses = HashMap::new();
    for (i, l) in resources.listeners.iter().enumerate() {
        let translated = listener::translate(&mut cx, l, i, cluster_names);
        if !l.name.is_empty() {
            if let Some(first) = names.insert(l.name.as_str(), i) {
                cx.err(
                    "name",
                    format!("duplicate listener name (also listeners[{first}])"),
                );
            }
        }
        if let Some(t) = translated {
            if let Some(other) = addresses.insert(t.listener.address, t.listener.name.clone()) {
                cx.err(
                    "address",
                    format!(
                        "{} is also the address of listener {other:?}",
                        t.listener.address
                    ),
                );
            }
            listeners.push(t);
        }
    }

    let mut assignments = HashMap::new();
    let mut positions: HashMap<&str, usize> = HashMap::new();
    for (i, cla) in resources.endpoints.iter().enumerate() {
        let name = cla.cluster_name.as_str();
        match positions.entry(name) {
            Entry::Occupied(first) => {
                cx.resource = format!("cluster_load_assignment {name:?}");
                cx.err(
                    "cluster_name",
                    format!(
                        "duplicate ClusterLoadAssignment (also endpoints[{}])",
                        first.get()
                    ),
                );
            }
            Entry::Vacant(v) => {
                v.insert(i);
                assignments.insert(name, cla);
            }
        }
    }

    let mut clusters = Vec::new();
    let mut names = HashMap::new();
    for (i, c) in resources.clusters.iter().enumerate() {
        let translated = cluster::translate(&mut cx, c, i, &assignments);
        cx.resource = cluster::resource(c, i);
        if !c.name.is_empty() {
            if let Some(first) = names.insert(c.name.as_str(), i) {
                cx.err(
                    "name",
                    format!("duplicate cluster name (also clusters[{first}])"),
                );
            }
        }
        clusters.extend(translated);
    }

    // A cluster without an explicit respway hashtag (or read policy) follows the Envoy
    // listener-wide `enable_hashtagging` (`read_policy`) of the listeners that route to it.
    let mut out_clusters = Vec::new();
    for t in clusters {
        let mut c = t.cluster;
        c.read_policy = match t.read_policy {
            Some(p) => p,
            None => inherited_read_policy(&mut cx, &c.name, &listeners),
        };
        c.hashtag = match t.hashtag {
            Some(tag) => tag,
            None => {
                let flags: Vec<(&str, bool)> = listeners
                    .iter()
                    .filter(|l| l.routes_to(&c.name))
                    .map(|l| (l.listener.name.as_str(), l.enable_hashtagging))
                    .collect();
                let on = flags.iter().filter(|(_, f)| *f).count();
                if on != 0 && on != flags.len() {
                    cx.resource = format!("cluster {:?}", c.name);
                    let list = |want: bool| {
                        flags
                            .iter()
                            .filter(|(_, f)| *f == want)
                            .map(|(n, _)| format!("{n:?}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    };
                    cx.err(
                        "typed_extension_protocol_options",
                        format!(
                            "listeners {} enable hashtagging and {} do not; set respway.v1.ClusterOptions.hashtag",
                            list(true),
                            list(false)
                        ),
                    );
                }
                if flags.is_empty() || on != 0 {
                    Some(HashTag::default())
                } else {
                    None
                }
            }
        };
        // Every translated cluster passed its own checks; the picker build is the last one.
        if let Some(reason) = common::picker_error(&c) {
            cx.resource = format!("cluster {:?}", c.name);
            cx.err("", reason);
        }
        out_clusters.push(c);
    }

    let zone = resources.node_zone.clone();
    if zone.as_deref() == Some("") {
        cx.resource = "node".to_string();
        cx.err("zone", "must not be empty (leave it unset)");
    }

    cx.finish(Config {
        zone,
        listeners: listeners.into_iter().map(|l| l.listener).collect(),
        clusters: out_clusters,
    })
}

/// The read policy of a cluster that `respway.v1.ClusterOptions` says nothing about: the one
/// of the listeners routing to it (their `RedisProxy.settings.read_policy`), primary when
/// none does. Listeners that disagree are an error.
fn inherited_read_policy(
    cx: &mut Cx,
    cluster: &str,
    listeners: &[listener::Translated],
) -> ReadPolicy {
    let routing: Vec<&listener::Translated> =
        listeners.iter().filter(|l| l.routes_to(cluster)).collect();
    let Some(first) = routing.first() else {
        return ReadPolicy::Primary;
    };
    let policy = first.read_policy.0;
    if routing.iter().any(|l| l.read_policy.0 != policy) {
        cx.resource = format!("cluster {cluster:?}");
        let each = routing
            .iter()
            .map(|l| format!("{:?} ({})", l.listener.name, l.read_policy.1))
            .collect::<Vec<_>>()
            .join(", ");
        cx.err(
            "typed_extension_protocol_options",
            format!(
                "listeners {each} disagree on settings.read_policy; set respway.v1.ClusterOptions.read_policy"
            ),
        );
    }
    policy
}

// === helpers shared by the resource translators ===

/// The message name in a type URL (what follows the last `/`).
fn type_name(any: &Any) -> &str {
    any.type_url.rsplit('/').next().unwrap_or("")
}

/// Decodes `any` as a `T`, or says why not.
fn unpack<T: Message + Name + Default>(any: &Any) -> Result<T, String> {
    if type_name(any) != T::full_name() {
        return Err(format!(
            "expected {}, got {:?}",
            T::type_url(),
            any.type_url
        ));
    }
    T::decode(any.value.as_slice()).map_err(|e| format!("cannot decode {}: {e}", T::full_name()))
}

/// Records "not supported" for `field` when `set`.
fn unsupported(cx: &mut Cx, prefix: &str, fields: &[(&str, bool)]) {
    for (field, set) in fields {
        if *set {
            cx.err(join(prefix, field), "not supported by respway");
        }
    }
}

/// A protobuf duration, zero allowed.
fn duration(cx: &mut Cx, field: &str, d: &PbDuration) -> Option<Duration> {
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        cx.err(
            field,
            format!("invalid duration ({}s, {}ns)", d.seconds, d.nanos),
        );
        return None;
    }
    Some(Duration::new(d.seconds as u64, d.nanos as u32))
}

/// A protobuf duration that must be greater than zero.
fn positive_duration(cx: &mut Cx, field: &str, d: &PbDuration) -> Option<Duration> {
    let out = duration(cx, field, d)?;
    if out.is_zero() {
        cx.err(field, "must be greater than 0");
        return None;
    }
    Some(out)
}

/// An inline secret; files and environment variables are not read.
fn inline_secret(cx: &mut Cx, field: &str, ds: &DataSource) -> Option<String> {
    secret(cx, field, ds, false)
}

/// A secret inline, or with `external` from a file (read now, trailing newline trimmed) or
/// an environment variable of this host. Errors name the field, never the value.
fn secret(cx: &mut Cx, field: &str, ds: &DataSource, external: bool) -> Option<String> {
    if ds.watched_directory.is_some() {
        cx.err(join(field, "watched_directory"), "not supported by respway");
    }
    let s = match &ds.specifier {
        Some(data_source::Specifier::InlineString(s)) => s.clone(),
        Some(data_source::Specifier::InlineBytes(b)) => match String::from_utf8(b.clone()) {
            Ok(s) => s,
            Err(_) => {
                cx.err(join(field, "inline_bytes"), "must be UTF-8");
                return None;
            }
        },
        Some(data_source::Specifier::Filename(f)) if external => {
            match common::read_password_file(f) {
                Ok(s) => s,
                Err(e) => {
                    cx.err(join(field, "filename"), e);
                    return None;
                }
            }
        }
        Some(data_source::Specifier::EnvironmentVariable(v)) if external => {
            match common::read_password_env(v) {
                Ok(s) => s,
                Err(e) => {
                    cx.err(join(field, "environment_variable"), e);
                    return None;
                }
            }
        }
        Some(data_source::Specifier::Filename(_)) => {
            cx.err(
                join(field, "filename"),
                "not supported by respway (use inline_string)",
            );
            return None;
        }
        Some(data_source::Specifier::EnvironmentVariable(_)) => {
            cx.err(
                join(field, "environment_variable"),
                "not supported by respway (use inline_string)",
            );
            return None;
        }
        None => {
            cx.err(field, "required: inline_string");
            return None;
        }
    };
    if s.is_empty() {
        cx.err(field, "must not be empty");
        return None;
    }
    Some(s)
}

/// An IP socket address (TCP, numeric IP, numeric port).
fn socket_address(cx: &mut Cx, field: &str, addr: Option<&Address>) -> Option<SocketAddr> {
    let Some(addr) = addr.and_then(|a| a.address.as_ref()) else {
        cx.err(field, "required");
        return None;
    };
    let sa = match addr {
        address::Address::SocketAddress(sa) => sa,
        address::Address::Pipe(_) => {
            cx.err(
                join(field, "pipe"),
                "not supported by respway (use socket_address)",
            );
            return None;
        }
        address::Address::EnvoyInternalAddress(_) => {
            cx.err(
                join(field, "envoy_internal_address"),
                "not supported by respway (use socket_address)",
            );
            return None;
        }
    };
    let field = join(field, "socket_address");
    let before = cx.count();
    if sa.protocol != socket_address::Protocol::Tcp as i32 {
        cx.err(join(&field, "protocol"), "only TCP is supported");
    }
    unsupported(
        cx,
        &field,
        &[
            ("resolver_name", !sa.resolver_name.is_empty()),
            ("ipv4_compat", sa.ipv4_compat),
            (
                "network_namespace_filepath",
                !sa.network_namespace_filepath.is_empty(),
            ),
        ],
    );
    let ip = match sa.address.parse::<IpAddr>() {
        Ok(ip) => Some(ip),
        Err(_) => {
            cx.err(
                join(&field, "address"),
                format!(
                    "invalid IP address {:?} (host names are not resolved)",
                    sa.address
                ),
            );
            None
        }
    };
    let port = match &sa.port_specifier {
        Some(socket_address::PortSpecifier::PortValue(p)) => match u16::try_from(*p) {
            Ok(p) => Some(p),
            Err(_) => {
                cx.err(join(&field, "port_value"), format!("invalid port {p}"));
                None
            }
        },
        Some(socket_address::PortSpecifier::NamedPort(_)) => {
            cx.err(join(&field, "named_port"), "not supported by respway");
            None
        }
        None => {
            cx.err(join(&field, "port_value"), "required");
            None
        }
    };
    if cx.count() > before {
        return None;
    }
    Some(SocketAddr::new(ip?, port?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::respway::v1::{ClusterOptions, ListenerSettings};
    use envoy_types::pb::envoy::config::core::v3::{Pipe, SocketAddress};

    fn errors(f: impl FnOnce(&mut Cx)) -> Vec<String> {
        let mut cx = Cx::default();
        f(&mut cx);
        cx.errors.iter().map(|e| e.to_string()).collect()
    }

    fn sock(address: &str, port: socket_address::PortSpecifier) -> Address {
        Address {
            address: Some(address::Address::SocketAddress(SocketAddress {
                address: address.into(),
                port_specifier: Some(port),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn unpack_checks_the_type() {
        let any = envoy_types::util::pack_any(ClusterOptions::default());
        assert_eq!(
            unpack::<ListenerSettings>(&any),
            Err("expected type.googleapis.com/respway.v1.ListenerSettings, got \"type.googleapis.com/respway.v1.ClusterOptions\"".into())
        );
        let other_domain = Any {
            type_url: "example.com/x/respway.v1.ClusterOptions".into(),
            value: vec![],
        };
        assert_eq!(
            unpack::<ClusterOptions>(&other_domain),
            Ok(ClusterOptions::default())
        );
        let garbage = Any {
            type_url: ClusterOptions::type_url(),
            value: vec![0xff],
        };
        assert!(unpack::<ClusterOptions>(&garbage)
            .unwrap_err()
            .starts_with("cannot decode respway.v1.ClusterOptions: "));
    }

    #[test]
    fn socket_addresses() {
        use socket_address::PortSpecifier::{NamedPort, PortValue};
        let mut cx = Cx::default();
        let ok = sock("10.0.0.1", PortValue(6379));
        assert_eq!(
            socket_address(&mut cx, "a", Some(&ok)),
            Some("10.0.0.1:6379".parse().unwrap())
        );
        let pipe = Address {
            address: Some(address::Address::Pipe(Pipe::default())),
        };
        assert_eq!(
            errors(|cx| {
                socket_address(cx, "a", None);
                socket_address(cx, "b", Some(&pipe));
                socket_address(cx, "c", Some(&sock("redis", PortValue(6379))));
                socket_address(cx, "d", Some(&sock("10.0.0.1", NamedPort("redis".into()))));
            }),
            [
                "a: required",
                "b.pipe: not supported by respway (use socket_address)",
                "c.socket_address.address: invalid IP address \"redis\" (host names are not resolved)",
                "d.socket_address.named_port: not supported by respway",
            ]
        );
    }

    #[test]
    fn durations_and_secrets() {
        assert_eq!(
            errors(|cx| {
                positive_duration(cx, "a", &PbDuration::default());
                positive_duration(
                    cx,
                    "b",
                    &PbDuration {
                        seconds: -1,
                        nanos: 0,
                    },
                );
                inline_secret(
                    cx,
                    "c",
                    &DataSource {
                        specifier: Some(data_source::Specifier::Filename("/etc/pw".into())),
                        ..Default::default()
                    },
                );
            }),
            [
                "a: must be greater than 0",
                "b: invalid duration (-1s, 0ns)",
                "c.filename: not supported by respway (use inline_string)",
            ]
        );
    }
}
