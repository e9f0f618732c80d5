//! Listeners: addresses, client bounds, protocol, ACL users, TLS, limits, routes and mirrors.

use std::collections::{HashMap, HashSet};

use respway_filters::codec_limits::Limits;
use respway_filters::model::{
    AclUser, ClientLimits, Listener, ListenerTls, MirrorMode, MirrorPolicy, Observe, PrefixRoute,
    RespSettings, RouteTable,
};
use serde_yaml_ng::Value;

use crate::common::{self, MirrorProblem};
use crate::error::{index, join, Cx};

use super::*;

pub(super) const LISTENER_KEYS: &[&str] = &[
    "name",
    "address",
    "op_timeout",
    "max_pending_per_client",
    "client_buffer_limit",
    "client_buffer_hard_limit",
    "client_stall_timeout",
    "max_auth_failures",
    "allow_keyless_scripts",
    "allow_restricted_scripts",
    "admin_commands",
    "keys_max",
    "pubsub_buffer_limit",
    "slowlog_threshold",
    "slowlog_max_len",
    "hot_key_sample",
    "protocol",
    "advertised_redis_version",
    "downstream_auth_password",
    "users",
    "limits",
    "routes",
    "tls",
];
pub(super) const LIMITS_KEYS: &[&str] = &["max_bulk_len", "max_multibulk_len", "max_inline_len"];
pub(super) const ROUTES_KEYS: &[&str] = &[
    "case_insensitive",
    "catch_all",
    "catch_all_mirrors",
    "prefixes",
];
pub(super) const PREFIX_KEYS: &[&str] = &["prefix", "cluster", "remove_prefix", "mirrors"];
pub(super) const MIRROR_KEYS: &[&str] =
    &["cluster", "mode", "primary", "include_reads", "fraction"];
pub(super) const USER_KEYS: &[&str] = &[
    "name",
    "enabled",
    "password",
    "password_sha256",
    "nopass",
    "rules",
    "read_only",
];
pub(super) const LISTENER_TLS_KEYS: &[&str] = &["cert", "key", "client_ca", "require_client_cert"];

// === listeners ===

pub(super) fn resource_name(v: &Value, kind: &str, list: &str, i: usize) -> String {
    match v.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => format!("{kind} {n:?}"),
        _ => format!("{list}[{i}]"),
    }
}

pub(super) fn listener(
    cx: &mut Cx,
    v: &Value,
    i: usize,
    clusters: Option<&HashSet<&str>>,
) -> Option<Listener> {
    cx.resource = resource_name(v, "listener", "listeners", i);
    let before = cx.count();
    let m = Map::new(cx, v, "", LISTENER_KEYS)?;
    let name = m.required_name(cx);
    let address = m
        .addr(cx, "address")
        .unwrap_or_else(|| common::DEFAULT_LISTENER_ADDRESS.parse().expect("valid"));
    let op_timeout = m
        .duration(cx, "op_timeout")
        .unwrap_or(common::DEFAULT_OP_TIMEOUT);
    let max_pending = m
        .positive(cx, "max_pending_per_client", u32::MAX.into())
        .map_or(common::DEFAULT_MAX_PENDING, |n| n as usize);
    let client = client_limits(cx, &m);
    let resp = resp_settings(cx, &m);
    let downstream_password = m.non_empty_string(cx, "downstream_auth_password");
    let users = users(cx, &m, downstream_password.is_some());
    let limits = match m.get("limits") {
        Some(v) => limits(cx, v, &m.at("limits")),
        None => Limits::default(),
    };
    let routes = match m.get("routes") {
        Some(v) => routes(cx, v, &m.at("routes"), clusters),
        None => {
            cx.err("routes", "required");
            RouteTable::default()
        }
    };
    let tls = m.get("tls").and_then(|v| listener_tls(cx, v, &m.at("tls")));
    let observe = Observe {
        slowlog_threshold: m.duration_or_zero(cx, "slowlog_threshold"),
        slowlog_max_len: m
            .uint(cx, "slowlog_max_len", common::MAX_SLOWLOG_LEN)
            .map(|n| n as usize),
        hot_key_sample: m.uint(cx, "hot_key_sample", u64::from(u32::MAX)),
    };
    (cx.count() == before).then(|| Listener {
        tls,
        observe,
        name: name.unwrap_or_default(),
        address,
        routes,
        downstream_password,
        users,
        op_timeout,
        max_pending_per_client: max_pending,
        resp,
        client,
        limits,
    })
}

/// The listener's ACL `users`: plaintext passwords are hashed here and not kept.
pub(super) fn users(cx: &mut Cx, m: &Map<'_>, has_downstream_password: bool) -> Vec<AclUser> {
    let list = m.seq(cx, "users").unwrap_or_default();
    let at = m.at("users");
    let before = cx.count();
    let mut out = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let path = index(&at, i);
        let Some(u) = Map::new(cx, v, &path, USER_KEYS) else {
            continue;
        };
        let name = u.required_string(cx, "name");
        if let Some(reason) = name.as_deref().and_then(common::user_name_problem) {
            cx.err(u.at("name"), reason);
        }
        let mut passwords: Vec<_> = u
            .strings(cx, "password")
            .iter()
            .map(|p| respway_filters::acl::sha256(p.as_bytes()))
            .collect();
        let hashes = u.strings(cx, "password_sha256");
        for (j, h) in hashes.iter().enumerate() {
            match respway_filters::acl::digest_from_hex(h) {
                Some(d) => passwords.push(d),
                None => {
                    let field = if u.get("password_sha256").is_some_and(Value::is_sequence) {
                        index(&u.at("password_sha256"), j)
                    } else {
                        u.at("password_sha256")
                    };
                    cx.err(field, "expected 64 hexadecimal digits (a SHA-256 digest)");
                }
            }
        }
        let rules = match u.get("rules") {
            None => common::DEFAULT_USER_RULES
                .iter()
                .map(|r| r.to_string())
                .collect(),
            Some(Value::String(s)) => s.split_whitespace().map(str::to_string).collect(),
            Some(_) => u.strings(cx, "rules"),
        };
        if u.get("rules").is_some() && rules.is_empty() {
            cx.err(
                u.at("rules"),
                "must not be empty (leave it out for every permission, or use nocommands)",
            );
        }
        out.push(AclUser {
            name: name.unwrap_or_default(),
            enabled: u.boolean(cx, "enabled").unwrap_or(true),
            passwords,
            nopass: u.boolean(cx, "nopass").unwrap_or(false),
            rules,
            read_only: u.boolean(cx, "read_only").unwrap_or(false),
        });
    }
    if cx.count() == before {
        for (i, field, reason) in common::user_problems(&out, has_downstream_password, "password") {
            let item = index(&at, i);
            // A rule given as one string is reported at `rules`.
            let field = match list[i].get("rules") {
                Some(Value::String(_)) if field.starts_with("rules[") => "rules".to_string(),
                _ => field,
            };
            cx.err(join(&item, &field), reason);
        }
    }
    out
}

/// `tls: { cert, key, client_ca, require_client_cert }` of a listener.
pub(super) fn listener_tls(cx: &mut Cx, v: &Value, path: &str) -> Option<ListenerTls> {
    let before = cx.count();
    let t = Map::new(cx, v, path, LISTENER_TLS_KEYS)?;
    let cert = t.required_path(cx, "cert");
    let key = t.required_path(cx, "key");
    let client_ca = t.path(cx, "client_ca");
    let require_client_cert = t.boolean(cx, "require_client_cert").unwrap_or(false);
    if require_client_cert && t.get("client_ca").is_none() {
        cx.err(
            t.at("require_client_cert"),
            "needs client_ca (the CA that signs the client certificates)",
        );
    }
    (cx.count() == before).then(|| ListenerTls {
        cert: cert.unwrap_or_default(),
        key: key.unwrap_or_default(),
        client_ca,
        require_client_cert,
    })
}

/// The listener's per-client bounds and session rules (`client_buffer_limit`,
/// `client_buffer_hard_limit`, `client_stall_timeout`, `max_auth_failures`,
/// `allow_keyless_scripts`, `admin_commands`, `keys_max`, `pubsub_buffer_limit`).
pub(super) fn client_limits(cx: &mut Cx, m: &Map<'_>) -> ClientLimits {
    let d = ClientLimits::default();
    let max = usize::MAX as u64;
    let before = cx.count();
    let limit = m.positive(cx, "client_buffer_limit", max);
    let hard = m.positive(cx, "client_buffer_hard_limit", max);
    let buffer_limit = limit.map_or(d.buffer_limit, |n| n as usize);
    let buffer_hard_limit = hard.map_or(d.buffer_hard_limit, |n| n as usize);
    // Compared only when both read well (a wrong one is its own error).
    if cx.count() == before {
        if let Some(reason) = common::client_buffer_problem(
            buffer_limit,
            limit.is_none(),
            buffer_hard_limit,
            hard.is_none(),
        ) {
            cx.err(m.at("client_buffer_hard_limit"), reason);
        }
    }
    ClientLimits {
        buffer_limit,
        buffer_hard_limit,
        stall_timeout: m
            .duration(cx, "client_stall_timeout")
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
pub(super) fn resp_settings(cx: &mut Cx, m: &Map<'_>) -> RespSettings {
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
    let advertised_version = match m.get(key) {
        Some(Value::Number(_)) => {
            cx.err(
                m.at(key),
                "expected a string, got a number (quote the version, e.g. \"7.2\")",
            );
            None
        }
        _ => m
            .non_empty_string(cx, key)
            .and_then(|v| match common::redis_version_problem(&v) {
                Some(reason) => {
                    cx.err(m.at(key), reason);
                    None
                }
                None => Some(v),
            }),
    };
    RespSettings {
        protocol: protocol.unwrap_or(d.protocol),
        advertised_version: advertised_version.unwrap_or(d.advertised_version),
    }
}

pub(super) fn limits(cx: &mut Cx, v: &Value, path: &str) -> Limits {
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

pub(super) fn routes(
    cx: &mut Cx,
    v: &Value,
    path: &str,
    clusters: Option<&HashSet<&str>>,
) -> RouteTable {
    let mut table = RouteTable::default();
    let Some(m) = Map::new(cx, v, path, ROUTES_KEYS) else {
        return table;
    };
    table.case_insensitive = m.boolean(cx, "case_insensitive").unwrap_or(false);
    table.catch_all = m.string(cx, "catch_all");
    if let Some(c) = &table.catch_all {
        if clusters.is_some_and(|known| !known.contains(c.as_str())) {
            cx.err(m.at("catch_all"), format!("unknown cluster {c:?}"));
        }
    }
    table.catch_all_mirrors = mirrors(
        cx,
        &m,
        "catch_all_mirrors",
        table.catch_all.as_deref(),
        clusters,
    );
    if !table.catch_all_mirrors.is_empty() && table.catch_all.is_none() {
        cx.err(m.at("catch_all_mirrors"), "requires catch_all");
    }
    let prefixes = m.seq(cx, "prefixes").unwrap_or_default();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, p) in prefixes.iter().enumerate() {
        let at = index(&m.at("prefixes"), i);
        let Some(r) = Map::new(cx, p, &at, PREFIX_KEYS) else {
            continue;
        };
        let prefix = r.required_string(cx, "prefix");
        let cluster = r.required_string(cx, "cluster");
        let remove_prefix = r.boolean(cx, "remove_prefix").unwrap_or(false);
        if let Some(c) = &cluster {
            if clusters.is_some_and(|known| !known.contains(c.as_str())) {
                cx.err(r.at("cluster"), format!("unknown cluster {c:?}"));
            }
        }
        let mirrors = mirrors(cx, &r, "mirrors", cluster.as_deref(), clusters);
        if let Some(p) = &prefix {
            let key = if table.case_insensitive {
                p.to_ascii_lowercase()
            } else {
                p.clone()
            };
            if let Some(first) = seen.insert(key, i) {
                cx.err(
                    r.at("prefix"),
                    format!("duplicate prefix {p:?} (also prefixes[{first}])"),
                );
            } else if p.is_empty() && prefixes.len() > 1 {
                cx.err(
                    r.at("prefix"),
                    "an empty prefix is allowed only as the sole route (use catch_all)",
                );
            }
        }
        if let (Some(prefix), Some(cluster)) = (prefix, cluster) {
            table.routes.push(PrefixRoute {
                mirrors,
                prefix,
                remove_prefix,
                cluster,
            });
        }
    }
    if prefixes.is_empty() && m.get("catch_all").is_none() {
        cx.err(path, "at least one prefix or a catch_all is required");
    }
    table
}

/// The clusters a listener read from a resource file names that are not in `known` (the
/// clusters of a node's merged snapshot), as (YAML path, reason): `routes.catch_all`,
/// `routes.catch_all_mirrors[j].cluster`, `routes.prefixes[i].cluster`,
/// `routes.prefixes[i].mirrors[j].cluster`. A listener that parsed keeps every route and
/// mirror of its file, in order, so the indexes are the file's.
pub(crate) fn unknown_clusters(l: &Listener, known: &HashSet<&str>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut check = |path: String, cluster: &str| {
        if !known.contains(cluster) {
            out.push((path, format!("unknown cluster {cluster:?}")));
        }
    };
    let r = &l.routes;
    if let Some(c) = &r.catch_all {
        check("routes.catch_all".to_string(), c);
    }
    for (j, m) in r.catch_all_mirrors.iter().enumerate() {
        check(format!("routes.catch_all_mirrors[{j}].cluster"), &m.cluster);
    }
    for (i, p) in r.routes.iter().enumerate() {
        check(format!("routes.prefixes[{i}].cluster"), &p.cluster);
        for (j, m) in p.mirrors.iter().enumerate() {
            check(
                format!("routes.prefixes[{i}].mirrors[{j}].cluster"),
                &m.cluster,
            );
        }
    }
    out
}

/// The mirror policies under `key` of a route whose own cluster is `route_cluster`.
pub(super) fn mirrors(
    cx: &mut Cx,
    m: &Map<'_>,
    key: &str,
    route_cluster: Option<&str>,
    clusters: Option<&HashSet<&str>>,
) -> Vec<MirrorPolicy> {
    let list = m.seq(cx, key).unwrap_or_default();
    let at = m.at(key);
    let mut out = Vec::new();
    // The list index of each policy in `out`, for errors found across them.
    let mut positions = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let path = index(&at, i);
        let before = cx.count();
        let Some(p) = Map::new(cx, v, &path, MIRROR_KEYS) else {
            continue;
        };
        let cluster = p.required_string(cx, "cluster");
        if let Some(c) = &cluster {
            if clusters.is_some_and(|known| !known.contains(c.as_str())) {
                cx.err(p.at("cluster"), format!("unknown cluster {c:?}"));
            }
        }
        let mode = p.string(cx, "mode");
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
        let mode = match mode.as_deref() {
            None | Some("dual_write") => Some(MirrorMode::DualWrite {
                target_is_primary: target_is_primary.unwrap_or(false),
            }),
            Some("forward") => Some(MirrorMode::Forward),
            Some("read_only") => Some(MirrorMode::ReadOnly),
            Some(other) => {
                cx.err(
                    p.at("mode"),
                    format!(
                        "unknown mode {other:?} (expected one of: {})",
                        common::one_of(common::MIRROR_MODES.iter().copied())
                    ),
                );
                None
            }
        };
        if p.get("primary").is_some()
            && matches!(mode, Some(MirrorMode::Forward | MirrorMode::ReadOnly))
        {
            cx.err(p.at("primary"), "only used with mode dual_write");
        }
        let include_reads = p.boolean(cx, "include_reads").unwrap_or(false);
        let fraction_ppm = p
            .fraction_ppm(cx, "fraction")
            .unwrap_or(common::FULL_FRACTION_PPM);
        if let (Some(cluster), Some(mode), true) = (cluster, mode, cx.count() == before) {
            out.push(MirrorPolicy {
                cluster,
                mode,
                include_reads,
                fraction_ppm,
            });
            positions.push(i);
        }
    }
    if let Some(route_cluster) = route_cluster {
        let item = |i: usize| index(&at, positions[i]);
        for p in common::check_mirrors(route_cluster, &out) {
            match p {
                MirrorProblem::OwnCluster { mirror } => cx.err(
                    join(&item(mirror), "cluster"),
                    format!("{route_cluster:?} is the route's own cluster"),
                ),
                MirrorProblem::Duplicate { mirror, first } => cx.err(
                    join(&item(mirror), "cluster"),
                    format!(
                        "duplicate mirror cluster {:?} (also {key}[{}])",
                        out[mirror].cluster, positions[first]
                    ),
                ),
                MirrorProblem::SecondPrimary { mirror, first } => cx.err(
                    join(&item(mirror), "primary"),
                    format!(
                        "only one mirror of a route may be primary (also {key}[{}])",
                        positions[first]
                    ),
                ),
                MirrorProblem::SecondReadOnly { mirror, first } => cx.err(
                    join(&item(mirror), "mode"),
                    format!(
                        "only one read_only mirror per route (also {key}[{}])",
                        positions[first]
                    ),
                ),
            }
        }
    }
    out
}
