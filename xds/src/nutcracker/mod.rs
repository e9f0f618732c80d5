//! Twemproxy (nutcracker) configurations, read and written out as respway's static YAML.
//!
//! A nutcracker file is a map of pools, each with `listen`, `servers` and a few settings. Each
//! pool becomes one listener and one cluster of the pool's name: the listener's catch-all
//! route is the cluster, the servers are its shards, named as nutcracker names them (the name
//! written after the weight, else `host:port`, or just `host` on port 11211). Those names are
//! what ketama hashes and modula sorts by, so respway places every key where nutcracker does.
//!
//! What respway cannot do as nutcracker does is refused by name, never approximated: a
//! memcached pool (`redis: false`, nutcracker's default), `auto_eject_hosts: true` (respway
//! never moves a failed server's keys to the others), `distribution: random` (no placement),
//! unix sockets, host names (respway does not resolve them), key hashes it lacks, and unknown
//! keys. Settings without an equivalent that change no placement are named in a comment of the
//! output, with why they are ignored.
//!
//! [`convert`] turns the text into respway YAML; [`is_nutcracker`] tells a nutcracker file from
//! respway's own (which has `listeners:` and `clusters:`), so that `--config` takes either
//! ([`crate::load_file`]); [`import_file`] is `respway import-nutcracker FILE`.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use serde_yaml_ng::Value;

use crate::error::{ConfigError, ConfigErrors};

#[cfg(test)]
mod tests;

/// A pool's keys: nutcracker 0.5's directives (`conf_commands` in its `nc_conf.c`).
const POOL_KEYS: &[&str] = &[
    "listen",
    "hash",
    "hash_tag",
    "distribution",
    "timeout",
    "backlog",
    "client_connections",
    "redis",
    "redis_auth",
    "redis_db",
    "preconnect",
    "auto_eject_hosts",
    "server_connections",
    "server_retry_timeout",
    "server_failure_limit",
    "servers",
];

/// nutcracker's key hashes that respway has, under the same names and semantics.
const KEY_HASHES: &[&str] = &[
    "one_at_a_time",
    "md5",
    "crc32",
    "crc32a",
    "fnv1_64",
    "fnv1a_64",
    "fnv1_32",
    "fnv1a_32",
    "murmur",
];

/// nutcracker's port for memcached servers: an unnamed server on it is named (and hashed) by
/// its host alone (`conf_add_server`).
const MEMCACHED_PORT: u16 = 11211;

/// The keys of respway's own top level: a file with any of them is not a nutcracker file.
const RESPWAY_TOP_KEYS: &[&str] = &["listeners", "clusters", "node", "targets"];

/// True when `text` is a nutcracker configuration: a top-level map with none of respway's
/// top-level keys, in which some pool has `servers:`.
pub fn is_nutcracker(text: &str) -> bool {
    let Ok(Value::Mapping(top)) = serde_yaml_ng::from_str::<Value>(text) else {
        return false;
    };
    let respway_key = top
        .keys()
        .any(|k| k.as_str().is_some_and(|k| RESPWAY_TOP_KEYS.contains(&k)));
    !respway_key && top.values().any(|v| v.get("servers").is_some())
}

/// `text` converted when it is a nutcracker file ([`is_nutcracker`]), `None` when it is not.
pub fn convert_if_nutcracker(text: &str) -> Option<Result<String, ConfigErrors>> {
    is_nutcracker(text).then(|| convert(text))
}

/// A nutcracker configuration written out as respway's static YAML, with a comment for each
/// setting that is ignored.
///
/// # Errors
/// Every problem of every pool at once, each naming the pool and the key
/// (`pool "alpha": auto_eject_hosts: ...`).
pub fn convert(text: &str) -> Result<String, ConfigErrors> {
    let one = |reason: String| ConfigErrors(vec![ConfigError::new("", "", reason)]);
    let doc =
        serde_yaml_ng::from_str::<Value>(text).map_err(|e| one(format!("invalid YAML: {e}")))?;
    let Value::Mapping(top) = doc else {
        return Err(one(
            "a nutcracker configuration is a map of pools (`NAME: { listen: ..., servers: [...] }`)"
                .into(),
        ));
    };
    if top.is_empty() {
        return Err(one("the configuration has no pools".into()));
    }
    let mut errors = Vec::new();
    let mut pools = Vec::new();
    for (name, v) in &top {
        let name = scalar(name).unwrap_or_default();
        let mut cx = Cx {
            resource: format!("pool {name:?}"),
            errors: &mut errors,
        };
        if let Some(pool) = read_pool(&mut cx, name, v) {
            pools.push(pool);
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    Ok(write(&pools))
}

/// `respway import-nutcracker FILE`: the file converted, and checked as `--config` would load
/// it. Each error's resource starts with the file path, as [`crate::load_file`]'s do.
///
/// # Errors
/// The file cannot be read, is not a nutcracker file, cannot be converted, or converts to a
/// configuration respway refuses.
pub fn import_file(path: &Path) -> Result<String, ConfigErrors> {
    let file = path.display().to_string();
    let in_file = |errors: ConfigErrors| errors.in_file(&file);
    let text = std::fs::read_to_string(path).map_err(|e| {
        in_file(ConfigErrors(vec![ConfigError::new(
            "",
            "",
            format!("cannot read: {e}"),
        )]))
    })?;
    if !is_nutcracker(&text) {
        return Err(in_file(ConfigErrors(vec![ConfigError::new(
            "",
            "",
            "not a nutcracker configuration: expected a map of pools, each with `servers:`",
        )])));
    }
    let yaml = convert(&text).map_err(in_file)?;
    // Checked (and translated) as `--config` checks a file.
    crate::parse_yaml(&yaml).map_err(in_file)?;
    Ok(yaml)
}

/// One pool, read and checked.
struct Pool {
    name: String,
    listen: SocketAddr,
    distribution: &'static str,
    key_hash: &'static str,
    hash_tag: Option<String>,
    timeout_ms: Option<u64>,
    redis_auth: Option<String>,
    redis_db: u64,
    server_connections: Option<u64>,
    servers: Vec<Server>,
    /// Comments for the listener (settings ignored, and why).
    listener_notes: Vec<String>,
    /// Comments for the cluster.
    cluster_notes: Vec<String>,
}

/// One `servers` entry: `host:port:weight [name]`.
#[derive(Debug, PartialEq, Eq)]
struct Server {
    /// What nutcracker names it, hashes it by (ketama) and sorts it by (modula).
    name: String,
    address: SocketAddr,
    weight: u32,
}

/// Errors of one pool.
struct Cx<'e> {
    resource: String,
    errors: &'e mut Vec<ConfigError>,
}

impl Cx<'_> {
    fn err(&mut self, field: &str, reason: impl Into<String>) {
        self.errors
            .push(ConfigError::new(self.resource.clone(), field, reason));
    }
}

/// A YAML scalar as nutcracker reads it: its text.
fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The keys of one pool, typed as nutcracker types them.
struct Keys<'v> {
    map: &'v serde_yaml_ng::Mapping,
}

impl<'v> Keys<'v> {
    fn raw(&self, key: &str) -> Option<&'v Value> {
        self.map.get(key)
    }

    fn text(&self, cx: &mut Cx, key: &str) -> Option<String> {
        let v = self.raw(key)?;
        let s = scalar(v);
        if s.is_none() {
            cx.err(key, "must be a single value");
        }
        s
    }

    /// `conf_set_num`: a non-negative integer.
    fn num(&self, cx: &mut Cx, key: &str) -> Option<u64> {
        let s = self.text(cx, key)?;
        match s.parse::<u32>() {
            Ok(n) if n <= i32::MAX as u32 && s.bytes().all(|b| b.is_ascii_digit()) => {
                Some(n.into())
            }
            _ => {
                cx.err(key, format!("{s:?} is not a number"));
                None
            }
        }
    }

    /// `conf_set_bool`: `true` or `false`.
    fn boolean(&self, cx: &mut Cx, key: &str) -> Option<bool> {
        match self.raw(key)? {
            Value::Bool(b) => Some(*b),
            Value::String(s) if s == "true" => Some(true),
            Value::String(s) if s == "false" => Some(false),
            v => {
                let shown = scalar(v).unwrap_or_else(|| "this".into());
                cx.err(key, format!("{shown:?} is not \"true\" or \"false\""));
                None
            }
        }
    }
}

fn read_pool(cx: &mut Cx, name: String, v: &Value) -> Option<Pool> {
    let Value::Mapping(map) = v else {
        cx.err(
            "",
            "a pool is a map of settings (listen, servers, hash, distribution, ...)",
        );
        return None;
    };
    let before = cx.errors.len();
    for k in map.keys() {
        let k = scalar(k).unwrap_or_default();
        if !POOL_KEYS.contains(&k.as_str()) {
            cx.err(
                &k,
                format!(
                    "unknown nutcracker key (a pool has {})",
                    POOL_KEYS.join(", ")
                ),
            );
        }
    }
    let m = Keys { map };
    let mut listener_notes = Vec::new();
    let mut cluster_notes = Vec::new();

    match m.boolean(cx, "redis") {
        Some(true) => {}
        Some(false) => cx.err(
            "redis",
            "false is a memcached pool: respway speaks only Redis",
        ),
        None if m.raw("redis").is_none() => cx.err(
            "redis",
            "not set, which nutcracker reads as false, a memcached pool: respway speaks only \
             Redis (write `redis: true` for a Redis pool)",
        ),
        None => {}
    }
    if m.boolean(cx, "auto_eject_hosts") == Some(true) {
        cx.err(
            "auto_eject_hosts",
            "true is refused: respway never moves a failed server's keys to the other servers \
             (its keys get errors until it is back, and placement stays nutcracker's); set it \
             to false, nutcracker's default",
        );
    }
    let distribution = match m.text(cx, "distribution").as_deref() {
        None | Some("ketama") => "ketama",
        Some("modula") => "modula",
        Some("random") => {
            cx.err(
                "distribution",
                "random is refused: it places keys nowhere in particular, so there is no \
                 placement to keep; use ketama or modula",
            );
            "ketama"
        }
        Some(other) => {
            cx.err(
                "distribution",
                format!("{other:?} is not a nutcracker distribution (ketama, modula, random)"),
            );
            "ketama"
        }
    };
    let key_hash = match m.text(cx, "hash") {
        None => "fnv1a_64",
        Some(h) => match KEY_HASHES.iter().find(|k| **k == h) {
            Some(k) => k,
            None if ["crc16", "hsieh", "jenkins"].contains(&h.as_str()) => {
                cx.err(
                    "hash",
                    format!(
                        "{h} is a nutcracker hash respway does not have (it has {})",
                        KEY_HASHES.join(", ")
                    ),
                );
                "fnv1a_64"
            }
            None => {
                cx.err("hash", format!("{h:?} is not a nutcracker hash"));
                "fnv1a_64"
            }
        },
    };
    let hash_tag = m.text(cx, "hash_tag");
    if let Some(t) = &hash_tag {
        if t.len() != 2 || !t.is_ascii() {
            cx.err(
                "hash_tag",
                format!("{t:?} is not two characters (respway takes two ASCII characters)"),
            );
        }
    }
    let listen = match m.text(cx, "listen") {
        None => {
            cx.err("listen", "required");
            None
        }
        Some(l) => parse_listen(&l).map_err(|e| cx.err("listen", e)).ok(),
    };
    let timeout_ms = match m.num(cx, "timeout") {
        Some(0) => {
            listener_notes.push(
                "timeout: 0 is no timeout to nutcracker (it waits for a reply forever); \
                 respway's op_timeout default (1s) applies"
                    .to_string(),
            );
            None
        }
        None if m.raw("timeout").is_none() => {
            listener_notes.push(
                "no timeout: nutcracker waits for a reply forever; respway's op_timeout \
                 default (1s) applies"
                    .to_string(),
            );
            None
        }
        t => t,
    };
    if let Some(n) = m.num(cx, "backlog") {
        listener_notes.push(format!(
            "backlog: {n} is ignored: respway has no listen backlog setting"
        ));
    }
    if let Some(n) = m.num(cx, "client_connections") {
        listener_notes.push(format!(
            "client_connections: {n} is ignored: respway does not cap a listener's clients"
        ));
    }
    let redis_auth = m.text(cx, "redis_auth");
    if redis_auth.as_deref() == Some("") {
        cx.err("redis_auth", "must not be empty");
    }
    let redis_db = m.num(cx, "redis_db").unwrap_or(0);
    if m.boolean(cx, "preconnect") == Some(true) {
        cluster_notes.push(
            "preconnect: true is ignored: respway opens upstream connections on first use"
                .to_string(),
        );
    }
    let server_connections = m.num(cx, "server_connections");
    if server_connections == Some(0) {
        cx.err("server_connections", "cannot be 0");
    }
    for key in ["server_retry_timeout", "server_failure_limit"] {
        if let Some(n) = m.num(cx, key) {
            cluster_notes.push(format!(
                "{key}: {n} is ignored: it only matters with auto_eject_hosts, which respway \
                 refuses; a failed server is retried after a backoff (100 ms doubling to 5 s)"
            ));
        }
    }
    let servers = read_servers(cx, &m);
    if cx.errors.len() > before {
        return None;
    }
    Some(Pool {
        name,
        listen: listen?,
        distribution,
        key_hash,
        hash_tag,
        timeout_ms,
        redis_auth,
        redis_db,
        server_connections,
        servers,
        listener_notes,
        cluster_notes,
    })
}

/// `servers`: a non-empty list of `host:port:weight [name]`, names unique.
fn read_servers(cx: &mut Cx, m: &Keys) -> Vec<Server> {
    let list = match m.raw("servers") {
        None => {
            cx.err("servers", "required");
            return Vec::new();
        }
        Some(Value::Sequence(list)) if !list.is_empty() => list,
        Some(_) => {
            cx.err(
                "servers",
                "must be a non-empty list of \"host:port:weight [name]\"",
            );
            return Vec::new();
        }
    };
    let mut servers: Vec<Server> = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let field = format!("servers[{i}]");
        let parsed = match v {
            Value::String(s) => parse_server(s),
            _ => Err("must be a string \"host:port:weight [name]\"".to_string()),
        };
        match parsed {
            Ok(s) => {
                if let Some(j) = servers.iter().position(|o| o.name == s.name) {
                    cx.err(
                        &field,
                        format!(
                            "server name {:?} is also the name of servers[{j}] (nutcracker \
                             refuses this too)",
                            s.name
                        ),
                    );
                }
                servers.push(s);
            }
            Err(e) => cx.err(&field, e),
        }
    }
    servers
}

/// An IP address as written in nutcracker (`10.0.0.1`, `[::1]` or `::1`).
fn parse_ip(host: &str, what: &str) -> Result<IpAddr, String> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse().map_err(|_| {
        format!(
            "{host:?} is not an IP address: respway does not resolve host names; write the \
             {what}'s IP"
        )
    })
}

/// A port as nutcracker takes it: digits, 1 to 65535.
fn parse_port(port: &str) -> Result<u16, String> {
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(format!("{port:?} is not a port")),
    }
}

/// `listen`: `host:port` (a `/path` is a unix socket, refused).
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if s.starts_with('/') {
        return Err(format!(
            "{s:?} is a unix socket: respway listens on TCP only; write an IP:port"
        ));
    }
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not \"host:port\""))?;
    let port = parse_port(port)?;
    let ip = parse_ip(host, "listen address")?;
    Ok(SocketAddr::new(ip, port))
}

/// One server, parsed from the end as nutcracker does (`conf_add_server`): the name after the
/// last space, then the weight and the port after the last colons.
fn parse_server(s: &str) -> Result<Server, String> {
    if s.starts_with('/') {
        return Err(format!(
            "{s:?} is a unix socket server: respway connects to servers over TCP only"
        ));
    }
    let (pname, name) = match s.rsplit_once(' ') {
        Some((p, n)) => (p, Some(n)),
        None => (s, None),
    };
    let bad = || format!("{s:?} is not \"host:port:weight [name]\"");
    let (host_port, weight) = pname.rsplit_once(':').ok_or_else(bad)?;
    let (host, port) = host_port.rsplit_once(':').ok_or_else(bad)?;
    let weight = match weight.parse::<u32>() {
        Ok(0) => return Err(format!("{s:?} has a zero weight")),
        Ok(w) if weight.bytes().all(|b| b.is_ascii_digit()) => w,
        _ => return Err(format!("{s:?} has an invalid weight")),
    };
    let port = parse_port(port).map_err(|e| format!("{s:?}: {e}"))?;
    let name = match name {
        Some("") => return Err(format!("{s:?} has an empty name")),
        Some(n) => n.to_string(),
        None if port == MEMCACHED_PORT => host.to_string(),
        None => host_port.to_string(),
    };
    let ip = parse_ip(host, "server").map_err(|e| {
        format!(
            "{e}, and keep its placement with its nutcracker name: \"IP:{port}:{weight} {name}\""
        )
    })?;
    Ok(Server {
        name,
        address: SocketAddr::new(ip, port),
        weight,
    })
}

/// A YAML double-quoted string (JSON's escapes are YAML's).
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// The respway YAML of `pools`.
fn write(pools: &[Pool]) -> String {
    let mut y = String::from(
        "# respway configuration converted from a nutcracker (twemproxy) file\n\
         # (`respway import-nutcracker`): one listener and one cluster per pool, named after it;\n\
         # shards are named as nutcracker names its servers, so keys are placed where nutcracker\n\
         # places them.\n\
         listeners:\n",
    );
    for p in pools {
        let _ = writeln!(y, "  - name: {}", q(&p.name));
        for n in &p.listener_notes {
            let _ = writeln!(y, "    # {n}");
        }
        let _ = writeln!(y, "    address: {}", q(&p.listen.to_string()));
        if let Some(ms) = p.timeout_ms {
            let _ = writeln!(y, "    op_timeout: {ms}ms  # timeout");
        }
        if let Some(pw) = &p.redis_auth {
            let _ = writeln!(
                y,
                "    # redis_auth: clients AUTH with it, as nutcracker requires"
            );
            let _ = writeln!(y, "    downstream_auth_password: {}", q(pw));
        }
        let _ = writeln!(y, "    routes: {{ catch_all: {} }}", q(&p.name));
    }
    y.push_str("clusters:\n");
    for p in pools {
        let _ = writeln!(y, "  - name: {}", q(&p.name));
        for n in &p.cluster_notes {
            let _ = writeln!(y, "    # {n}");
        }
        let _ = writeln!(
            y,
            "    hash: {{ policy: {}, key_hash: {} }}",
            p.distribution, p.key_hash
        );
        match &p.hash_tag {
            Some(t) => {
                let _ = writeln!(y, "    hashtag: {}", q(t));
            }
            None => y.push_str("    hashtag: null  # no hash_tag: whole keys are hashed\n"),
        }
        if let Some(n) = p.server_connections {
            let _ = writeln!(
                y,
                "    connections_per_endpoint: {n}  # server_connections (respway opens them per worker)"
            );
        }
        if let Some(pw) = &p.redis_auth {
            let _ = writeln!(y, "    auth: {{ password: {} }}  # redis_auth", q(pw));
        }
        if p.redis_db != 0 {
            let _ = writeln!(y, "    db: {}  # redis_db", p.redis_db);
        }
        y.push_str("    shards:\n");
        for s in &p.servers {
            let _ = writeln!(
                y,
                "      - {{ name: {}, weight: {}, endpoints: [{{ address: {} }}] }}",
                q(&s.name),
                s.weight,
                q(&s.address.to_string())
            );
        }
    }
    y
}
