//! `Listener` → [`respway_filters::model::Listener`]: one filter chain holding Envoy's
//! `RedisProxy` (routes and their mirror policies, timeouts, downstream auth, protocol version)
//! and, optionally before it, respway's `ListenerSettings` (backpressure, codec limits, mirror
//! modes, per-client buffer bounds and session rules, protocol mode and advertised version).

use std::collections::{HashMap, HashSet};

use envoy_types::pb::envoy::config::listener::v3::{
    filter::ConfigType, FilterChain, Listener as PbListener,
};
use envoy_types::pb::envoy::extensions::filters::network::redis_proxy::v3::{
    redis_proxy::{conn_pool_settings::ReadPolicy as EnvoyReadPolicy, ProtocolVersion},
    RedisProxy,
};
use prost::Name;
use respway_filters::codec_limits::Limits;
use respway_filters::model::{
    AclUser, ClientLimits, ClusterEmulation, Listener, MirrorPolicy, Observe, ProtocolMode,
    ReadPolicy, RespSettings, RouteTable, ZoneFallback,
};

use super::routes::{check_mirrors, mirror_modes, routes};
use super::{
    duration, inline_secret, positive_duration, socket_address, type_name, unpack, unsupported,
};
use crate::common::{self};
use crate::error::{index, join, Cx};
use crate::pb::respway::v1::{self as rw, ListenerSettings};

/// A translated listener and the Envoy flag that cluster hashtags may inherit.
pub(super) struct Translated {
    /// The model listener.
    pub(super) listener: Listener,
    /// `RedisProxy.settings.enable_hashtagging`.
    pub(super) enable_hashtagging: bool,
    /// `RedisProxy.settings.read_policy` as respway's read policy, and its Envoy name.
    pub(super) read_policy: (ReadPolicy, &'static str),
}

impl Translated {
    /// Whether a route, the catch-all or a mirror policy of either names `cluster`.
    pub(super) fn routes_to(&self, cluster: &str) -> bool {
        let r = &self.listener.routes;
        let mirrors = |m: &[MirrorPolicy]| m.iter().any(|m| m.cluster == cluster);
        r.catch_all.as_deref() == Some(cluster)
            || mirrors(&r.catch_all_mirrors)
            || r.routes
                .iter()
                .any(|p| p.cluster == cluster || mirrors(&p.mirrors))
    }
}

/// The clusters a listener routes or mirrors to, read from every `RedisProxy` filter of its
/// filter chains (routes, catch-all and their mirror policies). Filters that do not decode
/// are skipped: [`translate`] reports them. The ADS client uses this to know when a listener
/// is warm (every cluster it names has arrived).
pub(crate) fn referenced_clusters(l: &PbListener) -> Vec<String> {
    let mut out = Vec::new();
    for chain in &l.filter_chains {
        for f in &chain.filters {
            let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
                continue;
            };
            if type_name(any) != RedisProxy::full_name() {
                continue;
            }
            let Ok(redis) = unpack::<RedisProxy>(any) else {
                continue;
            };
            let Some(pr) = &redis.prefix_routes else {
                continue;
            };
            let routes = pr.routes.iter().chain(pr.catch_all_route.iter());
            for r in routes {
                out.push(r.cluster.clone());
                out.extend(r.request_mirror_policy.iter().map(|m| m.cluster.clone()));
            }
        }
    }
    out.retain(|c| !c.is_empty());
    out.sort();
    out.dedup();
    out
}

/// Translates one listener; `None` when it had errors (all recorded in `cx`).
#[allow(deprecated)] // deprecated Envoy fields are read to refuse them
pub(super) fn translate(
    cx: &mut Cx,
    l: &PbListener,
    i: usize,
    clusters: &HashSet<&str>,
) -> Option<Translated> {
    cx.resource = if l.name.is_empty() {
        format!("listeners[{i}]")
    } else {
        format!("listener {:?}", l.name)
    };
    let before = cx.count();
    if l.name.is_empty() {
        cx.err("name", "must not be empty");
    }
    let address = socket_address(cx, "address", l.address.as_ref());
    unsupported_listener_fields(cx, l);

    let Some(chain) = l.filter_chains.first() else {
        cx.err("filter_chains", "one filter chain is required");
        return None;
    };
    if l.filter_chains.len() > 1 {
        cx.err(
            "filter_chains",
            format!(
                "exactly one filter chain is supported (got {})",
                l.filter_chains.len()
            ),
        );
    }
    let fc = "filter_chains[0]";
    unsupported(
        cx,
        fc,
        &[
            ("filter_chain_match", chain.filter_chain_match.is_some()),
            (
                "use_proxy_proto",
                chain.use_proxy_proto.is_some_and(|b| b.value),
            ),
            (
                "transport_socket_connect_timeout",
                chain.transport_socket_connect_timeout.is_some(),
            ),
        ],
    );

    let tls = chain
        .transport_socket
        .as_ref()
        .and_then(|ts| super::tls::listener(cx, &join(fc, "transport_socket"), ts));

    let (redis, settings) = chain_filters(cx, chain, fc);
    let Some((rp, redis)) = redis else {
        cx.err(
            join(fc, "filters"),
            "an envoy.filters.network.redis_proxy filter (RedisProxy) is required",
        );
        return None;
    };

    // RedisProxy. Envoy's proto validation requires a non-empty stat_prefix, settings and
    // settings.op_timeout; so does respway, so that a config Envoy would refuse is refused
    // here too. respway labels its metrics with the listener name, not stat_prefix.
    if redis.stat_prefix.is_empty() {
        cx.err(
            join(&rp, "stat_prefix"),
            "required (Envoy requires it; respway labels metrics with the listener name)",
        );
    }
    let mut op_timeout = common::DEFAULT_OP_TIMEOUT;
    let mut enable_hashtagging = false;
    let mut read_policy = (ReadPolicy::Primary, "MASTER");
    if redis.settings.is_none() {
        cx.err(
            join(&rp, "settings"),
            "required (Envoy requires it, with settings.op_timeout)",
        );
    }
    if let Some(s) = &redis.settings {
        let sp = join(&rp, "settings");
        match &s.op_timeout {
            Some(d) => {
                op_timeout =
                    positive_duration(cx, &join(&sp, "op_timeout"), d).unwrap_or(op_timeout);
            }
            None => cx.err(join(&sp, "op_timeout"), "required (Envoy requires it)"),
        }
        enable_hashtagging = s.enable_hashtagging;
        unsupported(
            cx,
            &sp,
            &[
                ("enable_redirection", s.enable_redirection),
                ("dns_cache_config", s.dns_cache_config.is_some()),
                (
                    "max_buffer_size_before_flush",
                    s.max_buffer_size_before_flush != 0,
                ),
                ("buffer_flush_timeout", s.buffer_flush_timeout.is_some()),
                (
                    "max_upstream_unknown_connections",
                    s.max_upstream_unknown_connections.is_some(),
                ),
                ("connection_rate_limit", s.connection_rate_limit.is_some()),
            ],
        );
        // enable_command_stats is accepted either way: respway always keeps per-command stats.
        // Clusters without respway.v1.ClusterOptions.read_policy follow it (see mod.rs).
        match EnvoyReadPolicy::try_from(s.read_policy) {
            Ok(p @ EnvoyReadPolicy::Master) => read_policy = (ReadPolicy::Primary, p.as_str_name()),
            Ok(p @ (EnvoyReadPolicy::Replica | EnvoyReadPolicy::PreferReplica)) => {
                read_policy = (ReadPolicy::PreferReplica, p.as_str_name());
            }
            Ok(p @ EnvoyReadPolicy::Any) => read_policy = (ReadPolicy::Any, p.as_str_name()),
            Ok(p @ EnvoyReadPolicy::LocalZoneAffinity) => {
                let fallback = ZoneFallback::AnyReplica;
                read_policy = (ReadPolicy::ZoneLocal { fallback }, p.as_str_name());
            }
            Ok(
                p @ (EnvoyReadPolicy::PreferMaster
                | EnvoyReadPolicy::LocalZoneAffinityReplicasAndPrimary),
            ) => cx.err(
                join(&sp, "read_policy"),
                format!(
                    "{} is not supported by respway (use MASTER, PREFER_REPLICA, REPLICA, ANY or LOCAL_ZONE_AFFINITY, or respway.v1.ClusterOptions.read_policy)",
                    p.as_str_name()
                ),
            ),
            Err(_) => cx.err(
                join(&sp, "read_policy"),
                format!("unknown value {}", s.read_policy),
            ),
        }
    }
    unsupported(
        cx,
        &rp,
        &[
            ("latency_in_micros", redis.latency_in_micros),
            ("faults", !redis.faults.is_empty()),
            (
                "external_auth_provider",
                redis.external_auth_provider.is_some(),
            ),
            ("custom_commands", !redis.custom_commands.is_empty()),
        ],
    );
    // RESP2 is also proto3's unset, so it leaves the choice to the clients (unless
    // ListenerSettings.protocol says otherwise); RESP3 is enforced as Envoy does.
    let envoy_protocol = match ProtocolVersion::try_from(redis.protocol_version) {
        Ok(ProtocolVersion::Resp2) => ProtocolMode::Auto,
        Ok(ProtocolVersion::Resp3) => ProtocolMode::Resp3,
        Err(_) => {
            cx.err(
                join(&rp, "protocol_version"),
                format!("unknown value {}", redis.protocol_version),
            );
            ProtocolMode::Auto
        }
    };

    let mut passwords: Vec<(String, _)> = redis
        .downstream_auth_passwords
        .iter()
        .enumerate()
        .map(|(i, ds)| (index(&join(&rp, "downstream_auth_passwords"), i), ds))
        .collect();
    if let Some(ds) = &redis.downstream_auth_password {
        passwords.push((join(&rp, "downstream_auth_password"), ds));
    }
    // With `downstream_auth_username` (other than "default"), the passwords are that user's,
    // who may run everything: one ACL user. Without, the one password is the default user's.
    let username = redis
        .downstream_auth_username
        .as_ref()
        .and_then(|ds| inline_secret(cx, &join(&rp, "downstream_auth_username"), ds))
        .filter(|u| u != "default");
    let mut envoy_user = None;
    let mut downstream_password = None;
    match &username {
        Some(name) => {
            if let Some(reason) = common::user_name_problem(name) {
                cx.err(join(&rp, "downstream_auth_username"), reason);
            }
            if passwords.is_empty() {
                cx.err(
                    join(&rp, "downstream_auth_passwords"),
                    "required with downstream_auth_username",
                );
            }
            let digests = passwords
                .iter()
                .filter_map(|(field, ds)| inline_secret(cx, field, ds))
                .map(|p| respway_filters::acl::sha256(p.as_bytes()))
                .collect();
            envoy_user = Some(AclUser {
                name: name.clone(),
                enabled: true,
                passwords: digests,
                nopass: false,
                rules: common::DEFAULT_USER_RULES
                    .iter()
                    .map(|r| r.to_string())
                    .collect(),
                read_only: false,
            });
        }
        None => {
            if passwords.len() > 1 {
                cx.err(
                    join(&rp, "downstream_auth_passwords"),
                    "only one downstream password is supported by respway (unless \
                     downstream_auth_username is set)",
                );
            }
            downstream_password = passwords
                .first()
                .and_then(|(field, ds)| inline_secret(cx, field, ds));
        }
    }

    let routes_at = join(&rp, "prefix_routes");
    let mut routes = match &redis.prefix_routes {
        Some(pr) => routes(cx, &routes_at, pr, clusters),
        None => {
            cx.err(&routes_at, "required");
            RouteTable::default()
        }
    };

    // respway.v1.ListenerSettings.
    let mut max_pending = common::DEFAULT_MAX_PENDING;
    let mut limits = Limits::default();
    let mut client = ClientLimits::default();
    let mut observe = Observe::default();
    let mut cluster_emulation = None;
    let mut resp = RespSettings {
        protocol: envoy_protocol,
        ..RespSettings::default()
    };
    let modes = match &settings {
        Some((at, s)) => mirror_modes(cx, at, &s.mirror_modes, &mut routes),
        None => HashMap::new(),
    };
    check_mirrors(
        cx,
        &routes_at,
        settings.as_ref().map(|(at, _)| at.as_str()),
        &modes,
        &routes,
    );
    let mut users: Vec<AclUser> = envoy_user.into_iter().collect();
    if let Some((at, s)) = &settings {
        users.extend(acl_users(cx, at, s));
        for (i, field, reason) in
            common::user_problems(&users, downstream_password.is_some(), "password_sha256")
        {
            // The Envoy user (if any) is first: it can only collide by name.
            let offset = usize::from(username.is_some());
            match i.checked_sub(offset) {
                Some(i) => cx.err(join(&index(&join(at, "users"), i), &field), reason),
                None => cx.err(join(&rp, "downstream_auth_username"), reason),
            }
        }
        client = client_limits(cx, at, s);
        observe = observe_settings(cx, at, s);
        cluster_emulation = s
            .cluster_emulation
            .as_ref()
            .map(|e| emulation(cx, &join(at, "cluster_emulation"), e));
        resp_settings(cx, at, s, &mut resp);
        if s.max_pending_per_client != 0 {
            max_pending = s.max_pending_per_client as usize;
        }
        if let Some(l) = &s.limits {
            let pick = |v: u64, d: usize| if v == 0 { d } else { v as usize };
            limits = Limits {
                max_bulk_len: pick(l.max_bulk_len, limits.max_bulk_len),
                max_multibulk_len: pick(l.max_multibulk_len, limits.max_multibulk_len),
                max_inline_len: pick(l.max_inline_len, limits.max_inline_len),
            };
        }
    }

    if cx.count() > before {
        return None;
    }
    Some(Translated {
        listener: Listener {
            tls,
            name: l.name.clone(),
            address: address?,
            routes,
            downstream_password,
            users,
            op_timeout,
            max_pending_per_client: max_pending,
            resp,
            client,
            limits,
            observe,
            cluster_emulation,
        },
        enable_hashtagging,
        read_policy,
    })
}

/// `ListenerSettings.slowlog_threshold`, `slowlog_max_len`, `hot_key_sample` (unset: the
/// sidecar's own flags).
fn observe_settings(cx: &mut Cx, at: &str, s: &ListenerSettings) -> Observe {
    let slowlog_threshold = s
        .slowlog_threshold
        .as_ref()
        .and_then(|d| duration(cx, &join(at, "slowlog_threshold"), d));
    let slowlog_max_len = s.slowlog_max_len.and_then(|n| {
        if n > common::MAX_SLOWLOG_LEN {
            cx.err(
                join(at, "slowlog_max_len"),
                format!("must be at most {}", common::MAX_SLOWLOG_LEN),
            );
            return None;
        }
        Some(n as usize)
    });
    let hot_key_sample = s.hot_key_sample.and_then(|n| {
        if n > u64::from(u32::MAX) {
            cx.err(
                join(at, "hot_key_sample"),
                format!("must be at most {}", u32::MAX),
            );
            return None;
        }
        Some(n)
    });
    Observe {
        slowlog_threshold,
        slowlog_max_len,
        hot_key_sample,
    }
}

/// `ListenerSettings.cluster_emulation` (at `at`): each announced address parsed, none twice.
fn emulation(cx: &mut Cx, at: &str, e: &rw::ClusterEmulation) -> ClusterEmulation {
    let (announce, problems) = common::announce_addresses(&e.announce);
    for (i, reason) in problems {
        cx.err(index(&join(at, "announce"), i), reason);
    }
    ClusterEmulation { announce }
}

/// `ListenerSettings.users` (at `at`); problems across users are checked by the caller.
fn acl_users(cx: &mut Cx, at: &str, s: &ListenerSettings) -> Vec<AclUser> {
    let mut out = Vec::new();
    for (i, u) in s.users.iter().enumerate() {
        let item = index(&join(at, "users"), i);
        if let Some(reason) = common::user_name_problem(&u.name) {
            cx.err(join(&item, "name"), reason);
        }
        let mut passwords = Vec::new();
        for (j, h) in u.password_sha256.iter().enumerate() {
            match respway_filters::acl::digest_from_hex(h) {
                Some(d) => passwords.push(d),
                None => cx.err(
                    index(&join(&item, "password_sha256"), j),
                    "expected 64 hexadecimal digits (a SHA-256 digest)",
                ),
            }
        }
        let rules = if u.rules.is_empty() {
            common::DEFAULT_USER_RULES
                .iter()
                .map(|r| r.to_string())
                .collect()
        } else {
            u.rules.clone()
        };
        out.push(AclUser {
            name: u.name.clone(),
            enabled: u.enabled.unwrap_or(true),
            passwords,
            nopass: u.nopass,
            rules,
            read_only: u.read_only,
        });
    }
    out
}

/// `ListenerSettings`' (at `at`) per-client bounds and session rules; each 0 or unset is
/// the default, and the hard buffer limit is at least the limit.
fn client_limits(cx: &mut Cx, at: &str, s: &ListenerSettings) -> ClientLimits {
    let d = ClientLimits::default();
    let before = cx.count();
    let mut bytes = |field: &str, v: u64, default: usize| match v {
        0 => default,
        v => usize::try_from(v).unwrap_or_else(|_| {
            cx.err(join(at, field), format!("must be at most {}", usize::MAX));
            default
        }),
    };
    let buffer_limit = bytes("client_buffer_limit", s.client_buffer_limit, d.buffer_limit);
    let buffer_hard_limit = bytes(
        "client_buffer_hard_limit",
        s.client_buffer_hard_limit,
        d.buffer_hard_limit,
    );
    if cx.count() == before {
        if let Some(reason) = common::client_buffer_problem(
            buffer_limit,
            s.client_buffer_limit == 0,
            buffer_hard_limit,
            s.client_buffer_hard_limit == 0,
        ) {
            cx.err(join(at, "client_buffer_hard_limit"), reason);
        }
    }
    let stall_timeout = match &s.client_stall_timeout {
        Some(t) => {
            positive_duration(cx, &join(at, "client_stall_timeout"), t).unwrap_or(d.stall_timeout)
        }
        None => d.stall_timeout,
    };
    ClientLimits {
        buffer_limit,
        buffer_hard_limit,
        stall_timeout,
        max_auth_failures: match s.max_auth_failures {
            0 => d.max_auth_failures,
            n => n,
        },
        allow_keyless_scripts: s.allow_keyless_scripts,
        allow_restricted_scripts: s.allow_restricted_scripts,
        admin_commands: s.admin_commands,
        keys_max: match s.keys_max {
            0 => d.keys_max,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        },
        pubsub_buffer_limit: match s.pubsub_buffer_limit {
            0 => d.pubsub_buffer_limit,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        },
    }
}

/// `ListenerSettings`' (at `at`) protocol mode, which wins over `RedisProxy.protocol_version`
/// when set, and advertised version (empty: the default).
fn resp_settings(cx: &mut Cx, at: &str, s: &ListenerSettings, resp: &mut RespSettings) {
    match rw::Protocol::try_from(s.protocol) {
        Ok(rw::Protocol::Unspecified) => {}
        Ok(rw::Protocol::Auto) => resp.protocol = ProtocolMode::Auto,
        Ok(rw::Protocol::Resp2) => resp.protocol = ProtocolMode::Resp2,
        Ok(rw::Protocol::Resp3) => resp.protocol = ProtocolMode::Resp3,
        Err(_) => cx.err(
            join(at, "protocol"),
            format!("unknown value {}", s.protocol),
        ),
    }
    let version = &s.advertised_redis_version;
    if !version.is_empty() {
        match common::redis_version_problem(version) {
            Some(reason) => cx.err(join(at, "advertised_redis_version"), reason),
            None => resp.advertised_version = version.clone(),
        }
    }
}

/// Refuses the Envoy listener fields respway does not implement (each named in the error).
#[allow(deprecated)] // deprecated Envoy fields are read to refuse them
fn unsupported_listener_fields(cx: &mut Cx, l: &PbListener) {
    unsupported(
        cx,
        "",
        &[
            ("additional_addresses", !l.additional_addresses.is_empty()),
            ("stats_matcher", l.stats_matcher.is_some()),
            ("fcds_config", l.fcds_config.is_some()),
            ("filter_chain_matcher", l.filter_chain_matcher.is_some()),
            (
                "use_original_dst",
                l.use_original_dst.is_some_and(|b| b.value),
            ),
            ("default_filter_chain", l.default_filter_chain.is_some()),
            (
                "per_connection_buffer_limit_bytes",
                l.per_connection_buffer_limit_bytes.is_some(),
            ),
            (
                "per_connection_buffer_high_watermark_timeout",
                l.per_connection_buffer_high_watermark_timeout.is_some(),
            ),
            ("deprecated_v1", l.deprecated_v1.is_some()),
            ("drain_type", l.drain_type != 0),
            ("listener_filters", !l.listener_filters.is_empty()),
            (
                "listener_filters_timeout",
                l.listener_filters_timeout.is_some(),
            ),
            (
                "continue_on_listener_filters_timeout",
                l.continue_on_listener_filters_timeout,
            ),
            ("transparent", l.transparent.is_some_and(|b| b.value)),
            ("freebind", l.freebind.is_some_and(|b| b.value)),
            ("socket_options", !l.socket_options.is_empty()),
            (
                "tcp_fast_open_queue_length",
                l.tcp_fast_open_queue_length.is_some(),
            ),
            ("udp_listener_config", l.udp_listener_config.is_some()),
            ("api_listener", l.api_listener.is_some()),
            (
                "connection_balance_config",
                l.connection_balance_config.is_some(),
            ),
            (
                "enable_reuse_port",
                l.enable_reuse_port.is_some_and(|b| !b.value),
            ),
            ("access_log", !l.access_log.is_empty()),
            ("tcp_backlog_size", l.tcp_backlog_size.is_some()),
            (
                "max_connections_to_accept_per_socket_event",
                l.max_connections_to_accept_per_socket_event.is_some(),
            ),
            ("bind_to_port", l.bind_to_port.is_some_and(|b| !b.value)),
            ("enable_mptcp", l.enable_mptcp),
            ("ignore_global_conn_limit", l.ignore_global_conn_limit),
            ("bypass_overload_manager", l.bypass_overload_manager),
            ("tcp_keepalive", l.tcp_keepalive.is_some()),
            ("internal_listener", l.listener_specifier.is_some()),
        ],
    );
}

/// A filter found in the chain, with the path it was found at.
type Found<T> = Option<(String, T)>;

/// The filter chain's filters: Envoy's `RedisProxy` (required, last) and respway's
/// `ListenerSettings` (optional), each with the path it was found at.
fn chain_filters(
    cx: &mut Cx,
    chain: &FilterChain,
    fc: &str,
) -> (Found<RedisProxy>, Found<ListenerSettings>) {
    let mut redis: Found<RedisProxy> = None;
    let mut settings: Found<ListenerSettings> = None;
    let filters = join(fc, "filters");
    for (fi, f) in chain.filters.iter().enumerate() {
        let at = index(&filters, fi);
        let any = match &f.config_type {
            Some(ConfigType::TypedConfig(any)) => any,
            Some(ConfigType::ConfigDiscovery(_)) => {
                cx.err(join(&at, "config_discovery"), "not supported by respway");
                continue;
            }
            None => {
                cx.err(join(&at, "typed_config"), "required");
                continue;
            }
        };
        let typed = join(&at, "typed_config");
        let name = type_name(any);
        if name == RedisProxy::full_name() {
            if fi + 1 != chain.filters.len() {
                cx.err(
                    &at,
                    "envoy.filters.network.redis_proxy must be the last filter",
                );
            }
            match unpack::<RedisProxy>(any) {
                Ok(r) if redis.is_none() => redis = Some((typed, r)),
                Ok(_) => cx.err(&at, "duplicate envoy.filters.network.redis_proxy filter"),
                Err(e) => cx.err(typed, e),
            }
        } else if name == ListenerSettings::full_name() {
            match unpack::<ListenerSettings>(any) {
                Ok(s) if settings.is_none() => settings = Some((typed, s)),
                Ok(_) => cx.err(&at, "duplicate respway.v1.ListenerSettings filter"),
                Err(e) => cx.err(typed, e),
            }
        } else {
            cx.err(
                at,
                format!(
                    "unsupported network filter {:?} ({}); respway runs envoy.filters.network.redis_proxy and respway.listener",
                    f.name, any.type_url
                ),
            );
        }
    }
    (redis, settings)
}
