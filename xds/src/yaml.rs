//! The static YAML schema (documented in `SCHEMA.md`), read into the validated model.
//!
//! The document is read as an untyped YAML tree and walked by hand rather than through
//! `#[derive(Deserialize)]`: serde stops at the first error and does not say where it was,
//! while this walk reports every error at once, each with its resource and key path. The model
//! read here is then written out as Envoy resources ([`crate::to_resources`]) and those are
//! translated back, so the YAML file and the xDS stream share one translation.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use respway_filters::codec_limits::Limits;
use respway_filters::model::{
    AclUser, ClientLimits, Cluster, Config, Endpoint, EndpointAuth, HashPolicy, HashTag,
    HotKeyRead, HotKeyRule, Listener, ListenerTls, MirrorMode, MirrorPolicy, PrefixRoute,
    ReadPolicy, RespSettings, RingHashFunction, Role, RouteTable, Shard, UpstreamAuth, UpstreamTls,
    ZoneFallback, DEFAULT_DATABASES, DEFAULT_DEDICATED_CONNECTIONS,
    DEFAULT_MAX_QUEUE_PER_CONNECTION,
};
use serde_yaml_ng::{Mapping, Value};

use crate::common::{self, MirrorProblem, SlotProblem};
use crate::error::{index, join, ConfigErrors, Cx};

/// Which sidecars a resource file is for (its top-level `targets`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Targets {
    /// Node ids (the ADS request's `node.id`).
    pub node_ids: Vec<String>,
    /// Zones (the ADS request's `node.locality.zone`).
    pub zones: Vec<String>,
}

const TOP_KEYS: &[&str] = &["node", "listeners", "clusters"];
const FRAGMENT_TOP_KEYS: &[&str] = &["targets", "listeners", "clusters", "node"];
const TARGETS_KEYS: &[&str] = &["node_ids", "zones"];
const NODE_KEYS: &[&str] = &["id", "zone"];
const LISTENER_KEYS: &[&str] = &[
    "name",
    "address",
    "op_timeout",
    "max_pending_per_client",
    "client_buffer_limit",
    "client_buffer_hard_limit",
    "client_stall_timeout",
    "max_auth_failures",
    "allow_keyless_scripts",
    "admin_commands",
    "keys_max",
    "pubsub_buffer_limit",
    "protocol",
    "advertised_redis_version",
    "downstream_auth_password",
    "users",
    "limits",
    "routes",
    "tls",
];
const LISTENER_TLS_KEYS: &[&str] = &["cert", "key", "client_ca", "require_client_cert"];
const CLUSTER_TLS_KEYS: &[&str] = &["ca", "cert", "key", "server_name", "insecure_skip_verify"];
const LIMITS_KEYS: &[&str] = &["max_bulk_len", "max_multibulk_len", "max_inline_len"];
const ROUTES_KEYS: &[&str] = &[
    "case_insensitive",
    "catch_all",
    "catch_all_mirrors",
    "prefixes",
];
const PREFIX_KEYS: &[&str] = &["prefix", "cluster", "remove_prefix", "mirrors"];
const MIRROR_KEYS: &[&str] = &["cluster", "mode", "primary", "include_reads", "fraction"];
const CLUSTER_KEYS: &[&str] = &[
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
const HOT_KEY_KEYS: &[&str] = &["prefix", "read"];
const AUTH_KEYS: &[&str] = &["username", "password", "password_file", "password_env"];
const USER_KEYS: &[&str] = &[
    "name",
    "enabled",
    "password",
    "password_sha256",
    "nopass",
    "rules",
    "read_only",
];
const SHARD_KEYS: &[&str] = &["name", "hash_key", "weight", "slots", "endpoints"];
const ENDPOINT_KEYS: &[&str] = &["address", "role", "zone", "auth"];
const POLICIES: &[(&str, &[&str])] = &[
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
pub(crate) fn parse(text: &str) -> Result<Config, ConfigErrors> {
    parse_doc(text, Mode::Static).map(|(_, config)| config)
}

/// A resource file of the management server (`respway-xds serve --resources DIR`): the
/// schema's `listeners` and `clusters`, either of which may be left out, and `targets` naming
/// the sidecars it is for. Routes may name clusters of other files: those references are
/// checked once the files are merged into a node's snapshot.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fragment {
    /// `None`: the file is for every node.
    pub(crate) targets: Option<Targets>,
    /// The file's listeners and clusters (`zone` is always `None`).
    pub(crate) config: Config,
}

/// Reads a management-server resource file (see [`Fragment`]), reporting every error.
pub(crate) fn parse_fragment(text: &str) -> Result<Fragment, ConfigErrors> {
    parse_doc(text, Mode::Fragment).map(|(targets, config)| Fragment { targets, config })
}

/// Which document [`parse_doc`] reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The sidecar's static file: `node`, and both lists required.
    Static,
    /// A management-server file: `targets`, lists optional, cross-file cluster references.
    Fragment,
}

fn parse_doc(text: &str, mode: Mode) -> Result<(Option<Targets>, Config), ConfigErrors> {
    let mut cx = Cx::default();
    // Anchors are resolved by the parser; merge keys (`<<: *base`) are applied here.
    let doc = serde_yaml_ng::from_str::<Value>(text).and_then(|mut v| v.apply_merge().map(|()| v));
    let doc = match doc {
        Ok(v) => v,
        Err(e) => {
            cx.err("", format!("invalid YAML: {e}"));
            return Err(ConfigErrors(cx.errors));
        }
    };
    if doc.is_null() {
        let what = match mode {
            Mode::Static => "listeners and clusters are required",
            Mode::Fragment => "a resource file defines listeners, clusters or both",
        };
        cx.err("", format!("the document is empty: {what}"));
        return Err(ConfigErrors(cx.errors));
    }
    let keys = match mode {
        Mode::Static => TOP_KEYS,
        Mode::Fragment => FRAGMENT_TOP_KEYS,
    };
    let Some(top) = Map::new(&mut cx, &doc, "", keys) else {
        return Err(ConfigErrors(cx.errors));
    };

    let mut zone = None;
    let mut file_targets = None;
    match mode {
        Mode::Static => zone = top.get("node").and_then(|v| node(&mut cx, v)),
        Mode::Fragment => {
            if top.raw("node").is_some() {
                cx.err(
                    "node",
                    "not used in a respway-xds resource file: a sidecar's own node is in its \
                     bootstrap; name the sidecars a file is for with `targets`",
                );
            }
            file_targets = top.raw("targets").and_then(|v| targets(&mut cx, v));
        }
    }

    // Route targets are checked against every cluster name in the file, so that a cluster with
    // errors of its own does not also make each route to it an error. A management-server
    // file may route to clusters of other files: translate checks the merged snapshot.
    let cluster_names: HashSet<&str> = top
        .get("clusters")
        .and_then(Value::as_sequence)
        .map(|s| {
            s.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    let known = (mode == Mode::Static).then_some(&cluster_names);
    let list = |cx: &mut Cx, key: &str| -> &[Value] {
        match mode {
            Mode::Static => top.non_empty_seq(cx, key),
            Mode::Fragment => top.seq(cx, key).unwrap_or_default(),
        }
    };

    let listener_values = list(&mut cx, "listeners");
    let mut listeners = Vec::new();
    let mut seen = HashMap::new();
    for (i, v) in listener_values.iter().enumerate() {
        listeners.extend(listener(&mut cx, v, i, known));
        if let Some(name) = v.get("name").and_then(Value::as_str) {
            if let Some(first) = seen.insert(name, i) {
                cx.err(
                    "name",
                    format!("duplicate listener name (also listeners[{first}])"),
                );
            }
        }
        cx.resource.clear();
    }

    let cluster_values = list(&mut cx, "clusters");
    if mode == Mode::Fragment
        && listener_values.is_empty()
        && cluster_values.is_empty()
        && cx.count() == 0
    {
        cx.err(
            "",
            "defines no listeners and no clusters (a resource file defines either or both)",
        );
    }
    let mut clusters = Vec::new();
    let mut seen = HashMap::new();
    for (i, v) in cluster_values.iter().enumerate() {
        clusters.extend(cluster(&mut cx, v, i));
        if let Some(name) = v.get("name").and_then(Value::as_str) {
            if let Some(first) = seen.insert(name, i) {
                cx.err(
                    "name",
                    format!("duplicate cluster name (also clusters[{first}])"),
                );
            }
        }
        cx.resource.clear();
    }
    cx.finish((
        file_targets,
        Config {
            zone,
            listeners,
            clusters,
        },
    ))
}

// === targets ===

/// `targets: { node_ids: [...], zones: [...] }`: at least one id or zone, none empty or
/// repeated.
fn targets(cx: &mut Cx, v: &Value) -> Option<Targets> {
    let before = cx.count();
    let m = Map::new(cx, v, "targets", TARGETS_KEYS)?;
    let mut out = Targets::default();
    for (key, into) in [("node_ids", &mut out.node_ids), ("zones", &mut out.zones)] {
        let at = m.at(key);
        for (i, item) in m.seq(cx, key).unwrap_or_default().iter().enumerate() {
            match item.as_str() {
                Some("") => cx.err(index(&at, i), "must not be empty"),
                Some(s) if into.iter().any(|x| x == s) => {
                    cx.err(index(&at, i), format!("duplicate {s:?}"))
                }
                Some(s) => into.push(s.to_string()),
                None => cx.err(
                    index(&at, i),
                    format!("expected a string, got {}", kind(item)),
                ),
            }
        }
    }
    if out.node_ids.is_empty() && out.zones.is_empty() && cx.count() == before {
        cx.err(
            "targets",
            "names no node id and no zone (leave `targets` out for a file for every node)",
        );
    }
    (cx.count() == before).then_some(out)
}

// === node ===

/// The sidecar's own node: `id` (accepted, unused for now) and `zone`.
fn node(cx: &mut Cx, v: &Value) -> Option<String> {
    let m = Map::new(cx, v, "node", NODE_KEYS)?;
    m.non_empty_string(cx, "id");
    m.non_empty_string(cx, "zone")
}

// === listeners ===

fn resource_name(v: &Value, kind: &str, list: &str, i: usize) -> String {
    match v.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => format!("{kind} {n:?}"),
        _ => format!("{list}[{i}]"),
    }
}

fn listener(
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
    (cx.count() == before).then(|| Listener {
        tls,
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
fn users(cx: &mut Cx, m: &Map<'_>, has_downstream_password: bool) -> Vec<AclUser> {
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
fn listener_tls(cx: &mut Cx, v: &Value, path: &str) -> Option<ListenerTls> {
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

/// `tls: { ca, cert, key, server_name, insecure_skip_verify }` of a cluster.
fn cluster_tls(cx: &mut Cx, v: &Value, path: &str) -> Option<UpstreamTls> {
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

/// The listener's per-client bounds and session rules (`client_buffer_limit`,
/// `client_buffer_hard_limit`, `client_stall_timeout`, `max_auth_failures`,
/// `allow_keyless_scripts`, `admin_commands`, `keys_max`, `pubsub_buffer_limit`).
fn client_limits(cx: &mut Cx, m: &Map<'_>) -> ClientLimits {
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
fn resp_settings(cx: &mut Cx, m: &Map<'_>) -> RespSettings {
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

fn limits(cx: &mut Cx, v: &Value, path: &str) -> Limits {
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

fn routes(cx: &mut Cx, v: &Value, path: &str, clusters: Option<&HashSet<&str>>) -> RouteTable {
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
fn mirrors(
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

// === clusters ===

fn cluster(cx: &mut Cx, v: &Value, i: usize) -> Option<Cluster> {
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
fn upstream_auth(cx: &mut Cx, v: &Value, path: &str) -> Option<UpstreamAuth> {
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
fn endpoint_auth(cx: &mut Cx, m: &Map<'_>) -> Vec<EndpointAuth> {
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
    out
}

/// `read_policy` and, for `zone_local`, its `zone_fallback`.
fn read_policy(cx: &mut Cx, m: &Map<'_>) -> ReadPolicy {
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
fn hot_keys(cx: &mut Cx, m: &Map<'_>) -> Vec<HotKeyRule> {
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
struct RawShard {
    name: Option<String>,
    hash_key: Option<String>,
    weight: u32,
    slots: Vec<(u32, u32)>,
    endpoints: Vec<Endpoint>,
}

/// The shards; `policy` is the cluster's policy if its kind is known, `policy_valid` says
/// whether its numbers are right too (the slot table checks need the slot count).
fn shards(cx: &mut Cx, m: &Map<'_>, policy: Option<&HashPolicy>, policy_valid: bool) -> Vec<Shard> {
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

fn shard(cx: &mut Cx, v: &Value, path: &str, policy: Option<&HashPolicy>) -> Option<RawShard> {
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

// === reading YAML values ===

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// A YAML mapping at `path` whose keys were checked against the schema. Getters report a
/// wrong type (or out-of-range number) and return `None`, so callers fall back to a default
/// and keep walking; the walk as a whole fails if any error was reported.
struct Map<'v> {
    map: &'v Mapping,
    path: String,
}

impl<'v> Map<'v> {
    /// Checks that `v` is a mapping with only `known` keys (each unknown key is an error).
    fn new(cx: &mut Cx, v: &'v Value, path: &str, known: &[&str]) -> Option<Map<'v>> {
        let Value::Mapping(map) = v else {
            cx.err(path, format!("expected a mapping, got {}", kind(v)));
            return None;
        };
        for k in map.keys() {
            match k.as_str() {
                Some(k) if known.contains(&k) => {}
                Some(k) => cx.err(
                    join(path, k),
                    format!("unknown field (expected one of: {})", known.join(", ")),
                ),
                None => cx.err(path, format!("keys must be strings, got {}", kind(k))),
            }
        }
        Some(Map {
            map,
            path: path.to_string(),
        })
    }

    /// The value, `Some(Null)` included.
    fn raw(&self, key: &str) -> Option<&'v Value> {
        self.map.get(key)
    }

    /// The value; a null counts as absent.
    fn get(&self, key: &str) -> Option<&'v Value> {
        self.raw(key).filter(|v| !v.is_null())
    }

    /// Path of `key`.
    fn at(&self, key: &str) -> String {
        join(&self.path, key)
    }

    fn string(&self, cx: &mut Cx, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(s) => Some(s.clone()),
            other => {
                cx.err(
                    self.at(key),
                    format!("expected a string, got {}", kind(other)),
                );
                None
            }
        }
    }

    fn non_empty_string(&self, cx: &mut Cx, key: &str) -> Option<String> {
        let s = self.string(cx, key)?;
        if s.is_empty() {
            cx.err(self.at(key), "must not be empty (leave it out or use null)");
            return None;
        }
        Some(s)
    }

    /// A file path: a non-empty string.
    fn path(&self, cx: &mut Cx, key: &str) -> Option<PathBuf> {
        self.non_empty_string(cx, key).map(PathBuf::from)
    }

    /// A required file path.
    fn required_path(&self, cx: &mut Cx, key: &str) -> Option<PathBuf> {
        if self.get(key).is_none() {
            cx.err(self.at(key), "required");
            return None;
        }
        self.path(cx, key)
    }

    fn required_string(&self, cx: &mut Cx, key: &str) -> Option<String> {
        if self.get(key).is_none() {
            cx.err(self.at(key), "required");
            return None;
        }
        self.string(cx, key)
    }

    /// `name`, required and not empty.
    fn required_name(&self, cx: &mut Cx) -> Option<String> {
        let name = self.required_string(cx, "name")?;
        if name.is_empty() {
            cx.err(self.at("name"), "must not be empty");
            return None;
        }
        Some(name)
    }

    /// A required string parsed by `parse`.
    fn required<T>(
        &self,
        cx: &mut Cx,
        key: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        let s = self.required_string(cx, key)?;
        parse(&s).map_err(|e| cx.err(self.at(key), e)).ok()
    }

    fn uint(&self, cx: &mut Cx, key: &str, max: u64) -> Option<u64> {
        let v = self.get(key)?;
        match v.as_u64() {
            Some(n) if n <= max => Some(n),
            Some(_) => {
                cx.err(self.at(key), format!("must be at most {max}"));
                None
            }
            None => {
                cx.err(
                    self.at(key),
                    format!("expected an unsigned integer, got {}", kind(v)),
                );
                None
            }
        }
    }

    fn positive(&self, cx: &mut Cx, key: &str, max: u64) -> Option<u64> {
        let n = self.uint(cx, key, max)?;
        if n == 0 {
            cx.err(self.at(key), "must be greater than 0");
            return None;
        }
        Some(n)
    }

    fn boolean(&self, cx: &mut Cx, key: &str) -> Option<bool> {
        match self.get(key)? {
            Value::Bool(b) => Some(*b),
            other => {
                cx.err(
                    self.at(key),
                    format!("expected true or false, got {}", kind(other)),
                );
                None
            }
        }
    }

    /// A percentage from 0 to 100 (decimals allowed, down to 0.0001%) in parts per million.
    fn fraction_ppm(&self, cx: &mut Cx, key: &str) -> Option<u32> {
        let v = self.get(key)?;
        let Some(percent) = v.as_f64() else {
            cx.err(
                self.at(key),
                format!("expected a percentage (a number), got {}", kind(v)),
            );
            return None;
        };
        if !(0.0..=100.0).contains(&percent) {
            cx.err(self.at(key), "must be between 0 and 100 (a percentage)");
            return None;
        }
        let scaled = percent * 10_000.0;
        let ppm = scaled.round();
        if (scaled - ppm).abs() > 1e-6 {
            cx.err(
                self.at(key),
                format!("{percent} has more than 4 decimal places (the resolution is 0.0001%)"),
            );
            return None;
        }
        Some(ppm as u32)
    }

    /// A duration string greater than zero.
    fn duration(&self, cx: &mut Cx, key: &str) -> Option<Duration> {
        let s = self.string(cx, key)?;
        match common::parse_duration(&s) {
            Ok(d) if d.is_zero() => {
                cx.err(self.at(key), "must be greater than 0");
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                cx.err(self.at(key), e);
                None
            }
        }
    }

    fn addr(&self, cx: &mut Cx, key: &str) -> Option<SocketAddr> {
        let s = self.string(cx, key)?;
        common::parse_socket_addr(&s)
            .map_err(|e| cx.err(self.at(key), e))
            .ok()
    }

    fn seq(&self, cx: &mut Cx, key: &str) -> Option<&'v [Value]> {
        match self.get(key)? {
            Value::Sequence(s) => Some(s.as_slice()),
            other => {
                cx.err(
                    self.at(key),
                    format!("expected a list, got {}", kind(other)),
                );
                None
            }
        }
    }

    /// A string or a list of strings (each an error when it is not one).
    fn strings(&self, cx: &mut Cx, key: &str) -> Vec<String> {
        match self.get(key) {
            None => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Sequence(list)) => {
                let mut out = Vec::new();
                for (i, v) in list.iter().enumerate() {
                    match v.as_str() {
                        Some(s) => out.push(s.to_string()),
                        None => cx.err(
                            index(&self.at(key), i),
                            format!("expected a string, got {}", kind(v)),
                        ),
                    }
                }
                out
            }
            Some(other) => {
                cx.err(
                    self.at(key),
                    format!(
                        "expected a string or a list of strings, got {}",
                        kind(other)
                    ),
                );
                Vec::new()
            }
        }
    }

    /// A required list with at least one element; empty when it is not.
    fn non_empty_seq(&self, cx: &mut Cx, key: &str) -> &'v [Value] {
        if self.get(key).is_none() {
            cx.err(self.at(key), "required");
            return &[];
        }
        let s = self.seq(cx, key).unwrap_or_default();
        if s.is_empty() && self.get(key).is_some_and(Value::is_sequence) {
            cx.err(self.at(key), "must not be empty");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    /// The model read from YAML is the model its Envoy resources translate to, for the
    /// listener's client bounds and protocol settings and the cluster's upstream queue bound,
    /// databases and dedicated connections too.
    #[test]
    fn yaml_and_its_resources_give_the_same_model() {
        let text = r#"
listeners:
  - name: l
    client_buffer_limit: 1048576
    client_buffer_hard_limit: 4194304
    client_stall_timeout: 2m
    max_auth_failures: 1
    allow_keyless_scripts: true
    protocol: resp3
    advertised_redis_version: "7.2.4"
    routes: { catch_all: a }
clusters:
  - name: a
    max_queue_per_connection: 1
    databases: 2
    dedicated_connections: 3
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
"#;
        let direct = super::parse(text).unwrap();
        let client = &direct.listeners[0].client;
        assert_eq!(
            (client.buffer_limit, client.buffer_hard_limit),
            (1 << 20, 4 << 20)
        );
        assert_eq!(client.stall_timeout, std::time::Duration::from_secs(120));
        assert_eq!(client.max_auth_failures, 1);
        assert!(client.allow_keyless_scripts);
        let resp = &direct.listeners[0].resp;
        assert_eq!(
            (resp.protocol, resp.advertised_version.as_str()),
            (respway_filters::model::ProtocolMode::Resp3, "7.2.4")
        );
        let c = &direct.clusters[0];
        assert_eq!(c.max_queue_per_connection, 1);
        assert_eq!((c.databases, c.dedicated_connections), (2, 3));
        assert_eq!(
            crate::translate(&crate::to_resources(&direct)).unwrap(),
            direct
        );
    }
}
