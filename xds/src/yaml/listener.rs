//! Listeners, read into Envoy's `Listener`: address and TLS, and one filter chain holding
//! respway's `ListenerSettings` (client bounds, protocol, ACL users, limits, mirror modes)
//! and Envoy's `RedisProxy` (op timeout, downstream password, routes and mirrors).
//!
//! Only what is about the YAML's shape is checked here; the translation checks the rest.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent;
use envoy_types::pb::envoy::config::core::v3::{transport_socket, TransportSocket};
use envoy_types::pb::envoy::config::listener::v3::Listener as PbListener;
use envoy_types::pb::envoy::extensions::filters::network::redis_proxy::v3::{
    redis_proxy::{
        prefix_routes::{route::RequestMirrorPolicy, Route},
        ConnPoolSettings, PrefixRoutes, ProtocolVersion,
    },
    RedisProxy,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::ValidationContextType, CertificateValidationContext, CommonTlsContext,
    DownstreamTlsContext, TlsCertificate,
};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;
use respway_filters::codec_limits::Limits;
use respway_filters::model::{ClientLimits, ProtocolMode, RespSettings};
use serde_yaml_ng::Value;

use super::origin::Origins;
use super::reference::{
    EMULATION_KEYS, LIMITS_KEYS, LISTENER_KEYS, LISTENER_TLS_KEYS, MIRROR_KEYS, PREFIX_KEYS,
    ROUTES_KEYS, USER_KEYS,
};
use super::value::Map;
use crate::common;
use crate::emit::{duration, file, fractional_percent, inline, saturate};
use crate::error::{index, join, Cx};
use crate::names;
use crate::pb::respway::v1 as rw;

/// Where the translation finds respway's `ListenerSettings` and Envoy's `RedisProxy`.
const S: &str = "filter_chains[0].filters[0].typed_config";
const P: &str = "filter_chains[0].filters[1].typed_config";

/// How the reader names a resource in its errors: by name, else by list position.
pub(super) fn resource_name(v: &Value, kind: &str, list: &str, i: usize) -> String {
    match v.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => format!("{kind} {n:?}"),
        _ => format!("{list}[{i}]"),
    }
}

/// One listener; `hashtags` says, per cluster name, whether the cluster uses a hashtag (the
/// listener-wide Envoy flag summarizes the clusters it routes to). `None` when the value is
/// not a mapping.
pub(super) fn listener(
    cx: &mut Cx,
    o: &mut Origins,
    v: &Value,
    i: usize,
    hashtags: &HashMap<&str, bool>,
) -> Option<PbListener> {
    cx.resource = resource_name(v, "listener", "listeners", i);
    let envoy = match v.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => format!("listener {n:?}"),
        _ => format!("listeners[{i}]"),
    };
    o.enter(&envoy, &cx.resource);
    let m = Map::new(cx, v, "", LISTENER_KEYS)?;
    o.note("name", "name");
    let name = m.required_name(cx).unwrap_or_default();
    o.note("address", "address");
    let address = m
        .addr(cx, "address")
        .unwrap_or_else(|| common::DEFAULT_LISTENER_ADDRESS.parse().expect("valid"));
    o.note(format!("{P}.settings.op_timeout"), "op_timeout");
    let op_timeout = m
        .duration_or_zero(cx, "op_timeout")
        .unwrap_or(common::DEFAULT_OP_TIMEOUT);
    o.note(
        format!("{S}.max_pending_per_client"),
        "max_pending_per_client",
    );
    let max_pending = m
        .positive(cx, "max_pending_per_client", u32::MAX.into())
        .map_or(common::DEFAULT_MAX_PENDING, |n| n as usize);
    let client = client_limits(cx, o, &m);
    let (protocol, advertised) = resp_settings(cx, o, &m);
    o.note(
        format!("{P}.downstream_auth_passwords"),
        "downstream_auth_password",
    );
    let downstream_password = m.non_empty_string(cx, "downstream_auth_password");
    let users = users(cx, o, &m);
    o.note(format!("{S}.limits"), "limits");
    let limits = match m.get("limits") {
        Some(v) => limits(cx, o, v, &m.at("limits")),
        None => Limits::default(),
    };
    let (prefix_routes, mirror_modes) = match m.get("routes") {
        Some(v) => routes(cx, o, v, &m.at("routes")),
        None => {
            cx.err("routes", "required");
            (PrefixRoutes::default(), Vec::new())
        }
    };
    let tls = m
        .get("tls")
        .and_then(|v| listener_tls(cx, o, v, &m.at("tls")));
    for key in ["slowlog_threshold", "slowlog_max_len", "hot_key_sample"] {
        o.note(format!("{S}.{key}"), key);
    }
    let slowlog_threshold = m.duration_or_zero(cx, "slowlog_threshold");
    let slowlog_max_len = m.uint(cx, "slowlog_max_len", u64::MAX);
    let hot_key_sample = m.uint(cx, "hot_key_sample", u64::from(u32::MAX));
    let cluster_emulation = cluster_emulation(cx, o, &m);

    // Hashtags are per cluster in respway (`ClusterOptions.hashtag`, always written), so the
    // listener-wide Envoy flag only summarizes: on when any routed cluster uses a hashtag.
    let enable_hashtagging =
        routed_clusters(&prefix_routes).any(|c| hashtags.get(c.as_str()).copied().unwrap_or(false));
    let redis = RedisProxy {
        stat_prefix: name.clone(),
        settings: Some(ConnPoolSettings {
            op_timeout: Some(duration(op_timeout)),
            enable_hashtagging,
            ..Default::default()
        }),
        prefix_routes: Some(prefix_routes),
        downstream_auth_passwords: downstream_password.iter().map(|p| inline(p)).collect(),
        // What Envoy can say of the protocol: RESP3 enforced. Its RESP2 is also proto3's unset,
        // so the mode itself is always written in `ListenerSettings.protocol` as well.
        protocol_version: match protocol {
            ProtocolMode::Resp3 => ProtocolVersion::Resp3,
            ProtocolMode::Auto | ProtocolMode::Resp2 => ProtocolVersion::Resp2,
        } as i32,
        ..Default::default()
    };
    let settings = rw::ListenerSettings {
        max_pending_per_client: saturate(max_pending),
        limits: Some(rw::CodecLimits {
            max_bulk_len: limits.max_bulk_len as u64,
            max_multibulk_len: limits.max_multibulk_len as u64,
            max_inline_len: limits.max_inline_len as u64,
        }),
        mirror_modes,
        client_buffer_limit: client.buffer_limit as u64,
        client_buffer_hard_limit: client.buffer_hard_limit as u64,
        client_stall_timeout: Some(duration(client.stall_timeout)),
        max_auth_failures: client.max_auth_failures,
        allow_keyless_scripts: client.allow_keyless_scripts,
        allow_restricted_scripts: client.allow_restricted_scripts,
        admin_commands: client.admin_commands,
        keys_max: client.keys_max as u64,
        pubsub_buffer_limit: client.pubsub_buffer_limit as u64,
        slowlog_threshold: slowlog_threshold.map(duration),
        slowlog_max_len,
        hot_key_sample,
        protocol: match protocol {
            ProtocolMode::Auto => rw::Protocol::Auto,
            ProtocolMode::Resp2 => rw::Protocol::Resp2,
            ProtocolMode::Resp3 => rw::Protocol::Resp3,
        } as i32,
        advertised_redis_version: advertised,
        users,
        cluster_emulation,
    };
    Some(crate::emit::listener_resource(
        name, address, tls, settings, redis,
    ))
}

/// Every cluster a route, the catch-all or a mirror of either names.
fn routed_clusters(pr: &PrefixRoutes) -> impl Iterator<Item = &String> {
    pr.routes
        .iter()
        .chain(pr.catch_all_route.iter())
        .flat_map(|r| {
            std::iter::once(&r.cluster).chain(r.request_mirror_policy.iter().map(|m| &m.cluster))
        })
}

/// `cluster_emulation: true` (one node: the address each client connected to), `false`, or
/// `{ announce: [IP:port, ...] }`; the addresses are checked by the translation.
fn cluster_emulation(cx: &mut Cx, o: &mut Origins, m: &Map<'_>) -> Option<rw::ClusterEmulation> {
    let key = "cluster_emulation";
    let at = m.at(key);
    o.note(format!("{S}.{key}"), &at);
    match m.get(key)? {
        Value::Bool(true) => Some(rw::ClusterEmulation::default()),
        Value::Bool(false) => None,
        v @ Value::Mapping(_) => {
            let e = Map::new(cx, v, &at, EMULATION_KEYS)?;
            let listed = e.get("announce").is_some_and(Value::is_sequence);
            o.note(format!("{S}.{key}.announce"), e.at("announce"));
            let announce = e.strings(cx, "announce");
            for i in 0..announce.len() {
                let yaml = match listed {
                    true => index(&e.at("announce"), i),
                    false => e.at("announce"),
                };
                o.note(format!("{S}.{key}.announce[{i}]"), yaml);
            }
            Some(rw::ClusterEmulation { announce })
        }
        other => {
            cx.err(
                at,
                format!(
                    "expected true, false or a mapping with announce, got {}",
                    super::value::kind(other)
                ),
            );
            None
        }
    }
}

/// The listener's ACL `users`, as `ListenerSettings.users`: plaintext passwords are hashed
/// here and not kept.
fn users(cx: &mut Cx, o: &mut Origins, m: &Map<'_>) -> Vec<rw::User> {
    let list = m.seq(cx, "users").unwrap_or_default();
    let at = m.at("users");
    o.note(format!("{S}.users"), &at);
    let mut out = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let path = index(&at, i);
        let envoy = format!("{S}.users[{i}]");
        o.note(&envoy, &path);
        let Some(u) = Map::new(cx, v, &path, USER_KEYS) else {
            out.push(rw::User::default());
            continue;
        };
        o.note(format!("{envoy}.name"), u.at("name"));
        let name = u.required_string(cx, "name").unwrap_or_default();
        let mut passwords = Vec::new();
        // The digests' field as a whole is the YAML's `password_sha256` when only that is
        // given, else its `password`.
        let whole = match (u.get("password"), u.get("password_sha256")) {
            (None, Some(_)) => "password_sha256",
            _ => "password",
        };
        o.note(format!("{envoy}.password_sha256"), u.at(whole));
        for key in ["password", "password_sha256"] {
            let given = u.strings(cx, key);
            let listed = u.get(key).is_some_and(Value::is_sequence);
            for (j, p) in given.iter().enumerate() {
                let yaml = if listed {
                    index(&u.at(key), j)
                } else {
                    u.at(key)
                };
                o.note(
                    format!("{envoy}.password_sha256[{}]", passwords.len()),
                    yaml,
                );
                passwords.push(if key == "password" {
                    respway_filters::acl::digest_to_hex(&respway_filters::acl::sha256(p.as_bytes()))
                } else {
                    match respway_filters::acl::digest_from_hex(p) {
                        Some(d) => respway_filters::acl::digest_to_hex(&d),
                        None => p.clone(),
                    }
                });
            }
        }
        o.note(format!("{envoy}.rules"), u.at("rules"));
        let rules = match u.get("rules") {
            None => common::DEFAULT_USER_RULES
                .iter()
                .map(|r| r.to_string())
                .collect(),
            Some(Value::String(s)) => s.split_whitespace().map(str::to_string).collect(),
            Some(_) => {
                for j in 0..u
                    .get("rules")
                    .and_then(Value::as_sequence)
                    .map_or(0, Vec::len)
                {
                    o.note(format!("{envoy}.rules[{j}]"), index(&u.at("rules"), j));
                }
                u.strings(cx, "rules")
            }
        };
        // An empty list is the resource's "every permission": it cannot say "none".
        if u.get("rules").is_some() && rules.is_empty() {
            cx.err(
                u.at("rules"),
                "must not be empty (leave it out for every permission, or use nocommands)",
            );
        }
        for key in ["enabled", "nopass", "read_only"] {
            o.note(format!("{envoy}.{key}"), u.at(key));
        }
        out.push(rw::User {
            name,
            enabled: Some(u.boolean(cx, "enabled").unwrap_or(true)),
            password_sha256: passwords,
            nopass: u.boolean(cx, "nopass").unwrap_or(false),
            rules,
            read_only: u.boolean(cx, "read_only").unwrap_or(false),
        });
    }
    out
}

/// `tls: { cert, key, client_ca, require_client_cert }` of a listener, as Envoy's
/// `DownstreamTlsContext` in a TLS transport socket.
fn listener_tls(cx: &mut Cx, o: &mut Origins, v: &Value, path: &str) -> Option<TransportSocket> {
    let ts = "filter_chains[0].transport_socket";
    let typed = format!("{ts}.typed_config");
    let common = format!("{typed}.common_tls_context");
    o.note(ts, path);
    o.note(
        format!("{common}.tls_certificates[0].certificate_chain"),
        join(path, "cert"),
    );
    o.note(
        format!("{common}.tls_certificates[0].private_key"),
        join(path, "key"),
    );
    o.note(
        format!("{common}.validation_context"),
        join(path, "client_ca"),
    );
    o.note(
        format!("{typed}.require_client_certificate"),
        join(path, "require_client_cert"),
    );
    let t = Map::new(cx, v, path, LISTENER_TLS_KEYS)?;
    let cert = t.required_path(cx, "cert");
    let key = t.required_path(cx, "key");
    let client_ca = t.path(cx, "client_ca");
    let require_client_cert = t.boolean(cx, "require_client_cert").unwrap_or(false);
    let context = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificates: vec![TlsCertificate {
                certificate_chain: cert.as_deref().map(file),
                private_key: key.as_deref().map(file),
                ..Default::default()
            }],
            validation_context_type: client_ca.as_ref().map(|ca| {
                ValidationContextType::ValidationContext(CertificateValidationContext {
                    trusted_ca: Some(file(ca)),
                    ..Default::default()
                })
            }),
            ..Default::default()
        }),
        require_client_certificate: Some(BoolValue {
            value: require_client_cert,
        }),
        ..Default::default()
    };
    Some(TransportSocket {
        name: names::TLS_TRANSPORT_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    })
}

/// The listener's per-client bounds and session rules (`client_buffer_limit`,
/// `client_buffer_hard_limit`, `client_stall_timeout`, `max_auth_failures`,
/// `allow_keyless_scripts`, `admin_commands`, `keys_max`, `pubsub_buffer_limit`). A count of
/// 0 is the resource's "default", so it is refused here.
fn client_limits(cx: &mut Cx, o: &mut Origins, m: &Map<'_>) -> ClientLimits {
    for key in [
        "client_buffer_limit",
        "client_buffer_hard_limit",
        "client_stall_timeout",
        "max_auth_failures",
        "allow_keyless_scripts",
        "allow_restricted_scripts",
        "admin_commands",
        "keys_max",
        "pubsub_buffer_limit",
    ] {
        o.note(format!("{S}.{key}"), key);
    }
    let d = ClientLimits::default();
    let max = usize::MAX as u64;
    ClientLimits {
        buffer_limit: m
            .positive(cx, "client_buffer_limit", max)
            .map_or(d.buffer_limit, |n| n as usize),
        buffer_hard_limit: m
            .positive(cx, "client_buffer_hard_limit", max)
            .map_or(d.buffer_hard_limit, |n| n as usize),
        stall_timeout: m
            .duration_or_zero(cx, "client_stall_timeout")
            .unwrap_or(d.stall_timeout),
        max_auth_failures: m
            .positive(cx, "max_auth_failures", u32::MAX.into())
            .map_or(d.max_auth_failures, |n| n as u32),
        allow_keyless_scripts: m
            .boolean(cx, "allow_keyless_scripts")
            .unwrap_or(d.allow_keyless_scripts),
        allow_restricted_scripts: m
            .boolean(cx, "allow_restricted_scripts")
            .unwrap_or(d.allow_restricted_scripts),
        admin_commands: m.boolean(cx, "admin_commands").unwrap_or(d.admin_commands),
        keys_max: m
            .positive(cx, "keys_max", max)
            .map_or(d.keys_max, |n| n as usize),
        pubsub_buffer_limit: m
            .positive(cx, "pubsub_buffer_limit", max)
            .map_or(d.pubsub_buffer_limit, |n| n as usize),
    }
}

/// The listener's `protocol` and `advertised_redis_version`.
fn resp_settings(cx: &mut Cx, o: &mut Origins, m: &Map<'_>) -> (ProtocolMode, String) {
    o.note(format!("{S}.protocol"), "protocol");
    o.note(format!("{P}.protocol_version"), "protocol");
    o.note(
        format!("{S}.advertised_redis_version"),
        "advertised_redis_version",
    );
    let d = RespSettings::default();
    let protocol = m.string(cx, "protocol").and_then(|s| {
        match common::PROTOCOL_MODES.iter().find(|(n, _)| *n == s) {
            Some((_, p)) => Some(*p),
            None => {
                cx.err(
                    m.at("protocol"),
                    format!(
                        "unknown protocol {s:?} (expected one of: {})",
                        common::one_of(common::PROTOCOL_MODES.iter().map(|(n, _)| *n))
                    ),
                );
                None
            }
        }
    });
    // An unquoted `7.2` or `7` is a YAML number (and `7.20` would read as 7.2): it must be
    // quoted.
    let key = "advertised_redis_version";
    let advertised = match m.get(key) {
        Some(Value::Number(_)) => {
            cx.err(
                m.at(key),
                "expected a string, got a number (quote the version, e.g. \"7.2\")",
            );
            None
        }
        _ => m.non_empty_string(cx, key),
    };
    (
        protocol.unwrap_or(d.protocol),
        advertised.unwrap_or(d.advertised_version),
    )
}

fn limits(cx: &mut Cx, o: &mut Origins, v: &Value, path: &str) -> Limits {
    for key in LIMITS_KEYS {
        o.note(format!("{S}.limits.{key}"), join(path, key));
    }
    let d = Limits::default();
    let Some(m) = Map::new(cx, v, path, LIMITS_KEYS) else {
        return d;
    };
    let max = usize::MAX as u64;
    Limits {
        max_bulk_len: m
            .positive(cx, "max_bulk_len", max)
            .map_or(d.max_bulk_len, |n| n as usize),
        max_multibulk_len: m
            .positive(cx, "max_multibulk_len", max)
            .map_or(d.max_multibulk_len, |n| n as usize),
        max_inline_len: m
            .positive(cx, "max_inline_len", max)
            .map_or(d.max_inline_len, |n| n as usize),
    }
}

/// `routes`, as `RedisProxy.prefix_routes` and the mirror modes of `ListenerSettings`.
fn routes(
    cx: &mut Cx,
    o: &mut Origins,
    v: &Value,
    path: &str,
) -> (PrefixRoutes, Vec<rw::RouteMirrorMode>) {
    let pr = format!("{P}.prefix_routes");
    o.note(&pr, path);
    let mut table = PrefixRoutes::default();
    let mut modes = Vec::new();
    let Some(m) = Map::new(cx, v, path, ROUTES_KEYS) else {
        return (table, modes);
    };
    // The YAML path of each mirror mode, the catch-all's first as they are read.
    let mut paths = Vec::new();
    o.note(format!("{pr}.case_insensitive"), m.at("case_insensitive"));
    table.case_insensitive = m.boolean(cx, "case_insensitive").unwrap_or(false);
    let ca = format!("{pr}.catch_all_route");
    o.note(&ca, m.at("catch_all"));
    let catch_all = m.string(cx, "catch_all");
    let catch_all_mirrors = mirrors(
        cx,
        o,
        &m,
        "catch_all_mirrors",
        &ca,
        None,
        (&mut modes, &mut paths),
    );
    if !catch_all_mirrors.is_empty() && catch_all.is_none() {
        // Mirrors of the catch-all live on the catch-all route: without one, they cannot be
        // written.
        cx.err(m.at("catch_all_mirrors"), "requires catch_all");
    }
    let prefixes = m.seq(cx, "prefixes").unwrap_or_default();
    o.note(format!("{pr}.routes"), m.at("prefixes"));
    let mut prefix_modes = Vec::new();
    let mut prefix_paths = Vec::new();
    for (i, p) in prefixes.iter().enumerate() {
        let at = index(&m.at("prefixes"), i);
        let ra = format!("{pr}.routes[{i}]");
        o.note(&ra, &at);
        let Some(r) = Map::new(cx, p, &at, PREFIX_KEYS) else {
            table.routes.push(Route::default());
            continue;
        };
        for key in ["prefix", "cluster", "remove_prefix"] {
            o.note(format!("{ra}.{key}"), r.at(key));
        }
        let prefix = r.required_string(cx, "prefix").unwrap_or_default();
        let cluster = r.required_string(cx, "cluster").unwrap_or_default();
        let remove_prefix = r.boolean(cx, "remove_prefix").unwrap_or(false);
        let request_mirror_policy = mirrors(
            cx,
            o,
            &r,
            "mirrors",
            &ra,
            Some(&prefix),
            (&mut prefix_modes, &mut prefix_paths),
        );
        table.routes.push(Route {
            prefix,
            remove_prefix,
            cluster,
            request_mirror_policy,
            ..Default::default()
        });
    }
    if let Some(cluster) = catch_all {
        table.catch_all_route = Some(Route {
            cluster,
            request_mirror_policy: catch_all_mirrors,
            ..Default::default()
        });
    }
    // `ListenerSettings.mirror_modes` lists the prefix routes' mirrors, then the catch-all's.
    if table.catch_all_route.is_some() {
        prefix_modes.append(&mut modes);
        prefix_paths.append(&mut paths);
    }
    for (k, path) in prefix_paths.iter().enumerate() {
        let ea = format!("{S}.mirror_modes[{k}]");
        o.note(&ea, path);
        o.note(format!("{ea}.cluster"), join(path, "cluster"));
        o.note(format!("{ea}.mode"), join(path, "mode"));
        o.note(format!("{ea}.target_is_primary"), join(path, "primary"));
    }
    (table, prefix_modes)
}

/// The mirror policies under `key` of the route at Envoy path `route` (`prefix`: `None` for
/// the catch-all); their modes are added to `modes`.
fn mirrors(
    cx: &mut Cx,
    o: &mut Origins,
    m: &Map<'_>,
    key: &str,
    route: &str,
    prefix: Option<&str>,
    (modes, paths): (&mut Vec<rw::RouteMirrorMode>, &mut Vec<String>),
) -> Vec<RequestMirrorPolicy> {
    let list = m.seq(cx, key).unwrap_or_default();
    let at = m.at(key);
    let mut out = Vec::new();
    // The cluster of each mirror written, and its position in the list.
    let mut written: Vec<(String, usize)> = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let path = index(&at, i);
        o.mark(&path);
        for key in ["cluster", "primary", "mode", "include_reads", "fraction"] {
            o.mark(join(&path, key));
        }
        let before = cx.count();
        let Some(p) = Map::new(cx, v, &path, MIRROR_KEYS) else {
            continue;
        };
        let cluster = p.required_string(cx, "cluster").unwrap_or_default();
        let target_is_primary =
            p.string(cx, "primary").and_then(|s| {
                match common::MIRROR_PRIMARIES.iter().find(|(n, _)| *n == s) {
                    Some((_, t)) => Some(*t),
                    None => {
                        cx.err(
                            p.at("primary"),
                            format!(
                                "unknown primary {s:?} (expected one of: {})",
                                common::one_of(common::MIRROR_PRIMARIES.iter().map(|(n, _)| *n))
                            ),
                        );
                        None
                    }
                }
            });
        let mode = match p.string(cx, "mode").as_deref() {
            None | Some("dual_write") => rw::MirrorMode::DualWrite,
            Some("forward") => rw::MirrorMode::Forward,
            Some("read_only") => rw::MirrorMode::ReadOnly,
            Some("move") => rw::MirrorMode::Move,
            Some("prepare_move") => rw::MirrorMode::PrepareMove,
            Some(other) => {
                cx.err(
                    p.at("mode"),
                    format!(
                        "unknown mode {other:?} (expected one of: {})",
                        common::one_of(common::MIRROR_MODES.iter().copied())
                    ),
                );
                rw::MirrorMode::DualWrite
            }
        };
        // Only a dual-write mirror has a primary to name: with another mode it cannot be
        // written.
        if p.get("primary").is_some() && mode != rw::MirrorMode::DualWrite {
            cx.err(p.at("primary"), "only used with mode dual_write");
        }
        let include_reads = p.boolean(cx, "include_reads").unwrap_or(false);
        let fraction_ppm = p
            .fraction_ppm(cx, "fraction")
            .unwrap_or(common::FULL_FRACTION_PPM);
        // A mirror that does not read is left out (its errors fail the file), so that it
        // does not also show as a conflict with the others.
        if cx.count() > before {
            continue;
        }
        // A mirror's mode is written keyed by its route and cluster: a second mirror to the
        // same cluster cannot be written apart.
        if let Some((_, first)) = written.iter().find(|(c, _)| *c == cluster) {
            cx.err(
                p.at("cluster"),
                format!("duplicate mirror cluster {cluster:?} (also {key}[{first}])"),
            );
            continue;
        }
        let ma = format!("{route}.request_mirror_policy[{}]", out.len());
        o.note(&ma, &path);
        o.note(format!("{ma}.cluster"), join(&path, "cluster"));
        o.note(format!("{ma}.runtime_fraction"), join(&path, "fraction"));
        o.note(
            format!("{ma}.exclude_read_commands"),
            join(&path, "include_reads"),
        );
        written.push((cluster.clone(), i));
        out.push(RequestMirrorPolicy {
            cluster: cluster.clone(),
            runtime_fraction: Some(RuntimeFractionalPercent {
                default_value: Some(fractional_percent(fraction_ppm)),
                runtime_key: String::new(),
            }),
            exclude_read_commands: !include_reads,
        });
        paths.push(path);
        modes.push(rw::RouteMirrorMode {
            prefix: prefix.map(str::to_string),
            cluster,
            mode: mode as i32,
            target_is_primary: mode == rw::MirrorMode::DualWrite
                && target_is_primary.unwrap_or(false),
        });
    }
    out
}
