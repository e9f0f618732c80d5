//! The parser's inverse: a model written out in the static YAML schema, for the sidecar's
//! `GET /config_dump`. It is rendered from the model alone (a configuration served over xDS
//! has no file), with the schema's keys and units, so that reading it back gives the same
//! model: durations as `250ms`, policies and modes by their YAML names, hashtags as `"{}"`,
//! fractions as percentages, a shard's endpoint credentials under the endpoint.
//!
//! Secrets are never written: passwords (`downstream_auth_password`, `auth.password`, which
//! stands for `password_file` and `password_env` too) and the users' password digests
//! (`password_sha256`) are shown as [`REDACTED`]. Settings at their default are left out
//! unless asked for, as a hand-written file leaves them out; settings that are unset (no TLS,
//! no auth, no users) are left out either way. What the file cannot say (a duration finer
//! than a microsecond, credentials of an address that is no endpoint: both only from xDS) is
//! listed in [`ConfigDump::notes`].

use std::net::SocketAddr;
use std::time::Duration;

use respway_filters::codec_limits::Limits;
use respway_filters::model::{
    AclUser, ClientLimits, Cluster, ClusterEmulation, Config, EndpointAuth, HashPolicy, HashTag,
    HealthCheck, HotKeyRead, Listener, MirrorMode, MirrorPolicy, NearCache, ReadPolicy,
    RedisClusterSource, RespSettings, Role, RouteTable, Shard, UpstreamAuth, ZoneFallback,
    DEFAULT_DATABASES, DEFAULT_DEDICATED_CONNECTIONS, DEFAULT_FAILOVER_HOLD,
    DEFAULT_MAX_QUEUE_PER_CONNECTION,
};
use serde_yaml_ng::{Mapping, Value};

use crate::common;

/// What a secret is shown as.
pub const REDACTED: &str = "<redacted>";

/// A configuration rendered as the YAML schema (see [`config_dump`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigDump {
    tree: Value,
    notes: Vec<String>,
}

impl ConfigDump {
    /// The document: `node`, `listeners`, `clusters`, as the file has them.
    pub fn tree(&self) -> &Value {
        &self.tree
    }

    /// What the document cannot show, one sentence each (empty for any configuration read
    /// from a file).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The document as YAML, after a `# version: N` comment and one `# ` comment per note.
    pub fn to_yaml(&self, version: u64) -> String {
        let mut out = format!("# version: {version}\n");
        for n in &self.notes {
            out.push_str("# ");
            out.push_str(n);
            out.push('\n');
        }
        out + &serde_yaml_ng::to_string(&self.tree).unwrap_or_default()
    }

    /// The same document as JSON: `{"version": N, "config": {...}, "notes": [...]}`.
    pub fn to_json(&self, version: u64) -> String {
        let body = serde_json::json!({
            "version": version,
            "config": &self.tree,
            "notes": &self.notes,
        });
        serde_json::to_string_pretty(&body).unwrap_or_default() + "\n"
    }
}

/// Renders `config` as the static YAML schema. `include_defaults`: settings at their default
/// value are written too (else they are left out, as in a hand-written file).
pub fn config_dump(config: &Config, include_defaults: bool) -> ConfigDump {
    let mut w = Writer {
        all: include_defaults,
        notes: Vec::new(),
    };
    let mut top = Mapping::new();
    if let Some(zone) = &config.zone {
        let mut node = Mapping::new();
        node.insert("zone".into(), zone.as_str().into());
        top.insert("node".into(), Value::Mapping(node));
    }
    let listeners = config.listeners.iter().map(|l| w.listener(l)).collect();
    top.insert("listeners".into(), Value::Sequence(listeners));
    let clusters = config.clusters.iter().map(|c| w.cluster(c)).collect();
    top.insert("clusters".into(), Value::Sequence(clusters));
    ConfigDump {
        tree: Value::Mapping(top),
        notes: w.notes,
    }
}

/// The rendering state: whether defaults are written, and the notes so far.
struct Writer {
    all: bool,
    notes: Vec<String>,
}

/// A mapping being written, in the order of the parser's keys.
struct Map {
    m: Mapping,
    all: bool,
}

impl Map {
    /// Writes `key` whatever its value.
    fn put(&mut self, key: &str, v: impl Into<Value>) {
        self.m.insert(key.into(), v.into());
    }

    /// Writes `key` unless its value is the default (`is_default`) and defaults are left out.
    fn set(&mut self, key: &str, v: impl Into<Value>, is_default: bool) {
        if self.all || !is_default {
            self.put(key, v);
        }
    }

    /// Writes `key` when `v` is set.
    fn some(&mut self, key: &str, v: Option<impl Into<Value>>) {
        if let Some(v) = v {
            self.put(key, v);
        }
    }

    /// Writes `key` when the list is not empty.
    fn list(&mut self, key: &str, items: Vec<Value>) {
        if !items.is_empty() {
            self.put(key, Value::Sequence(items));
        }
    }

    fn done(self) -> Value {
        Value::Mapping(self.m)
    }
}

/// An integer setting (the model's `usize` and `u64` are written as the YAML number).
fn num(n: impl TryInto<u64>) -> Value {
    Value::Number(n.try_into().unwrap_or(u64::MAX).into())
}

/// The YAML name of a table entry (`KEY_HASHES`, `ZONE_FALLBACKS`, ...).
fn name_of<T: PartialEq>(table: &[(&'static str, T)], v: &T) -> &'static str {
    table.iter().find(|(_, t)| t == v).map_or("", |(n, _)| n)
}

/// A mirror's `fraction`: the percentage, a whole number when it is one (`12.5`, `0.0001`,
/// `100`), read back to the same parts per million.
fn percentage(ppm: u32) -> Value {
    let (whole, frac) = (ppm / 10_000, ppm % 10_000);
    if frac == 0 {
        return num(whole);
    }
    let text = format!("{whole}.{frac:04}");
    let text = text.trim_end_matches('0');
    Value::Number(
        text.parse::<f64>()
            .unwrap_or(f64::from(ppm) / 10_000.0)
            .into(),
    )
}

impl Writer {
    fn map(&self) -> Map {
        Map {
            m: Mapping::new(),
            all: self.all,
        }
    }

    /// A duration in the largest unit that writes it exactly (`2m`, `250ms`, `0us`). One finer
    /// than a microsecond (only xDS can say one) is rounded up to the next microsecond, so it
    /// stays above zero, and noted (`at` names the setting).
    fn duration(&mut self, d: Duration, at: impl FnOnce() -> String) -> String {
        let shown = crate::emit::duration_string(d);
        if !d.subsec_nanos().is_multiple_of(1_000) {
            self.notes.push(format!(
                "{}: {}ns is shown as {shown} (a file's durations are whole microseconds)",
                at(),
                d.as_nanos()
            ));
        }
        shown
    }

    fn listener(&mut self, l: &Listener) -> Value {
        let at = format!("listener {:?}", l.name);
        let mut m = self.map();
        m.put("name", l.name.as_str());
        let default_address = l.address.to_string() == common::DEFAULT_LISTENER_ADDRESS;
        m.set("address", l.address.to_string(), default_address);
        let op_timeout = self.duration(l.op_timeout, || format!("{at}: op_timeout"));
        m.set(
            "op_timeout",
            op_timeout,
            l.op_timeout == common::DEFAULT_OP_TIMEOUT,
        );
        m.set(
            "max_pending_per_client",
            num(l.max_pending_per_client),
            l.max_pending_per_client == common::DEFAULT_MAX_PENDING,
        );
        self.client_limits(&mut m, &l.client, &at);
        let o = &l.observe;
        if let Some(d) = o.slowlog_threshold {
            let d = self.duration(d, || format!("{at}: slowlog_threshold"));
            m.put("slowlog_threshold", d);
        }
        m.some("slowlog_max_len", o.slowlog_max_len.map(num));
        m.some("hot_key_sample", o.hot_key_sample.map(num));
        resp_settings(&mut m, &l.resp);
        let emulation = l.cluster_emulation.as_ref();
        m.set(
            "cluster_emulation",
            emulation.map_or(Value::Bool(false), cluster_emulation),
            emulation.is_none(),
        );
        m.some(
            "downstream_auth_password",
            l.downstream_password.as_ref().map(|_| REDACTED),
        );
        m.list("users", l.users.iter().map(|u| self.user(u)).collect());
        let limits = self.limits(&l.limits);
        if limits.as_mapping().is_some_and(|l| !l.is_empty()) {
            m.put("limits", limits);
        }
        m.put("routes", self.routes(&l.routes));
        if let Some(t) = &l.tls {
            let mut tls = self.map();
            tls.put("cert", t.cert.display().to_string());
            tls.put("key", t.key.display().to_string());
            tls.some(
                "client_ca",
                t.client_ca.as_ref().map(|p| p.display().to_string()),
            );
            tls.set(
                "require_client_cert",
                t.require_client_cert,
                !t.require_client_cert,
            );
            m.put("tls", tls.done());
        }
        m.done()
    }

    /// The listener's `client_*` keys and session rules.
    fn client_limits(&mut self, m: &mut Map, c: &ClientLimits, at: &str) {
        let d = ClientLimits::default();
        m.set(
            "client_buffer_limit",
            num(c.buffer_limit),
            c.buffer_limit == d.buffer_limit,
        );
        m.set(
            "client_buffer_hard_limit",
            num(c.buffer_hard_limit),
            c.buffer_hard_limit == d.buffer_hard_limit,
        );
        let stall = self.duration(c.stall_timeout, || format!("{at}: client_stall_timeout"));
        m.set(
            "client_stall_timeout",
            stall,
            c.stall_timeout == d.stall_timeout,
        );
        m.set(
            "max_auth_failures",
            num(c.max_auth_failures),
            c.max_auth_failures == d.max_auth_failures,
        );
        m.set(
            "allow_keyless_scripts",
            c.allow_keyless_scripts,
            c.allow_keyless_scripts == d.allow_keyless_scripts,
        );
        m.set(
            "allow_restricted_scripts",
            c.allow_restricted_scripts,
            c.allow_restricted_scripts == d.allow_restricted_scripts,
        );
        m.set(
            "admin_commands",
            c.admin_commands,
            c.admin_commands == d.admin_commands,
        );
        m.set("keys_max", num(c.keys_max), c.keys_max == d.keys_max);
        m.set(
            "pubsub_buffer_limit",
            num(c.pubsub_buffer_limit),
            c.pubsub_buffer_limit == d.pubsub_buffer_limit,
        );
    }

    fn user(&self, u: &AclUser) -> Value {
        let mut m = self.map();
        m.put("name", u.name.as_str());
        m.set("enabled", u.enabled, u.enabled);
        match u.passwords.len() {
            0 => {}
            1 => m.put("password_sha256", REDACTED),
            n => m.put("password_sha256", Value::Sequence(vec![REDACTED.into(); n])),
        }
        m.set("nopass", u.nopass, !u.nopass);
        let rules: Vec<Value> = u.rules.iter().map(|r| r.as_str().into()).collect();
        m.set(
            "rules",
            Value::Sequence(rules),
            u.rules.iter().eq(common::DEFAULT_USER_RULES.iter()),
        );
        m.set("read_only", u.read_only, !u.read_only);
        m.done()
    }

    fn limits(&self, l: &Limits) -> Value {
        let d = Limits::default();
        let mut m = self.map();
        m.set(
            "max_bulk_len",
            num(l.max_bulk_len),
            l.max_bulk_len == d.max_bulk_len,
        );
        m.set(
            "max_multibulk_len",
            num(l.max_multibulk_len),
            l.max_multibulk_len == d.max_multibulk_len,
        );
        m.set(
            "max_inline_len",
            num(l.max_inline_len),
            l.max_inline_len == d.max_inline_len,
        );
        m.done()
    }

    fn routes(&self, r: &RouteTable) -> Value {
        let mut m = self.map();
        m.set("case_insensitive", r.case_insensitive, !r.case_insensitive);
        m.some("catch_all", r.catch_all.as_deref());
        m.list(
            "catch_all_mirrors",
            r.catch_all_mirrors.iter().map(|p| self.mirror(p)).collect(),
        );
        let prefixes = r
            .routes
            .iter()
            .map(|p| {
                let mut m = self.map();
                m.put("prefix", p.prefix.as_str());
                m.put("cluster", p.cluster.as_str());
                m.set("remove_prefix", p.remove_prefix, !p.remove_prefix);
                m.list(
                    "mirrors",
                    p.mirrors.iter().map(|p| self.mirror(p)).collect(),
                );
                m.done()
            })
            .collect();
        m.list("prefixes", prefixes);
        m.done()
    }

    fn mirror(&self, p: &MirrorPolicy) -> Value {
        let mut m = self.map();
        m.put("cluster", p.cluster.as_str());
        match p.mode {
            MirrorMode::DualWrite { target_is_primary } => {
                m.set("mode", "dual_write", true);
                let side = name_of(common::MIRROR_PRIMARIES, &target_is_primary);
                m.set("primary", side, !target_is_primary);
            }
            MirrorMode::Forward => m.put("mode", "forward"),
            MirrorMode::ReadOnly => m.put("mode", "read_only"),
            MirrorMode::Move => m.put("mode", "move"),
            MirrorMode::PrepareMove => m.put("mode", "prepare_move"),
        }
        m.set("include_reads", p.include_reads, !p.include_reads);
        m.set(
            "fraction",
            percentage(p.fraction_ppm),
            p.fraction_ppm == common::FULL_FRACTION_PPM,
        );
        m.done()
    }

    // === clusters ===

    fn cluster(&mut self, c: &Cluster) -> Value {
        let at = format!("cluster {:?}", c.name);
        let mut m = self.map();
        m.put("name", c.name.as_str());
        let default_hash = c.hash
            == HashPolicy::Maglev {
                table_size: common::DEFAULT_TABLE_SIZE,
            };
        // A Redis Cluster's hash and hashtag are Redis Cluster's own, not written.
        let redis = c.redis_cluster.is_some();
        m.set("hash", self.hash(&c.hash), default_hash || redis);
        match c.hashtag {
            _ if redis => {}
            None => m.put("hashtag", Value::Null),
            Some(t) => m.set(
                "hashtag",
                common::hashtag_string(Some(t)),
                t == HashTag::default(),
            ),
        }
        m.set(
            "connections_per_endpoint",
            num(c.connections_per_endpoint),
            c.connections_per_endpoint == common::DEFAULT_CONNECTIONS_PER_ENDPOINT,
        );
        m.set(
            "max_queue_per_connection",
            num(c.max_queue_per_connection),
            c.max_queue_per_connection == DEFAULT_MAX_QUEUE_PER_CONNECTION,
        );
        m.set(
            "dedicated_connections",
            num(c.dedicated_connections),
            c.dedicated_connections == DEFAULT_DEDICATED_CONNECTIONS,
        );
        let connect = self.duration(c.connect_timeout, || format!("{at}: connect_timeout"));
        m.set(
            "connect_timeout",
            connect,
            c.connect_timeout == common::DEFAULT_CONNECT_TIMEOUT,
        );
        m.some("auth", c.auth.as_ref().map(|a| self.auth(a)));
        m.set("db", num(c.db), c.db == 0);
        m.set(
            "databases",
            num(c.databases),
            c.databases == DEFAULT_DATABASES,
        );
        let (policy, fallback) = match c.read_policy {
            ReadPolicy::Primary => ("primary", None),
            ReadPolicy::PreferReplica => ("prefer_replica", None),
            ReadPolicy::ZoneLocal { fallback } => ("zone_local", Some(fallback)),
            ReadPolicy::Any => ("any", None),
        };
        m.set("read_policy", policy, c.read_policy == ReadPolicy::Primary);
        if let Some(f) = fallback {
            let name = name_of(common::ZONE_FALLBACKS, &f);
            m.set("zone_fallback", name, f == ZoneFallback::Primary);
        }
        let hot_keys = c
            .hot_keys
            .iter()
            .map(|h| {
                let mut m = self.map();
                m.put("prefix", h.prefix.as_str());
                let read = name_of(common::HOT_KEY_READS, &h.read);
                m.set("read", read, h.read == HotKeyRead::RoundRobin);
                m.done()
            })
            .collect();
        m.list("hot_keys", hot_keys);
        if let Some(h) = &c.health_check {
            let d = HealthCheck::default();
            let mut hm = self.map();
            let interval = self.duration(h.interval, || format!("{at}: health_check.interval"));
            hm.set("interval", interval, h.interval == d.interval);
            let timeout = self.duration(h.timeout, || format!("{at}: health_check.timeout"));
            hm.set("timeout", timeout, h.timeout == d.timeout);
            hm.set(
                "unhealthy_threshold",
                num(h.unhealthy_threshold),
                h.unhealthy_threshold == d.unhealthy_threshold,
            );
            hm.set(
                "healthy_threshold",
                num(h.healthy_threshold),
                h.healthy_threshold == d.healthy_threshold,
            );
            hm.some("drain_key", h.drain_key.as_deref());
            m.put("health_check", hm.done());
        }
        if let Some(n) = &c.near_cache {
            let near_cache = self.near_cache(n, &at);
            m.put("near_cache", near_cache);
        }
        let mut placed = vec![false; c.endpoint_auth.len()];
        match &c.redis_cluster {
            Some(src) => {
                let d = RedisClusterSource::default();
                let mut r = self.map();
                let seeds = src.seeds.iter().map(|a| a.to_string().into());
                r.put("seeds", Value::Sequence(seeds.collect()));
                for (key, v, dv) in [
                    (
                        "cluster_refresh_rate",
                        src.cluster_refresh_rate,
                        d.cluster_refresh_rate,
                    ),
                    (
                        "cluster_refresh_timeout",
                        src.cluster_refresh_timeout,
                        d.cluster_refresh_timeout,
                    ),
                    (
                        "redirect_refresh_interval",
                        src.redirect_refresh_interval,
                        d.redirect_refresh_interval,
                    ),
                ] {
                    let text = self.duration(v, || format!("{at}: redis_cluster.{key}"));
                    r.set(key, text, v == dv);
                }
                for (key, v, dv) in [
                    (
                        "redirect_refresh_threshold",
                        src.redirect_refresh_threshold,
                        d.redirect_refresh_threshold,
                    ),
                    (
                        "failure_refresh_threshold",
                        src.failure_refresh_threshold,
                        d.failure_refresh_threshold,
                    ),
                    (
                        "host_degraded_refresh_threshold",
                        src.host_degraded_refresh_threshold,
                        d.host_degraded_refresh_threshold,
                    ),
                ] {
                    r.set(key, num(v), v == dv);
                }
                m.put("redis_cluster", r.done());
            }
            None => {
                let mut shards = Vec::new();
                for (i, s) in c.shards.iter().enumerate() {
                    shards.push(self.shard(c, i, s, &mut placed));
                }
                m.put("shards", Value::Sequence(shards));
            }
        }
        for (e, placed) in c.endpoint_auth.iter().zip(placed) {
            if !placed {
                self.notes.push(format!(
                    "{at}: the credentials for {}, which is no endpoint of the cluster, are not \
                     shown (a file gives credentials per endpoint)",
                    e.address
                ));
            }
        }
        if let Some(t) = &c.tls {
            let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
            let mut tls = self.map();
            tls.some("ca", path(&t.ca));
            tls.some("cert", path(&t.cert));
            tls.some("key", path(&t.key));
            tls.some("server_name", t.server_name.as_deref());
            tls.set(
                "insecure_skip_verify",
                t.insecure_skip_verify,
                !t.insecure_skip_verify,
            );
            m.put("tls", tls.done());
        }
        m.done()
    }

    /// A cluster's `near_cache` (`{}` when every setting is the default and defaults are left
    /// out); sizes in the largest unit that writes them exactly (`64mb`).
    fn near_cache(&mut self, n: &NearCache, at: &str) -> Value {
        let d = NearCache::default();
        let size = |b: u64| common::size_string(b).map_or_else(|| num(b), Value::from);
        let mut m = self.map();
        let mode = name_of(common::NEAR_CACHE_MODES, &n.mode);
        m.set("mode", mode, n.mode == d.mode);
        let prefixes = n.prefixes.iter().map(|p| p.as_str().into()).collect();
        m.list("prefixes", prefixes);
        let admit = name_of(common::NEAR_CACHE_ADMITS, &n.admit);
        m.set("admit", admit, n.admit == d.admit);
        m.set("max_bytes", size(n.max_bytes), n.max_bytes == d.max_bytes);
        m.set(
            "max_entry_bytes",
            size(n.max_entry_bytes),
            n.max_entry_bytes == d.max_entry_bytes,
        );
        let max_age = self.duration(n.max_age, || format!("{at}: near_cache.max_age"));
        m.set("max_age", max_age, n.max_age == n.mode.default_max_age());
        m.set(
            "hot_reads_per_sec",
            num(n.hot_reads_per_sec),
            n.hot_reads_per_sec == d.hot_reads_per_sec,
        );
        m.done()
    }

    fn auth(&self, a: &UpstreamAuth) -> Value {
        let mut m = self.map();
        m.some("username", a.username.as_deref());
        m.put("password", REDACTED);
        m.done()
    }

    fn hash(&self, h: &HashPolicy) -> Value {
        let mut m = self.map();
        match h {
            HashPolicy::Maglev { table_size } => {
                m.put("policy", "maglev");
                m.set(
                    "table_size",
                    num(*table_size),
                    *table_size == common::DEFAULT_TABLE_SIZE,
                );
            }
            HashPolicy::RingHash {
                minimum_ring_size,
                maximum_ring_size,
                function,
            } => {
                m.put("policy", "ring_hash");
                m.set(
                    "minimum_ring_size",
                    num(*minimum_ring_size),
                    *minimum_ring_size == common::DEFAULT_MIN_RING,
                );
                m.set(
                    "maximum_ring_size",
                    num(*maximum_ring_size),
                    *maximum_ring_size == common::MAX_RING,
                );
                let (name, default) = match function {
                    respway_filters::model::RingHashFunction::XxHash => ("xx_hash", true),
                    respway_filters::model::RingHashFunction::MurmurHash2 => {
                        ("murmur_hash_2", false)
                    }
                };
                m.set("function", name, default);
            }
            HashPolicy::Ketama { key_hash } | HashPolicy::Modula { key_hash } => {
                let policy = match h {
                    HashPolicy::Ketama { .. } => "ketama",
                    _ => "modula",
                };
                m.put("policy", policy);
                let name = name_of(common::KEY_HASHES, key_hash);
                m.set(
                    "key_hash",
                    name,
                    *key_hash == respway_filters::model::KeyHash::Fnv1a64,
                );
            }
            HashPolicy::Crc32Slots { slots } => {
                m.put("policy", "crc32_slots");
                m.set("slots", num(*slots), *slots == common::DEFAULT_CRC32_SLOTS);
            }
            HashPolicy::Crc16Slots => m.put("policy", "crc16_slots"),
        }
        m.done()
    }

    /// Shard `i` of `c`; an endpoint's credentials are written under it (`placed` marks
    /// which of `c.endpoint_auth` were).
    fn shard(&mut self, c: &Cluster, i: usize, s: &Shard, placed: &mut [bool]) -> Value {
        let mut m = self.map();
        let default_name = s.name == format!("shard-{i}");
        m.set("name", s.name.as_str(), default_name);
        // The hash key the parser would work out from what is written: the name counts for
        // twemproxy's policies only when it is written.
        let written_name = (self.all || !default_name).then_some(s.name.as_str());
        let derived = match &s.sentinel {
            Some(_) => s.name.clone(),
            None => common::default_hash_key(&c.hash, written_name, s.primary().address),
        };
        m.set("hash_key", s.hash_key.as_str(), s.hash_key == derived);
        m.set("weight", num(s.weight), s.weight == 1);
        let slots = s
            .slots
            .iter()
            .map(|r| common::slot_range_string(*r).into())
            .collect();
        m.list("slots", slots);
        if let Some(sentinel) = &s.sentinel {
            // The endpoints found from the Sentinels are not written: they are not configured.
            let mut st = self.map();
            st.put("master", sentinel.master.as_str());
            let list = sentinel.sentinels.iter().map(|a| a.to_string().into());
            st.put("sentinels", Value::Sequence(list.collect()));
            if !sentinel.zones.is_empty() {
                let mut zm = self.map();
                for (a, z) in &sentinel.zones {
                    zm.put(&a.to_string(), z.as_str());
                }
                st.put("zones", zm.done());
            }
            let hold = sentinel.failover_hold;
            let at = || format!("cluster {:?}: shards[{i}].sentinel.failover_hold", c.name);
            let text = self.duration(hold, at);
            st.set("failover_hold", text, hold == DEFAULT_FAILOVER_HOLD);
            let stale = sentinel.serve_stale_reads;
            st.set("serve_stale_reads", stale, stale);
            let auth = sentinel
                .sentinels
                .iter()
                .find_map(|a| position(&c.endpoint_auth, *a));
            if let Some(j) = auth {
                st.put("auth", self.auth(&c.endpoint_auth[j].auth));
            }
            for a in &sentinel.sentinels {
                if let Some(j) = position(&c.endpoint_auth, *a) {
                    placed[j] = true;
                }
            }
            m.put("sentinel", st.done());
            return m.done();
        }
        let single = s.endpoints.len() == 1;
        let endpoints = s
            .endpoints
            .iter()
            .map(|e| {
                let mut m = self.map();
                m.put("address", e.address.to_string());
                let role = match e.role {
                    Role::Primary => "primary",
                    Role::Replica => "replica",
                };
                m.set("role", role, single && e.role == Role::Primary);
                m.some("zone", e.zone.as_deref());
                if let Some(j) = position(&c.endpoint_auth, e.address) {
                    placed[j] = true;
                    m.put("auth", self.auth(&c.endpoint_auth[j].auth));
                }
                m.done()
            })
            .collect();
        m.put("endpoints", Value::Sequence(endpoints));
        m.done()
    }
}

/// The listener's `protocol` and `advertised_redis_version`.
fn resp_settings(m: &mut Map, r: &RespSettings) {
    let d = RespSettings::default();
    m.set(
        "protocol",
        name_of(common::PROTOCOL_MODES, &r.protocol),
        r.protocol == d.protocol,
    );
    m.set(
        "advertised_redis_version",
        r.advertised_version.as_str(),
        r.advertised_version == d.advertised_version,
    );
}

/// The listener's `cluster_emulation`: `true` when it announces no address.
fn cluster_emulation(e: &ClusterEmulation) -> Value {
    if e.announce.is_empty() {
        return Value::Bool(true);
    }
    let announce = e.announce.iter().map(|a| a.to_string().into()).collect();
    let mut m = Mapping::new();
    m.insert("announce".into(), Value::Sequence(announce));
    Value::Mapping(m)
}

/// Which of `auth` is for `address`.
fn position(auth: &[EndpointAuth], address: SocketAddr) -> Option<usize> {
    auth.iter().position(|e| e.address == address)
}

#[cfg(test)]
mod tests;
