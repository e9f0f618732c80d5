//! The bootstrap file (`--bootstrap FILE`): who this sidecar is, where its management server
//! is, and the static resources it serves until (or while) the server is away.
//!
//! ```yaml
//! node: { id: sidecar-1, zone: z1 }       # id required with xds
//! xds: { server: "http://127.0.0.1:18000" } # optional: the ADS management server
//! # or several, tried in order (failover: see respway_xds::client):
//! # xds: { servers: ["http://10.0.1.5:18000", "http://10.0.2.5:18000"] }
//! # over TLS (mTLS with cert/key; the certificate's DNS name is the node id for secrets):
//! # xds:
//! #   servers: ["https://xds-a:18000"]
//! #   tls: { ca: ca.pem, cert: node.pem, key: node.key, server_name: xds.internal }
//! # how long a cluster waits for its ClusterLoadAssignment before it is used with no
//! # endpoints (Envoy's initial_fetch_timeout; default 15s):
//! #   initial_fetch_timeout: 15s
//! # HTTP/2 PINGs after `interval` without a frame; a PING unanswered for `timeout` ends the
//! # connection (then the next server): a silent server is left within interval + timeout
//! #   keepalive: { interval: 30s, timeout: 10s }
//! static_resources:                       # optional: the same schema as --config
//!   listeners: [...]
//!   clusters: [...]
//! ```
//!
//! Every error is reported at once, naming the file and the field.

use std::path::Path;
use std::time::Duration;

use respway_filters::model::Config;
use serde_yaml_ng::Value;

/// A parsed bootstrap.
#[derive(Debug, Clone)]
pub struct Bootstrap {
    /// `node.id`.
    pub node_id: Option<String>,
    /// `node.zone`.
    pub zone: Option<String>,
    /// `xds.server`, or the list `xds.servers`: the management servers in order; empty
    /// without xDS.
    pub xds_servers: Vec<String>,
    /// `xds.tls`: TLS to the management servers (files reloaded when they change).
    pub xds_tls: Option<respway_tls::ClientFiles>,
    /// `xds.initial_fetch_timeout`: how long a cluster waits for its assignment (`None`: the
    /// client's default, 15 s).
    pub xds_initial_fetch_timeout: Option<Duration>,
    /// `xds.keepalive.interval` (`None`: the client's default, 30 s).
    pub xds_keepalive_interval: Option<Duration>,
    /// `xds.keepalive.timeout` (`None`: the client's default, 10 s).
    pub xds_keepalive_timeout: Option<Duration>,
    /// `static_resources`, translated as written: the sidecar sets the node's `zone` over it
    /// (as over every configuration from a file), so it is not set here.
    pub static_config: Option<Config>,
}

impl Bootstrap {
    /// Reads and checks a bootstrap file.
    ///
    /// # Errors
    /// Every problem, one per line, each prefixed with the file name.
    pub fn load(path: &Path) -> Result<Bootstrap, String> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| format!("{file}: {e}"))?;
        Bootstrap::parse(&text).map_err(|errors| {
            errors
                .lines()
                .map(|l| format!("{file}: {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        })
    }

    /// Parses bootstrap YAML text.
    ///
    /// # Errors
    /// Every problem, one per line.
    pub(crate) fn parse(text: &str) -> Result<Bootstrap, String> {
        let doc: Value = serde_yaml_ng::from_str(text).map_err(|e| format!("invalid YAML: {e}"))?;
        let Value::Mapping(top) = doc else {
            return Err("the bootstrap must be a mapping".into());
        };
        let mut errors = Vec::new();
        let mut b = Bootstrap {
            node_id: None,
            zone: None,
            xds_servers: Vec::new(),
            xds_tls: None,
            xds_initial_fetch_timeout: None,
            xds_keepalive_interval: None,
            xds_keepalive_timeout: None,
            static_config: None,
        };
        let string = |v: &Value, field: &str, errors: &mut Vec<String>| match v {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Null => None,
            _ => {
                errors.push(format!("{field}: must be a non-empty string"));
                None
            }
        };
        for (k, v) in &top {
            match k.as_str() {
                Some("node") => match v {
                    Value::Mapping(m) => {
                        for (nk, nv) in m {
                            match nk.as_str() {
                                Some("id") => b.node_id = string(nv, "node.id", &mut errors),
                                Some("zone") => b.zone = string(nv, "node.zone", &mut errors),
                                other => errors
                                    .push(format!("node.{}: unknown field", other.unwrap_or("?"))),
                            }
                        }
                    }
                    _ => errors.push("node: must be a mapping".into()),
                },
                Some("xds") => match v {
                    Value::Mapping(m) => {
                        if m.contains_key("server") && m.contains_key("servers") {
                            errors.push(
                                "xds: give either server (one) or servers (a list), not both"
                                    .into(),
                            );
                        }
                        for (xk, xv) in m {
                            match xk.as_str() {
                                Some("server") => {
                                    b.xds_servers.extend(string(xv, "xds.server", &mut errors));
                                }
                                Some("servers") => match xv {
                                    Value::Sequence(list) if !list.is_empty() => {
                                        for (i, s) in list.iter().enumerate() {
                                            let field = format!("xds.servers[{i}]");
                                            match string(s, &field, &mut errors) {
                                                Some(s) if b.xds_servers.contains(&s) => errors
                                                    .push(format!(
                                                        "{field}: {s:?} is listed twice"
                                                    )),
                                                Some(s) => b.xds_servers.push(s),
                                                None if s.is_null() => errors.push(format!(
                                                    "{field}: must be a non-empty string"
                                                )),
                                                None => {}
                                            }
                                        }
                                    }
                                    _ => errors.push(
                                        "xds.servers: must be a non-empty list of server addresses"
                                            .into(),
                                    ),
                                },
                                Some("tls") => b.xds_tls = xds_tls(xv, &mut errors),
                                Some("initial_fetch_timeout") => {
                                    b.xds_initial_fetch_timeout =
                                        duration(xv, "xds.initial_fetch_timeout", &mut errors);
                                }
                                Some("keepalive") => match xv {
                                    Value::Mapping(ka) => {
                                        for (kk, kv) in ka {
                                            match kk.as_str() {
                                                Some("interval") => {
                                                    b.xds_keepalive_interval = duration(
                                                        kv,
                                                        "xds.keepalive.interval",
                                                        &mut errors,
                                                    );
                                                }
                                                Some("timeout") => {
                                                    b.xds_keepalive_timeout = duration(
                                                        kv,
                                                        "xds.keepalive.timeout",
                                                        &mut errors,
                                                    );
                                                }
                                                other => errors.push(format!(
                                                    "xds.keepalive.{}: unknown field",
                                                    other.unwrap_or("?")
                                                )),
                                            }
                                        }
                                    }
                                    _ => errors.push(
                                        "xds.keepalive: must be a mapping { interval, timeout }"
                                            .into(),
                                    ),
                                },
                                other => errors
                                    .push(format!("xds.{}: unknown field", other.unwrap_or("?"))),
                            }
                        }
                    }
                    _ => errors.push("xds: must be a mapping".into()),
                },
                Some("static_resources") => {
                    // The node's zone is set over it by the sidecar (`with_zone` in main.rs),
                    // as over every configuration from a file.
                    let text = match serde_yaml_ng::to_string(v) {
                        Ok(t) => t,
                        Err(e) => {
                            errors.push(format!("static_resources: {e}"));
                            continue;
                        }
                    };
                    match respway_xds::parse_yaml(&text).and_then(|r| respway_xds::translate(&r)) {
                        Ok(c) => b.static_config = Some(c),
                        Err(e) => errors.extend(
                            e.to_string()
                                .lines()
                                .map(|l| format!("static_resources: {l}")),
                        ),
                    }
                }
                other => errors.push(format!("{}: unknown field", other.unwrap_or("?"))),
            }
        }
        for (i, server) in b.xds_servers.iter().enumerate() {
            let field = if top.get("xds").and_then(|x| x.get("servers")).is_some() {
                format!("xds.servers[{i}]")
            } else {
                "xds.server".to_string()
            };
            if b.xds_tls.is_some() && server.starts_with("http://") {
                errors.push(format!(
                    "{field}: {server:?} is plaintext but xds.tls is set; use https:// or no scheme"
                ));
            }
            if b.xds_tls.is_none() && server.starts_with("https://") {
                errors.push(format!(
                    "{field}: {server:?} needs xds.tls (at least xds.tls.ca)"
                ));
            }
        }
        if !b.xds_servers.is_empty() && b.node_id.is_none() {
            errors.push("node.id: required when xds.server is set".into());
        }
        if b.xds_servers.is_empty() && b.static_config.is_none() {
            errors.push("static_resources: required when there is no xds.server".into());
        }
        if errors.is_empty() {
            Ok(b)
        } else {
            Err(errors.join("\n"))
        }
    }
}

/// A duration of more than 0 (`250ms`, `15s`, ...) at `field`; `None` (and an error) otherwise.
fn duration(v: &Value, field: &str, errors: &mut Vec<String>) -> Option<Duration> {
    let parsed = match v {
        Value::String(s) => respway_xds::client::parse_duration(s),
        _ => Err("must be a duration such as \"250ms\" or \"15s\"".to_string()),
    };
    match parsed {
        Ok(d) if d.is_zero() => errors.push(format!("{field}: must be more than 0")),
        Ok(d) => return Some(d),
        Err(e) => errors.push(format!("{field}: {e}")),
    }
    None
}

/// `xds.tls`: `{ ca, cert?, key?, server_name?, insecure_skip_verify? }` (file paths).
fn xds_tls(v: &Value, errors: &mut Vec<String>) -> Option<respway_tls::ClientFiles> {
    let Value::Mapping(m) = v else {
        errors.push("xds.tls: must be a mapping".into());
        return None;
    };
    let mut files = respway_tls::ClientFiles {
        ca: None,
        cert: None,
        key: None,
        server_name: None,
        insecure_skip_verify: false,
    };
    for (k, v) in m {
        let key = k.as_str().unwrap_or("?");
        let path = |errors: &mut Vec<String>| match v {
            Value::String(s) if !s.is_empty() => Some(std::path::PathBuf::from(s)),
            _ => {
                errors.push(format!("xds.tls.{key}: must be a file path"));
                None
            }
        };
        match key {
            "ca" => files.ca = path(errors),
            "cert" => files.cert = path(errors),
            "key" => files.key = path(errors),
            "server_name" => match v {
                Value::String(s) if !s.is_empty() => files.server_name = Some(s.clone()),
                _ => errors.push("xds.tls.server_name: must be a non-empty string".into()),
            },
            "insecure_skip_verify" => match v {
                Value::Bool(b) => files.insecure_skip_verify = *b,
                _ => errors.push("xds.tls.insecure_skip_verify: must be true or false".into()),
            },
            other => errors.push(format!("xds.tls.{other}: unknown field")),
        }
    }
    if files.ca.is_none() && !files.insecure_skip_verify {
        errors.push(
            "xds.tls.ca: required (the CA that signs the management servers' certificates)".into(),
        );
    }
    if files.cert.is_some() != files.key.is_some() {
        errors.push("xds.tls: cert and key must be given together".into());
    }
    Some(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_at_once() {
        let err = Bootstrap::parse("node: { idd: x, zone: 3 }\nxds: { server: \"\" }\nfoo: 1\n")
            .unwrap_err();
        assert_eq!(
            err,
            "node.idd: unknown field\nnode.zone: must be a non-empty string\nxds.server: must be a non-empty string\nfoo: unknown field\nstatic_resources: required when there is no xds.server"
        );
        let err = Bootstrap::parse("xds: { server: \"http://127.0.0.1:1\" }\n").unwrap_err();
        assert_eq!(err, "node.id: required when xds.server is set");
    }

    #[test]
    fn one_server_or_a_list() {
        let b =
            Bootstrap::parse("node: { id: a }\nxds: { server: \"http://127.0.0.1:1\" }\n").unwrap();
        assert_eq!(b.xds_servers, ["http://127.0.0.1:1"]);
        let b = Bootstrap::parse(
            "node: { id: a }\nxds:\n  servers: [\"http://10.0.1.5:18000\", \"10.0.2.5:18000\"]\n",
        )
        .unwrap();
        assert_eq!(b.xds_servers, ["http://10.0.1.5:18000", "10.0.2.5:18000"]);
        let err = Bootstrap::parse(
            "node: { id: a }\nxds: { server: \"http://a:1\", servers: [\"http://a:1\", \"\", 3, \"http://a:1\"] }\n",
        )
        .unwrap_err();
        assert_eq!(
            err,
            "xds: give either server (one) or servers (a list), not both\nxds.servers[0]: \"http://a:1\" is listed twice\nxds.servers[1]: must be a non-empty string\nxds.servers[2]: must be a non-empty string\nxds.servers[3]: \"http://a:1\" is listed twice"
        );
        let err = Bootstrap::parse("node: { id: a }\nxds: { servers: [] }\n").unwrap_err();
        assert_eq!(
            err,
            "xds.servers: must be a non-empty list of server addresses\nstatic_resources: required when there is no xds.server"
        );
    }

    #[test]
    fn initial_fetch_timeout_is_a_duration_of_more_than_zero() {
        let b = Bootstrap::parse(
            "node: { id: a }\nxds: { server: \"http://a:1\", initial_fetch_timeout: 1500ms }\n",
        )
        .unwrap();
        assert_eq!(
            b.xds_initial_fetch_timeout,
            Some(Duration::from_millis(1500))
        );
        for (v, why) in [
            ("0s", "must be more than 0"),
            ("15", "invalid duration \"15\""),
            ("3", "must be a duration such as"),
        ] {
            let quoted = if v == "3" {
                v.to_string()
            } else {
                format!("\"{v}\"")
            };
            let err = Bootstrap::parse(&format!(
                "node: {{ id: a }}\nxds: {{ server: \"http://a:1\", initial_fetch_timeout: {quoted} }}\n"
            ))
            .unwrap_err();
            assert!(
                err.starts_with(&format!("xds.initial_fetch_timeout: {why}")),
                "{v}: {err}"
            );
        }
    }

    #[test]
    fn keepalive_takes_two_durations() {
        let b = Bootstrap::parse(
            "node: { id: a }\nxds: { server: \"http://a:1\", keepalive: { interval: 2s, timeout: 500ms } }\n",
        )
        .unwrap();
        assert_eq!(b.xds_keepalive_interval, Some(Duration::from_secs(2)));
        assert_eq!(b.xds_keepalive_timeout, Some(Duration::from_millis(500)));
        let err = Bootstrap::parse(
            "node: { id: a }\nxds: { server: \"http://a:1\", keepalive: { interval: 0s, timeout: x, every: 1s } }\n",
        )
        .unwrap_err();
        assert_eq!(
            err,
            "xds.keepalive.interval: must be more than 0\nxds.keepalive.timeout: invalid duration \"x\" (expected an integer and a unit: us, ms, s, m or h, e.g. \"250ms\")\nxds.keepalive.every: unknown field"
        );
        let err =
            Bootstrap::parse("node: { id: a }\nxds: { server: \"http://a:1\", keepalive: 3s }\n")
                .unwrap_err();
        assert_eq!(
            err,
            "xds.keepalive: must be a mapping { interval, timeout }"
        );
    }

    #[test]
    fn static_resources_are_translated_as_written_and_the_node_keeps_its_zone() {
        let b = Bootstrap::parse(
            "node: { id: a, zone: z1 }\nstatic_resources:\n  listeners:\n    - name: l\n      routes: { catch_all: c }\n  clusters:\n    - name: c\n      shards:\n        - endpoints: [ { address: \"127.0.0.1:6379\" } ]\n",
        )
        .unwrap();
        // main.rs's `with_zone` puts the node's zone over it
        // (`tests/cli.rs`: the_nodes_zone_applies_to_static_resources_and_zone_overrides_it).
        let c = b.static_config.unwrap();
        assert_eq!(c.zone, None);
        assert_eq!(b.zone.as_deref(), Some("z1"));
        assert_eq!(b.node_id.as_deref(), Some("a"));
    }

    #[test]
    fn xds_tls_names_its_files_and_matches_the_servers_schemes() {
        let b = Bootstrap::parse(
            "node: { id: a }\nxds:\n  servers: [\"https://x:1\", \"y:2\"]\n  tls: { ca: ca.pem, cert: a.pem, key: a.key, server_name: xds.internal }\n",
        )
        .unwrap();
        let t = b.xds_tls.unwrap();
        assert_eq!(t.ca.as_deref(), Some(Path::new("ca.pem")));
        assert_eq!(t.cert.as_deref(), Some(Path::new("a.pem")));
        assert_eq!(t.server_name.as_deref(), Some("xds.internal"));
        assert!(!t.insecure_skip_verify);
        let err = Bootstrap::parse(
            "node: { id: a }\nxds:\n  servers: [\"http://x:1\"]\n  tls: { cert: a.pem, sni: x }\n",
        )
        .unwrap_err();
        assert_eq!(
            err,
            "xds.tls.sni: unknown field\nxds.tls.ca: required (the CA that signs the management servers' certificates)\nxds.tls: cert and key must be given together\nxds.servers[0]: \"http://x:1\" is plaintext but xds.tls is set; use https:// or no scheme"
        );
        let err =
            Bootstrap::parse("node: { id: a }\nxds: { server: \"https://x:1\" }\n").unwrap_err();
        assert_eq!(
            err,
            "xds.server: \"https://x:1\" needs xds.tls (at least xds.tls.ca)"
        );
    }
}
